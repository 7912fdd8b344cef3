"""DAG backfill and causal delivery for every topic a node is in (sans-I/O).

:class:`Backfill` is the repair room's one face: the core calls in after it has verified
and stored an event, and routes the WANT / BLOCKS / HEADS messages, the DHT fetch results
and the room's timers here. Nothing here does I/O: the local block store, the durable
delivery log, the tree neighbours and the event check are small interfaces passed in, and
fetches, sends and timers are outputs. An event that repair brought in (not down the tree)
comes out as :class:`~pulsar.proto.events.Repaired`, for the core to push down its tree.

Inside, each part owns its state and calls only the parts below it:

- :mod:`.anti_entropy` (HEADS, digests, WANT answers; per topic an ``Exchange``)
- :mod:`.answers` (BLOCKS and DHT answers, WANT timeouts, peers gone)
- :mod:`.gaps` (taking events in, opening, moving and ending gaps; the gaps themselves are
  kept in :mod:`.gap_table`, the waits computed in :mod:`.waits`)
- :mod:`.causal` (held, delivered, settled, heads, the horizon; per topic an ``Ordering``)

What a lower part cannot do itself comes back as a value (the tips a delivery merges, the
gap an event moved), never as a call upward.

**Causal delivery.** An event is delivered only after its parent. An event whose parent is
neither delivered nor *settled* (see below) is **held**; when the parent is delivered, every
held descendant that became ready is delivered too, concurrent ones in
:func:`dag.history.order_key` order, so every node delivers a DAG the same way.

**Backfill.** A missing parent opens a **gap**. A gap has one **frontier**: the oldest CID
still missing on its chain (events link one parent each, so a gap is a chain). The frontier
is looked up in the local store first, then asked for with one WANT ("``head`` and its
ancestors, up to N blocks, in one batch") from the peer that sent the event, then fetched
from the DHT one block at a time, until the chain reaches an event that is delivered: then
the whole held chain is delivered, oldest first. Every block is checked by the ``verify``
callback (CID, signatures, publishing rights, topic) before anything else looks at it, and
only the block that *is* the frontier is taken from an answer, so a peer cannot make us
verify or hold what we did not ask for.

=====================================  =====================================================
input                                  transition
=====================================  =====================================================
event accepted, parent delivered       deliver it, then its ready descendants
event accepted, parent held/frontier   hold it (no new request: that chain is being fetched)
event accepted, parent unknown         hold it; open a gap: local store, else WANT to the
                                       sender (DHT ``Fetch`` when there is none);
                                       ``SetTimer(GapTimeout)``
BLOCKS for a WANT in flight            take blocks while each is the frontier; then, if the
                                       chain moved, WANT again from that peer, else go to
                                       the DHT; an invalid frontier block drops the gap
WANT timeout, peer down                go to the DHT
DHT block for the frontier             take it; fetch the next frontier
block created before the horizon       history (settle, walk ends) if its parent is none
                                       or history, or it ends ``horizon_confirm`` such
                                       blocks in a row; delivered if its parent was; else
                                       held and its parent fetched (see the horizon)
DHT miss                               retry with back-off ``fetch_retries`` times, then
                                       stall until the gap timeout
gap timeout                            report ``GapReported`` and deliver the held events
                                       waiting on the gap (causal order among what is
                                       known); keep fetching if a request is in flight,
                                       else drop the gap and arm ``RetryLost``
``RetryLost``                          open the gap again (a neighbour, else the DHT);
                                       30 s after the drop, doubling, ``lost_retries``
held events reach ``max_pending``      release the oldest gap early (``"overflow"``)
HEADS from a neighbour                 open a gap (WANT to that neighbour) per unknown head
heads timer                            send our heads to each neighbour whose copy is stale
                                       (all of them after 1, 2, 4 ... 32 quiet ticks)
WANT from a peer                       answer from the local store with one BLOCKS batch
=====================================  =====================================================

**Late ancestors.** When a gap times out, its held descendants are delivered without it;
if the missing event arrives later (a fetch still in flight, a retry, anti-entropy) it is
still delivered, once: it is new to the application, which was told about the gap by the
``GapReported`` output and can reorder by the DAG if it cares. Dropping it instead would
trade a late delivery for a permanent loss, and persistence is the point of the system.

**Settled events and the horizon.** The delivered-set memory is bounded
(``settled_limit`` per topic): what falls out of it is asked of the ``is_delivered``
callback (the runtime's durable delivery log), and the runtime can seed it on restart with
:meth:`Backfill.open` (``heads=``, ``delivered=``) or :meth:`Backfill.mark_delivered`. A
subscription also has a **horizon** (``since`` minus ``horizon_slack``): history from
before the subscription is *settled* (treated as delivered) without being delivered, and
the walk ends there. Without a horizon a fresh subscriber would fetch the topic's whole
past before its first event.

The horizon is read on the subscriber's clock, an event's ``created`` on its publisher's,
so one event created before the horizon does not show that its chain is history: a
publisher whose clock was stepped back for a moment (an NTP step, a resumed VM) publishes
events that look minutes older than they are. Ending the walk at the first one lost every
event below it that was published after the subscription (the verifier found it: a
restarted subscriber settled such an event, never fetched its 18 ancestors, and delivered
its child without its parent). So the walk ends only on evidence one wrong clock cannot
give alone, and errs toward delivering:

- A backfilled event created before the horizon whose parent was delivered is delivered:
  what follows a delivered event was published after it, whatever its clock said. One
  whose parent is history, or that has no parent, is history.
- Otherwise it is held like any other event and its parent is fetched. The walk ends when
  ``horizon_confirm`` events in a row (2: the event and its parent) were created before the
  horizon: they are settled, and what waits on them is delivered. When a parent turns out
  newer than the horizon instead (the clock went backwards along the chain), the walk goes
  on and the held events are delivered after it, in causal order as always.
- An event that comes down the tree created before the horizon is delivered, as before,
  but after its parent: a missing parent is fetched like any other's (it used to be
  delivered at once and its parent never asked for).
- A look-ahead that cannot finish (its gap times out, is evicted or gets an invalid block)
  ends as the horizon alone ended it before: the backfilled events older than the horizon
  are history, the others delivered; no gap is reported and nothing is asked for again.

Cost: a fresh subscriber's walk fetches one block more than it used to; the look-ahead's
WANT carries no ``after`` and asks for just the blocks that decide (``limit``), so it is
one round trip. A *resumed* subscription (opened with ``heads`` or ``delivered``: a
restart) looks ``horizon_confirm_resumed`` (8) events ahead: its walks end at events it
delivered before the restart, so only a chain that forks off older history (a CUSTOM link
to an old event) pays for it, and a restart is when a whole skew window's events are
backfilled at once. The limits: a run of skewed events longer than the look-ahead, or a
skewed event with no parent, still looks like history. An event whose publisher's clock
was *ahead* looks newer than it is, and is delivered, as it always was (a look-ahead that
meets one delivers what is above it: events from at most that skew before the horizon,
never a loss). The alternatives were worse: a slack of minutes makes every fresh
subscriber fetch and deliver minutes of history, and no horizon the whole past; the
subscriber never saw a backfilled event arrive, so its own clock cannot date it.

**Heads anti-entropy.** Heads are the delivered events with no delivered children. Each
``heads_interval`` a node sends its heads to its tree and lazy neighbours; a neighbour that
does not know one opens a gap for it (a WANT back to the sender). This finds branches that
nobody forwarded: concurrent LAST_SEEN publishers and CUSTOM links fork the DAG, and a lost
or never-sent event on one branch is otherwise invisible until a descendant names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import assert_never

from dag import CID, EventDescriptor, PeerId
from pulsar.proto.events import GapReported, Out, Reconciled
from pulsar.proto.tree.rtt import RttTable

from .answers import Answers
from .anti_entropy import AntiEntropy
from .causal import CausalOrder
from .gaps import GapFetching
from .messages import Blocks, Heads, HeadsDigest, Want
from .state import (
    REPAIR_HOP,
    UNVOUCHED,
    BackfillConfig,
    IsDelivered,
    Lookup,
    Neighbours,
    Repaired,
    RepairOut,
    Unvouched,
    Verdict,
    Verify,
    event_links,
)
from .timers import (
    BackfillTimer,
    GapTimeout,
    HeadsTick,
    ReconcileTimeout,
    RetryFetch,
    RetryLost,
    WantTimeout,
)

__all__ = [
    "REPAIR_HOP",
    "Backfill",
    "BackfillConfig",
    "BackfillTimer",
    "GapReported",
    "GapTimeout",
    "HeadsTick",
    "IsDelivered",
    "ReconcileTimeout",
    "Lookup",
    "Neighbours",
    "RepairOut",
    "Repaired",
    "RetryFetch",
    "UNVOUCHED",
    "Unvouched",
    "Verdict",
    "Verify",
    "WantTimeout",
    "event_links",
]


def _never_delivered(topic: CID, cid: CID) -> bool:
    return False


class Backfill:
    """Causal delivery, backfill and heads anti-entropy for every topic of one node.

    ``lookup`` reads the local block store (to answer WANTs and to find a missing block
    locally before asking anyone), ``verify`` checks a fetched block (see :data:`Verify`),
    ``is_delivered`` asks the durable delivery log about CIDs no longer in memory, and
    ``neighbours`` names the peers to send heads to (without it no heads timer is set and
    the driver calls :meth:`tick` itself).
    """

    def __init__(
        self,
        lookup: Lookup,
        verify: Verify,
        *,
        is_delivered: IsDelivered | None = None,
        neighbours: Neighbours | None = None,
        config: BackfillConfig | None = None,
        rtt: RttTable | None = None,
    ) -> None:
        self.config = config or BackfillConfig()
        self.rtt = rtt or RttTable()
        self._causal = CausalOrder(self.config, is_delivered or _never_delivered)
        self._gaps = GapFetching(self.config, self.rtt, self._causal, lookup, verify,
                                 neighbours)
        self._answers = Answers(self._gaps)
        self._exchange = AntiEntropy(self.config, self._causal, self._gaps, lookup,
                                     neighbours)

    @property
    def coming(self) -> Callable[[CID], bool]:
        """Events arriving by another way (a large event's fragments, in the core): a
        neighbour's HEADS naming one opens no gap, or the event would be fetched and
        delivered before its payload is complete."""
        return self._gaps.coming

    @coming.setter
    def coming(self, coming: Callable[[CID], bool]) -> None:
        self._gaps.coming = coming

    # -- topics

    def open(
        self,
        topic: CID,
        now: float,
        *,
        deliver: bool = True,
        since: float | None = None,
        heads: Iterable[CID] = (),
        delivered: Iterable[CID] = (),
    ) -> Out:
        """Start (or, for an open topic, widen) tracking ``topic``'s tree.

        ``deliver=False`` is a relay: events are ordered, backfilled and answered for, but
        not delivered. ``since`` is when the subscription began (seconds since the epoch;
        None: deliver the whole history). ``heads`` and ``delivered`` restore what the
        durable store knows after a restart. Returns the first heads timer.

        A relay that becomes a subscriber starts over: what it settled while relaying was
        never delivered, so its heads are walked back again (from the local store, where
        it kept every block) and delivered from the subscription's ``since``."""
        order = self._causal.topics.get(topic)
        if order is not None:
            if deliver and not order.deliver:
                relayed = list(order.heads)
                self.close(topic)
                self._open(topic, True, since, heads, delivered)
                return self._gaps.learn_heads(topic, relayed, None, now)
            self._causal.mark_delivered(topic, delivered)
            return []
        self._open(topic, deliver, since, heads, delivered)
        out = self._gaps.missing_merges(topic, now)
        return out + self.arm_tick()

    def _open(self, topic: CID, deliver: bool, since: float | None, heads: Iterable[CID],
              delivered: Iterable[CID]) -> None:
        order = self._causal.open(topic, deliver, since, heads, delivered)
        self._gaps.table.open_topic(order)
        self._exchange.open_topic(topic)

    def close(self, topic: CID) -> None:
        """Forget ``topic`` (unsubscribed): held events are dropped, gaps closed."""
        self._causal.close(topic)
        self._exchange.close_topic(topic)
        self._gaps.table.close_topic(topic)

    def mark_delivered(self, topic: CID, cids: Iterable[CID]) -> None:
        """Record CIDs the runtime already delivered (its durable log, after a restart)."""
        self._causal.mark_delivered(topic, cids)

    def raise_horizon(self, topic: CID, before: float) -> None:
        """See :meth:`CausalOrder.raise_horizon`."""
        self._causal.raise_horizon(topic, before)

    # -- what the core asks

    def known(self, topic: CID, cid: CID) -> bool:
        """Whether ``cid`` is delivered (as far as memory knows) or held in ``topic``: the
        core can skip a copy that arrives down the tree after it was backfilled."""
        return self._causal.known(topic, cid)

    def heads(self, topic: CID) -> list[CID]:
        """The newest heads of ``topic`` (at most 256), oldest first: persist them, and
        they are what HEADS carries."""
        return self._causal.heads(topic)

    def horizon(self, topic: CID) -> str | None:
        """Where ``topic``'s history ends for this node (a descriptor timestamp; None: the
        whole history is delivered): events created before it are not delivered."""
        order = self._causal.topics.get(topic)
        return None if order is None else order.horizon

    def held(self, topic: CID) -> int:
        return self._causal.held(topic)

    def fetching(self, cid: CID) -> bool:
        """Whether a ``Fetch(cid)`` of ours is outstanding (route its ``BlockFetched`` here)."""
        return self._gaps.fetching(cid)

    def missing(self, topic: CID) -> list[CID]:
        """The frontiers of ``topic``'s open gaps: what is being fetched right now."""
        return self._gaps.missing(topic)

    @property
    def metrics(self) -> dict[str, int]:
        """Counters, plus the gauges ``gaps_open`` and ``held``."""
        return {**self._causal.counts, **self._gaps.counts, **self._exchange.counts,
                "gaps_open": len(self._gaps.table.by_id), "held": self._causal.held_count}

    # -- inputs

    def accepted(
        self, topic: CID, event: EventDescriptor, hop: int, sender: PeerId | None, now: float
    ) -> Out:
        """An event the core verified (CID, signatures, rights) and stored, from the tree
        (``sender``) or published here (``sender=None``). Delivers it and what it unblocks,
        or holds it and starts fetching its ancestors. The topic must be open."""
        return self._gaps.accepted(topic, event, hop, sender, now)

    def learn_heads(
        self, topic: CID, heads: Iterable[CID], peer: PeerId | None, now: float,
        *, reorder: bool = False,
    ) -> Out:
        """Heads learned from ``peer`` (None: from the DHT's heads records): open a gap
        for each one we do not know, asking that peer first (or the DHT)."""
        return self._gaps.learn_heads(topic, heads, peer, now, reorder=reorder)

    def on_blocks(self, peer: PeerId, msg: Blocks, now: float) -> RepairOut:
        return self._answers.on_blocks(peer, msg, now)

    def on_fetched(self, cid: CID, block: bytes | None, now: float) -> RepairOut:
        return self._answers.on_fetched(cid, block, now)

    def on_reconciled(self, msg: Reconciled, now: float) -> RepairOut:
        """Blocks a range reconciliation fetched (see :class:`~pulsar.proto.events.Reconcile`)."""
        return self._answers.on_reconciled(msg, now)

    def peer_down(self, peer: PeerId, now: float) -> Out:
        """``peer`` is gone: its WANTs will not be answered, ask the DHT instead."""
        out = self._answers.peer_down(peer, now)
        self._exchange.forget_peer(peer)
        return out

    def on_want(self, peer: PeerId, msg: Want, now: float) -> Out:
        return self._exchange.on_want(peer, msg, now)

    def on_heads(self, peer: PeerId, msg: Heads, now: float) -> Out:
        return self._exchange.on_heads(peer, msg, now)

    def on_digest(self, peer: PeerId, msg: HeadsDigest, now: float) -> Out:
        return self._exchange.on_digest(peer, msg, now)

    def cover(self, topic: CID, cid: CID, peers: Iterable[PeerId]) -> None:
        """``peers`` have event ``cid`` of ``topic`` or were told of it: a HEADS need not
        tell them."""
        self._exchange.cover(topic, cid, peers)

    def tick(self, topic: CID, neighbours: Iterable[PeerId], now: float) -> Out:
        """One heads tick for ``topic`` (see :meth:`AntiEntropy.tick`)."""
        return self._exchange.tick(topic, neighbours, now)

    def arm_tick(self) -> Out:
        """The heads tick's timer, when one should be armed (see :meth:`AntiEntropy.arm_tick`)."""
        return self._exchange.arm_tick()

    def on_timer(self, timer: BackfillTimer, now: float) -> Out:
        match timer:
            case GapTimeout():
                return self._gaps.on_gap_timeout(timer, now)
            case WantTimeout():
                return self._answers.on_want_timeout(timer, now)
            case RetryLost():
                return self._gaps.on_retry_lost(timer, now)
            case RetryFetch():
                return self._gaps.on_retry_fetch(timer, now)
            case HeadsTick():
                return self._exchange.on_tick(timer, now)
            case ReconcileTimeout():
                return self._answers.on_reconcile_timeout(timer, now)
            case _:
                assert_never(timer)
