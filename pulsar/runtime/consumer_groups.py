"""Consumer groups across nodes, with no broker: the members of a group find each other,
watch each other's liveness and hear each other's acknowledgements through GROUP beats
(:mod:`pulsar.proto.groups.messages`); who handles an event is the view's
(:mod:`pulsar.proto.groups.view`). What a member does with that — hand an event out,
leave it to another member, take it over when that member goes — is the durable
consumers' (:mod:`pulsar.runtime.consumers`), which this module calls back.

**Beats.** Every ``beat_interval`` each local member sends a beat *directly* to every
member it knows; what it settles goes in a beat of its own :data:`ACK_LINGER` later (at
once past :data:`ACK_FLUSH` of them). Members find each other by
*announces*: the same beat with no acknowledgements, flooded over the topic's tree and lazy
links (every node that follows the topic relays it, at most ``hops`` times, once per beat),
sent on joining, for the first three beats, and every :data:`ANNOUNCE_EVERY` th after —
also by a member alone in its group, so a flood costs the topic's links once per five
seconds per member, whatever happens. A
member that hears a member new to it answers it directly at once, so a joiner knows the
group within a round trip, well inside its :data:`~pulsar.proto.groups.view.JOIN_LEAD`.

**Trust.** A beat is believed only if its member's node signed it; relays cannot alter
it (``hops`` aside). Every node relays a beat at most once; beats from one peer are
limited to :data:`MAX_BEATS_PER_PEER` a second, and only groups with a member on this
node are tracked (others' beats are relayed, not kept).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Protocol

from dag import CID, Identity, PeerId
from pulsar.proto.groups.messages import MAX_ACKED, GroupBeat
from pulsar.proto.groups.view import JOIN_LEAD, GroupView, MemberId, MemberState

__all__ = ["ACK_FLUSH", "ACK_LINGER", "ANNOUNCE_EVERY", "COUNTERS", "RECENT_ACKS",
           "ConsumerGroups", "GroupHost", "LocalMember"]

log = logging.getLogger("pulsar.node")

ACK_LINGER: Final = 0.05
"""Seconds an acknowledgement waits for others to share its beat. The beat goes then, not
at the next tick: a member that dies has its share taken over, and what it settled in the
last beat interval but had not told would be handled twice (the benchmark's kill saw 7
such events with a whole interval, at 33 events/s per member)."""
ACK_FLUSH: Final = 128
"""Acknowledgements waiting that send a beat at once."""
RECENT_ACKS: Final = 4096
"""Acknowledgements a member repeats to a member it has just heard of (in beats of 512):
a joiner, or a member back from a restart or a partition, learns what was settled while it
could not hear, so it neither hands those events out nor watches them for ever."""
ANNOUNCE_EVERY: Final = 5
"""Beats between two announces over the topic's links (after the first three)."""
ANNOUNCE_HOPS: Final = 6
"""Relays an announce may take."""
MAX_BEATS_PER_PEER: Final = 200
"""Beats one peer may hand us per second (relayed ones included); more are dropped."""
_RELAYED_MEMORY: Final = 8192
COUNTERS: Final = ("group_beats_sent", "group_beats_heard", "group_beats_rejected",
                   "group_beats_relayed", "group_members_gone", "group_taken_over",
                   "group_duplicates", "group_acks_sent")
"""The node's metrics this module and the consumers count for groups."""


class GroupHost(Protocol):
    """What the groups call back: the durable consumers."""

    def group_acked(self, topic: CID, name: str, member: MemberId,
                    events: tuple[CID, ...]) -> None: ...

    def group_changed(self, topic: CID, name: str) -> None: ...


@dataclass(slots=True, eq=False)
class LocalMember:
    """A consumer of this node that belongs to a group."""

    topic: CID
    name: str
    group: str
    view: GroupView
    ready_at: float
    """Monotonic time from which it hands out (the join lead: the others know it by then)."""
    beats: int = 0
    seq: int = 0
    acked: list[CID] = field(default_factory=list)
    """Settled since the last beat, not told yet."""
    recent: deque[CID] = field(default_factory=lambda: deque(maxlen=RECENT_ACKS))
    """The last settled, told again to a member new to it (it was not there to hear)."""
    lingering: bool = False
    epoch_seen: int = 0
    joined: float = 0.0
    announced_at: float | None = None
    """When an announce first went to at least one peer."""
    taken_over: int = 0
    duplicates: int = 0
    ready_told: bool = False

    @property
    def me(self) -> MemberId:
        return self.view.me.id


