"""The repair room's settings and small records: the configuration, a gap, a held event,
and the interfaces through which the room reads the node's own stores.

The parts of the room each own their state (see :mod:`pulsar.proto.repair.backfill`);
these are the values they pass to one another.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from dag import CID, EventDescriptor, PeerId
from dag.event_links import EventLinks, event_links
from pulsar.proto.events import OutEvent

from .messages import (
    MAX_ANSWER_BYTES,
    MAX_BLOCK,
    MAX_BLOCKS,
    MAX_HAVE,
    MAX_WANT_LIMIT,
)

__all__ = [
    "REPAIR_HOP",
    "RepairOut",
    "Repaired",
    "BackfillConfig",
    "Gap",
    "EventLinks",
    "Held",
    "IsDelivered",
    "Lookup",
    "Neighbours",
    "UNVOUCHED",
    "Unvouched",
    "Verdict",
    "Verify",
    "bounded_put",
    "event_links",
]

@dataclass(frozen=True, slots=True)
class Repaired:
    """An event that repair brought in (a BLOCKS answer, a DHT fetch), new to this node and
    not history: the tree's children may lack it too, so the core pushes the recent ones
    down (``Dissemination.push_repaired``) once the input is handled. It never leaves the
    core."""

    topic: CID
    event: EventDescriptor


RepairOut = list[OutEvent | Repaired]
"""What an answer to repair's requests yields: outputs, and the events it repaired."""

REPAIR_HOP: Final = 0
"""The ``hop`` of a ``Deliver`` for an event that came by backfill, not down the tree.
Tree hops start at 1, so 0 never hides a real hop count (the LDH figures stay honest)."""

Lookup = Callable[[CID], bytes | None]
"""A block from the local store (blocks not yet flushed included), or None."""
class Unvouched:
    """What :data:`Verify` returns for a well-formed event of the tree whose publisher only
    an older version allows and that no recorded history vouches for *yet*. Walks from
    several heads meet an event in no set order, and the walk from the head a revoking
    version recorded may reach it after a walk from an unvouched descendant did: such an
    event is not invalid for good, and is judged again later (``GapFetching.wait_for_vouching``)."""

    __slots__ = ()


UNVOUCHED: Final = Unvouched()
Verdict = EventDescriptor | Unvouched | None
"""What :data:`Verify` says of a block."""

Verify = Callable[[CID, bytes | EventDescriptor], Verdict]
"""``verify(tree topic, block)``: the event if the block is a valid event of that tree
(CID, canonical schema, signatures, topic lineage, publishing rights), :data:`UNVOUCHED`
(see there), else None. None means *invalid for good*: the gap it was meant to fill is
dropped at once. Given an :class:`EventDescriptor` instead of a block, the event was
parsed and its signatures checked by the driver (off the event loop): the rest is
judged."""
IsDelivered = Callable[[CID, CID], bool]
"""``is_delivered(tree topic, event cid)``: the durable delivery log, asked only for CIDs
that fell out of memory (parents at a gap's start, heads from neighbours)."""
Neighbours = Callable[[CID], Iterable[PeerId]]
"""The peers to exchange heads with for a topic (tree edges and lazy links)."""


