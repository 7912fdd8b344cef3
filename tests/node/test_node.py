"""The embedded node end to end: real UDP, TCP and SQLite on loopback."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dag import EventDescriptor, EventLinking, PeerId
from pulsar import Node, PublishError

from .conftest import Network, collect, eventually


async def test_forty_nodes_every_subscriber_gets_every_event_once_in_order(
    network: Network,
) -> None:
    nodes = await network.start(40)
    author = nodes[0]
    topic = await author.create_topic("forty")
    subs = await asyncio.gather(*(n.subscribe(topic.cid) for n in nodes[10:]))
    published = []
    for i in range(300):
        published.append(await author.publish(topic.cid, b"event %d" % i))
    expected = [e.cid for e in published]
    received = await asyncio.gather(*(collect(s, 300) for s in subs))
    for events in received:
        assert [e.cid for e in events] == expected
    for sub in subs:
        assert sub.pending() == 0  # nothing delivered twice
    # The chain is LAST_SEEN: each event links the previous one.
    assert [e.parent for e in published[1:]] == expected[:-1]
    # Every tree edge is known to both ends.
    for node in nodes:
        view = node.tree(topic.cid)
        if view is None:
            continue
        for parent in view.parents:
            parent_node = next(n for n in nodes if n.peer_id == parent)
            assert node.peer_id in parent_node.tree(topic.cid).children  # type: ignore[union-attr]


async def test_publishing_rules(network: Network) -> None:
    author, allowed, refused, requester, reader = await network.start(5)
    topic = await author.create_topic(
        "rules", allowed_publishers=[allowed.peer_id], request_to_publish=[requester.peer_id]
    )
    sub = await reader.subscribe(topic.cid)
    ok = await allowed.publish(topic.cid, b"from the whitelist")
    assert ok.publisher == allowed.peer_id
    with pytest.raises(PublishError, match="not allowed"):
        await refused.publish(topic.cid, b"refused")
    via = await requester.publish(topic.cid, b"please publish this")
    assert via.author == requester.peer_id and via.publisher != requester.peer_id
    assert topic.may_publish(via.publisher)
    events = await collect(sub, 2)
    assert {e.payload for e in events} == {b"from the whitelist", b"please publish this"}


async def test_custom_linking_and_large_payloads(network: Network) -> None:
    a, b, c = await network.start(3)
    topic = await a.create_topic("custom", event_linking=EventLinking.CUSTOM)
    sub = await c.subscribe(topic.cid)
    first = await a.publish(topic.cid, b"root")
    big = bytes(range(256)) * 100  # 25.6 KB: a chunk tree
    second = await b.publish(topic.cid, big, parent=first.cid)
    assert second.parent == first.cid and not second.is_inline
    events = await collect(sub, 2)
    assert [e.cid for e in events] == [first.cid, second.cid]
    assert await c.payload_of(events[1]) == big


async def test_topic_update_through_the_meta_topic(network: Network) -> None:
    author, other, reader = await network.start(3)
    topic = await author.create_topic("versions", allowed_publishers=[])
    await reader.subscribe(topic.cid)
    with pytest.raises(PublishError):
        await other.publish(topic.cid, b"not yet")
    v2 = await author.update_topic(topic.cid, allowed_publishers=[other.peer_id])
    assert v2.parent == topic.cid and v2.meta == topic.meta
    await eventually(lambda: reader.core.latest(topic.cid) == v2, timeout=10)
    await eventually(lambda: other.core.latest(topic.cid) == v2, timeout=10)
    event = await other.publish(topic.cid, b"now allowed")
    assert event.topic == v2.cid
    with pytest.raises(PublishError, match="author"):
        await other.update_topic(topic.cid, name="hijack")


async def test_unsubscribe_and_a_crashed_interior_node(network: Network) -> None:
    nodes = await network.start(12)
    author = nodes[0]
    topic = await author.create_topic("churn")
    subs = {n.peer_id: await n.subscribe(topic.cid) for n in nodes[1:]}
    interior = max(nodes[1:], key=lambda n: len(n.tree(topic.cid).children))  # type: ignore[union-attr]
    await author.publish(topic.cid, b"before")
    for sub in subs.values():
        assert [e.payload for e in await collect(sub, 1)] == [b"before"]
    leaver = next(n for n in nodes[1:] if n is not interior)
    await leaver.unsubscribe(topic.cid)
    await interior.stop()  # a crash as far as its neighbours can tell
    live = [n for n in nodes[1:] if n is not interior and n is not leaver]
    await eventually(
        lambda: all(
            (v := n.tree(topic.cid)) is not None and interior.peer_id not in v.parents for n in live
        ),
        timeout=15,
    )
    await author.publish(topic.cid, b"after")
    for node in live:
        assert [e.payload for e in await collect(subs[node.peer_id], 1)] == [b"after"]
    assert subs[leaver.peer_id].closed


async def test_author_offline_other_publishers_and_new_subscribers(network: Network) -> None:
    nodes = await network.start(10)
    author, publisher = nodes[0], nodes[1]
    topic = await author.create_topic("orphan", allowed_publishers=[publisher.peer_id])
    early = {n.peer_id: await n.subscribe(topic.cid) for n in nodes[2:7]}
    await author.stop()
    late = {n.peer_id: await n.subscribe(topic.cid) for n in nodes[7:]}
    await eventually(
        lambda: all(
            author.peer_id not in n.tree(topic.cid).parents  # type: ignore[union-attr]
            for n in nodes[1:]
            if n.tree(topic.cid) is not None
        ),
        timeout=15,
    )
    await publisher.publish(topic.cid, b"no author needed")
    for sub in [*early.values(), *late.values()]:
        assert [e.payload for e in await collect(sub, 1)] == [b"no author needed"]


async def test_bad_frames_and_forged_events_are_rejected(
    network: Network, caplog: pytest.LogCaptureFixture
) -> None:
    author, relay, reader = await network.start(3)
    topic = await author.create_topic("safety", allowed_publishers=[])
    sub = await reader.subscribe(topic.cid)
    caplog.set_level(logging.WARNING)
    # A malformed frame from an authenticated peer.
    await relay.transport.send(reader.peer_id, reader.address, b"\xff\x00garbage")
    # An event by a non-allowed publisher, sent straight to the reader.
    from pulsar.proto.codec import encode_message
    from pulsar.proto.tree.messages import Event

    forged = EventDescriptor.create(relay.identity, topic.cid, b"forged")
    await relay.transport.send(
        reader.peer_id, reader.address, encode_message(Event(topic.cid, forged.block, 1))
    )
    await eventually(lambda: reader.metrics["rejected_frames"] >= 2, timeout=10)
    # One summary line per peer per interval (the forged event is in the next one).
    assert any("1 malformed" in r.message for r in caplog.records)
    genuine = await author.publish(topic.cid, b"genuine")
    assert (await collect(sub, 1))[0].cid == genuine.cid
    assert isinstance(reader.peer_id, PeerId) and isinstance(reader, Node)


async def test_restarted_subscriber_catches_up_once_and_history_replays(
    network: Network,
) -> None:
    nodes = await network.start(6)
    author, reader = nodes[0], nodes[4]
    topic = await author.create_topic("durable")
    sub = await reader.subscribe(topic.cid)
    first = [await author.publish(topic.cid, b"a%d" % i) for i in range(20)]
    assert [e.cid for e in await collect(sub, 20)] == [e.cid for e in first]
    await reader.stop()
    missed = [await author.publish(topic.cid, b"b%d" % i) for i in range(20)]
    reader = await network.restart(reader)
    sub = await reader.subscribe(topic.cid)
    after = [await author.publish(topic.cid, b"c%d" % i) for i in range(20)]
    got = await collect(sub, 40, timeout=30)
    assert [e.cid for e in got] == [e.cid for e in missed + after]
    assert sub.pending() == 0
    replay = [e.cid async for e in reader.history(topic.cid)]
    assert replay == [e.cid for e in first + missed + after]
    middle = [e.cid async for e in reader.history(topic.cid, since=first[-1].cid, limit=5)]
    assert middle == [e.cid for e in missed[:5]]
    assert reader.metrics["backfilled"] >= 1


async def test_late_subscriber_replays_everything_with_the_publisher_offline(
    network: Network,
) -> None:
    nodes = await network.start(6)
    author, relay, late = nodes[0], nodes[1], nodes[5]
    topic = await author.create_topic("archive")
    await relay.subscribe(topic.cid)
    published = [await author.publish(topic.cid, b"old %d" % i) for i in range(30)]
    relay_sub = relay._driver.subscriptions[topic.cid][0]
    await collect(relay_sub, 30)
    await author.stop()
    sub = await late.subscribe(topic.cid, replay=True)
    got = await collect(sub, 30, timeout=30)
    assert [e.cid for e in got] == [e.cid for e in published]


async def test_loss_and_crashes_on_loopback_every_live_subscriber_gets_everything(
    network: Network,
) -> None:
    """30 real nodes, 10 % of data frames dropped by every transport, 30 % of the nodes
    stopped a third of the way through: every live subscriber ends with every event,
    once, in publish (causal) order."""
    network.drop_rate = 0.10
    nodes = await network.start(30)
    author = nodes[0]
    topic = await author.create_topic("lossy")
    subs = {n.peer_id: await n.subscribe(topic.cid) for n in nodes[1:]}
    doomed = nodes[3::3][:9]
    published = []
    for i in range(90):
        published.append(await author.publish(topic.cid, b"event %d" % i))
        if i == 30:
            await asyncio.gather(*(n.stop() for n in doomed))
    expected = [e.cid for e in published]
    live = [n for n in nodes[1:] if n not in doomed]
    received = await asyncio.gather(*(collect(subs[n.peer_id], 90, timeout=90) for n in live))
    for events in received:
        assert [e.cid for e in events] == expected
    drops = sum(n.config.faults.stats.dropped_random for n in nodes if n.config.faults)
    assert drops > 0
    repairs = sum(n.metrics["backfilled"] + n.metrics["grafts"] for n in live)
    assert repairs > 0
