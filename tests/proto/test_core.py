"""The protocol core, driven without sockets: exact inputs, asserted outputs, and small
simulated networks running the real state machines."""

from __future__ import annotations

from typing import Any

import pytest

from dag import CID, EventDescriptor, Identity, PeerId, TopicDescriptor, decode, encode
from dag.codec import encode_reference_free
from pulsar.proto import events as ev
from pulsar.proto.core import CoreConfig, PulsarCore
from pulsar.proto.gossip.plumtree import ShuffleTimer
from pulsar.proto.repair.backfill import HeadsTick
from pulsar.proto.repair.messages import Heads, Joined
from pulsar.proto.timers import JoinTimeout, RecordTimer, RetryParent
from pulsar.proto.tree.messages import Event, Join, Leave, Ping, RequestToPublish
from pulsar.tools.sim import SimNetwork, SimNode
from tests.helpers.records import record_written


class StaticRouting:
    def __init__(self, peers: list[PeerId]) -> None:
        self.peers = peers

    def closest_peers(self, key: bytes, count: int) -> list[PeerId]:
        target = int.from_bytes(key, "big")
        return sorted(self.peers, key=lambda p: int.from_bytes(p.kademlia_id(), "big") ^ target)


def _tree_outputs(out: list[Any]) -> list[Any]:
    """The outputs of the tree logic, without the repair layers' periodic timers, the
    look-ups a subscription starts (heads records, the meta topic's descriptor) and the
    round-trip probes (tested on their own below)."""
    periodic = (ShuffleTimer, HeadsTick)
    return [
        o
        for o in out
        if not (isinstance(o, ev.SetTimer) and isinstance(o.timer, periodic))
        and not isinstance(o, ev.FetchRecords | ev.Fetch)
        and not (isinstance(o, ev.Send) and isinstance(o.message, Ping))
    ]


def _step(core: PulsarCore, event: Any, now: float) -> list[Any]:
    """One input to ``core``; the tree logic's outputs (see :func:`_tree_outputs`)."""
    return _tree_outputs(core.handle(event, now))


def _leave_and_join(topic: TopicDescriptor, old: PeerId, new: PeerId) -> list[Any]:
    """Routing around ``old``: it is told we left (it may only be slow), then ``new``."""
    return [ev.Send(old, Leave(topic.cid)), *_join(topic, new)]


def _join(topic: TopicDescriptor, peer: PeerId) -> list[Any]:
    """What a JOIN to ``peer`` looks like: the message and its answer deadline."""
    return [
        ev.Send(peer, Join(topic.cid, topic.block)),
        ev.SetTimer(2.0, JoinTimeout(topic.cid, peer)),
    ]


def _ident(i: int) -> Identity:
    return Identity.from_seed(bytes([i]) * 32)


def _topic(author: Identity, **kw: Any) -> TopicDescriptor:
    meta = TopicDescriptor.create(author, "t/meta")
    return TopicDescriptor.create(author, "t", meta=meta.cid, **kw)


def _distance(a: PeerId, b: PeerId) -> int:
    return int.from_bytes(a.kademlia_id(), "big") ^ int.from_bytes(b.kademlia_id(), "big")


# --------------------------------------------------------------------------- exact outputs


def test_join_goes_to_the_closest_strictly_closer_peer() -> None:
    author = _ident(1)
    others = [_ident(i) for i in range(2, 12)]
    topic = _topic(author)
    ranked = sorted(others, key=lambda i: _distance(i.peer_id, author.peer_id))
    far = ranked[-1]
    routing = StaticRouting([i.peer_id for i in ranked[:-1]])  # not the author itself
    core = PulsarCore(far, routing)
    out = _step(core, ev.Subscribe(topic), 0.0)
    assert out == _join(topic, ranked[0].peer_id)
    view = core.tree(topic.cid)
    assert view is not None and view.parents == {ranked[0].peer_id} and not view.is_root


