"""The tree's timers: a parent to retry, a JOIN unanswered, the root's check.

Their union with every other core timer is :data:`pulsar.proto.timers.Timer`."""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID, PeerId

__all__ = ["JoinTimeout", "RetryParent", "RootCheck"]


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
