"""The Floodsub baseline core, driven without sockets: a hand-run network of four cores."""

from __future__ import annotations

from typing import Any

import pytest

from dag import EventDescriptor, Identity, PeerId, TopicDescriptor
from pulsar.proto import events as ev
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.flood.core import FloodCore, Greet, Subs
from pulsar.proto.tree.messages import Event


class AllPeers:
    def __init__(self, peers: list[PeerId]) -> None:
        self.peers = peers

    def closest_peers(self, key: bytes, count: int) -> list[PeerId]:
        return self.peers[:count]


class Net:
    """Cores that know each other; sends are delivered (through the real encoding) in
    order until the network is quiet."""

    def __init__(self, count: int) -> None:
        self.ids = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(count)]
        peers = [i.peer_id for i in self.ids]
        self.cores = {i.peer_id: FloodCore(i, AllPeers(peers)) for i in self.ids}
        self.delivered: dict[PeerId, list[EventDescriptor]] = {p: [] for p in peers}
        self.sent: list[tuple[PeerId, PeerId, Any]] = []
        self.outputs: list[Any] = []

    def run(self, origin: PeerId, out: list[Any]) -> None:
        queue = [(origin, o) for o in out]
        while queue:
            sender, output = queue.pop(0)
            self.outputs.append(output)
            if isinstance(output, ev.Deliver):
                self.delivered[sender].append(output.event)
            elif isinstance(output, ev.Send):
                message = decode_message(encode_message(output.message))
                self.sent.append((sender, output.peer, message))
                target = self.cores[output.peer]
                queue += [(output.peer, o)
                          for o in target.handle(ev.Received(sender, message), 0.0)]

    def subscribe_all(self, topic: TopicDescriptor) -> None:
        for peer, core in self.cores.items():
            self.run(peer, core.handle(ev.Subscribe(topic), 0.0))

    def publish(self, peer: PeerId, topic: TopicDescriptor, payload: bytes) -> EventDescriptor:
        out = self.cores[peer].handle(ev.Publish(topic.cid, payload, None, 1), 1.0)
        published = [o for o in out if isinstance(o, ev.Published)]
        self.run(peer, out)
        assert published, out
        return published[0].event


def _topic(author: Identity, **kw: Any) -> TopicDescriptor:
    meta = TopicDescriptor.create(author, "t/meta")
    return TopicDescriptor.create(author, "t", meta=meta.cid, **kw)


def test_subscribing_greets_known_peers_and_learns_members() -> None:
    net = Net(4)
    topic = _topic(net.ids[0])
    net.subscribe_all(topic)
    for peer, core in net.cores.items():
        view = core.tree(topic.cid)
        assert view is not None and view.subscribed
        assert view.children == frozenset(p for p in net.cores if p != peer)
    # A greeting timer keeps greeting peers that become known later.
    greets = [o for o in net.outputs if isinstance(o, ev.SetTimer)]
    assert all(isinstance(o.timer, Greet) for o in greets) and len(greets) == 4


def test_an_event_is_flooded_to_every_member_and_delivered_once() -> None:
    net = Net(4)
    topic = _topic(net.ids[0])
    net.subscribe_all(topic)
    net.sent.clear()
    event = net.publish(net.ids[1].peer_id, topic, b"hello")
    copies = [m for _, _, m in net.sent if isinstance(m, Event)]
    # The publisher sends 3 copies; each receiver forwards to the 2 members other than its
    # sender: 3 + 3 * 2 = 9 copies for 3 deliveries, so 6 duplicates.
    assert len(copies) == 9
    for peer, events in net.delivered.items():
        assert [e.cid for e in events] == [event.cid], peer
    assert sum(c.metrics["duplicates"] for c in net.cores.values()) == 6
    hops = sorted(m.hop for m in copies)
    assert hops == [1, 1, 1, 2, 2, 2, 2, 2, 2]


def test_last_seen_linking_chains_a_publishers_events() -> None:
    net = Net(3)
    topic = _topic(net.ids[0])
    net.subscribe_all(topic)
    first = net.publish(net.ids[0].peer_id, topic, b"1")
    second = net.publish(net.ids[0].peer_id, topic, b"2")
    assert first.parent is None and second.parent == first.cid
    assert net.cores[net.ids[0].peer_id].heads(topic.cid) == [second.cid]


def test_events_breaking_the_topic_rules_are_rejected_not_forwarded() -> None:
    net = Net(3)
    author, outsider = net.ids[0], net.ids[2]
    topic = _topic(author, allowed_publishers=[author.peer_id])
    net.subscribe_all(topic)
    out = net.cores[outsider.peer_id].handle(ev.Publish(topic.cid, b"x", None, 7), 0.0)
    assert [type(o) for o in out] == [ev.CommandFailed]
    # Forged by hand and sent anyway: the receiver rejects it and floods nothing.
    forged = EventDescriptor.create(outsider, topic.cid, b"x")
    receiver = net.cores[net.ids[1].peer_id]
    out = receiver.handle(ev.Received(outsider.peer_id, Event(topic.cid, forged.block, 1)), 0)
    assert [type(o) for o in out] == [ev.Rejected]
    assert receiver.metrics["rejected"] == 1


def test_unsubscribing_stops_the_flood_to_that_peer() -> None:
    net = Net(3)
    topic = _topic(net.ids[0])
    net.subscribe_all(topic)
    leaver = net.ids[2].peer_id
    net.run(leaver, net.cores[leaver].handle(ev.Unsubscribe(topic.cid), 0.0))
    net.sent.clear()
    net.publish(net.ids[0].peer_id, topic, b"after")
    assert all(dst != leaver for _, dst, m in net.sent if isinstance(m, Event))
    assert net.delivered[leaver] == []


def test_a_lost_peer_is_forgotten_and_greeted_again() -> None:
    net = Net(2)
    topic = _topic(net.ids[0])
    net.subscribe_all(topic)
    a, b = (i.peer_id for i in net.ids)
    net.cores[a].handle(ev.PeerDown(b), 0.0)
    view = net.cores[a].tree(topic.cid)
    assert view is not None and view.children == frozenset()
    out = net.cores[a].handle(ev.TimerFired(Greet()), 0.0)
    assert ev.Send(b, Subs((topic.cid,), True)) in out


@pytest.mark.parametrize("wire", [
    {"t": "subs", "topics": "x", "on": True},
    {"t": "subs", "topics": [], "on": 1},
    {"t": "subs", "topics": [b"\x01"], "on": True},
])
def test_malformed_subs_messages_are_refused(wire: dict[str, Any]) -> None:
    from dag import encode

    with pytest.raises(MessageError):
        decode_message(encode(wire))


def test_duplicate_topics_in_subs_are_refused() -> None:
    topic = _topic(Identity.generate())
    frame = encode_message(Subs((topic.cid, topic.cid), True))
    with pytest.raises(MessageError, match="duplicates"):
        decode_message(frame)
