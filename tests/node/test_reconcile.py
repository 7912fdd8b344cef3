"""Catch-up by range reconciliation on real nodes (loopback UDP and TCP, SQLite on disk): a
subscriber back after missing hundreds of events gets every one, in causal order, once,
through RECON and RWANT rather than a WANT per 512 blocks; and the answering side refuses
what it should."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from dag import CID
from pulsar import Node
from pulsar.proto.reconcile.items import INFINITY
from pulsar.proto.reconcile.messages import Fingerprint, RBlocks, Recon, RWant
from tests.waiting import eventually

from .conftest import Network, PartitionableNetwork


async def _publish(node: Node, topic: CID, count: int, tag: str) -> None:
    numbers = iter(range(count))

    async def worker() -> None:
        for n in numbers:
            await node.publish(topic, f"{tag}{n}".encode())

    await asyncio.gather(*(worker() for _ in range(16)))


async def _causal_log(node: Node, topic: CID) -> list[CID]:
    """The log's CIDs, checked: each once, each after its parent."""
    seen: set[CID] = set()
    order: list[CID] = []
    async for event in node.history(topic):
        assert event.cid not in seen, "delivered twice"
        assert event.parent is None or event.parent in seen, "delivered before its parent"
        seen.add(event.cid)
        order.append(event.cid)
    return order


async def test_a_node_back_after_missing_900_events_catches_up_by_reconciliation(
        network: Network) -> None:
    author, stays, away = await network.start(3)
    topic = (await author.create_topic("catch/up")).cid
    await stays.subscribe(topic)
    await away.subscribe(topic)
    await _publish(author, topic, 50, "before")
    await eventually(lambda: away.last_position(topic) == 50 == stays.last_position(topic))
    config = away.config
    await away.stop()
    await _publish(author, topic, 900, "missed")
    await eventually(lambda: stays.last_position(topic) == 950)

    back = await Node.start(replace(config, bootstrap=(author.address,)))
    network.nodes[2] = back
    await eventually(lambda: back.last_position(topic) == 950, timeout=30)
    order = await _causal_log(back, topic)
    assert set(order) == set(await _causal_log(stays, topic))
    metrics = back.metrics
    assert metrics["reconciliations"] == 1
    assert metrics["reconciled"] > 0  # the walk's first answer brought the rest
    assert metrics["reconciled"] + metrics["backfilled"] >= 900
    assert metrics["wants_sent"] <= 2  # the first WANT, not one per 512 blocks
    assert metrics["gaps_reported"] == 0


async def test_with_reconcile_off_the_same_catch_up_walks(network: Network) -> None:
    author, _, away = await network.start(3)
    topic = (await author.create_topic("catch/walk")).cid
    await away.subscribe(topic)
    await _publish(author, topic, 10, "before")
    await eventually(lambda: away.last_position(topic) == 10)
    config = away.config
    await away.stop()
    await _publish(author, topic, 1_200, "missed")
    back = await Node.start(replace(config, bootstrap=(author.address,), reconcile=False))
    network.nodes[2] = back
    await eventually(lambda: back.last_position(topic) == 1_210, timeout=30)
    await _causal_log(back, topic)
    assert back.metrics["reconciliations"] == 0
    assert back.metrics["wants_sent"] >= 3


async def test_only_a_neighbour_in_the_topic_is_answered(network: Network) -> None:
    author, member, stranger = await network.start(3)
    topic = (await author.create_topic("catch/who")).cid
    await member.subscribe(topic)
    await _publish(author, topic, 20, "e")
    await eventually(lambda: member.last_position(topic) == 20)
    sent: list[tuple[str, object]] = []
    author_driver = author._driver
    original = author_driver._send

    def spy(peer: object, message: object) -> None:
        sent.append((str(peer), message))
        original(peer, message)  # type: ignore[arg-type]

    author_driver._send = spy  # type: ignore[method-assign]
    author_driver.reconciler._send = spy
    ask = Recon(topic, 5, 0, (Fingerprint((0, b""), INFINITY, 0, b"\0" * 16),), ())
    author_driver.reconciler.on_frame(stranger.peer_id, ask)
    # An odd round is an answer: to a session the author does not have, so it is a late
    # one, and answering it would start two answerers talking to each other.
    author_driver.reconciler.on_frame(member.peer_id, replace(ask, round=1))
    author_driver.reconciler.on_frame(member.peer_id, ask)  # answered once indexed

    def answers() -> list[Recon]:
        return [m for _, m in sent if isinstance(m, Recon)]

    await eventually(lambda: len(answers()) == 1)
    assert [p for p, m in sent if isinstance(m, Recon)] == [str(member.peer_id)]
    listed = [cid for ids in answers()[0].ids for cid, _ in ids.items]
    assert len(listed) == 20 == len(set(listed))  # the member holds nothing: all 20, once
    author_driver.reconciler.on_frame(member.peer_id, RWant(topic, 5, tuple(listed[:3])))
    blocks = [m for p, m in sent if isinstance(m, RBlocks)]
    assert len(blocks) == 1 and blocks[0].n == 3 and len(blocks[0].blocks) == 3


async def test_a_healed_partition_is_caught_up_by_reconciliation(tmp_path: Path) -> None:
    """Two subscribers cut off from the publisher's side while it publishes 700 events
    get every one after the partition heals — the first event after the heal reveals the
    gap, and it is too deep to walk — in causal order, once."""
    net = PartitionableNetwork(tmp_path)
    try:
        author, near, far, farther = await net.start(4)
        topic = (await author.create_topic("catch/heal")).cid
        for node in (near, far, farther):
            await node.subscribe(topic)
        await _publish(author, topic, 20, "before")
        await eventually(lambda: all(n.last_position(topic) == 20
                                     for n in (near, far, farther)))
        net.faults.partition([[author.peer_id, near.peer_id],
                              [far.peer_id, farther.peer_id]])
        await _publish(author, topic, 700, "during")
        await eventually(lambda: near.last_position(topic) == 720)
        assert far.last_position(topic) < 720 and farther.last_position(topic) < 720
        net.faults.heal()
        await _publish(author, topic, 5, "after")
        await eventually(lambda: all(n.last_position(topic) == 725
                                     for n in (near, far, farther)), timeout=60)
        expected = set(await _causal_log(near, topic))
        for node in (far, farther):
            assert set(await _causal_log(node, topic)) == expected
            assert node.metrics["gaps_reported"] == 0
        assert far.metrics["reconciliations"] + farther.metrics["reconciliations"] >= 1
        assert far.metrics["reconciled"] + farther.metrics["reconciled"] > 0
    finally:
        await net.close()


async def test_events_of_a_version_the_node_missed_are_caught_up_too(network: Network) -> None:
    """While the node was away the author updated the topic and published 500 more
    events naming the new version, which the node does not know when reconciliation
    brings them: they are walked for and delivered once the version is fetched, not
    dropped."""
    author, _, away = await network.start(3)
    topic = (await author.create_topic("catch/version")).cid
    await away.subscribe(topic)
    await _publish(author, topic, 10, "before")
    await eventually(lambda: away.last_position(topic) == 10)
    config = away.config
    await away.stop()
    await _publish(author, topic, 200, "old")
    await author.update_topic(topic, name="catch/version/2")
    await _publish(author, topic, 500, "new")
    back = await Node.start(replace(config, bootstrap=(author.address,)))
    network.nodes[2] = back
    await eventually(lambda: back.last_position(topic) == 710, timeout=60)
    await _causal_log(back, topic)
    assert back.metrics["reconciliations"] >= 1
    assert back.metrics["gaps_reported"] == 0
