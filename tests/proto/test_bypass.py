"""Relays step aside: a node in a tree only to relay a JOIN names its own parent in its
JOINED, and the child joins there, so events stop taking a detour through it."""

from __future__ import annotations

import random

from dag import Identity, PeerId
from pulsar.proto import events as ev
from pulsar.proto.core import PulsarCore
from pulsar.proto.repair.messages import Joined
from pulsar.proto.timers import JoinTimeout
from pulsar.proto.tree.messages import Join, Leave
from pulsar.tools.sim import SimNetwork

from .test_core import StaticRouting, _ident, _topic


def _by_distance(author: PeerId, candidates: list[Identity]) -> list[Identity]:
    target = int.from_bytes(author.kademlia_id(), "big")
    return sorted(candidates,
                  key=lambda i: int.from_bytes(i.peer_id.kademlia_id(), "big") ^ target)


AUTHOR = _ident(1)
TOPIC = _topic(AUTHOR)
# Nearest the author first: a relay R closer than the child C, a far node F.
RELAY, CHILD, FAR = _by_distance(AUTHOR.peer_id, [_ident(i) for i in range(2, 12)])[0:10:4]


def _sends(out: ev.Out) -> list[tuple[PeerId, object]]:
    return [(o.peer, o.message) for o in out if isinstance(o, ev.Send)]


def _attached_relay() -> PulsarCore:
    relay = PulsarCore(RELAY, StaticRouting([AUTHOR.peer_id]))
    relay.handle(ev.Received(CHILD.peer_id, Join(TOPIC.cid, TOPIC.block)), 0.0)
    relay.handle(ev.Received(AUTHOR.peer_id, Joined(TOPIC.cid, ())), 0.1)
    return relay


def test_a_relay_names_its_parent_to_a_child_that_joins_after_it_is_attached() -> None:
    relay = _attached_relay()
    out = _sends(relay.handle(ev.Received(FAR.peer_id, Join(TOPIC.cid, TOPIC.block)), 0.2))
    [(peer, joined)] = [(p, m) for p, m in out if isinstance(m, Joined)]
    assert peer == FAR.peer_id and isinstance(joined, Joined)
    assert joined.up == AUTHOR.peer_id


def test_a_relay_sends_earlier_children_up_once_it_is_attached() -> None:
    relay = PulsarCore(RELAY, StaticRouting([AUTHOR.peer_id]))
    out = _sends(relay.handle(ev.Received(CHILD.peer_id, Join(TOPIC.cid, TOPIC.block)), 0.0))
    assert all(m.up is None for _, m in out if isinstance(m, Joined))  # not attached yet
    out = _sends(relay.handle(ev.Received(AUTHOR.peer_id, Joined(TOPIC.cid, ())), 0.1))
    assert [(p, m.up) for p, m in out if isinstance(m, Joined)] == [
        (CHILD.peer_id, AUTHOR.peer_id)
    ]


def test_a_subscriber_or_the_author_never_sends_children_elsewhere() -> None:
    member = PulsarCore(RELAY, StaticRouting([AUTHOR.peer_id]))
    member.handle(ev.Subscribe(TOPIC), 0.0)
    member.handle(ev.Received(AUTHOR.peer_id, Joined(TOPIC.cid, ())), 0.1)
    out = _sends(member.handle(ev.Received(CHILD.peer_id, Join(TOPIC.cid, TOPIC.block)), 0.2))
    assert all(m.up is None for _, m in out if isinstance(m, Joined))


def test_the_child_joins_the_relays_parent_and_leaves_the_relay() -> None:
    child = PulsarCore(CHILD, StaticRouting([RELAY.peer_id]))
    out = child.handle(ev.Subscribe(TOPIC), 0.0)
    assert (RELAY.peer_id, Join(TOPIC.cid, TOPIC.block)) in _sends(out)
    out = child.handle(ev.Received(RELAY.peer_id, Joined(TOPIC.cid, (), (), AUTHOR.peer_id)), 0.1)
    assert _sends(out)[:2] == [
        (RELAY.peer_id, Leave(TOPIC.cid)), (AUTHOR.peer_id, Join(TOPIC.cid, TOPIC.block))
    ]
    assert any(isinstance(o, ev.SetTimer) and o.timer == JoinTimeout(TOPIC.cid, AUTHOR.peer_id)
               for o in out)
    view = child.tree(TOPIC.cid)
    assert view is not None and view.parents == {AUTHOR.peer_id} and not view.attached
    assert child.counters()["relays_bypassed"] == 1


def test_a_parent_named_that_is_not_closer_to_the_author_is_ignored() -> None:
    """The progress rule keeps trees acyclic: a relay (or a liar) cannot send a child to
    a node farther from the author than the child itself."""
    child = PulsarCore(CHILD, StaticRouting([RELAY.peer_id]))
    child.handle(ev.Subscribe(TOPIC), 0.0)
    out = child.handle(ev.Received(RELAY.peer_id, Joined(TOPIC.cid, (), (), FAR.peer_id)), 0.1)
    assert not any(isinstance(m, Join | Leave) for _, m in _sends(out))
    view = child.tree(TOPIC.cid)
    assert view is not None and view.parents == {RELAY.peer_id} and view.attached


def test_sparse_routing_tables_leave_no_relay_in_any_tree() -> None:
    """Routing tables of 3 peers per bucket: most JOINs reach the author through nodes
    that do not subscribe. Those step aside; every event is delivered, with no copy to a
    non-subscriber, and the trees stay acyclic."""
    net = SimNetwork(100, seed=4, bucket_size=3, latency_range=(0.01, 0.1))
    author = net.node(0)
    requests = [net.command(author, lambda r, i=i: ev.CreateTopic(r, f"t{i}")) for i in range(4)]
    net.settle(5)
    topics = [author.topics[r] for r in requests]
    rng = random.Random(2)
    for i, topic in enumerate(topics):
        for j in rng.sample(range(1, 100), 4 + 8 * i):
            net.subscribe(net.node(j), topic, since=0.0)
    net.settle(20)
    net.stats.copies = net.stats.delivered_pairs = 0
    for k in range(20):
        for topic in topics:
            net.publish(author, topic.cid, b"%d" % k)
        net.settle(0.5)
    net.settle(30)
    assert net.stats.delivered_pairs == 20 * sum(4 + 8 * i for i in range(4))
    assert net.stats.copies == net.stats.delivered_pairs  # RMR 0: nobody got a copy twice
    relays = [n for n in net.nodes.values() for t in topics
              if (tree := n.core._trees.get(t.cid)) is not None and not tree.deliver
              and n is not author]
    assert relays == []
    assert sum(n.core.counters()["relays_bypassed"] for n in net.nodes.values()) > 50
