"""The broker's promises under restarts, a revocation and offline publishers, checked on a
simulated network of real protocol cores: no unauthorised delivery, no order violation,
one causal history (no second root), every live subscriber gets every authorised event."""

from __future__ import annotations

from dag import CID, EventDescriptor, PublishRule, TopicDescriptor
from pulsar.proto import events as ev
from pulsar.proto.core import CoreConfig
from pulsar.proto.tree.messages import Event
from pulsar.tools.sim import SimNetwork, SimNode


def _order_violations(node: SimNode, topic: CID) -> int:
    """Delivered events whose parent was delivered after them (or never, though it
    exists in the topic's history)."""
    position = {e.cid: i for i, e in enumerate(node.delivered.get(topic, []))}
    return sum(
        1
        for e in node.delivered.get(topic, [])
        if e.parent is not None and position.get(e.parent, len(position)) > position[e.cid]
    )


def test_revocation_restarts_and_offline_publishers_keep_every_promise() -> None:
    net = SimNetwork(30, bucket_size=2, seed=7, config=CoreConfig(join_timeout=1.0))
    author, bob, carol = net.node(0), net.node(1), net.node(2)
    subscribers = [net.node(i) for i in range(3, 30)]
    request = net.command(author, lambda r: ev.CreateTopic(
        r, "sound", allowed_publishers=(bob.peer_id, carol.peer_id)))
    net.settle(5)
    v1 = author.topics[request]
    for node in (bob, carol, *subscribers):
        net.subscribe(node, v1, since=0.0)
    net.settle(10)

    def publish(node: SimNode, payload: bytes) -> None:
        net.publish(node, v1.cid, payload)
        net.settle(1)

    for i in range(5):
        publish(author, b"a%d" % i)
        publish(bob, b"b%d" % i)
        publish(carol, b"c%d" % i)

    # Bob goes offline; the author revokes him while he is away.
    net.crash(bob)
    net.settle(2)
    update = net.command(author, lambda r: ev.UpdateTopic(
        r, v1.cid, ev.TopicChanges(allowed_publishers=PublishRule(True, (carol.peer_id,)))))
    net.settle(5)
    v2 = author.topics[update]
    assert v2.parent == v1.cid and v2.heads

    # Bob comes back knowing only v1, and tries to publish: he learns v2 first and fails.
    net.restart(bob)
    net.settle(5)
    refused = net.publish(bob, v1.cid, b"after revocation")
    net.settle(5)
    assert refused in bob.failed and refused not in bob.published
    # A Bob that does not run our core signs under v1 (back-dated) and pushes it anyway.
    forged = EventDescriptor.create(bob.identity, v1.cid, b"forged", now=1.0)
    for node in subscribers[:5]:
        net.input(node.peer_id, ev.Received(bob.peer_id, Event(v1.cid, forged.block, 1)))
    net.settle(5)

    # The author restarts and goes on; Carol goes offline for good; the author publishes.
    net.crash(author)
    net.settle(2)
    net.restart(author)
    net.settle(10)
    net.crash(carol)
    for i in range(5):
        publish(author, b"after restart %d" % i)
    net.settle(30)

    live = [n for n in subscribers if n.alive]
    expected = {e.cid for e in author.delivered[v1.cid]}
    unauthorised = 0
    for node in live:
        events = node.delivered.get(v1.cid, [])
        assert {e.cid for e in events} == expected, "every live subscriber has every event"
        assert len(events) == len({e.cid for e in events}), "each event once"
        assert _order_violations(node, v1.cid) == 0
        assert sum(1 for e in events if e.parent is None) == 1, "one root: one history"
        unauthorised += sum(
            1 for e in events if e.publisher == bob.peer_id and e.cid not in _vouched(v2, node)
        )
        assert node.core.latest(v1.cid) == v2
    assert unauthorised == 0
    assert forged.cid not in expected
    assert len(expected) == 20  # 15 before the revocation, 5 after the author's restart


def _vouched(version: TopicDescriptor, node: SimNode) -> set[CID]:
    """The events ``version``'s recorded heads vouch for: those heads and their ancestors."""
    by_cid = {e.cid: e for events in node.delivered.values() for e in events}
    vouched: set[CID] = set()
    stack = list(version.heads)
    while stack:
        cid = stack.pop()
        if cid in vouched or cid not in by_cid:
            continue
        vouched.add(cid)
        parent = by_cid[cid].parent
        if parent is not None:
            stack.append(parent)
    return vouched


def _publish_then_crash(net: SimNetwork, node: SimNode, topic: CID, payload: bytes) -> CID:
    """Publish with every message ``node`` sends lost, and kill it the moment the publish
    is acknowledged: nobody has heard of the event, only the DHT quorum holds it."""
    net.drop = lambda sender, receiver, message: sender == node.peer_id
    request = net.publish(node, topic, payload)
    while request not in node.published:
        assert request not in node.failed
        net.run(until=net.now + 0.001)
    net.crash(node)
    net.drop = None
    return node.published[request].cid


def _acknowledged_event_survives_a_crash(publisher_is: str, keep: bool) -> bool:
    """``publisher_is``: ``relay`` (in the tree only to publish), ``subscriber``, or
    ``behind`` (a subscriber still fetching a missing event, so its own event, which links
    to what it saw last, waits undelivered behind that gap, as after a partition)."""
    net = SimNetwork(20, bucket_size=2, seed=11, config=CoreConfig(join_timeout=1.0))
    author, publisher = net.node(0), net.node(1)
    subscribers = [net.node(i) for i in range(2, 20)]
    request = net.command(author, lambda r: ev.CreateTopic(r, "outbox"))
    net.settle(5)
    topic = author.topics[request]
    for node in subscribers:
        net.subscribe(node, topic, since=0.0)
    if publisher_is == "relay":
        net.relay(publisher, topic)
    else:
        net.subscribe(publisher, topic, since=0.0)
    net.settle(10)
    net.publish(author, topic.cid, b"before")
    net.settle(5)
    if publisher_is == "behind":
        # It misses "gap" entirely, then hears "after gap" (whose parent it lacks) and
        # nothing that would repair the gap.
        net.drop = lambda sender, receiver, message: receiver == publisher.peer_id
        net.publish(author, topic.cid, b"gap")
        net.settle(0.5)
        net.drop = lambda sender, receiver, message: (
            receiver == publisher.peer_id and not isinstance(message, Event))
        net.publish(author, topic.cid, b"after gap")
        net.settle(0.2)
        assert publisher.core.backfill.held(topic.cid) == 1
    lost = _publish_then_crash(net, publisher, topic.cid, b"acknowledged, then killed")
    if not keep:  # what a node without the outbox would remember
        publisher.outbox.clear()
    net.settle(2)
    net.restart(publisher)
    net.settle(30)
    return all(lost in {e.cid for e in n.delivered.get(topic.cid, [])} for n in subscribers)


def test_an_acknowledged_event_reaches_everyone_after_its_publisher_is_killed() -> None:
    # A relay publisher never delivers its own event, and one still behind a gap has not
    # yet: only the outbox names the event after the crash. Without it (the controls) the
    # event is lost to every subscriber.
    for publisher_is in ("relay", "behind"):
        assert _acknowledged_event_survives_a_crash(publisher_is, keep=True), publisher_is
        assert not _acknowledged_event_survives_a_crash(publisher_is, keep=False), publisher_is
    # A subscriber that delivered its event at once: its durable log and heads name it.
    assert _acknowledged_event_survives_a_crash("subscriber", keep=True)
