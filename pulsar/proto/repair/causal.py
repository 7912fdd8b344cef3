"""Causal delivery: an event is delivered only after its parent.

An event whose parent is neither delivered nor settled is held; when the parent is
delivered, every held descendant that became ready is delivered too, concurrent ones in
:func:`dag.history.order_key` order, so every node delivers a DAG the same way. The heads
(delivered events with no delivered children) are kept here; a subscription's horizon
(``since`` minus ``horizon_slack``) settles what is older without delivering it, once a
backfilled chain shows it is older (``horizon_confirm`` events in a row, not one event
that a publisher's clock gone back can make look old). See :mod:`pulsar.proto.repair.backfill`
for the whole layer, and the argument for the horizon rule."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Final

from dag import CID, EventDescriptor, PeerId
from dag.descriptors import iso_timestamp
from dag.history import order_key
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .messages import MAX_HEADS
from .state import (
    BackfillParts,
    Gap,
    Held,
    TopicState,
    bounded_put,
    event_links,
)

__all__ = ["RESTORE_MERGE_WALK", "CausalOrder"]

RESTORE_MERGE_WALK: Final = 256
"""Events a restarted subscription reads back from its heads to find merged tips it never
got (one local store read each)."""


class CausalOrder(BackfillParts):
    """The causal-order part of :class:`~pulsar.proto.repair.backfill.Backfill`: holding, delivering
    in order, heads, the horizon."""

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
        state = self._topics.get(topic)
        if state is not None:
            if deliver and not state.deliver:
                relayed = list(state.heads)
                self.close(topic)
                self._new_state(topic, True, since, heads, delivered)
                return self.learn_heads(topic, relayed, None, now)
            self.mark_delivered(topic, delivered)
            return []
        self._new_state(topic, deliver, since, heads, delivered)
        out = self._missing_merges(self._topics[topic], now)
        return out + self.arm_tick()

    def _missing_merges(self, state: TopicState, now: float) -> Out:
        """After a restart: the merged tips that the last events delivered before it link
        to and that were never delivered. Their fetches (gaps opened when the linking
        event was delivered) died with the process, and nothing else names them again: a
        merged tip is nobody's head. The walk reads the local store back from the restored
        heads, at most :data:`RESTORE_MERGE_WALK` events."""
        if not state.restored:
            return []
        stack = list(state.heads)
        seen: set[CID] = set()
        wanted: list[CID] = []
        while stack and len(seen) < RESTORE_MERGE_WALK:
            cid = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            block = self._lookup(cid)
            links = None if block is None else event_links(block)
            if links is None:
                continue
            for merged in links.merges:
                if merged not in state.settled and not self._is_delivered(state.cid, merged):
                    wanted.append(merged)
            if links.parent is not None:
                stack.append(links.parent)
        return self.learn_heads(state.cid, wanted, None, now) if wanted else []

    def raise_horizon(self, topic: CID, before: float) -> None:
        """Events of ``topic`` created before ``before`` (less the horizon slack) are
        history from now on: a backfill that meets one settles it instead of delivering it
        (the log it would go into was cut there). The horizon only ever moves forward."""
        state = self._topics.get(topic)
        if state is None or not state.deliver:
            return
        horizon = iso_timestamp(max(0.0, before - self.config.horizon_slack))
        if state.horizon is None or horizon > state.horizon:
            state.horizon = horizon

    def _new_state(self, topic: CID, deliver: bool, since: float | None, heads: Iterable[CID],
                   delivered: Iterable[CID]) -> None:
        horizon = None
        if since is not None:
            horizon = iso_timestamp(max(0.0, since - self.config.horizon_slack))
        state = self._topics[topic] = TopicState(topic, deliver, horizon)
        delivered = tuple(delivered)
        heads = tuple(heads)
        state.restored = bool(heads or delivered)
        self.mark_delivered(topic, delivered)
        for head in heads:
            bounded_put(state.settled, head, None, self.config.settled_limit)
            bounded_put(state.heads, head, None, self.config.heads_limit)
        if state.heads:
            self._activate(topic)

    def close(self, topic: CID) -> None:
        """Forget ``topic`` (unsubscribed): held events are dropped, gaps closed."""
        state = self._topics.pop(topic, None)
        self._active.pop(topic, None)
        if state is None:
            return
        self._held -= len(state.held)
        for gap in list(state.frontier.values()):
            self._close(gap)

    def mark_delivered(self, topic: CID, cids: Iterable[CID]) -> None:
        """Record CIDs the runtime already delivered (its durable log, after a restart)."""
        state = self._topics[topic]
        for cid in cids:
            bounded_put(state.settled, cid, None, self.config.settled_limit)

    def known(self, topic: CID, cid: CID) -> bool:
        """Whether ``cid`` is delivered (as far as memory knows) or held in ``topic``: the
        core can skip a copy that arrives down the tree after it was backfilled."""
        state = self._topics.get(topic)
        return state is not None and (cid in state.settled or cid in state.held)

    def heads(self, topic: CID) -> list[CID]:
        """The newest heads of ``topic`` (at most 256), oldest first: persist them, and
        they are what HEADS carries."""
        state = self._topics.get(topic)
        if state is None:
            return []
        return list(state.heads)[-MAX_HEADS:]

    def take_repaired(self) -> list[tuple[CID, EventDescriptor]]:
        """The ``(topic, event)`` pairs taken in by repair (not down the tree) since the
        last call, oldest first: the core pushes the recent ones down its tree."""
        taken, self._repaired = self._repaired, []
        return taken

    def held(self, topic: CID) -> int:
        state = self._topics.get(topic)
        return 0 if state is None else len(state.held)

    def accepted(
        self, topic: CID, event: EventDescriptor, hop: int, sender: PeerId | None, now: float
    ) -> Out:
        """An event the core verified (CID, signatures, rights) and stored, from the tree
        (``sender``) or published here (``sender=None``). Delivers it and what it unblocks,
        or holds it and starts fetching its ancestors. The topic must be open."""
        state = self._topics[topic]
        if event.cid in state.held or event.cid in state.settled:
            self._counts["duplicates"] += 1
            return []
        if state.restored and self._is_delivered(topic, event.cid):
            # Delivered before the restart (the log says so): a neighbour sent it again.
            bounded_put(state.settled, event.cid, None, self.config.settled_limit)
            self._counts["duplicates"] += 1
            return []
        out: Out = []
        gap = self._add(state, event, hop, sender, now, out, fetched=False)
        if gap is not None:
            self._pump(state, gap, now, out)
        return out

    def _add(
        self,
        state: TopicState,
        event: EventDescriptor,
        hop: int,
        sender: PeerId | None,
        now: float,
        out: Out,
        *,
        fetched: bool,
        local: bool = False,
    ) -> Gap | None:
        """Take in a verified event that is neither held nor settled. Returns the gap whose
        frontier it moved (its caller decides what to request next), or None."""
        cid = event.cid
        parent = event.parent
        run = 0
        if state.horizon is not None and event.created < state.horizon:
            run = 1 + self._lookahead(state, cid)
            if fetched and self._history(state, parent, run):
                # History from before the subscription: the walk ends here.
                boundary = state.frontier.pop(cid, None)
                # Settled like a delivery (not delivered): it is a head until its children
                # come, so a node that only learned this far still links its next event here.
                self._settle_history(state, event)
                if boundary is not None:
                    self._end(state, boundary, now, out)
                children = state.waiting.pop(cid, None)
                if children:
                    self._resolve(state, children, out, now)
                return None
        if fetched and not local:  # new to this node: its children may lack it too
            self._repaired.append((state.cid, event))
        ready = self._ready(state, parent)
        if not ready and self._held >= self.config.max_pending:
            self._make_room(now, out)
            ready = self._ready(state, parent)
            if not ready and self._held >= self.config.max_pending:  # cannot happen
                ready = True  # with every held event under a gap; never hold beyond the cap
                if parent is not None:
                    bounded_put(state.released, parent, None, self.config.memo_limit)
        gap = state.frontier.pop(cid, None)
        if ready:
            if gap is not None:
                self._end(state, gap, now, out)
            self._deliver(state, [Held(event, hop)], out, now)
            return None
        assert parent is not None  # an event without a parent is always ready
        state.held[cid] = Held(event, hop, run, fetched and run > 0)
        self._held += 1
        state.waiting.setdefault(parent, []).append(cid)
        if parent in state.frontier or parent in state.held:
            if gap is not None:  # two gaps met: the older chain's gap carries on
                self._merge(state, gap, self._gap_above(state, parent), now, out)
            return None
        if gap is not None:
            gap.frontier = parent
            state.frontier[parent] = gap
            gap.failures = 0
            gap.stalled = False
            return gap
        self._open_gap(state, parent, sender, now, out, reorder=not fetched)
        return None

    def _history(self, state: TopicState, parent: CID | None, run: int) -> bool:
        """Whether a backfilled event older than the horizon, ``run`` such events in a row
        down to it, is history (settled, the walk ends) rather than held while its parent
        is fetched. A parent that is delivered makes it a delivery (what follows a
        delivered event is delivered, whatever its clock said); a held or missing one, a
        wait, until ``run`` reaches :meth:`_confirm`. (A head restored from the store
        counts as delivered, though it may have been where an earlier walk ended: then such
        a child of it is delivered, an event more from before the subscription, not lost.)"""
        if parent is None or parent in state.history:
            return True
        if parent in state.held or parent in state.frontier:
            return False  # its fate follows the parent's (delivered, or history)
        if parent in state.settled:
            return False  # delivered: so is what follows it (``_ready`` says so next)
        if self._is_delivered(state.cid, parent):
            bounded_put(state.settled, parent, None, self.config.settled_limit)
            return False
        return run >= self._confirm(state)

    def _confirm(self, state: TopicState) -> int:
        config = self.config
        return config.horizon_confirm_resumed if state.restored else config.horizon_confirm

    def _lookahead(self, state: TopicState, cid: CID) -> int:
        """The longest run of events older than the horizon that waits on ``cid`` (0: none,
        or the child waiting on it is newer): ``cid``'s gap is looking past the horizon."""
        children = state.waiting.get(cid)
        if not children:
            return 0
        held = state.held
        return max(held[c].run for c in children)

    def _settle_history(self, state: TopicState, event: EventDescriptor) -> None:
        self._settle(state, event)
        bounded_put(state.history, event.cid, None, self.config.settled_limit)

    def _resolve(self, state: TopicState, cids: list[CID], out: Out, now: float) -> int:
        """Unhold ``cids`` (whose parent is history, or will not come): the backfilled ones
        older than the horizon are history too, with the same on their own held children;
        the rest are delivered with what they unblock. Returns how many were delivered."""
        roots: list[Held] = []
        stack = self._unhold(state, cids)
        while stack:
            held = stack.pop()
            if not held.early:
                roots.append(held)
                continue
            self._settle_history(state, held.event)
            children = state.waiting.pop(held.event.cid, None)
            if children:
                stack += self._unhold(state, children)
        return self._deliver(state, roots, out, now)

    def _ready(self, state: TopicState, parent: CID | None) -> bool:
        if parent is None:
            return True
        if parent in state.held or parent in state.frontier:
            return False
        if parent in state.settled:
            return True
        if self._is_delivered(state.cid, parent):
            bounded_put(state.settled, parent, None, self.config.settled_limit)
            return True
        return False

    def _deliver(self, state: TopicState, roots: list[Held], out: Out, now: float) -> int:
        """Deliver ``roots`` and every held descendant they unblock: Kahn's algorithm with
        a heap on :func:`order_key`, so concurrent branches come out the same everywhere."""
        heap = [(order_key(h.event), h) for h in roots]
        heapq.heapify(heap)
        count = 0
        merged: list[CID] = []
        while heap:
            _, held = heapq.heappop(heap)
            event = held.event
            self._settle(state, event)
            if state.deliver:
                out.append(ev.Deliver(state.cid, event, held.hop))
            count += 1
            merged += event.merges
            children = state.waiting.pop(event.cid, None)
            if children:
                for child in self._unhold(state, children):
                    heapq.heappush(heap, (order_key(child.event), child))
        if state.deliver:
            self._counts["delivered"] += count
        if merged:
            self._follow_merges(state, merged, now, out)
        return count

    def _follow_merges(self, state: TopicState, merged: list[CID], now: float, out: Out) -> None:
        """Fetch the merged tips of delivered events that this node does not know: their
        branch is history the publisher saw and we have not (a fork whose other side we
        missed). Nothing waits on them; each is backfilled as a head a neighbour named,
        after one reorder wait, since it is most likely still on its way down the tree."""
        unknown = [m for m in merged
                   if m not in state.settled and m not in state.held and m not in state.frontier]
        if unknown:
            self._counts["merges_followed"] += len(unknown)
            out += self.learn_heads(state.cid, unknown, None, now, reorder=True)

    def _unhold(self, state: TopicState, cids: list[CID]) -> list[Held]:
        self._held -= len(cids)
        return [state.held.pop(c) for c in cids]

    def _settle(self, state: TopicState, event: EventDescriptor) -> None:
        """Record a delivered event and keep the heads: it replaces its parent and the
        tips it merges as heads, unless an event linking to it was delivered before it
        (a released gap, or a merge link that arrived first)."""
        cid = event.cid
        bounded_put(state.settled, cid, None, self.config.settled_limit)
        if event.parent is not None:
            state.heads.pop(event.parent, None)
        for merged in event.merges:
            if state.heads.pop(merged, False) is False and merged not in state.settled:
                bounded_put(state.released, merged, None, self.config.memo_limit)
        if cid in state.released:
            del state.released[cid]
        else:
            bounded_put(state.heads, cid, None, self.config.heads_limit)
        self._activate(state.cid)
