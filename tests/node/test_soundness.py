"""The broker's promises across restarts, revocations and offline publishers, on real
nodes (UDP DHT, TCP transport, SQLite) on loopback. Each test is one of the problems the
soundness review found; each failed on the code before the typed core."""

from __future__ import annotations

import contextlib
import socket
import sqlite3

import pytest

from dag import CID, EventLinking
from pulsar import Node, NodeConfig, PublishError

from .conftest import FAST_DHT, Network, collect, eventually


async def _start_again(network: Network, index: int) -> Node:
    """Start node ``index`` again on its data directory (it was stopped before)."""
    seeds = tuple(n.address for i, n in enumerate(network.nodes) if i != index
                  and not n.stopped)[:3]
    node = await Node.start(network.config(index, seeds))
    network.nodes[index] = node
    return node


async def test_a_revoked_publisher_restarted_with_the_old_version_cannot_publish(
    network: Network,
) -> None:
    author, bob, reader, _ = await network.start(4)
    topic = await author.create_topic("revocation", allowed_publishers=[bob.peer_id])
    sub = await reader.subscribe(topic.cid)
    await bob.publish(topic.cid, b"while allowed")
    await collect(sub, 1)
    await bob.stop()  # Bob is away while the author revokes him: he keeps only v1
    v2 = await author.update_topic(topic.cid, allowed_publishers=[])
    await eventually(lambda: reader.core.latest(topic.cid) == v2, timeout=10)
    bob = await _start_again(network, 1)
    with pytest.raises(PublishError, match="not allowed"):
        await bob.publish(topic.cid, b"after revocation")
    assert bob.core.latest(topic.cid) == v2  # he learned it before publishing
    late = await author.publish(topic.cid, b"from the author")
    (event,) = await collect(sub, 1)
    assert event.cid == late.cid and sub.pending() == 0


async def test_a_restarted_author_updates_on_top_of_its_latest_version(network: Network) -> None:
    author, bob, reader = await network.start(3)
    topic = await author.create_topic("versions", allowed_publishers=[bob.peer_id])
    v2 = await author.update_topic(topic.cid, allowed_publishers=[])
    author = await network.restart(author)
    await eventually(lambda: author.core.latest(topic.cid) == v2, timeout=5)  # resumed
    v3 = await author.update_topic(topic.cid, name="versions, renamed")
    assert v3.parent == v2.cid
    assert not v3.may_publish(bob.peer_id)  # v2's revocation is not undone
    await reader.subscribe(topic.cid)
    await eventually(lambda: reader.core.latest(topic.cid) == v3, timeout=10)


async def test_last_seen_survives_a_restart_and_a_publisher_that_does_not_follow(
    network: Network,
) -> None:
    author, other, reader, _ = await network.start(4)
    topic = await author.create_topic("chain", allowed_publishers=[other.peer_id])
    sub = await reader.subscribe(topic.cid)
    first = await author.publish(topic.cid, b"1")
    author = await network.restart(author)
    second = await author.publish(topic.cid, b"2")
    assert second.parent == first.cid
    # `other` never subscribed: it learns the heads before it links.
    third = await other.publish(topic.cid, b"3")
    assert third.parent == second.cid
    events = await collect(sub, 3)
    assert [e.cid for e in events] == [first.cid, second.cid, third.cid]
    assert sum(1 for e in events if e.parent is None) == 1


async def test_only_the_author_publishes_on_a_meta_topic(network: Network) -> None:
    author, mallory = await network.start(2)
    topic = await author.create_topic("meta-guard")
    assert topic.meta is not None
    meta = await mallory.get_topic(topic.meta)
    assert meta.allowed_publishers.enabled and not meta.allowed_publishers.peers
    with pytest.raises(PublishError):
        await mallory.publish(topic.meta, topic.cid.raw)