def test_node_knowing_nobody_closer_asks_the_author_then_acts_as_root() -> None:
    author = _ident(1)
    topic = _topic(author)
    others = [_ident(i) for i in range(2, 12)]
    closest = min(others, key=lambda i: _distance(i.peer_id, author.peer_id))
    farther = [i.peer_id for i in others if i is not closest]
    core = PulsarCore(closest, StaticRouting(farther))
    # Nobody known is closer to the author: the JOIN goes to the author itself (the runtime
    # locates it), not straight to acting as root.
    assert _step(core, ev.Subscribe(topic), 0.0) == _join(topic, author.peer_id)
    # The author cannot be reached: act as root, and check again later.
    out = _step(core, ev.SendFailed(author.peer_id), 0.5)
    assert len(out) == 1 and isinstance(out[0], ev.SetTimer)
    check = out[0].timer
    assert core.tree(topic.cid).is_root  # type: ignore[union-attr]
    # While the author is avoided, a root check keeps us root without asking it again ...
    assert _step(core, ev.TimerFired(check), 5.5) == [ev.SetTimer(5.0, check)]
    assert core.tree(topic.cid).is_root  # type: ignore[union-attr]
    # ... after ``avoid_for``, the next one asks it again: an author that came back takes
    # the half of the tree that ran without it.
    out = _step(core, ev.TimerFired(check), 0.5 + CoreConfig().avoid_for + 0.1)
    assert out == _join(topic, author.peer_id)
    _step(core, ev.Received(author.peer_id, Joined(topic.cid, ())), 31.0)
    view = core.tree(topic.cid)
    assert view is not None and view.parents == {author.peer_id} and view.attached
    assert not view.is_root


def test_join_received_by_a_member_stops_there() -> None:
    author = _ident(1)
    topic = _topic(author)
    core = PulsarCore(author, StaticRouting([]))
    core.handle(ev.Subscribe(topic), 0.0)
    child = _ident(2).peer_id
    # Answered with our heads (none yet): the child knows its JOIN got through.
    out = _step(core, ev.Received(child, Join(topic.cid, topic.block)), 0.0)
    assert out == [ev.Send(child, Joined(topic.cid, ()))]
    assert core.tree(topic.cid).children == {child}  # type: ignore[union-attr]


def test_joined_names_members_so_a_new_child_has_lazy_links_without_a_shuffle() -> None:
    author = _ident(1)
    topic = _topic(author)
    core = PulsarCore(author, StaticRouting([]))
    core.handle(ev.Subscribe(topic), 0.0)
    first, second = _ident(2).peer_id, _ident(3).peer_id
    core.handle(ev.Received(first, Join(topic.cid, topic.block)), 0.0)
    out = _step(core, ev.Received(second, Join(topic.cid, topic.block)), 0.1)
    assert out == [ev.Send(second, Joined(topic.cid, (), (first,)))]
    # The child takes the sample as lazy links at once.
    child = PulsarCore(_ident(3), StaticRouting([author.peer_id]))
    child.handle(ev.Subscribe(topic), 0.2)
    child.handle(ev.Received(author.peer_id, Joined(topic.cid, (), (first,))), 0.3)
    assert child.lazy.lazy(topic.cid) == {first}


