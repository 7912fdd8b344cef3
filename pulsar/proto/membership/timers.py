"""The membership overlay's one timer.

Their union with every other core timer is :data:`pulsar.proto.timers.Timer`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MembershipTick"]


@dataclass(frozen=True, slots=True)
class MembershipTick:
    """The node's one membership tick (HyParView): repair while links are missing, the
    shuffle every interval otherwise. ``seq`` names the armed one."""

    seq: int
