"""Issue #28: a topic replayed from its CID alone, with every publisher and subscriber
offline, after the author revoked a publisher, restarted and renamed the topic. Real nodes
(UDP DHT, TCP transport, SQLite) on loopback.

The heads records name the renamed version (the author's) and the first one (the revoked
publisher's). A replay subscriber used to backfill the heads at once, while it was still
fetching those versions: the author's newest event, naming the revoking version, was
then refused for good as "not a valid event" (so its ancestors were never fetched), and
a revoked publisher's event reached after the versions arrived was refused as not vouched
for, its child having been admitted before the version that vouches for it was known."""

from __future__ import annotations

from pulsar import Node

from .conftest import Network, collect


async def test_replay_from_the_cid_after_a_revocation_a_restart_and_a_rename(
    network: Network,
) -> None:
    nodes = await network.start(10)
    author, bob, subscribers = nodes[0], nodes[1], nodes[2:4]
    topic = await author.create_topic("issue 28", allowed_publishers=[bob.peer_id])
    subs = [await n.subscribe(topic.cid) for n in subscribers]
    from_bob = [await bob.publish(topic.cid, b"bob %d" % i) for i in range(2)]
    for sub in subs:
        await collect(sub, 2)
    revoked = await author.update_topic(topic.cid, allowed_publishers=[])
    before = await author.publish(topic.cid, b"author before the restart")
    for sub in subs:
        await collect(sub, 1)
    author = await network.restart(author)
    after = await author.publish(topic.cid, b"author after the restart")
    for sub in subs:
        await collect(sub, 1)
    renamed = await author.update_topic(topic.cid, name="issue 28, renamed")
    assert renamed.parent == revoked.cid and not renamed.may_publish(bob.peer_id)
    # Every publisher and subscriber stops cleanly.
    for node in [author, bob, *subscribers]:
        await node.stop()
    expected = [e.cid for e in [*from_bob, before, after]]

    async def fresh_node() -> Node:
        seeds = tuple(n.address for n in nodes[4:7])
        node = await Node.start(network.config(len(network.nodes), seeds))
        network.nodes.append(node)
        return node

    # A fresh node subscribes with replay: the whole history, from the CID alone.
    reader = await fresh_node()
    sub = await reader.subscribe(topic.cid, replay=True)
    events = await collect(sub, 4, timeout=8)
    assert [e.cid for e in events] == expected
    assert reader.core.latest(topic.cid) == renamed
    # The one-shot replay of another fresh node finds the same.
    other = await fresh_node()
    assert [e.cid async for e in other.replay(topic.cid)] == expected