def test_publish_stores_in_the_dht_before_forwarding() -> None:
    author = _ident(1)
    topic = _topic(author)
    core = PulsarCore(author, StaticRouting([]))
    core.handle(ev.Subscribe(topic), 0.0)
    child = _ident(2).peer_id
    core.handle(ev.Received(child, Join(topic.cid, topic.block)), 0.0)
    out = _step(core, ev.Publish(topic.cid, b"hi", None, 7), 1.0)
    assert len(out) == 1 and isinstance(out[0], ev.StoreDht)
    stored = out[0]
    out = core.handle(ev.DhtStored(stored.cid, 3), 1.1)
    kinds = [type(o) for o in out]
    # Stored: delivered here and sent down the tree, but not acknowledged yet.
    assert kinds[:2] == [ev.Deliver, ev.Send] and ev.Published not in kinds
    # The heads record (at once: a publish waits for it), the node's heads tick (the
    # topic's heads changed) and its shuffle tick (events and no lazy links yet).
    timers = {type(o.timer) for o in out[2:] if isinstance(o, ev.SetTimer)}
    assert timers == {RecordTimer, HeadsTick, ShuffleTimer} and len(out) == 6
    # Kept (durably, before the publish is acknowledged) until delivered here.
    assert ev.KeepPublished(topic.cid, stored.cid) in out
    assert ev.SetTimer(0.0, RecordTimer(topic.cid, 1.1)) in out
    send = out[1]
    assert send.peer == child and send.message == Event(topic.cid, stored.block, 1)
    # The record names the event; stored at the quorum, the publish is acknowledged.
    out = core.handle(ev.TimerFired(RecordTimer(topic.cid, 1.1)), 1.1)
    (write,) = [o for o in out if isinstance(o, ev.StoreRecord)]
    assert stored.cid in write.record.heads
    out = core.handle(ev.RecordStored(topic.cid, write.record.seq, 3), 1.2)
    assert [o for o in out if isinstance(o, ev.Published)] == [
        ev.Published(7, EventDescriptor.from_block(stored.block))]


def test_a_publisher_forwards_its_chain_in_order_whatever_order_the_stores_finish() -> None:
    author = _ident(1)
    topic = _topic(author)
    core = PulsarCore(author, StaticRouting([]))
    core.handle(ev.Subscribe(topic), 0.0)
    child = _ident(2).peer_id
    core.handle(ev.Received(child, Join(topic.cid, topic.block)), 0.0)
    stores = [core.handle(ev.Publish(topic.cid, b"%d" % i, None, i), 1.0 + i)[0] for i in range(4)]
    chain = [decode(s.block)["parent"] for s in stores[1:]]
    assert chain == [s.cid for s in stores[:-1]]  # LAST_SEEN: each links the one before

    def sent(out: list[Any]) -> list[CID]:
        return [EventDescriptor.from_block(o.message.block).cid
                for o in out if isinstance(o, ev.Send)]

    # The last two stores finish first: held back until the first one is through.
    assert sent(core.handle(ev.DhtStored(stores[3].cid, 3), 5.0)) == []
    assert sent(core.handle(ev.DhtStored(stores[1].cid, 3), 5.1)) == []
    assert sent(core.handle(ev.DhtStored(stores[0].cid, 3), 5.2)) == [stores[0].cid, stores[1].cid]
    # The third completes the chain, releasing the fourth behind it.
    out = _step(core, ev.DhtStored(stores[2].cid, 1), 5.3)
    assert sent(out) == [stores[2].cid, stores[3].cid]
    # Acknowledged once the heads record naming them is stored, in one write.
    assert core._trees[topic.cid].record_due == 5.2  # armed by the first two, at once
    out = record_written(core, [ev.SetTimer(0.0, RecordTimer(topic.cid, 5.2))], 5.4)
    assert [o.request for o in out if isinstance(o, ev.Published)] == [0, 1, 2, 3]


def test_forged_event_is_rejected_and_not_forwarded() -> None:
    author, mallory, relay_id = _ident(1), _ident(3), _ident(4)
    topic = _topic(author, allowed_publishers=[])
    relay = PulsarCore(relay_id, StaticRouting([author.peer_id]))
    relay.handle(ev.Subscribe(topic), 0.0)
    forged = EventDescriptor.create(mallory, topic.cid, b"spam")
    out = relay.handle(ev.Received(mallory.peer_id, Event(topic.cid, forged.block, 1)), 0.0)
    assert [type(o) for o in out] == [ev.Rejected]
    genuine = EventDescriptor.create(author, topic.cid, b"real")
    value = decode(genuine.block)
    value["payload"] = b"tampered"
    tampered = encode_reference_free(value)
    out = relay.handle(ev.Received(author.peer_id, Event(topic.cid, tampered, 1)), 0.0)
    assert [type(o) for o in out] == [ev.Rejected] and "signature" in out[0].reason


