"""The fragment layer's timers: pacing ticks and stalls.

Their union with every other core timer is :data:`pulsar.proto.timers.Timer`."""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID

__all__ = ["FragmentStall", "FragmentTick", "FragmentTimer"]


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


FragmentTimer = FragmentTick | FragmentStall
