"""Floodsub's one timer.

Their union with every other core timer is :data:`pulsar.proto.timers.Timer`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Greet"]


@dataclass(frozen=True, slots=True)
class Greet:
    """Floodsub greets newly known peers with its subscriptions."""
