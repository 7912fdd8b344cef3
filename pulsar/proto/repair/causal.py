"""Causal delivery: an event is delivered only after its parent.

An event whose parent is neither delivered nor settled is held; when the parent is
delivered, every held descendant that became ready is delivered too, concurrent ones in
:func:`dag.history.order_key` order, so every node delivers a DAG the same way. The heads
(delivered events with no delivered children) are kept here; a subscription's horizon
(``since`` minus ``horizon_slack``) settles what is older without delivering it, once a
backfilled chain shows it is older (``horizon_confirm`` events in a row, not one event
that a publisher's clock gone back can make look old). See :mod:`pulsar.proto.repair.backfill`
for the whole layer, and the argument for the horizon rule.

This is the bottom of the repair room: it owns what was delivered, held and settled per
topic, and calls nothing above it. Gap fetching (:mod:`.gaps`) decides *when* an event is
taken in and what is fetched; it asks this part whether an event is ready, holds it here,
and delivers through it. What a delivery asks of the part above comes back as a value
(the merged tips to follow), never as a call.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from dag import CID, EventDescriptor
from dag.descriptors import iso_timestamp
from dag.history import order_key
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .messages import MAX_HEADS
from .state import BackfillConfig, Held, IsDelivered, bounded_put

__all__ = ["CausalOrder", "Ordering"]


@dataclass(slots=True, eq=False)
class Ordering:
    """One topic's causal order: what was delivered (or settled), held and is a head."""

    cid: CID
    deliver: bool
    """False for a relay: events are ordered and settled, not delivered."""
    horizon: str | None
    restored: bool = False
    """Opened with what a durable store remembered (a restart): an event arriving may
    have been delivered before, so the durable log is asked before delivering it."""
    settled: OrderedDict[CID, None] = field(default_factory=OrderedDict)
    """Delivered (or pre-horizon) CIDs, oldest first. An OrderedDict because evicting the
    oldest key of a plain dict with ``next(iter(d))`` is O(n) once its front is full of
    deleted slots (measured 32 us an insert at 100,000 entries against 0.7 us)."""
    held: dict[CID, Held] = field(default_factory=dict)
    waiting: dict[CID, list[CID]] = field(default_factory=dict)
    """Missing or held CID -> the held events naming it as parent."""
    heads: OrderedDict[CID, None] = field(default_factory=OrderedDict)
    history: OrderedDict[CID, None] = field(default_factory=OrderedDict)
    """The settled CIDs that were history, not delivered (a subset of ``settled``, bounded
    the same way): what links to one and is older than the horizon is history too."""
    released: OrderedDict[CID, None] = field(default_factory=OrderedDict)
    """Events something delivered links to (a released gap's frontier, a merged tip not
    delivered yet): if they come late, they are not heads."""


