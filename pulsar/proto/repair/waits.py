"""How long the repair room waits, and what a WANT says it has: pure functions of the
configuration, the measured round-trip times and one topic's causal order. Gap fetching
(:mod:`.gaps`) asks them; they hold no state."""

from __future__ import annotations

from dag import CID, PeerId
from pulsar.proto.tree.rtt import RttTable

from .causal import Ordering
from .messages import MAX_HAVE
from .state import BackfillConfig

__all__ = ["have", "patience", "reorder_wait", "want_wait"]


def patience(config: BackfillConfig, rtt: RttTable, peer: PeerId | None) -> float:
    """How long a gap opened from ``peer`` holds delivery back: its repair's steps
    follow that path's RTO, so a gap timeout shorter than they take releases events
    whose parent is still on its way (in the testbed's order scenario every order
    violation was a parent that came 2-20 s after a 5 s timeout, from a busy author
    whose RTO had grown to over 2 s)."""
    rto = None if peer is None else rtt.worst_rto({peer})
    if rto is None:
        return config.gap_timeout
    return min(max(config.gap_timeout, config.gap_rtts * rto),
               max(config.gap_timeout, config.max_gap_timeout))


def reorder_wait(config: BackfillConfig, rtt: RttTable, peer: PeerId | None) -> float:
    """How long a gap opened by a tree arrival from ``peer`` waits before its first
    request: the RTO of that path (0 while nothing is measured), at most half the gap
    timeout. With no peer (a merged tip, which may come from any side of the tree),
    the longest RTO among the neighbours measured lately."""
    rto = rtt.worst_rto(frozenset() if peer is None else {peer})
    return 0.0 if rto is None else min(rto, config.gap_timeout / 2)


def want_wait(config: BackfillConfig, rtt: RttTable, peer: PeerId) -> float:
    """How long a WANT to ``peer`` goes unanswered before the DHT is asked instead."""
    wait = config.want_timeout
    rto = rtt.worst_rto({peer})
    if rto is not None:
        wait = min(max(wait, config.want_rtts * rto), config.max_want_timeout)
    return wait


def have(config: BackfillConfig, order: Ordering) -> tuple[CID, ...]:
    """Where a WANT's answer may stop: our newest heads, then our most recently
    delivered events (the parent of a missing event is most likely among them)."""
    count = config.have_count
    found: dict[CID, None] = dict.fromkeys(list(order.heads)[-count:] if count else ())
    limit = min(MAX_HAVE, len(found) + config.have_recent)
    for cid in reversed(order.settled):
        if len(found) >= limit:
            break
        found[cid] = None
    return tuple(found)
