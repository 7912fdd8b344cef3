"""Every timer of the protocol cores, as one closed union.

Timers are values: a core emits ``SetTimer(delay, timer)`` and the driver later feeds back
``TimerFired(timer)``. Keeping them all here, each a frozen dataclass naming what it is
for, lets :data:`Timer` be a closed union that the cores match exhaustively (``mypy``
checks every case is handled) and lets the driver treat them as opaque, hashable values.
"""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID, PeerId

__all__ = [
    "DispatchTimer",
    "FragmentStall",
    "FragmentTick",
    "GapTimeout",
    "GraftTimer",
    "Greet",
    "HeadsTick",
    "JoinTimeout",
    "MembershipTick",
    "RecordTimer",
    "RequestTimeout",
    "RetryFetch",
    "RetryLost",
    "RetryParent",
    "RootCheck",
    "ShuffleTimer",
    "Timer",
    "WantTimeout",
]


# --------------------------------------------------------------------------- tree


@dataclass(frozen=True, slots=True)
class RetryParent:
    """Re-send our JOIN to a parent that went away (backoff between attempts)."""

    topic: CID
    peer: PeerId


@dataclass(frozen=True, slots=True)
class JoinTimeout:
    """A JOIN not answered by JOINED in time counts as a failed attempt."""

    topic: CID
    peer: PeerId


@dataclass(frozen=True, slots=True)
class RootCheck:
    """A node acting as root (author unreachable) looks again for a way in."""

    topic: CID


@dataclass(frozen=True, slots=True)
class RequestTimeout:
    """A request to publish whose event never came back fails."""

    topic: CID
    signature: bytes


@dataclass(frozen=True, slots=True)
class RecordTimer:
    """Write this node's heads record of ``topic`` to the DHT (debounced after publishes).
    ``due`` tells a timer that was overtaken by an earlier one from the current one."""

    topic: CID
    due: float


# --------------------------------------------------------------------------- backfill


@dataclass(frozen=True, slots=True)
class GapTimeout:
    topic: CID
    gap: int
    seq: int
    """Only the newest timer of a gap counts: its deadline moves when gaps merge."""


@dataclass(frozen=True, slots=True)
class WantTimeout:
    topic: CID
    gap: int
    peer: PeerId
    head: CID


@dataclass(frozen=True, slots=True)
class RetryFetch:
    topic: CID
    gap: int


@dataclass(frozen=True, slots=True)
class RetryLost:
    """A gap given up on: its missing event ``cid`` is asked for again (a partition may
    have healed, its DHT holders may be back)."""

    topic: CID
    cid: CID


@dataclass(frozen=True, slots=True)
class HeadsTick:
    """The node's one heads anti-entropy tick: it visits only topics whose heads changed
    lately, and is not armed at all while every topic is idle. ``seq`` names the armed
    one: a tick re-armed sooner (a topic woke up) makes the older one stale."""

    seq: int


# --------------------------------------------------------------------------- plumtree


@dataclass(frozen=True, slots=True)
class DispatchTimer:
    """Send the IHAVE entries queued for the lazy links of every topic: one batch per
    neighbour (the node has one such timer)."""


@dataclass(frozen=True, slots=True)
class GraftTimer:
    topic: CID
    event: CID


@dataclass(frozen=True, slots=True)
class ShuffleTimer:
    """The node's one shuffle tick: it visits topics that lack lazy links and are due
    (each backs off while shuffles bring nobody new); not armed while none lacks any."""


# --------------------------------------------------------------------------- membership


@dataclass(frozen=True, slots=True)
class MembershipTick:
    """The node's one membership tick (HyParView): repair while links are missing, the
    shuffle every interval otherwise. ``seq`` names the armed one."""

    seq: int


# --------------------------------------------------------------------------- large events


@dataclass(frozen=True, slots=True)
class FragmentTick:
    """The node's one pacing tick: release the next fragments queued for neighbours (the
    uplink's budget has refilled, or a staggered group's turn has come). Armed only while
    fragments wait."""


@dataclass(frozen=True, slots=True)
class FragmentStall:
    """Check a large event being received: if no fragment came for a while, ask the
    neighbours (FWANT), then the DHT, then give up. ``seq`` names the armed check."""

    topic: CID
    event: CID
    seq: int


# --------------------------------------------------------------------------- floodsub


@dataclass(frozen=True, slots=True)
class Greet:
    """Floodsub greets newly known peers with its subscriptions."""


BackfillTimer = GapTimeout | WantTimeout | RetryFetch | RetryLost | HeadsTick
PlumtreeTimer = DispatchTimer | GraftTimer | ShuffleTimer
TreeTimer = RetryParent | JoinTimeout | RootCheck | RequestTimeout | RecordTimer
FragmentTimer = FragmentTick | FragmentStall
Timer = TreeTimer | BackfillTimer | PlumtreeTimer | FragmentTimer | MembershipTick | Greet