class CausalOrder:
    """Holding, delivering in order, heads and the horizon, for every topic of one node.

    ``is_delivered`` asks the durable delivery log about CIDs no longer in memory."""

    def __init__(self, config: BackfillConfig, is_delivered: IsDelivered) -> None:
        self.config = config
        self._is_delivered = is_delivered
        self.topics: dict[CID, Ordering] = {}
        self.held_count = 0
        """Events held over all topics (bounded by ``max_pending``)."""
        self.active: dict[CID, None] = {}
        """Topics whose heads changed lately: the only ones the heads tick visits."""
        self.woke = False
        """A topic became active since the heads tick was last armed."""
        self.counts: dict[str, int] = {"delivered": 0}

    # -- topics

    def open(self, topic: CID, deliver: bool, since: float | None, heads: Iterable[CID],
             delivered: Iterable[CID]) -> Ordering:
        """Start ordering ``topic``; ``heads`` and ``delivered`` are what the durable
        store restored (a restart)."""
        horizon = None
        if since is not None:
            horizon = iso_timestamp(max(0.0, since - self.config.horizon_slack))
        order = self.topics[topic] = Ordering(topic, deliver, horizon)
        delivered = tuple(delivered)
        heads = tuple(heads)
        order.restored = bool(heads or delivered)
        self.mark_delivered(topic, delivered)
        for head in heads:
            bounded_put(order.settled, head, None, self.config.settled_limit)
            bounded_put(order.heads, head, None, self.config.heads_limit)
        if order.heads:
            self._activate(topic)
        return order

    def close(self, topic: CID) -> Ordering | None:
        """Forget ``topic``: its held events are dropped."""
        order = self.topics.pop(topic, None)
        self.active.pop(topic, None)
        if order is not None:
            self.held_count -= len(order.held)
        return order

    def mark_delivered(self, topic: CID, cids: Iterable[CID]) -> None:
        """Record CIDs the runtime already delivered (its durable log, after a restart)."""
        order = self.topics[topic]
        for cid in cids:
            bounded_put(order.settled, cid, None, self.config.settled_limit)

    def raise_horizon(self, topic: CID, before: float) -> None:
        """Events of ``topic`` created before ``before`` (less the horizon slack) are
        history from now on: a backfill that meets one settles it instead of delivering it
        (the log it would go into was cut there). The horizon only ever moves forward."""
        order = self.topics.get(topic)
        if order is None or not order.deliver:
            return
        horizon = iso_timestamp(max(0.0, before - self.config.horizon_slack))
        if order.horizon is None or horizon > order.horizon:
            order.horizon = horizon

    def known(self, topic: CID, cid: CID) -> bool:
        """Whether ``cid`` is delivered (as far as memory knows) or held in ``topic``."""
        order = self.topics.get(topic)
        return order is not None and (cid in order.settled or cid in order.held)

    def heads(self, topic: CID) -> list[CID]:
        """The newest heads of ``topic`` (at most 256), oldest first: persist them, and
        they are what HEADS carries."""
        order = self.topics.get(topic)
        if order is None:
            return []
        return list(order.heads)[-MAX_HEADS:]

    def held(self, topic: CID) -> int:
        order = self.topics.get(topic)
        return 0 if order is None else len(order.held)

    def in_log(self, order: Ordering, cid: CID) -> bool:
        """Whether the durable delivery log has ``cid`` (asked of CIDs not in memory)."""
        return self._is_delivered(order.cid, cid)

    def delivered_before(self, order: Ordering, cid: CID) -> bool:
        """Whether the durable log has ``cid`` (it fell out of memory); remembered if so."""
        if self.in_log(order, cid):
            bounded_put(order.settled, cid, None, self.config.settled_limit)
            return True
        return False

    # -- decisions

    def ready(self, order: Ordering, parent: CID | None, fetching: bool) -> bool:
        """Whether an event with ``parent`` may be delivered now (``fetching``: the parent
        is a gap's frontier)."""
        if parent is None:
            return True
        if parent in order.held or fetching:
            return False
        if parent in order.settled:
            return True
        return self.delivered_before(order, parent)

    def is_history(self, order: Ordering, parent: CID | None, run: int, fetching: bool) -> bool:
        """Whether a backfilled event older than the horizon, ``run`` such events in a row
        down to it, is history (settled, the walk ends) rather than held while its parent
        is fetched. A parent that is delivered makes it a delivery (what follows a
        delivered event is delivered, whatever its clock said); a held or missing one, a
        wait, until ``run`` reaches :meth:`confirm`. (A head restored from the store
        counts as delivered, though it may have been where an earlier walk ended: then such
        a child of it is delivered, an event more from before the subscription, not lost.)"""
        if parent is None or parent in order.history:
            return True
        if parent in order.held or fetching:
            return False  # its fate follows the parent's (delivered, or history)
        if parent in order.settled:
            return False  # delivered: so is what follows it (``ready`` says so next)
        if self.delivered_before(order, parent):
            return False
        return run >= self.confirm(order)

    def confirm(self, order: Ordering) -> int:
        config = self.config
        return config.horizon_confirm_resumed if order.restored else config.horizon_confirm

    def lookahead(self, order: Ordering, cid: CID) -> int:
        """The longest run of events older than the horizon that waits on ``cid`` (0: none,
        or the child waiting on it is newer): ``cid``'s gap is looking past the horizon."""
        children = order.waiting.get(cid)
        if not children:
            return 0
        held = order.held
        return max(held[c].run for c in children)

    def waits_only_past_horizon(self, order: Ordering, cid: CID) -> bool:
        """Whether something waits on ``cid`` and all of it is older than the horizon."""
        children = order.waiting.get(cid)
        if not children:
            return False
        return all(order.held[c].run for c in children)

    def gap_above(self, order: Ordering, cid: CID) -> CID:
        """The missing CID a held one waits on: follow held parents to it."""
        while cid in order.held:
            parent = order.held[cid].event.parent
            assert parent is not None
            cid = parent
        return cid

    # -- transitions

    def hold(self, order: Ordering, event: EventDescriptor, hop: int, run: int,
             early: bool) -> None:
        assert event.parent is not None  # an event without a parent is always ready
        order.held[event.cid] = Held(event, hop, run, early)
        self.held_count += 1
        order.waiting.setdefault(event.parent, []).append(event.cid)

    def deliver(self, order: Ordering, roots: list[Held], out: Out) -> tuple[int, list[CID]]:
        """Deliver ``roots`` and every held descendant they unblock: Kahn's algorithm with
        a heap on :func:`order_key`, so concurrent branches come out the same everywhere.
        Returns how many were delivered and the tips they merge (to be followed)."""
        heap = [(order_key(h.event), h) for h in roots]
        heapq.heapify(heap)
        count = 0
        merged: list[CID] = []
        while heap:
            _, held = heapq.heappop(heap)
            event = held.event
            self.settle(order, event)
            if order.deliver:
                out.append(ev.Deliver(order.cid, event, held.hop))
            count += 1
            merged += event.merges
            children = order.waiting.pop(event.cid, None)
            if children:
                for child in self._unhold(order, children):
                    heapq.heappush(heap, (order_key(child.event), child))
        if order.deliver:
            self.counts["delivered"] += count
        return count, merged

    def resolve(self, order: Ordering, cids: list[CID], out: Out) -> tuple[int, list[CID]]:
        """Unhold ``cids`` (whose parent is history, or will not come): the backfilled ones
        older than the horizon are history too, with the same on their own held children;
        the rest are delivered with what they unblock (see :meth:`deliver`)."""
        roots: list[Held] = []
        stack = self._unhold(order, cids)
        while stack:
            held = stack.pop()
            if not held.early:
                roots.append(held)
                continue
            self.settle_history(order, held.event)
            children = order.waiting.pop(held.event.cid, None)
            if children:
                stack += self._unhold(order, children)
        return self.deliver(order, roots, out)

    def release(self, order: Ordering, missing: CID, out: Out) -> tuple[int, list[CID]]:
        """Deliver what waits on ``missing`` as if it had been delivered (it is not: if it
        comes later it is delivered then)."""
        children = order.waiting.pop(missing, None)
        if not children:
            return 0, []
        bounded_put(order.released, missing, None, self.config.memo_limit)
        return self.resolve(order, children, out)

    def settle_history(self, order: Ordering, event: EventDescriptor) -> None:
        self.settle(order, event)
        bounded_put(order.history, event.cid, None, self.config.settled_limit)

    def settle(self, order: Ordering, event: EventDescriptor) -> None:
        """Record a delivered event and keep the heads: it replaces its parent and the
        tips it merges as heads, unless an event linking to it was delivered before it
        (a released gap, or a merge link that arrived first)."""
        cid = event.cid
        bounded_put(order.settled, cid, None, self.config.settled_limit)
        if event.parent is not None:
            order.heads.pop(event.parent, None)
        for merged in event.merges:
            if order.heads.pop(merged, False) is False and merged not in order.settled:
                bounded_put(order.released, merged, None, self.config.memo_limit)
        if cid in order.released:
            del order.released[cid]
        else:
            bounded_put(order.heads, cid, None, self.config.heads_limit)
        self._activate(order.cid)

    def _unhold(self, order: Ordering, cids: list[CID]) -> list[Held]:
        self.held_count -= len(cids)
        return [order.held.pop(c) for c in cids]

    def _activate(self, topic: CID) -> None:
        if topic not in self.active:
            self.active[topic] = None
            self.woke = True
