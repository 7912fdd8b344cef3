"""Consumer groups under crash, join and partition, simulated: the real beat code
(``ConsumerGroups``) of several nodes over an in-memory network with a fake clock, each
tick a beat interval. Views, and so who handles which event, are checked after each."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dag import CID, Identity, PeerId, cid_of, encode
from pulsar.proto.codec import decode_frame, encode_message
from pulsar.proto.groups.messages import GroupBeat
from pulsar.proto.groups.view import MemberId
from pulsar.runtime.consumer_groups import ConsumerGroups

TOPIC = cid_of(encode({"topic": "simulated"}))
EVENTS = [cid_of(encode({"job": i})) for i in range(400)]


@dataclass
class Host:
    changed: int = 0
    acked: list[tuple[MemberId, tuple[CID, ...]]] = field(default_factory=list)

    def group_acked(self, topic: CID, name: str, member: MemberId,
                    events: tuple[CID, ...]) -> None:
        self.acked.append((member, events))

    def group_changed(self, topic: CID, name: str) -> None:
        self.changed += 1


class Net:
    def __init__(self, count: int) -> None:
        self.now = 1_000.0
        self.ids = [Identity.generate() for _ in range(count)]
        self.by_peer = {i.peer_id: n for n, i in enumerate(self.ids)}
        self.queue: deque[tuple[int, int, bytes]] = deque()
        self.up = set(range(count))
        self.cut: set[frozenset[int]] = set()
        self.hosts = [Host() for _ in range(count)]
        self.nodes = [self._node(n) for n in range(count)]

    def _node(self, n: int) -> ConsumerGroups:
        def send(peer: PeerId, beat: GroupBeat) -> None:
            self.queue.append((n, self.by_peer[peer], encode_message(beat)))

        def links(topic: CID) -> list[PeerId]:  # a full mesh stands for the topic's links
            return [i.peer_id for m, i in enumerate(self.ids) if m != n]

        groups = ConsumerGroups(self.ids[n], send, links, clock=lambda: self.now,
                                monotonic=lambda: self.now)
        groups.host = self.hosts[n]
        return groups

    def deliver(self) -> None:
        while self.queue:
            src, dst, frame = self.queue.popleft()
            if dst in self.up and frozenset((src, dst)) not in self.cut:
                beat = decode_frame(frame)
                assert isinstance(beat, GroupBeat)
                self.nodes[dst].on_beat(self.ids[src].peer_id, beat)

    def run(self, seconds: float) -> None:
        for _ in range(int(seconds)):
            self.now += 1.0
            for n in sorted(self.up):
                self.nodes[n].tick()
            self.deliver()

    def join(self, n: int) -> None:
        self.nodes[n].join(TOPIC, f"w{n}", "g")
        self.deliver()

    def view(self, n: int) -> set[int]:
        member = self.nodes[n].member(TOPIC, f"w{n}")
        assert member is not None
        return {self.by_peer[PeerId(m.id.peer)] for m in member.view.live()}

    def handlers(self, members: set[int], created: float) -> dict[CID, set[int]]:
        """Which of ``members`` would hand each event out, by their own views."""
        out: dict[CID, set[int]] = {cid: set() for cid in EVENTS}
        for n in members:
            member = self.nodes[n].member(TOPIC, f"w{n}")
            assert member is not None
            for cid in EVENTS:
                if member.view.mine(cid, created):
                    out[cid].add(n)
        return out


def test_views_agree_and_every_event_has_one_handler_through_crash_join_and_partition(
) -> None:
    net = Net(5)
    for n in range(4):
        net.join(n)
    net.run(3)
    assert all(net.view(n) == {0, 1, 2, 3} for n in range(4))
    later = net.now + 10
    assert all(len(h) == 1 for h in net.handlers({0, 1, 2, 3}, later).values())

    # A crash: node 3 says nothing more; 3 s later the others drop it, and its events
    # go to them, one handler each.
    net.up.discard(3)
    net.run(4)
    assert all(net.view(n) == {0, 1, 2} for n in range(3))
    shared = net.handlers({0, 1, 2}, later)
    assert all(len(h) == 1 for h in shared.values())
    assert {n for h in shared.values() for n in h} == {0, 1, 2}

    # A join: events created before the joiner's since stay with the others; later ones
    # are split over four.
    joined_at = net.now
    net.join(4)
    net.run(3)
    assert all(net.view(n) == {0, 1, 2, 4} for n in (0, 1, 2, 4))
    before = net.handlers({0, 1, 2, 4}, joined_at)
    assert all(len(h) == 1 and 4 not in h for h in before.values())
    after = net.handlers({0, 1, 2, 4}, net.now + 10)
    assert all(len(h) == 1 for h in after.values())
    assert sum(1 for h in after.values() if 4 in h) > 50  # about a quarter of 400

    # A partition {0, 1} | {2, 4}: each side drops the other and handles everything itself
    # (the duplicates a partition costs); healed, announces bring the views back together.
    net.cut = {frozenset((a, b)) for a in (0, 1) for b in (2, 4)}
    net.run(4)
    assert net.view(0) == net.view(1) == {0, 1} and net.view(2) == net.view(4) == {2, 4}
    left, right = net.handlers({0, 1}, later), net.handlers({2, 4}, later)
    assert all(len(left[c]) == 1 and len(right[c]) == 1 for c in EVENTS)
    net.cut = set()
    net.run(6)  # the next announce (every fifth beat) crosses the healed links
    assert all(net.view(n) == {0, 1, 2, 4} for n in (0, 1, 2, 4))
    assert all(len(h) == 1 for h in net.handlers({0, 1, 2, 4}, later).values())
    assert all(host.changed > 0 for host in net.hosts[:3])


def test_acknowledgements_reach_the_other_members_and_a_forged_beat_is_dropped() -> None:
    net = Net(3)
    for n in range(3):
        net.join(n)
    net.run(3)
    net.nodes[0].acked(TOPIC, "w0", EVENTS[:5])
    net.run(1)
    for n in (1, 2):
        assert [events for _, events in net.hosts[n].acked] == [tuple(EVENTS[:5])]
    # A beat that claims to be node 0's, signed by node 2: not believed, not relayed.
    real = GroupBeat.signed(net.ids[0], topic=TOPIC, group="g", name="w0", inc=1, seq=99,
                            since=0, leaving=True, acked=(), hops=3)
    forged = GroupBeat(real.topic, real.group, real.member, real.name, real.inc, real.seq,
                       real.since, real.leaving, real.acked, real.hops,
                       net.ids[2].sign(real.signing_bytes()))
    net.nodes[1].on_beat(net.ids[2].peer_id, forged)
    assert net.nodes[1].counters["group_beats_rejected"] == 1 and not net.queue
    assert net.view(1) == {0, 1, 2}
