"""The repair layer's timers: gaps, WANTs, fetch retries and the heads tick.

Their union with every other core timer is :data:`pulsar.proto.timers.Timer`."""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID, PeerId

__all__ = ["BackfillTimer", "GapTimeout", "HeadsTick", "ReconcileTimeout", "RetryFetch",
           "RetryLost", "WantTimeout"]


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


@dataclass(frozen=True, slots=True)
class ReconcileTimeout:
    """A reconciliation of ``topic`` asked for with ``seq`` was not reported done in
    time: its gaps stop waiting for it."""

    topic: CID
    seq: int


BackfillTimer = GapTimeout | WantTimeout | RetryFetch | RetryLost | HeadsTick | ReconcileTimeout