def test_lost_parent_is_retried_then_routed_around() -> None:
    author = _ident(1)
    topic = _topic(author)
    others = sorted(
        (_ident(i) for i in range(2, 12)), key=lambda i: _distance(i.peer_id, author.peer_id)
    )
    me = others[-1]
    routing = StaticRouting([i.peer_id for i in others[:-1]])
    core = PulsarCore(me, routing, CoreConfig(parent_retries=2))
    core.handle(ev.Subscribe(topic), 0.0)
    first = others[0].peer_id
    core.handle(ev.Received(first, Joined(topic.cid, ())), 0.5)  # the edge was confirmed
    out = _step(core, ev.PeerDown(first), 1.0)
    assert out == [ev.SetTimer(0.25, RetryParent(topic.cid, first))]
    assert _step(core, ev.TimerFired(RetryParent(topic.cid, first)), 1.3) == _join(topic, first)
    # Connection lost again before an answer: retried once more, with backoff ...
    assert _step(core, ev.PeerDown(first), 1.4) == [ev.SetTimer(0.5, RetryParent(topic.cid, first))]
    # ... and once the retries are used up, routing goes around it.
    out = _step(core, ev.PeerDown(first), 2.0)
    assert out == _join(topic, others[1].peer_id)
    # A re-sent JOIN that cannot even be dialled gives up at once (the transport retried).
    second = others[1].peer_id
    core.handle(ev.Received(second, Joined(topic.cid, ())), 2.1)
    core.handle(ev.PeerDown(second), 2.2)
    assert _step(core, ev.TimerFired(RetryParent(topic.cid, second)), 2.5) == _join(topic, second)
    assert _step(core, ev.SendFailed(second), 2.6) == _join(topic, others[2].peer_id)


def test_a_parent_never_reached_is_routed_around_at_once() -> None:
    """SendFailed comes after the transport's own dials: a parent that never answered our
    JOIN and cannot be dialled (an offline author) is not retried with backoff."""
    author = _ident(1)
    topic = _topic(author)
    others = sorted(
        (_ident(i) for i in range(2, 12)), key=lambda i: _distance(i.peer_id, author.peer_id)
    )
    core = PulsarCore(others[-1], StaticRouting([i.peer_id for i in others[:-1]]))
    core.handle(ev.Subscribe(topic), 0.0)
    out = _step(core, ev.SendFailed(others[0].peer_id), 0.1)
    assert out == _join(topic, others[1].peer_id)


def test_a_parent_too_slow_to_answer_the_join_is_left_and_routed_around() -> None:
    """It is connected but its JOINED did not come in time: after the retries it is told
    with LEAVE (it may have taken us as a child after all) and routing goes around it."""
    author = _ident(1)
    topic = _topic(author)
    others = sorted(
        (_ident(i) for i in range(2, 12)), key=lambda i: _distance(i.peer_id, author.peer_id)
    )
    core = PulsarCore(others[-1], StaticRouting([i.peer_id for i in others[:-1]]),
                      CoreConfig(parent_retries=1))
    core.handle(ev.Subscribe(topic), 0.0)
    slow = others[0].peer_id
    timeout = ev.TimerFired(JoinTimeout(topic.cid, slow))
    assert _step(core, timeout, 2.0) == [ev.SetTimer(0.25, RetryParent(topic.cid, slow))]
    assert _step(core, ev.TimerFired(RetryParent(topic.cid, slow)), 2.3) == _join(topic, slow)
    assert _step(core, timeout, 4.3) == _leave_and_join(topic, slow, others[1].peer_id)


