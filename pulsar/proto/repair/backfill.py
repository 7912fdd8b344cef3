"""DAG backfill and causal delivery for every topic a node is in (sans-I/O).

This module owns every transition of the repair layer; the core calls in after it has
verified and stored an event, and routes the WANT / BLOCKS / HEADS messages, the DHT fetch
results and this module's timers here. Nothing here does I/O: the local block store, the
durable delivery log, the tree neighbours and the event check are small interfaces passed
in, and fetches, sends and timers are outputs.

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

from collections.abc import Callable
from typing import assert_never

from dag import CID, EventDescriptor
from pulsar.proto import events as ev
from pulsar.proto.events import GapReported, Out
from pulsar.proto.tree.rtt import RttTable

from .anti_entropy import AntiEntropy
from .causal import CausalOrder
from .gaps import GapFetching
from .state import (
    REPAIR_HOP,
    UNVOUCHED,
    BackfillConfig,
    Gap,
    IsDelivered,
    Lookup,
    Neighbours,
    TopicState,
    Unvouched,
    Verify,
    event_links,
)
from .timers import BackfillTimer, GapTimeout, HeadsTick, RetryFetch, RetryLost, WantTimeout

__all__ = [
    "REPAIR_HOP",
    "Backfill",
    "BackfillConfig",
    "BackfillTimer",
    "GapReported",
    "GapTimeout",
    "HeadsTick",
    "IsDelivered",
    "Lookup",
    "Neighbours",
    "RetryFetch",
    "UNVOUCHED",
    "Unvouched",
    "Verify",
    "WantTimeout",
    "event_links",
]


def _never_coming(cid: CID) -> bool:
    return False


def _never_delivered(topic: CID, cid: CID) -> bool:
    return False


class Backfill(CausalOrder, GapFetching, AntiEntropy):
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
        self._lookup = lookup
        self._verify = verify
        self._is_delivered = is_delivered or _never_delivered
        self.coming: Callable[[CID], bool] = _never_coming
        """Events arriving by another way (a large event's fragments, in the core): a
        neighbour's HEADS naming one opens no gap, or the event would be fetched and
        delivered before its payload is complete."""
        self._neighbours = neighbours
        self._topics: dict[CID, TopicState] = {}
        self._gaps: dict[int, Gap] = {}
        self._fetches: dict[CID, Gap] = {}
        self._held = 0
        self._next_gap = 0
        self._repaired: list[tuple[CID, EventDescriptor]] = []
        self._active: dict[CID, None] = {}
        self._woke = False
        self._tick_seq = 0
        self._tick_armed = False
        self._tick_prompt = False
        self._counts: dict[str, int] = {
            "delivered": 0,
            "backfilled": 0,
            "found_locally": 0,
            "wants_sent": 0,
            "want_timeouts": 0,
            "wants_answered": 0,
            "blocks_answered": 0,
            "fetches": 0,
            "gaps_reported": 0,
            "heads_sent": 0,
            "heads_skipped": 0,
            "lost_retried": 0,
            "digests_sent": 0,
            "digests_matched": 0,
            "digests_spared": 0,
            "digests_deferred": 0,
            "heads_unknown": 0,
            "unvouched": 0,
            "merges_followed": 0,
            "duplicates": 0,
            "rejected": 0,
        }

    def arm_tick(self) -> Out:
        """The heads tick's timer, if a topic is active and it is not armed yet, or armed
        for later than ``heads_first_delay`` while a topic just woke up (the core asks after
        every input: one live timer for the node, none while all is idle)."""
        woke, self._woke = self._woke, False
        if not self._active or self._neighbours is None:
            return []
        prompt = woke and not (self._tick_armed and self._tick_prompt)
        if self._tick_armed and not prompt:
            return []
        self._tick_seq += 1
        self._tick_armed, self._tick_prompt = True, prompt
        delay = self.config.heads_first_delay if prompt else self.config.heads_interval
        return [ev.SetTimer(delay, HeadsTick(self._tick_seq))]

    @property
    def metrics(self) -> dict[str, int]:
        """Counters, plus the gauges ``gaps_open`` and ``held``."""
        return {**self._counts, "gaps_open": len(self._gaps), "held": self._held}

    def on_timer(self, timer: BackfillTimer, now: float) -> Out:
        match timer:
            case GapTimeout():
                return self._on_gap_timeout(timer, now)
            case WantTimeout():
                return self._on_want_timeout(timer, now)
            case RetryLost():
                return self._on_retry_lost(timer, now)
            case RetryFetch():
                gap = self._gaps.get(timer.gap)
                if gap is None:
                    return []
                gap.retry_armed = False
                out: Out = []
                self._pump(self._topics[gap.topic], gap, now, out)
                return out
            case HeadsTick():
                if timer.seq != self._tick_seq:
                    return []  # re-armed sooner since: this one is stale
                self._tick_armed = False
                out = []
                for topic in list(self._active):
                    neighbours = self._neighbours(topic) if self._neighbours else ()
                    out += self.tick(topic, neighbours, now)
                return out + self.arm_tick()
            case _:
                assert_never(timer)
