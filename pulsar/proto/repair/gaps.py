"""Gap fetching: how a missing ancestor is found, and when an event is taken in.

A missing parent opens a gap whose frontier is the oldest CID still missing on its chain.
The frontier is looked up in the local store first, then asked for with one WANT from the
peer that sent the event, then fetched from the DHT one block at a time, until the chain
reaches an event that is delivered. Gaps time out (their held descendants are released and
reported), merge when two chains meet, and are bounded per topic and per node. See
:mod:`pulsar.proto.repair.backfill` for the transition table.

This part owns the gaps, the fetches in flight and the per-topic memos of what failed or
was lost. It sits above causal order (:mod:`.causal`): every event the core accepted or a
fetch brought is taken in here (:meth:`GapFetching.accepted`, ``_add``), which asks causal
order whether it is ready, holds or delivers it there, and moves the gaps accordingly.
Heads learned from anywhere (a neighbour's HEADS, a delivered event's merge links, a
restart) open gaps here too (:meth:`GapFetching.learn_heads`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from dag import CID, EventDescriptor, PeerId
from pulsar.proto import events as ev
from pulsar.proto.events import GapReported, Out
from pulsar.proto.tree.rtt import RttTable

from .causal import CausalOrder
from .gap_table import Fetching, GapTable
from .messages import Want
from .state import (
    REPAIR_HOP,
    BackfillConfig,
    Gap,
    Held,
    Lookup,
    Neighbours,
    Unvouched,
    Verify,
    bounded_put,
    event_links,
)
from .timers import GapTimeout, RetryFetch, RetryLost, WantTimeout
from .waits import have, patience, reorder_wait, want_wait

__all__ = ["RESTORE_MERGE_WALK", "GapFetching"]

RESTORE_MERGE_WALK: Final = 256
"""Events a restarted subscription reads back from its heads to find merged tips it never
got (one local store read each)."""

_PARK_SLACK = 0.001
"""A parked gap whose wait would end within this asks now (its timer firing at the very
end of the wait must not find a sliver of it left and park again)."""


def _never_coming(cid: CID) -> bool:
    return False


class GapFetching:
    """Taking events in, and fetching what they miss, for every topic of one node.

    ``lookup`` reads the local block store, ``verify`` checks a fetched block (see
    :data:`~.state.Verify`), ``neighbours`` names the peers a lost event is asked of again.
    """

    def __init__(self, config: BackfillConfig, rtt: RttTable, causal: CausalOrder,
                 lookup: Lookup, verify: Verify, neighbours: Neighbours | None) -> None:
        self.config = config
        self.rtt = rtt
        self.causal = causal
        self._lookup = lookup
        self.verify = verify
        self._neighbours = neighbours
        self.coming: Callable[[CID], bool] = _never_coming
        """Events arriving by another way (a large event's fragments, in the core): a
        neighbour's HEADS naming one opens no gap, or the event would be fetched and
        delivered before its payload is complete."""
        self.table = GapTable()
        self.topics = self.table.topics
        """The per-topic records (the table's: one name for what every method reads)."""
        self.counts: dict[str, int] = dict.fromkeys((
            "backfilled", "found_locally", "wants_sent", "want_timeouts", "fetches",
            "gaps_reported", "lost_retried", "heads_unknown", "unvouched",
            "merges_followed", "duplicates", "rejected", "reconciliations", "reconciled",
            "reconcile_refused", "reconcile_timeouts"), 0)

    # -- topics

    def fetching(self, cid: CID) -> bool:
        """Whether a ``Fetch(cid)`` of ours is outstanding (route its ``BlockFetched`` here)."""
        return cid in self.table.fetches

    def missing(self, topic: CID) -> list[CID]:
        """The frontiers of ``topic``'s open gaps: what is being fetched right now."""
        f = self.topics.get(topic)
        return [] if f is None else list(f.frontier)

    # -- taking events in

    def accepted(
        self, topic: CID, event: EventDescriptor, hop: int, sender: PeerId | None, now: float
    ) -> Out:
        """An event the core verified (CID, signatures, rights) and stored, from the tree
        (``sender``) or published here (``sender=None``). Delivers it and what it unblocks,
        or holds it and starts fetching its ancestors. The topic must be open."""
        f = self.topics[topic]
        order = f.order
        if event.cid in order.held or event.cid in order.settled:
            self.counts["duplicates"] += 1
            return []
        if order.restored and self.causal.delivered_before(order, event.cid):
            # Delivered before the restart (the log says so): a neighbour sent it again.
            self.counts["duplicates"] += 1
            return []
        out: Out = []
        gap, _ = self.take(f, event, hop, sender, now, out, fetched=False)
        if gap is not None:
            self.pump(f, gap, now, out)
        return out

    def take(
        self,
        f: Fetching,
        event: EventDescriptor,
        hop: int,
        sender: PeerId | None,
        now: float,
        out: Out,
        *,
        fetched: bool,
    ) -> tuple[Gap | None, bool]:
        """Take in a verified event that is neither held nor settled. Returns the gap whose
        frontier it moved (its caller decides what to request next) or None, and whether
        the event is part of the subscription (delivered or held) rather than history
        from before it (settled, and the walk ends)."""
        causal, order = self.causal, f.order
        cid = event.cid
        parent = event.parent
        run = 0
        if order.horizon is not None and event.created < order.horizon:
            run = 1 + causal.lookahead(order, cid)
            if fetched and causal.is_history(order, parent, run, parent in f.frontier):
                # History from before the subscription: the walk ends here.
                boundary = f.frontier.pop(cid, None)
                # Settled like a delivery (not delivered): it is a head until its children
                # come, so a node that only learned this far still links its next event here.
                causal.settle_history(order, event)
                if boundary is not None:
                    self._end(f, boundary, now, out)
                children = order.waiting.pop(cid, None)
                if children:
                    self._resolve(f, children, out, now)
                return None, False
        ready = causal.ready(order, parent, parent in f.frontier)
        if not ready and causal.held_count >= self.config.max_pending:
            self._make_room(now, out)
            ready = causal.ready(order, parent, parent in f.frontier)
            if not ready and causal.held_count >= self.config.max_pending:  # cannot happen
                ready = True  # with every held event under a gap; never hold beyond the cap
                if parent is not None:
                    bounded_put(order.released, parent, None, self.config.memo_limit)
        gap = f.frontier.pop(cid, None)
        if ready:
            if gap is not None:
                self._end(f, gap, now, out)
            self._deliver(f, [Held(event, hop)], out, now)
            return None, True
        assert parent is not None  # an event without a parent is always ready
        causal.hold(order, event, hop, run, fetched and run > 0)
        if parent in f.frontier or parent in order.held:
            if gap is not None:  # two gaps met: the older chain's gap carries on
                above = f.frontier.get(causal.gap_above(order, parent))
                self._merge(f, gap, above, now, out)
            return None, True
        if gap is not None:
            gap.frontier = parent
            f.frontier[parent] = gap
            gap.failures = 0
            gap.stalled = False
            return gap, True
        self._open_gap(f, parent, sender, now, out, reorder=not fetched)
        return None, True

    def _deliver(self, f: Fetching, roots: list[Held], out: Out, now: float) -> int:
        count, merged = self.causal.deliver(f.order, roots, out)
        if merged:
            self._follow_merges(f, merged, now, out)
        return count

    def _resolve(self, f: Fetching, cids: list[CID], out: Out, now: float) -> int:
        count, merged = self.causal.resolve(f.order, cids, out)
        if merged:
            self._follow_merges(f, merged, now, out)
        return count

    def _follow_merges(self, f: Fetching, merged: list[CID], now: float, out: Out) -> None:
        """Fetch the merged tips of delivered events that this node does not know: their
        branch is history the publisher saw and we have not (a fork whose other side we
        missed). Nothing waits on them; each is backfilled as a head a neighbour named,
        after one reorder wait, since it is most likely still on its way down the tree."""
        order = f.order
        unknown = [m for m in merged
                   if m not in order.settled and m not in order.held and m not in f.frontier]
        if unknown:
            self.counts["merges_followed"] += len(unknown)
            out += self.learn_heads(order.cid, unknown, None, now, reorder=True)

    def missing_merges(self, topic: CID, now: float) -> Out:
        """After a restart: the merged tips that the last events delivered before it link
        to and that were never delivered. Their fetches (gaps opened when the linking
        event was delivered) died with the process, and nothing else names them again: a
        merged tip is nobody's head. The walk reads the local store back from the restored
        heads, at most :data:`RESTORE_MERGE_WALK` events."""
        order = self.topics[topic].order
        if not order.restored:
            return []
        stack = list(order.heads)
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
                if merged not in order.settled and not self.causal.in_log(order, merged):
                    wanted.append(merged)
            if links.parent is not None:
                stack.append(links.parent)
        return self.learn_heads(topic, wanted, None, now) if wanted else []

    def learn_heads(
        self, topic: CID, heads: Iterable[CID], peer: PeerId | None, now: float,
        *, reorder: bool = False,
    ) -> Out:
        """Heads learned from ``peer`` (None: from the DHT's heads records): open a gap
        for each one we do not know, asking that peer first (or the DHT)."""
        f = self.topics.get(topic)
        if f is None:
            return []
        order = f.order
        out: Out = []
        for head in heads:
            gap = f.frontier.get(head)
            if gap is not None and gap.peer is None and peer is not None:
                gap.peer = peer  # a neighbour has it: its next request is a WANT, not the DHT
            if head in order.settled or head in order.held or gap is not None:
                continue
            if self.coming(head):
                continue
            until = f.failed.get(head)
            if until is not None:
                if until > now:
                    continue
                del f.failed[head]
            if self.causal.delivered_before(order, head):
                continue
            self.counts["heads_unknown"] += 1
            self._open_gap(f, head, peer, now, out, reorder=reorder)
        return out

    # -- gaps and their requests

    def _open_gap(
        self, f: Fetching, missing: CID, peer: PeerId | None, now: float, out: Out,
        *, reorder: bool = False,
    ) -> Gap:
        """A new gap below ``missing``. With ``reorder`` (opened by an event that came
        down the tree, or by a neighbour's HEADS) its first request waits the sender's
        RTO: the missing event is most likely on its way over another path (down the
        tree, a lazy or grafted link), and asking at once makes its copy arrive twice."""
        while len(f.frontier) >= self.config.max_topic_gaps:
            self._drop(min(f.frontier.values(), key=lambda g: g.id), "evicted", now, out)
        while len(self.table.by_id) >= self.config.max_gaps:
            self._drop(next(iter(self.table.by_id.values())), "evicted", now, out)
        gap = self.table.new(f, missing, now, peer, patience(self.config, self.rtt, peer))
        self._arm(gap, gap.patience, out)
        wait = reorder_wait(self.config, self.rtt, peer) if reorder else 0.0
        if wait > 0.0:
            gap.retry_armed = True
            out.append(ev.SetTimer(wait, RetryFetch(gap.topic, gap.id)))
        self.pump(f, gap, now, out)
        return gap

    def pump(self, f: Fetching, gap: Gap, now: float, out: Out) -> None:
        """Issue the gap's next request unless one is in flight: the local store first
        (walking back as long as it has the blocks), then a WANT, then the DHT."""
        if f.reconciling is not None:
            return  # the reconciliation brings the history in; asked again when it ends
        while not (gap.closed or gap.asked is not None or gap.retry_armed or gap.stalled):
            cid = gap.frontier
            block = self._lookup(cid)
            if block is not None:
                event = self.verify(gap.topic, block)
                if isinstance(event, Unvouched):
                    self.wait_for_vouching(gap, now, out)
                    return
                if event is not None and event.cid == cid:
                    self.counts["found_locally"] += 1
                    self.take(f, event, REPAIR_HOP, None, now, out, fetched=True)
                    continue
            if gap.peer is not None and self._park(f, gap, now, out):
                return
            gap.parked = False
            gap.asked = cid
            gap.asked_peer = gap.peer
            if gap.peer is None:
                self.table.fetches[cid] = gap
                self.counts["fetches"] += 1
                out.append(ev.Fetch(cid))
                return
            gap.asked_at = now
            self._want(f, gap, gap.peer, cid, out)
            return

    def _park(self, f: Fetching, gap: Gap, now: float, out: Out) -> bool:
        """Whether ``gap`` waits for a WANT already in flight to its peer for this topic.

        The chains a restarted node misses share most of their ancestors, and one WANT per
        head brought those ancestors once per head (3,483 of the churn scenario's 4,686
        answered blocks were duplicates); asked once that answer is in, a gap's frontier
        has often arrived already. It waits at most the peer's RTO after that WANT left
        (``want_timeout`` / 4 unmeasured): a WANT lost on the way must not hold up the
        others until its own timeout (the simulator's loss runs then released gaps by
        timeout that had been repaired in time)."""
        rto = self.rtt.worst_rto({gap.peer}) if gap.peer is not None else None
        limit = rto if rto is not None else self.config.want_timeout / 4
        sent = self.table.wants_to(f, gap.peer, gap)
        wait = min((at + limit - now for at in sent), default=0.0)
        if wait <= _PARK_SLACK:
            return False  # nothing in flight, or overdue: ask now
        gap.parked = True
        gap.retry_armed = True
        out.append(ev.SetTimer(wait, RetryFetch(gap.topic, gap.id)))
        return True

    def unpark(self, f: Fetching, peer: PeerId, now: float, out: Out) -> None:
        """A WANT to ``peer`` is over: the oldest gap waiting to ask it goes next."""
        for gap in list(f.frontier.values()):
            if gap.parked and gap.peer == peer and not gap.closed:
                gap.parked = False
                gap.retry_armed = False  # its wait timer, when it fires, finds it asked
                self.pump(f, gap, now, out)
                if gap.asked is not None:
                    return

    def _want(self, f: Fetching, gap: Gap, peer: PeerId, cid: CID, out: Out) -> None:
        order = f.order
        f.wants[(peer, cid)] = gap
        self.counts["wants_sent"] += 1
        run = self.causal.lookahead(order, cid)
        if run:
            # Looking past the horizon: just the blocks that decide, in one answer (with
            # ``after`` it would stop at each one older than the horizon).
            limit = min(self.config.want_limit, max(1, self.causal.confirm(order) - run))
            want = Want(order.cid, cid, limit, have(self.config, order), None)
        else:
            want = Want(order.cid, cid, self.config.want_limit, have(self.config, order),
                        order.horizon)
        out.append(ev.Send(peer, want))
        timeout = WantTimeout(order.cid, gap.id, peer, cid)
        out.append(ev.SetTimer(want_wait(self.config, self.rtt, peer), timeout))

    def _merge(self, f: Fetching, gap: Gap, into: Gap | None, now: float, out: Out) -> None:
        """``gap``'s chain now hangs under ``into``: close it, and let ``into`` time out no
        later than ``gap`` would have, so merging never extends how long events wait."""
        self._end(f, gap, now, out)
        if into is not None and gap.since < into.since:
            into.since = gap.since
            self._arm(into, max(0.0, into.since + into.patience - now), out)

    def _arm(self, gap: Gap, delay: float, out: Out) -> None:
        self.table.arm(gap, delay, out)

    def _end(self, f: Fetching, gap: Gap, now: float, out: Out) -> None:
        """``gap`` is over (its chain connected): close it, and if it had a WANT in flight
        the next gap waiting to ask that peer goes."""
        asked = gap.asked_peer if gap.asked is not None else None
        self._close(gap)
        if asked is not None:
            self.unpark(f, asked, now, out)

    def _close(self, gap: Gap) -> None:
        self.table.close(gap)

    # -- giving up, and bounds

    def _release(self, f: Fetching, gap: Gap, out: Out, now: float) -> int:
        """Deliver what waits on ``gap`` as if its frontier had been delivered (it is not:
        if it comes later it is delivered then). Backfilled events older than the horizon
        are settled as history instead, as they were before the look-ahead past it."""
        count, merged = self.causal.release(f.order, gap.frontier, out)
        if merged:
            self._follow_merges(f, merged, now, out)
        return count

    def _inconclusive(self, f: Fetching, gap: Gap, now: float, out: Out) -> bool:
        """A gap that only looks past the horizon (everything waiting on it is older than
        the horizon) and cannot go on — timed out, evicted, an invalid block, overflow —
        ends as the horizon alone would have ended it: its backfilled events are settled
        as history, the others (tree arrivals) delivered. Nothing is reported and nothing
        is asked for again: it is no gap in what the subscription promised."""
        if not self.causal.waits_only_past_horizon(f.order, gap.frontier):
            return False
        self._release(f, gap, out, now)
        self._end(f, gap, now, out)
        return True

    def _report(self, gap: Gap, released: int, reason: str, out: Out) -> None:
        self.counts["gaps_reported"] += 1
        out.append(GapReported(gap.topic, gap.frontier, gap.since, released, reason))

    def _drop(self, gap: Gap, reason: str, now: float, out: Out) -> None:
        """Give up on ``gap``: release and report it, and do not ask for it again soon."""
        f = self.topics[gap.topic]
        if self._inconclusive(f, gap, now, out):
            return
        released = self._release(f, gap, out, now)
        self._report(gap, released, reason, out)
        self._end(f, gap, now, out)
        until = now + self.config.retry_heads_after
        bounded_put(f.failed, gap.frontier, until, self.config.memo_limit)
        if reason == "invalid":
            return
        attempt = f.lost.get(gap.frontier, 0)
        if attempt < self.config.lost_retries:
            bounded_put(f.lost, gap.frontier, attempt + 1, self.config.memo_limit)
            delay = self.config.retry_heads_after * (1 << attempt)
            out.append(ev.SetTimer(delay, RetryLost(gap.topic, gap.frontier)))

    def wait_for_vouching(self, gap: Gap, now: float, out: Out) -> None:
        """The frontier is a well-formed event whose publisher may no longer publish, and
        nothing vouches for it yet (:class:`~.state.Unvouched`). A walk from the head the
        revoking version recorded may still get there, and admitting that head's
        descendants vouches for it: so its children stay held and it is judged again (from
        the local store, where it is kept) after the fetch backoff, capped at its third
        step, for ``vouch_patience`` from the first refusal; the gap's timeout is put off
        as long (releasing the children would deliver them before their parent, which the
        walk may be about to vouch for: the 25-node seed 9 did so twice at the plain
        timeout). Then the gap times out like one whose block nobody has."""
        self.counts["unvouched"] += 1
        if gap.unvouched_since is None:
            gap.unvouched_since = now
        gap.asked = None
        gap.failures += 1
        if now - gap.unvouched_since >= self.config.vouch_patience:
            gap.stalled = True  # the gap's timeout decides now
            return
        gap.retry_armed = True
        delay = self.config.fetch_retry_delay * 2 ** min(gap.failures - 1, 2)
        out.append(ev.SetTimer(delay, RetryFetch(gap.topic, gap.id)))

    def invalid(self, f: Fetching, cid: CID, peer: PeerId | None, now: float, out: Out) -> None:
        """The block that *is* ``cid`` fails verification: nobody can give us a valid one,
        so the gap is dropped at once rather than at its timeout."""
        self.counts["rejected"] += 1
        out.append(ev.Rejected(peer, f"backfilled block {cid} is not a valid event of the topic"))
        gap = f.frontier.get(cid)
        if gap is not None:
            self._drop(gap, "invalid", now, out)
            f.failed[cid] = float("inf")

    def _make_room(self, now: float, out: Out) -> None:
        """``max_pending`` reached: release the oldest gaps that hold events until one
        fits. Their fetches go on; what arrives later is delivered when it connects."""
        while self.causal.held_count >= self.config.max_pending:
            victim: Gap | None = None
            for gap in self.table.by_id.values():
                if self.topics[gap.topic].order.waiting.get(gap.frontier) and (
                    victim is None or gap.since < victim.since
                ):
                    victim = gap
            if victim is None:
                return
            f = self.topics[victim.topic]
            if self._inconclusive(f, victim, now, out):
                continue
            released = self._release(f, victim, out, now)
            self._report(victim, released, "overflow", out)
            victim.since = now
            self._arm(victim, victim.patience, out)

    # -- timers

    def on_retry_fetch(self, timer: RetryFetch, now: float) -> Out:
        gap = self.table.by_id.get(timer.gap)
        if gap is None:
            return []
        gap.retry_armed = False
        out: Out = []
        self.pump(self.topics[gap.topic], gap, now, out)
        return out

    def on_retry_lost(self, timer: RetryLost, now: float) -> Out:
        """Ask again for the missing event of a gap given up on: from a tree neighbour
        first (a different one each attempt), else the DHT."""
        f = self.topics.get(timer.topic)
        cid = timer.cid
        if f is None or cid in f.order.settled or cid in f.order.held or cid in f.frontier:
            return []
        if self.causal.in_log(f.order, cid):
            return []
        f.failed.pop(cid, None)
        neighbours = sorted(self._neighbours(timer.topic), key=bytes) if self._neighbours else []
        peer = neighbours[f.lost.get(cid, 0) % len(neighbours)] if neighbours else None
        self.counts["lost_retried"] += 1
        out: Out = []
        self._open_gap(f, cid, peer, now, out)
        return out

    def on_gap_timeout(self, timer: GapTimeout, now: float) -> Out:
        gap = self.table.by_id.get(timer.gap)
        if gap is None or timer.seq != gap.timer_seq:
            return []  # closed, or superseded by a timer for a moved deadline
        out: Out = []
        f = self.topics[gap.topic]
        if f.reconciling is not None:  # held back by design, not lost: wait for it
            self._arm(gap, gap.patience, out)
            return out
        if self._inconclusive(f, gap, now, out):
            return out
        if gap.unvouched_since is not None and not gap.stalled:
            waited = now - gap.unvouched_since
            if waited < self.config.vouch_patience:  # the vouching walk may still come
                self._arm(gap, self.config.vouch_patience - waited, out)
                return out
        if gap.asked is None and not gap.retry_armed:  # (a parked gap's wait is armed)
            self._drop(gap, "timeout", now, out)  # stalled: nothing more is coming
            return out
        if gap.asked is not None and gap.asked_peer is None and not gap.waited_for_dht:
            gap.waited_for_dht = True  # a DHT get is in flight: its answer may be due
            self._arm(gap, self.config.dht_patience, out)
            return out
        released = self._release(f, gap, out, now)
        if released:
            self._report(gap, released, "timeout", out)
        gap.since = now  # still fetching: late ancestors are delivered when they come
        self._arm(gap, gap.patience, out)
        return out