def test_leave_from_parent_makes_the_child_rejoin() -> None:
    """The leaving parent is alive: routing may choose it again, now as a pure relay."""
    author = _ident(1)
    topic = _topic(author)
    others = sorted(
        (_ident(i) for i in range(2, 12)), key=lambda i: _distance(i.peer_id, author.peer_id)
    )
    core = PulsarCore(others[-1], StaticRouting([i.peer_id for i in others[:-1]]))
    core.handle(ev.Subscribe(topic), 0.0)
    out = _step(core, ev.Received(others[0].peer_id, Leave(topic.cid)), 1.0)
    assert out == _join(topic, others[0].peer_id)


def test_malformed_join_block_is_rejected() -> None:
    core = PulsarCore(_ident(1), StaticRouting([]))
    bogus = CID.parse("bafyreidykglsfhoixmivffc5uwhcgshx4j465xwqntbmu43nb2dzqwfvae")
    out = core.handle(ev.Received(_ident(2).peer_id, Join(bogus, encode({"a": 1}))), 0.0)
    assert [type(o) for o in out] == [ev.Rejected]


# --------------------------------------------------------------------------- simulations


def _network(n: int, bucket_size: int | None = 2, **kw: Any) -> tuple[SimNetwork, SimNode]:
    net = SimNetwork(n, bucket_size=bucket_size, **kw)
    return net, net.node(0)


def _subscribe_all(net: SimNetwork, topic: TopicDescriptor, nodes: list[SimNode]) -> None:
    for node in nodes:
        net.input(node.peer_id, ev.Subscribe(topic))
    net.settle()


def _payloads(node: SimNode, topic: CID) -> list[bytes]:
    return [e.payload for e in node.delivered.get(topic, [])]  # type: ignore[misc]


def _tree_is_acyclic_and_symmetric(net: SimNetwork, topic: CID) -> None:
    for node in net.nodes.values():
        view = node.core.tree(topic)
        if view is None:
            continue
        for parent in view.parents:
            parent_view = net.nodes[parent].core.tree(topic)
            assert parent_view is not None and node.peer_id in parent_view.children


@pytest.mark.parametrize("bucket_size", [None, 1])
def test_every_subscriber_gets_every_event_once_in_order(bucket_size: int | None) -> None:
    net, author = _network(40, bucket_size=bucket_size)
    topic = _topic(author.identity)
    subscribers = list(net.nodes.values())[1:31]
    _subscribe_all(net, topic, [author, *subscribers])
    for i in range(60):
        net.publish(author, topic.cid, b"e%d" % i)
    net.settle()
    expected = [b"e%d" % i for i in range(60)]
    for node in subscribers:
        assert _payloads(node, topic.cid) == expected
    _tree_is_acyclic_and_symmetric(net, topic.cid)
    relays_only = [n for n in net.nodes.values() if n not in subscribers and n is not author]
    assert all(not n.delivered for n in relays_only)


def test_whitelisted_and_refused_publishers() -> None:
    net, author = _network(12, bucket_size=None)
    nodes = list(net.nodes.values())
    allowed, refused = nodes[1], nodes[2]
    topic = _topic(author.identity, allowed_publishers=[allowed.peer_id])
    _subscribe_all(net, topic, nodes)
    ok = net.publish(allowed, topic.cid, b"allowed")
    bad = net.publish(refused, topic.cid, b"refused")
    net.settle()
    assert ok in allowed.published and bad in refused.failed
    for node in nodes:
        assert _payloads(node, topic.cid) == [b"allowed"]


def test_request_to_publish_reaches_an_allowed_node() -> None:
    net, author = _network(20, bucket_size=1)
    nodes = list(net.nodes.values())
    topic = _topic(author.identity, allowed_publishers=[], request_to_publish=True)
    _subscribe_all(net, topic, nodes)
    requester = next(n for n in nodes[1:] if not n.core.tree(topic.cid).is_root)  # type: ignore[union-attr]
    request = net.publish(requester, topic.cid, b"please", content_type="text/plain")
    net.settle()
    event = requester.published[request]
    assert event.author == requester.peer_id and event.publisher == author.peer_id
    # The requester's media type travels in the request and is signed by it.
    assert event.content_type == "text/plain"
    for node in nodes:
        assert _payloads(node, topic.cid) == [b"please"]


