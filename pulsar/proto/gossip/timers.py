"""Plumtree's timers: the IHAVE dispatch, grafts, member shuffles.

Their union with every other core timer is :data:`pulsar.proto.timers.Timer`."""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID

__all__ = ["DispatchTimer", "GraftTimer", "PlumtreeTimer", "ShuffleTimer"]


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


PlumtreeTimer = DispatchTimer | GraftTimer | ShuffleTimer
