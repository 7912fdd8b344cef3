"""Every timer of the protocol cores, as one closed union, and the publishing timers.

Timers are values: a core emits ``SetTimer(delay, timer)`` and the driver later feeds back
``TimerFired(timer)``. Each protocol defines its own in its ``timers`` module, each a
frozen dataclass naming what it is for; gathering them here lets :data:`Timer` be a
closed union that the cores match exhaustively (``mypy`` checks every case is handled)
and lets the driver treat them as opaque, hashable values.
"""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID

from .flood.timers import Greet
from .fragments.timers import FragmentStall, FragmentTick, FragmentTimer
from .gossip.timers import DispatchTimer, GraftTimer, PlumtreeTimer, ShuffleTimer
from .membership.timers import MembershipTick
from .repair.timers import (
    BackfillTimer,
    GapTimeout,
    HeadsTick,
    ReconcileTimeout,
    RetryFetch,
    RetryLost,
    WantTimeout,
)
from .tree.timers import JoinTimeout, RetryParent, RootCheck

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
    "ReconcileTimeout",
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


# --------------------------------------------------------------------------- publishing


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


TreeTimer = RetryParent | JoinTimeout | RootCheck | RequestTimeout | RecordTimer
Timer = TreeTimer | BackfillTimer | PlumtreeTimer | FragmentTimer | MembershipTick | Greet