def test_custom_linking_uses_the_given_parent() -> None:
    net, author = _network(8, bucket_size=None)
    nodes = list(net.nodes.values())
    topic = _topic(author.identity, event_linking="CUSTOM")
    _subscribe_all(net, topic, nodes)
    first = net.publish(author, topic.cid, b"root")
    net.settle()
    root = author.published[first]
    second = net.publish(nodes[3], topic.cid, b"child", parent=root.cid)
    third = net.publish(nodes[4], topic.cid, b"orphan")
    net.settle()
    assert nodes[3].published[second].parent == root.cid
    assert nodes[4].published[third].parent is None
    assert sorted(_payloads(nodes[5], topic.cid)) == [b"child", b"orphan", b"root"]


def test_last_seen_refuses_an_explicit_parent() -> None:
    net, author = _network(3, bucket_size=None)
    topic = _topic(author.identity)
    _subscribe_all(net, topic, [author])
    request = net.publish(author, topic.cid, b"x", parent=topic.cid)
    net.settle()
    assert "LAST_SEEN" in author.failed[request]


def test_unsubscribe_children_rejoin_and_keep_receiving() -> None:
    net, author = _network(30, bucket_size=1)
    nodes = list(net.nodes.values())
    topic = _topic(author.identity)
    _subscribe_all(net, topic, nodes)
    interior = max(nodes[1:], key=lambda n: len(n.core.tree(topic.cid).children))  # type: ignore[union-attr]
    assert interior.core.tree(topic.cid).children  # type: ignore[union-attr]
    net.input(interior.peer_id, ev.Unsubscribe(topic.cid))
    net.settle()
    # It may still relay for others (Scribe-style), but no longer delivers.
    assert not interior.core.is_subscribed(topic.cid)
    net.publish(author, topic.cid, b"after")
    net.settle()
    for node in nodes:
        if node is not interior:
            assert _payloads(node, topic.cid) == [b"after"], node.core.tree(topic.cid)
    assert _payloads(interior, topic.cid) == []


def test_crashed_interior_node_subtree_recovers() -> None:
    net, author = _network(30, bucket_size=1)
    nodes = list(net.nodes.values())
    topic = _topic(author.identity)
    _subscribe_all(net, topic, nodes)
    interior = max(nodes[1:], key=lambda n: len(n.core.tree(topic.cid).children))  # type: ignore[union-attr]
    net.crash(interior)
    net.settle()
    net.publish(author, topic.cid, b"after crash")
    net.settle()
    for node in nodes:
        if node is not interior:
            assert _payloads(node, topic.cid) == [b"after crash"]


def test_author_crash_other_publishers_and_new_subscribers() -> None:
    net, author = _network(25, bucket_size=1)
    nodes = list(net.nodes.values())
    publisher = nodes[1]
    topic = _topic(author.identity, allowed_publishers=[publisher.peer_id])
    early, late = nodes[:20], nodes[20:]
    _subscribe_all(net, topic, early)
    net.crash(author)
    net.settle()
    _subscribe_all(net, topic, late)
    net.publish(publisher, topic.cid, b"without the author")
    net.settle()
    for node in nodes[1:]:
        assert _payloads(node, topic.cid) == [b"without the author"], node.peer_id