class ConsumerGroups:
    """The group members of one node, and their beats.

    ``send`` puts a beat on the wire to one peer; ``neighbours`` names a topic's tree and
    lazy links (where announces go); ``clock`` is wall time (``since`` is compared with
    events' creation times), ``monotonic`` the time liveness is judged by.
    """

    def __init__(self, identity: Identity, send: Callable[[PeerId, GroupBeat], None],
                 neighbours: Callable[[CID], Iterable[PeerId]], *,
                 counters: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 beat_interval: float = 1.0, dead_after: float = 3.0,
                 join_lead: float = JOIN_LEAD) -> None:
        self._identity = identity
        self._send = send
        self._neighbours = neighbours
        self.clock = clock
        self.monotonic = monotonic
        self.beat_interval = beat_interval
        self.dead_after = dead_after
        self.join_lead = join_lead
        self.host: GroupHost | None = None
        self.counters: dict[str, int] = {} if counters is None else counters
        for key in COUNTERS:
            self.counters.setdefault(key, 0)
        self.members: dict[tuple[CID, str], LocalMember] = {}
        self._relayed: OrderedDict[tuple[bytes, str, int, int], None] = OrderedDict()
        self._rate: dict[PeerId, tuple[float, int]] = {}
        self._last_inc = 0

    # ------------------------------------------------------------------ local members

    def join(self, topic: CID, name: str, group: str) -> LocalMember:
        """Make ``name`` (a consumer of ``topic`` here) a member of ``group``: a new
        incarnation, announced at once, handing out from ``join_lead`` seconds on."""
        old = self.members.pop((topic, name), None)
        if old is not None:
            self._say_leaving(old)
        inc = max(int(self.clock() * 1000), self._last_inc + 1)
        self._last_inc = inc
        since = inc / 1000 + self.join_lead
        me = MemberState(MemberId(self._identity.peer_id.raw, name, inc), since,
                         self.monotonic())
        local = LocalMember(topic, name, group, GroupView(me, self.dead_after),
                            self.monotonic() + self.join_lead, joined=self.monotonic())
        local.epoch_seen = local.view.epoch
        self.members[(topic, name)] = local
        self._beat(local, announce=True)
        return local

    def leave(self, topic: CID, name: str) -> None:
        """The consumer is gone (deleted): the others take its share over at once."""
        local = self.members.pop((topic, name), None)
        if local is not None:
            self._say_leaving(local)

    def stop(self) -> None:
        """The node stops: every member says it is leaving (best effort)."""
        for local in list(self.members.values()):
            self._say_leaving(local)
        self.members.clear()

    def member(self, topic: CID, name: str) -> LocalMember | None:
        return self.members.get((topic, name))

    def ready(self, local: LocalMember) -> bool:
        """Whether ``local`` may hand out: its join lead is over, and it has heard another
        member, or its announce reached a peer a lead ago (nobody answered: it is alone),
        or ten beats passed (the topic has no links yet: it is alone too). A member that
        hands out before the others can have heard it would take their share as well."""
        now = self.monotonic()
        if now < local.ready_at:
            return False
        if local.view.others or now >= local.joined + 10 * self.beat_interval:
            return True
        return local.announced_at is not None and now >= local.announced_at + self.join_lead

    def acked(self, topic: CID, name: str, events: Iterable[CID]) -> None:
        """``name`` settled ``events``: the others hear it with the next beat."""
        local = self.members.get((topic, name))
        if local is None:
            return
        events = list(events)
        local.acked.extend(events)
        local.recent.extend(events)
        if len(local.acked) >= ACK_FLUSH:
            self._beat(local, announce=False)
        elif local.acked and not local.lingering:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # driven without a loop (a test): the next tick sends
                return
            local.lingering = True
            loop.call_later(ACK_LINGER, self._flush, local)

    def _flush(self, local: LocalMember) -> None:
        local.lingering = False
        if local.acked and self.members.get((local.topic, local.name)) is local:
            self._beat(local, announce=False)

    # ------------------------------------------------------------------ the network

    def on_beat(self, peer: PeerId, beat: GroupBeat) -> None:
        """A beat from ``peer`` (its member, or a relay)."""
        now = self.monotonic()
        if not self._admit(peer, now):
            self.counters["group_beats_rejected"] += 1
            return
        key = (beat.member.raw, beat.name, beat.inc, beat.seq)
        if key in self._relayed:
            return
        if not beat.verify():
            self.counters["group_beats_rejected"] += 1
            log.info("group beat from %s for member %s does not verify", peer, beat.member)
            return
        self._relayed[key] = None
        if len(self._relayed) > _RELAYED_MEMORY:
            self._relayed.popitem(last=False)
        self.counters["group_beats_heard"] += 1
        if beat.hops > 0:
            onward = beat.relayed()
            for neighbour in self._neighbours(beat.topic):
                if neighbour != peer and neighbour != beat.member:
                    self._send(neighbour, onward)
                    self.counters["group_beats_relayed"] += 1
        member = MemberId(beat.member.raw, beat.name, beat.inc)
        for local in list(self.members.values()):
            if local.topic != beat.topic or local.group != beat.group:
                continue
            known = (member.peer, member.name) in local.view.others
            ended = local.view.heard(member, beat.since / 1000, beat.seq, beat.leaving, now)
            self.counters["group_members_gone"] += len(ended)
            if not known and not beat.leaving and (member.peer, member.name) in \
                    local.view.others:
                self._beat(local, announce=False, only=beat.member)  # answer a newcomer
            if beat.acked and self.host is not None:
                self.host.group_acked(local.topic, local.name, member, beat.acked)
            self._changed(local)

    def tick(self) -> None:
        """One beat interval: expire the silent, beat to every member, announce now and
        then, and tell the consumers of views that changed or became ready."""
        now = self.monotonic()
        for local in list(self.members.values()):
            gone = local.view.expire(now)
            if gone:
                self.counters["group_members_gone"] += len(gone)
                log.info("group %s of topic %s: %s went silent", local.group, local.topic,
                         ", ".join(f"{PeerId(m.peer)}/{m.name}" for m in gone))
            announce = local.beats < 3 or local.beats % ANNOUNCE_EVERY == 0
            self._beat(local, announce=announce)
            if local.acked:
                self._beat(local, announce=False)
            self._changed(local)

    async def run(self, stopped: Callable[[], bool]) -> None:
        while not stopped():
            await asyncio.sleep(self.beat_interval)
            try:
                self.tick()
            except Exception as exc:  # a full disk under a callback: again next beat
                log.warning("group beat failed: %s", exc)

    # ------------------------------------------------------------------ plumbing

    def _changed(self, local: LocalMember) -> None:
        """Call the host back if the view moved, or the member just became ready (a first
        look at what it watched: entries whose owner is not in the view)."""
        first = not local.ready_told and self.ready(local)
        if (local.view.epoch != local.epoch_seen or first) and self.host is not None \
                and self.ready(local):
            local.epoch_seen = local.view.epoch
            local.ready_told = True
            self.host.group_changed(local.topic, local.name)

    def _say_leaving(self, local: LocalMember) -> None:
        while local.acked:  # what it settled first, or the others would take it over
            self._beat(local, announce=False)
        beat = self._make(local, leaving=True, acked=(), hops=ANNOUNCE_HOPS)
        for peer in self._targets(local):
            self._send(peer, beat)

    def _beat(self, local: LocalMember, *, announce: bool, only: PeerId | None = None
              ) -> None:
        """One beat of ``local``: acknowledgements (up to :data:`MAX_ACKED`) directly to
        the members it knows, or an announce over the topic's links as well."""
        if only is not None:  # a member new to us: who we are, and what we settled lately
            recent = list(local.recent)
            self._send(only, self._make(local, leaving=False, acked=(), hops=0))
            for i in range(0, len(recent), MAX_ACKED):
                self._send(only, self._make(local, leaving=False,
                                            acked=tuple(recent[i:i + MAX_ACKED]), hops=0))
            return
        acked = tuple(local.acked[:MAX_ACKED])
        del local.acked[:MAX_ACKED]
        local.beats += 1
        direct = [PeerId(s.id.peer) for s in local.view.others.values()]
        if acked or direct:
            beat = self._make(local, leaving=False, acked=acked, hops=0)
            for peer in set(direct):
                self._send(peer, beat)
            self.counters["group_acks_sent"] += len(acked) if direct else 0
        if announce:
            flooded = self._make(local, leaving=False, acked=(), hops=ANNOUNCE_HOPS)
            targets = self._targets(local)
            for peer in targets:
                self._send(peer, flooded)
            if targets and local.announced_at is None:
                local.announced_at = self.monotonic()

    def _targets(self, local: LocalMember) -> set[PeerId]:
        """Where an announce goes: the members it knows and the topic's links."""
        peers = {PeerId(s.id.peer) for s in local.view.others.values()}
        peers.update(self._neighbours(local.topic))
        peers.discard(self._identity.peer_id)
        return peers

    def _make(self, local: LocalMember, *, leaving: bool, acked: tuple[CID, ...],
              hops: int) -> GroupBeat:
        local.seq += 1
        self.counters["group_beats_sent"] += 1
        me = local.view.me
        return GroupBeat.signed(
            self._identity, topic=local.topic, group=local.group, name=local.name,
            inc=me.id.inc, seq=local.seq, since=int(me.since * 1000), leaving=leaving,
            acked=acked, hops=hops)

    def _admit(self, peer: PeerId, now: float) -> bool:
        start, count = self._rate.get(peer, (now, 0))
        if now - start >= 1.0:
            start, count = now, 0
        if count >= MAX_BEATS_PER_PEER:
            return False
        if len(self._rate) > 4096:
            self._rate.clear()
        self._rate[peer] = (start, count + 1)
        return True
