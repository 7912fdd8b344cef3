"""The durability gap the verifier found: a publisher gone for good with every DHT replica
of its events, while subscribers still hold the events they delivered (pinned, in their
own stores). A fresh node's replay from the topic's CID alone fetches them from there:
a node answers FIND_VALUE with its own blocks as with its DHT records. Real nodes (UDP
DHT, TCP transport, SQLite) on loopback."""

from __future__ import annotations

import time

from dht import dht_key
from pulsar import Node

from .conftest import Network, collect, eventually


def drop_records(node: Node, keys: set[bytes]) -> None:
    """Delete the DHT records under ``keys`` from ``node`` (keeping the others, heads
    records and topic descriptors included)."""
    records = node.dht.records
    kept = [(key, value) for key, value in records if key not in keys]
    records.expire(time.time() + 1)
    records.offer_many(kept)


async def test_a_replay_finds_the_events_only_subscribers_still_hold(
    network: Network,
) -> None:
    nodes = await network.start(4)
    publisher, subscribers, bystander = nodes[0], nodes[1:3], nodes[3]
    topic = await publisher.create_topic("held by its subscribers")
    subs = [await n.subscribe(topic.cid) for n in subscribers]
    published = [await publisher.publish(topic.cid, b"event %d" % i) for i in range(6)]
    for sub in subs:
        assert [e.cid for e in await collect(sub, 6)] == [e.cid for e in published]
    await eventually(lambda: all(n.store.has(e.cid) for n in subscribers for e in published),
                     what="the subscribers store the events they delivered")
    # The publisher leaves for good and every DHT replica of the events with it (as when
    # the replicas written behind the write quorum missed the subscribers).
    await publisher.stop()
    events = {dht_key(e.cid) for e in published}
    for node in [*subscribers, bystander]:
        drop_records(node, events)
        assert not any(node.dht.records.get(key) for key in events)
        assert node.dht.stats.local_blocks_served == 0

    seeds = (bystander.address,)
    reader = await Node.start(network.config(len(network.nodes), seeds))
    network.nodes.append(reader)
    replayed = [e.cid async for e in reader.replay(topic.cid)]
    assert replayed == [e.cid for e in published]
    assert sum(n.dht.stats.local_blocks_served for n in subscribers) >= len(published)


async def test_a_subscribers_audit_puts_the_events_back_into_the_dht(
    network: Network,
) -> None:
    """The same loss, then an audit round of one subscriber: the events it holds, which no
    closest node held any more, are stored there again, so a replay finds them after
    every subscriber has left too."""
    nodes = await network.start(4)
    publisher, subscribers, bystander = nodes[0], nodes[1:3], nodes[3]
    topic = await publisher.create_topic("put back by a subscriber")
    subs = [await n.subscribe(topic.cid) for n in subscribers]
    published = [await publisher.publish(topic.cid, b"event %d" % i) for i in range(6)]
    for sub in subs:
        await collect(sub, 6)
    await eventually(lambda: all(n.store.has(e.cid) for n in subscribers for e in published),
                     what="the subscribers store the events they delivered")
    await publisher.stop()
    events = {dht_key(e.cid) for e in published}
    for node in [*subscribers, bystander]:
        drop_records(node, events)

    report = await subscribers[0].dht.maintain(time.time() + 3600 + 1)
    # (the topic's blocks are records here too: left to the republish)
    assert (report.audited, report.repaired) == (len(published), len(published))
    assert all(bystander.dht.records.get(key) for key in events)
    for node in subscribers:
        await node.stop()

    reader = await Node.start(network.config(len(network.nodes), (bystander.address,)))
    network.nodes.append(reader)
    assert [e.cid async for e in reader.replay(topic.cid)] == [e.cid for e in published]
