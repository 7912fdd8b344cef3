"""One member's view of its consumer group, and who handles which event: pure logic,
no I/O (the runtime feeds it beats and the time, and asks it for owners).

**Who handles an event.** Rendezvous (highest-random-weight) hashing of the event's CID
over the live members: each member scores ``sha256(member key ‖ CID)`` and the highest
score handles it. Every member that holds the same view computes the same owner with no
message exchanged, and a view change moves only the events whose owner came or went
(1/k of them when a k-th member joins; exactly the gone member's when one leaves).

**Eligibility.** A member incarnation announces ``since``: events created before it are
not its to handle. A joining member sets it :data:`JOIN_LEAD` seconds ahead of its first
beat, so the others know it before any event it may own is published, and events from
before it joined stay with the members that were there (no duplicates on a join). Since
``created`` is in the signed event and ``since`` in the signed beat, every member judges
eligibility from the same numbers, whatever its clock. When no live member is eligible
(every member restarted since the event was created), every live member is.

**Liveness.** A member not heard from for ``dead_after`` seconds is out of the view until
it is heard again (a partition heals); one that said it is leaving, or whose incarnation a
newer one of the same ``(node, name)`` replaced, is out for good. Each change bumps
``epoch``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

from dag import CID

__all__ = ["JOIN_LEAD", "GroupView", "MemberId", "MemberState"]

JOIN_LEAD: Final = 2.0
"""Seconds between a member's first beat and the first event creation time it handles."""
MAX_MEMBERS: Final = 256
"""Most members one view keeps (others are not admitted until one goes)."""
MAX_GONE: Final = 4096
"""Ended incarnations remembered per view (the oldest forgotten first): enough to ignore
the late beats of every member a view held over a long churn, bounded against a peer that
mints member names."""


@dataclass(frozen=True, slots=True, order=True)
class MemberId:
    """A member incarnation: the node, the consumer's name there, and when it started."""

    peer: bytes
    name: str
    inc: int

    @property
    def key(self) -> bytes:
        return self.peer + b"/" + self.name.encode() + b"/" + self.inc.to_bytes(8, "big")

    def score(self, cid: CID) -> bytes:
        return hashlib.sha256(self.key + cid.raw).digest()


@dataclass(slots=True)
class MemberState:
    id: MemberId
    since: float
    """Events created before this (seconds since the epoch) are not this member's."""
    heard: float
    """When a beat of it last arrived (the runtime's monotonic clock)."""
    seq: int = 0


@dataclass(slots=True)
class GroupView:
    """What one local member knows of its group. ``me`` is always live."""

    me: MemberState
    dead_after: float
    others: dict[tuple[bytes, str], MemberState] = field(default_factory=dict)
    """By ``(node, name)``: the newest incarnation heard of each other member."""
    epoch: int = 1
    gone: dict[tuple[bytes, str], int] = field(default_factory=dict)
    """Incarnations known to be over (left, or replaced by a newer one): a late beat of one
    of them does not bring it back. One that only went silent comes back when heard."""

    def live(self) -> list[MemberState]:
        return [self.me, *self.others.values()]

    def heard(self, member: MemberId, since: float, seq: int, leaving: bool, now: float
              ) -> list[MemberId]:
        """A beat of ``member`` at ``now``; returns the incarnations that ended (a leaving
        one, or an older one it replaced). The view changed when that is non-empty or the
        member is new (then ``epoch`` moved)."""
        if member.peer == self.me.id.peer and member.name == self.me.id.name:
            return []  # our own beat, relayed back to us
        slot = (member.peer, member.name)
        if self.gone.get(slot, -1) >= member.inc:
            return []
        current = self.others.get(slot)
        ended: list[MemberId] = []
        if current is not None and current.id.inc > member.inc:
            return []  # an older incarnation's late beat
        if current is not None and current.id.inc < member.inc:
            ended.append(current.id)
            self._gone(slot, current.id.inc)
            current = None
        if leaving:
            if current is not None:
                ended.append(current.id)
                del self.others[slot]
            self._gone(slot, member.inc)
            if ended:
                self.epoch += 1
            return ended
        if current is None:
            if len(self.others) >= MAX_MEMBERS - 1:
                return ended
            self.others[slot] = MemberState(member, since, now, seq)
            self.epoch += 1
            return ended
        current.heard = max(current.heard, now)
        current.seq = max(current.seq, seq)
        if ended:
            self.epoch += 1
        return ended

    def expire(self, now: float) -> list[MemberId]:
        """The members not heard from for ``dead_after`` seconds, removed."""
        dead = [s for s in self.others.values() if now - s.heard > self.dead_after]
        for state in dead:
            # Not remembered as ended: silence may be a partition, and a member heard
            # again after it heals is back in the view (its events were taken over
            # meanwhile: what both sides handled is counted as duplicates).
            del self.others[(state.id.peer, state.id.name)]
        if dead:
            self.epoch += 1
        return [s.id for s in dead]

    def _gone(self, slot: tuple[bytes, str], inc: int) -> None:
        self.gone.pop(slot, None)
        self.gone[slot] = inc
        while len(self.gone) > MAX_GONE:
            del self.gone[next(iter(self.gone))]

    def owner(self, cid: CID, created: float) -> MemberId:
        """The live member that handles the event ``cid`` created at ``created``."""
        live = self.live()
        eligible = [m for m in live if m.since <= created] or live
        return max(eligible, key=lambda m: m.id.score(cid)).id

    def mine(self, cid: CID, created: float) -> bool:
        return self.owner(cid, created) == self.me.id