async def test_a_topic_is_replayed_from_its_cid_with_every_publisher_and_subscriber_offline(
    network: Network,
) -> None:
    nodes = await network.start(6)
    author, subscriber = nodes[0], nodes[1]
    topic = await author.create_topic("offline history")
    sub = await subscriber.subscribe(topic.cid)
    published = [await author.publish(topic.cid, b"event %d" % i) for i in range(30)]
    await collect(sub, 30)
    await eventually(lambda: author.metrics["records_written"] > 0, timeout=10)
    await author.stop()
    await subscriber.stop()
    fresh = await Node.start(network.config(len(network.nodes),
                                            tuple(n.address for n in nodes[2:4])))
    network.nodes.append(fresh)
    # The one-shot replay, and a range of it.
    replayed = [e.cid async for e in fresh.replay(topic.cid)]
    assert replayed == [e.cid for e in published]
    middle = [e.cid async for e in fresh.replay(topic.cid, since=published[9].cid,
                                                until=published[19].cid)]
    assert middle == [e.cid for e in published[10:20]]
    # A subscription with replay gets the whole history too, nobody online to ask.
    sub = await fresh.subscribe(topic.cid, replay=True)
    events = await collect(sub, 30, timeout=30)
    assert [e.cid for e in events] == [e.cid for e in published]


async def test_a_custom_parent_that_does_not_exist_is_refused(network: Network) -> None:
    author, _ = await network.start(2)
    topic = await author.create_topic("custom", event_linking=EventLinking.CUSTOM)
    nowhere = CID.parse("bafyreidykglsfhoixmivffc5uwhcgshx4j465xwqntbmu43nb2dzqwfvae")
    with pytest.raises(PublishError, match="not found"):
        await author.publish(topic.cid, b"orphan", parent=nowhere)


async def test_an_event_nobody_stored_is_not_published(tmp_path: object) -> None:
    network = Network(tmp_path)  # type: ignore[arg-type]
    try:
        (alone,) = await network.start(1)
        with pytest.raises(PublishError, match="min_acks"):
            await alone.create_topic("nowhere to store it")
    finally:
        await network.close()


async def test_a_node_whose_seeds_are_not_up_yet_joins_them_later(network: Network) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    early = await Node.start(NodeConfig(data_dir=network.root / "early",
                                        bootstrap=(("127.0.0.1", port),), dht=FAST_DHT))
    network.nodes.append(early)
    assert not any(True for _ in early.dht.server.protocol.router.contacts())
    seed = await Node.start(NodeConfig(data_dir=network.root / "seed", port=port, dht=FAST_DHT))
    network.nodes.append(seed)
    await eventually(
        lambda: any(True for _ in early.dht.server.protocol.router.contacts()), timeout=15
    )


async def test_stop_releases_the_port_at_once(network: Network) -> None:
    (node,) = await network.start(1)
    port = node.address[1]
    await node.stop()
    again = await Node.start(NodeConfig(data_dir=network.root / "again", port=port))
    network.nodes[0] = again
    assert again.address[1] == port


async def test_a_publish_is_acknowledged_only_once_the_outbox_row_is_committed(
    network: Network,
) -> None:
    author, publisher, reader = await network.start(3)
    topic = await author.create_topic("outbox")
    sub = await reader.subscribe(topic.cid)
    event = await publisher.publish(topic.cid, b"relayed, never delivered here")
    # Read by another connection at once: committed before publish() returned.
    with contextlib.closing(sqlite3.connect(publisher.store.path)) as conn:
        rows = conn.execute("SELECT topic, event FROM outbox").fetchall()
    assert [(bytes(t), bytes(e)) for t, e in rows] == [(topic.cid.raw, event.cid.raw)]
    (got,) = await collect(sub, 1)
    assert got.cid == event.cid
    # The restarted publisher rejoins the tree it only published in, for its outbox.
    publisher = await network.restart(publisher)
    await eventually(lambda: publisher.core.tree(topic.cid) is not None, timeout=10)
    assert publisher.state.subscriptions() == []
    # A subscribed publisher delivers its event at once: nothing to keep.
    own = await reader.publish(topic.cid, b"delivered here")
    assert own.cid in {e.cid for e in await collect(sub, 1)}
    assert reader.state.outbox() == {}