def test_request_to_publish_by_a_non_listed_requester_is_refused() -> None:
    net, author = _network(6, bucket_size=None)
    nodes = list(net.nodes.values())
    allowed_requester = nodes[1]
    topic = _topic(
        author.identity, allowed_publishers=[], request_to_publish=[allowed_requester.peer_id]
    )
    _subscribe_all(net, topic, nodes)
    request = net.publish(nodes[2], topic.cid, b"nope")
    net.settle()
    assert "not allowed" in nodes[2].failed[request]
    # A forged request carrying an unlisted author is stopped by the receiving node.
    created, sig = EventDescriptor.sign_content(nodes[2].identity, topic.cid, b"x")
    rtp = RequestToPublish(topic.cid, topic.cid, nodes[2].peer_id, b"x", created, sig)
    out = author.core.handle(ev.Received(nodes[2].peer_id, rtp), net.now)
    assert [type(o) for o in out] == [ev.Rejected]


def test_unanswered_join_counts_as_a_failed_attempt() -> None:
    author = _ident(1)
    topic = _topic(author)
    others = sorted(
        (_ident(i) for i in range(2, 12)), key=lambda i: _distance(i.peer_id, author.peer_id)
    )
    core = PulsarCore(others[-1], StaticRouting([i.peer_id for i in others[:-1]]))
    core.handle(ev.Subscribe(topic), 0.0)
    parent = others[0].peer_id
    out = core.handle(ev.TimerFired(JoinTimeout(topic.cid, parent)), 2.0)
    assert out == [ev.SetTimer(0.25, RetryParent(topic.cid, parent))]
    # HEADS (sent to lazy links too) does not prove the parent took us as a child ...
    core.handle(ev.TimerFired(RetryParent(topic.cid, parent)), 2.3)
    core.handle(ev.Received(parent, Heads(topic.cid, ())), 2.4)
    out = core.handle(ev.TimerFired(JoinTimeout(topic.cid, parent)), 4.3)
    assert out == [ev.SetTimer(0.5, RetryParent(topic.cid, parent))]  # backing off
    # ... its answer to the JOIN does: the next deadline passes quietly.
    core.handle(ev.TimerFired(RetryParent(topic.cid, parent)), 4.6)
    core.handle(ev.Received(parent, Joined(topic.cid, ())), 4.7)
    assert core.handle(ev.TimerFired(JoinTimeout(topic.cid, parent)), 6.6) == []


def test_counters_keep_the_core_and_the_ordering_layer_apart() -> None:
    """The core and the ordering layer both count duplicates and rejections; the merged
    counters keep both (the layer's under the plain name, the core's renamed)."""
    net, author = _network(3, bucket_size=None)
    topic = _topic(author.identity)
    nodes = list(net.nodes.values())
    _subscribe_all(net, topic, nodes)
    core = author.core
    assert isinstance(core, PulsarCore)
    core.flow.metrics["duplicates"] = 7
    core.metrics["rejected"] = 5
    core.backfill._gaps.counts["duplicates"] = 2
    counted = core.counters()
    assert counted["tree_duplicates"] == 7 and counted["inputs_rejected"] == 5
    assert counted["duplicates"] == 2 and "delivered" in counted


def test_unsubscribing_leaves_the_meta_topic_joined_for_it() -> None:
    """A subscriber follows the topic's meta topic for that topic alone: unsubscribing
    leaves both trees. The author stays in its meta tree (its root)."""
    net, author = _network(6, bucket_size=None)
    meta = TopicDescriptor.create(author.identity, "t/meta")
    topic = TopicDescriptor.create(author.identity, "t", meta=meta.cid)
    nodes = list(net.nodes.values())
    for node in nodes:
        node.store[meta.cid] = meta.block  # as a node that read it from the DHT holds it
    _subscribe_all(net, topic, nodes)
    reader = nodes[3]
    assert reader.core.tree(meta.cid) is not None
    net.input(reader.peer_id, ev.Unsubscribe(topic.cid))
    net.settle()
    assert reader.core.tree(topic.cid) is None
    assert reader.core.tree(meta.cid) is None
    net.input(author.peer_id, ev.Unsubscribe(topic.cid))
    net.settle()
    assert author.core.tree(meta.cid) is not None