@dataclass(frozen=True, slots=True)
class BackfillConfig:
    want_limit: int = 512
    """Blocks asked for per WANT: one round trip closes a gap of this length."""
    want_timeout: float = 2.0
    """How long a WANT may go unanswered before the DHT is asked instead, at least: with
    the peer's round-trip time measured, ``want_rtts`` x its RTO if longer (a slow path
    must not make every answer arrive after the DHT was asked, as a duplicate)."""
    want_rtts: float = 2.0
    max_want_timeout: float = 5.0
    """The longest a WANT is waited for before the DHT is asked too, however slow the
    path looks. A busy author's RTO grows to several seconds under load (and a peer never
    measured is given the longest RTO the node knows), so ``want_rtts`` x RTO reached
    12 s and more: in a testbed run under 5 % frame loss a lost WANT for a topic's last
    events was still waiting when the run ended. A late answer still counts; at worst the
    event comes twice."""
    gap_timeout: float = 5.0
    """How long a gap holds delivery back before it is reported and skipped, at least:
    with the RTO of the peer that opened it measured, ``gap_rtts`` x that RTO if longer
    (at most ``max_gap_timeout``). Its repair — the reorder wait (up to one RTO), a WANT
    (``want_rtts`` RTOs), then the DHT — takes about that long on that path."""
    gap_rtts: float = 4.0
    max_gap_timeout: float = 30.0
    vouch_patience: float = 30.0
    """How long a gap whose frontier nothing vouches for *yet* (a revoked publisher's
    event from before the revocation, met before the walk from the head the revoking
    version recorded) keeps its children held and judges the frontier again."""
    dht_patience: float = 5.0
    """Once, a gap whose timeout comes while its DHT get is in flight waits this much
    longer before it releases what it holds: the DHT's RPC timeout (``DhtConfig``), what a
    lookup round whose datagrams were all lost costs. Releasing at the moment the answer is
    due delivers the held events out of order for a block that was on its way (the
    simulator at 10 % loss, DHT datagrams included, did so)."""
    heads_interval: float = 2.0
    heads_first_delay: float = 0.1
    """When an idle topic's heads change, the tick comes this soon (its neighbours learn of
    a new head at once even if its publisher dies right after), then every interval."""
    heads_refresh: int = 1
    """Heads are sent to a neighbour when they changed since it last had them and name an
    event it was neither sent nor told of; after this many quiet ticks they go again to
    every neighbour whatever it was told, and again after 2, 4, 8, 16 and 32 times as many
    (a lost HEADS or event is caught up, and still if a refresh is lost too); then the
    topic falls idle: nothing more is sent for it until its heads change again. A topic
    whose heads keep changing sends them to everyone every 16th tick."""
    have_count: int = 8
    """How many of our newest heads a WANT carries, so the answer stops where we resume."""
    have_recent: int = 24
    """How many of our most recently delivered events a WANT carries besides (up to 32 in
    all). A missing parent usually hangs off a recent event that is no longer a head (the
    topic moved on along other branches); without it in ``have`` the answer walked on
    through everything we had, back to ``want_limit`` (in the testbed's latency scenario,
    BLOCKS copies of events a median of 28 s old: 5,871 of 15,699 payload copies)."""
    max_pending: int = 20_000
    """Events held (all topics). A gap longer than this is delivered in segments: the
    oldest gap is released early. 20,000 lets a 10,000-event gap plus the live events that
    arrive meanwhile be delivered in order; at ~1 KiB an event that is ~20 MiB."""
    max_gaps: int = 1024
    max_topic_gaps: int = 64
    """Gaps open at once in one topic: a publisher that names missing parents (CUSTOM
    links to nothing) costs its topic at most this many fetches in flight, never the
    whole node's ``max_gaps``."""
    """Gaps open at once (all topics); the oldest is dropped to open another."""
    settled_limit: int = 100_000
    """Delivered CIDs remembered per topic; older ones are asked of ``is_delivered``."""
    heads_limit: int = 1024
    """Heads remembered per topic; HEADS carries the newest 256."""
    memo_limit: int = 10_000
    """Entries in each small per-topic memo (released frontiers, failed heads)."""
    fetch_retries: int = 3
    """DHT misses for one frontier before the gap stalls until its timeout."""
    fetch_retry_delay: float = 0.5
    """First DHT retry delay; doubles each time."""
    retry_heads_after: float = 30.0
    """A head we could not get, or found invalid, is not asked for again this long."""
    lost_retries: int = 6
    """A gap given up on (its events released) is opened again after ``retry_heads_after``,
    then twice as long each time, this many times (30 s ... 16 min: about 32 minutes in
    all). Nobody names an interior event in HEADS, so without this an ancestor missing
    through a partition or a DHT outage would never come, though persistence is the
    point of the system."""
    answer_limit: int = MAX_BLOCKS
    """Most blocks we put in one BLOCKS answer."""
    answer_bytes: int = 512 * 1024
    """Most block bytes in one answer: one answer never holds the connection long."""
    horizon_slack: float = 60.0
    """Events created up to this long before a subscription began are still delivered
    (publishers' clocks differ, and events are in flight when a node subscribes)."""
    horizon_confirm: int = 2
    """Backfilled events older than the horizon (by their ``created``), one the parent of
    the next, that end a walk: one alone is not enough, its publisher's clock may have been
    behind (see :mod:`pulsar.proto.repair.backfill`). 2: the event and its parent, so a fresh
    subscriber's walk costs one block more than it would with 1."""
    horizon_confirm_resumed: int = 8
    """The same for a subscription resumed from a durable store (``open`` with ``heads``
    or ``delivered``): its walks almost always end at an event it delivered before the
    restart, so the longer look-ahead is paid only where a chain forks off older history,
    and it covers a run of skewed events published while the node was down. The look-ahead
    goes in one WANT (``limit`` the blocks still needed, no ``after``)."""
    reconcile: bool = False
    """Whether a gap too deep to walk turns to range reconciliation with the peer whose
    answer showed it (the :class:`~pulsar.proto.events.Reconcile` output). Off here: only
    a driver that carries reconciliations out (the node runtime's) may turn it on, or the
    gaps would wait ``reconcile_timeout`` for nothing."""
    reconcile_after: int = 128
    """Blocks a BLOCKS answer must bring, without its chain reaching what this node
    holds, for the gap to count as too deep to walk: a node back after missing this many
    events catches up by ranges (a few round trips whatever it missed) instead of one
    WANT round trip per ``want_limit`` blocks."""
    reconcile_after_bytes: int = 256 * 1024
    """The same in block bytes: an answer of large blocks stops at its byte budget long
    before ``reconcile_after`` blocks (64 blocks of 8 KiB fill 512 KiB), and its walk is
    the slowest of all."""
    reconcile_timeout: float = 120.0
    """The longest a topic's gaps wait for a reconciliation the driver did not report
    done; then they walk as before."""

    def __post_init__(self) -> None:
        if not 1 <= self.want_limit <= MAX_WANT_LIMIT:
            raise ValueError(f"want_limit must be in 1..{MAX_WANT_LIMIT}")
        if not 0 <= self.have_count <= MAX_HAVE or not 0 <= self.have_recent <= MAX_HAVE:
            raise ValueError(f"have_count and have_recent must be in 0..{MAX_HAVE}")
        if not 1 <= self.answer_limit <= MAX_BLOCKS:
            raise ValueError(f"answer_limit must be in 1..{MAX_BLOCKS}")
        if not MAX_BLOCK <= self.answer_bytes <= MAX_ANSWER_BYTES:
            raise ValueError(f"answer_bytes must be in {MAX_BLOCK}..{MAX_ANSWER_BYTES}")
        for name in ("max_pending", "max_gaps", "max_topic_gaps", "settled_limit",
                     "heads_limit", "memo_limit", "horizon_confirm",
                     "horizon_confirm_resumed"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.heads_refresh < 1 or self.fetch_retries < 0 or self.lost_retries < 0:
            raise ValueError(
                "heads_refresh must be >= 1, fetch_retries and lost_retries >= 0")
        if self.gap_rtts < 0:
            raise ValueError("gap_rtts must be >= 0")
        if self.max_want_timeout < self.want_timeout:
            raise ValueError("max_want_timeout must be at least want_timeout")
        for name in ("want_timeout", "gap_timeout", "heads_interval", "fetch_retry_delay",
                     "dht_patience", "vouch_patience"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


# --------------------------------------------------------------------------- state


@dataclass(slots=True, eq=False)
class Gap:
    """One missing chain: ``frontier`` is its oldest missing CID. At most one request (a
    WANT to ``asked_peer``, or a DHT fetch when that is None) is in flight at a time."""

    id: int
    topic: CID
    frontier: CID
    since: float
    peer: PeerId | None
    """Where the next request goes: a peer for a WANT, None for the DHT."""
    asked: CID | None = None
    asked_peer: PeerId | None = None
    failures: int = 0
    retry_armed: bool = False
    stalled: bool = False
    parked: bool = False
    """Its WANT waits for the one in flight to the same peer for the same topic."""
    asked_at: float = 0.0
    """When its WANT in flight (if any) was sent."""
    closed: bool = False
    timer_seq: int = 0
    patience: float = 5.0
    """How long it holds delivery back: the gap timeout, or longer on a slow path."""
    waited_for_dht: bool = False
    """Its timeout was put off once for a DHT get in flight (``dht_patience``)."""
    unvouched_since: float | None = None
    """When its frontier was first refused only because nothing vouched for it yet: the
    gap waits ``vouch_patience`` from then (``GapFetching.wait_for_vouching``)."""


@dataclass(slots=True)
class Held:
    event: EventDescriptor
    hop: int
    run: int = 0
    """Events older than the horizon in a row, down a chain to this one: itself, after the
    longest such run of its held descendants; 0 when it is not older than the horizon."""
    early: bool = False
    """Backfilled and older than the horizon: if its chain turns out to be history too it
    is settled without being delivered; if it links to a delivered or newer event, its
    publisher's clock was behind and it is delivered."""


def bounded_put(memo: OrderedDict[CID, Any], key: CID, value: Any, limit: int) -> None:
    memo[key] = value
    if len(memo) > limit:
        memo.popitem(last=False)
