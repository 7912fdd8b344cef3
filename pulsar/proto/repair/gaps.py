"""Gap fetching: how a missing ancestor is found.

A missing parent opens a gap whose frontier is the oldest CID still missing on its chain.
The frontier is looked up in the local store first, then asked for with one WANT from the
peer that sent the event, then fetched from the DHT one block at a time, until the chain
reaches an event that is delivered. Gaps time out (their held descendants are released and
reported), merge when two chains meet, and are bounded per topic and per node. See
:mod:`pulsar.proto.repair.backfill` for the transition table.
"""

from __future__ import annotations

from dag import CID, PeerId, cid_of
from pulsar.proto import events as ev
from pulsar.proto.events import GapReported, Out

from .messages import MAX_HAVE, Blocks, Want
from .state import (
    REPAIR_HOP,
    BackfillParts,
    Gap,
    TopicState,
    Unvouched,
    bounded_put,
)
from .timers import GapTimeout, RetryFetch, RetryLost, WantTimeout

__all__ = ["GapFetching"]

_PARK_SLACK = 0.001
"""A parked gap whose wait would end within this asks now (its timer firing at the very
end of the wait must not find a sliver of it left and park again)."""


class GapFetching(BackfillParts):
    """The gap-fetching part of :class:`~pulsar.proto.repair.backfill.Backfill`: local store, WANT,
    DHT, timeouts and bounds."""

    def fetching(self, cid: CID) -> bool:
        """Whether a ``Fetch(cid)`` of ours is outstanding (route its ``BlockFetched`` here)."""
        return cid in self._fetches

    def missing(self, topic: CID) -> list[CID]:
        """The frontiers of ``topic``'s open gaps: what is being fetched right now."""
        state = self._topics.get(topic)
        return [] if state is None else list(state.frontier)

    def on_blocks(self, peer: PeerId, msg: Blocks, now: float) -> Out:
        """A BLOCKS answer: take each block that is a frontier (newest first), then ask
        again where the chain still does not connect."""
        state = self._topics.get(msg.topic)
        if state is None:
            return []
        out: Out = []
        gap = state.wants.pop((peer, msg.head), None)
        if gap is not None and not gap.closed and gap.asked == msg.head and gap.asked_peer == peer:
            gap.asked = None
        else:
            gap = None  # a late answer: its blocks still count, the request is over
        bad = False
        touched: list[Gap] = []
        for block in msg.blocks:
            cid = cid_of(block)
            if cid not in state.frontier:
                break  # connected, stale, or not a chain: nothing more we asked for
            event = self._verify(state.cid, block)
            if isinstance(event, Unvouched):
                out.append(ev.StoreLocal(cid, block))  # judged again from here
                if gap is not None and gap.frontier == cid:
                    gap.asked = None  # the retry below is its next request
                self._wait_for_vouching(state.frontier[cid], now, out)
                bad = True
                break
            if event is None or event.cid != cid:
                self._invalid(state, cid, peer, now, out)
                bad = True
                break
            out.append(ev.StoreLocal(cid, block))
            self._counts["backfilled"] += 1
            moved = self._add(state, event, REPAIR_HOP, peer, now, out, fetched=True)
            if moved is not None and moved is not gap:
                touched.append(moved)
        if gap is not None and not gap.closed:
            if bad or gap.frontier == msg.head:
                gap.peer = None  # this peer cannot help with this chain: the DHT can
            self._pump(state, gap, now, out)
        for other in touched:
            self._pump(state, other, now, out)
        self._unpark(state, peer, now, out)
        return out

    def on_fetched(self, cid: CID, block: bytes | None, now: float) -> Out:
        """The driver's answer to our ``Fetch(cid)`` (``block`` None: nobody had it)."""
        gap = self._fetches.pop(cid, None)
        if gap is None:
            return []
        state = self._topics.get(gap.topic)
        if state is None:
            return []
        out: Out = []
        own = not gap.closed and gap.asked == cid and gap.asked_peer is None
        if own:
            gap.asked = None
        moved: Gap | None = None
        if block is not None and cid in state.frontier and cid.verifies(block):
            event = self._verify(state.cid, block)
            if isinstance(event, Unvouched):
                out.append(ev.StoreLocal(cid, block))  # judged again from here
                waiting = state.frontier[cid]
                self._wait_for_vouching(waiting, now, out)
                if own and waiting is not gap and not gap.closed:
                    self._pump(state, gap, now, out)
                return out
            if event is None or event.cid != cid:
                self._invalid(state, cid, None, now, out)
                return out
            out.append(ev.StoreLocal(cid, block))
            self._counts["backfilled"] += 1
            moved = self._add(state, event, REPAIR_HOP, None, now, out, fetched=True)
        if own and not gap.closed:
            if gap.frontier != cid:
                gap.failures = 0
            else:
                gap.failures += 1
                if gap.failures > self.config.fetch_retries:
                    gap.stalled = True  # wait for the gap timeout, or a tree arrival
                else:
                    gap.retry_armed = True
                    delay = self.config.fetch_retry_delay * 2 ** (gap.failures - 1)
                    out.append(ev.SetTimer(delay, RetryFetch(gap.topic, gap.id)))
            self._pump(state, gap, now, out)
        if moved is not None and moved is not gap:
            self._pump(state, moved, now, out)
        return out

    def peer_down(self, peer: PeerId, now: float) -> Out:
        """``peer`` is gone: its WANTs will not be answered, ask the DHT instead."""
        out: Out = []
        for gap in list(self._gaps.values()):
            if gap.closed:
                continue
            if gap.peer == peer:
                gap.peer = None
                if gap.parked:
                    gap.parked = False
                    self._pump(self._topics[gap.topic], gap, now, out)
            if gap.asked is not None and gap.asked_peer == peer:
                state = self._topics[gap.topic]
                state.wants.pop((peer, gap.asked), None)
                gap.asked = None
                self._pump(state, gap, now, out)
        for state in self._topics.values():
            state.sent.pop(peer, None)
        return out

    def _open_gap(
        self, state: TopicState, missing: CID, peer: PeerId | None, now: float, out: Out,
        *, reorder: bool = False,
    ) -> Gap:
        """A new gap below ``missing``. With ``reorder`` (opened by an event that came
        down the tree, or by a neighbour's HEADS) its first request waits the sender's
        RTO: the missing event is most likely on its way over another path (down the
        tree, a lazy or grafted link), and asking at once makes its copy arrive twice."""
        while len(state.frontier) >= self.config.max_topic_gaps:
            self._drop(min(state.frontier.values(), key=lambda g: g.id), "evicted", now, out)
        while len(self._gaps) >= self.config.max_gaps:
            self._drop(next(iter(self._gaps.values())), "evicted", now, out)
        gap = Gap(self._next_gap, state.cid, missing, now, peer,
                  patience=self._patience(peer))
        self._next_gap += 1
        self._gaps[gap.id] = gap
        state.frontier[missing] = gap
        self._arm(gap, gap.patience, out)
        wait = self._reorder_wait(peer) if reorder else 0.0
        if wait > 0.0:
            gap.retry_armed = True
            out.append(ev.SetTimer(wait, RetryFetch(gap.topic, gap.id)))
        self._pump(state, gap, now, out)
        return gap

    def _patience(self, peer: PeerId | None) -> float:
        """How long a gap opened from ``peer`` holds delivery back: its repair's steps
        follow that path's RTO, so a gap timeout shorter than they take releases events
        whose parent is still on its way (in the testbed's order scenario every order
        violation was a parent that came 2-20 s after a 5 s timeout, from a busy author
        whose RTO had grown to over 2 s)."""
        config = self.config
        rto = None if peer is None else self.rtt.worst_rto({peer})
        if rto is None:
            return config.gap_timeout
        return min(max(config.gap_timeout, config.gap_rtts * rto),
                   max(config.gap_timeout, config.max_gap_timeout))

    def _reorder_wait(self, peer: PeerId | None) -> float:
        """How long a gap opened by a tree arrival from ``peer`` waits before its first
        request: the RTO of that path (0 while nothing is measured), at most half the gap
        timeout. With no peer (a merged tip, which may come from any side of the tree),
        the longest RTO among the neighbours measured lately."""
        rto = self.rtt.worst_rto(frozenset() if peer is None else {peer})
        return 0.0 if rto is None else min(rto, self.config.gap_timeout / 2)

    def _pump(self, state: TopicState, gap: Gap, now: float, out: Out) -> None:
        """Issue the gap's next request unless one is in flight: the local store first
        (walking back as long as it has the blocks), then a WANT, then the DHT."""
        while not (gap.closed or gap.asked is not None or gap.retry_armed or gap.stalled):
            cid = gap.frontier
            block = self._lookup(cid)
            if block is not None:
                event = self._verify(state.cid, block)
                if isinstance(event, Unvouched):
                    self._wait_for_vouching(gap, now, out)
                    return
                if event is not None and event.cid == cid:
                    self._counts["found_locally"] += 1
                    self._add(state, event, REPAIR_HOP, None, now, out, fetched=True,
                              local=True)
                    continue
            if gap.peer is not None and self._park(state, gap, now, out):
                return
            gap.parked = False
            gap.asked = cid
            gap.asked_peer = gap.peer
            if gap.peer is None:
                self._fetches[cid] = gap
                self._counts["fetches"] += 1
                out.append(ev.Fetch(cid))
                return
            gap.asked_at = now
            self._want(state, gap, gap.peer, cid, out)
            return

    def _park(self, state: TopicState, gap: Gap, now: float, out: Out) -> bool:
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
        sent = [other.asked_at for (peer, _), other in state.wants.items()
                if peer == gap.peer and other is not gap]
        wait = min((at + limit - now for at in sent), default=0.0)
        if wait <= _PARK_SLACK:
            return False  # nothing in flight, or overdue: ask now
        gap.parked = True
        gap.retry_armed = True
        out.append(ev.SetTimer(wait, RetryFetch(gap.topic, gap.id)))
        return True

    def _unpark(self, state: TopicState, peer: PeerId, now: float, out: Out) -> None:
        """A WANT to ``peer`` is over: the oldest gap waiting to ask it goes next."""
        for gap in list(state.frontier.values()):
            if gap.parked and gap.peer == peer and not gap.closed:
                gap.parked = False
                gap.retry_armed = False  # its wait timer, when it fires, finds it asked
                self._pump(state, gap, now, out)
                if gap.asked is not None:
                    return

    def _want(self, state: TopicState, gap: Gap, peer: PeerId, cid: CID, out: Out) -> None:
        state.wants[(peer, cid)] = gap
        self._counts["wants_sent"] += 1
        run = self._lookahead(state, cid)
        if run:
            # Looking past the horizon: just the blocks that decide, in one answer (with
            # ``after`` it would stop at each one older than the horizon).
            limit = min(self.config.want_limit, max(1, self._confirm(state) - run))
            want = Want(state.cid, cid, limit, self._have(state), None)
        else:
            want = Want(state.cid, cid, self.config.want_limit, self._have(state),
                        state.horizon)
        out.append(ev.Send(peer, want))
        timeout = WantTimeout(state.cid, gap.id, peer, cid)
        wait = self.config.want_timeout
        rto = self.rtt.worst_rto({peer})
        if rto is not None:
            wait = min(max(wait, self.config.want_rtts * rto), self.config.max_want_timeout)
        out.append(ev.SetTimer(wait, timeout))

    def _have(self, state: TopicState) -> tuple[CID, ...]:
        """Where a WANT's answer may stop: our newest heads, then our most recently
        delivered events (the parent of a missing event is most likely among them)."""
        count = self.config.have_count
        have: dict[CID, None] = dict.fromkeys(list(state.heads)[-count:] if count else ())
        limit = min(MAX_HAVE, len(have) + self.config.have_recent)
        for cid in reversed(state.settled):
            if len(have) >= limit:
                break
            have[cid] = None
        return tuple(have)

    def _gap_above(self, state: TopicState, cid: CID) -> Gap | None:
        """The gap a held or frontier CID waits on: follow held parents to the frontier."""
        while cid in state.held:
            parent = state.held[cid].event.parent
            assert parent is not None
            cid = parent
        return state.frontier.get(cid)

    def _merge(self, state: TopicState, gap: Gap, into: Gap | None, now: float, out: Out) -> None:
        """``gap``'s chain now hangs under ``into``: close it, and let ``into`` time out no
        later than ``gap`` would have, so merging never extends how long events wait."""
        self._end(state, gap, now, out)
        if into is not None and gap.since < into.since:
            into.since = gap.since
            self._arm(into, max(0.0, into.since + into.patience - now), out)

    def _arm(self, gap: Gap, delay: float, out: Out) -> None:
        gap.timer_seq += 1
        out.append(ev.SetTimer(delay, GapTimeout(gap.topic, gap.id, gap.timer_seq)))

    def _end(self, state: TopicState, gap: Gap, now: float, out: Out) -> None:
        """``gap`` is over (its chain connected): close it, and if it had a WANT in flight
        the next gap waiting to ask that peer goes."""
        asked = gap.asked_peer if gap.asked is not None else None
        self._close(gap)
        if asked is not None:
            self._unpark(state, asked, now, out)

    def _close(self, gap: Gap) -> None:
        if gap.closed:
            return
        gap.closed = True
        self._gaps.pop(gap.id, None)
        state = self._topics.get(gap.topic)
        if state is not None and state.frontier.get(gap.frontier) is gap:
            del state.frontier[gap.frontier]
        if state is not None and gap.asked is not None and gap.asked_peer is not None:
            key = (gap.asked_peer, gap.asked)
            if state.wants.get(key) is gap:
                del state.wants[key]  # its answer still counts if it comes (as a late one)

    def _release(self, state: TopicState, gap: Gap, out: Out, now: float) -> int:
        """Deliver what waits on ``gap`` as if its frontier had been delivered (it is not:
        if it comes later it is delivered then). Backfilled events older than the horizon
        are settled as history instead, as they were before the look-ahead past it."""
        children = state.waiting.pop(gap.frontier, None)
        if not children:
            return 0
        bounded_put(state.released, gap.frontier, None, self.config.memo_limit)
        return self._resolve(state, children, out, now)

    def _inconclusive(self, state: TopicState, gap: Gap, now: float, out: Out) -> bool:
        """A gap that only looks past the horizon (everything waiting on it is older than
        the horizon) and cannot go on — timed out, evicted, an invalid block, overflow —
        ends as the horizon alone would have ended it: its backfilled events are settled
        as history, the others (tree arrivals) delivered. Nothing is reported and nothing
        is asked for again: it is no gap in what the subscription promised."""
        children = state.waiting.get(gap.frontier)
        if not children or not all(state.held[c].run for c in children):
            return False
        self._release(state, gap, out, now)
        self._end(state, gap, now, out)
        return True

    def _report(self, gap: Gap, released: int, reason: str, out: Out) -> None:
        self._counts["gaps_reported"] += 1
        out.append(GapReported(gap.topic, gap.frontier, gap.since, released, reason))

    def _drop(self, gap: Gap, reason: str, now: float, out: Out) -> None:
        """Give up on ``gap``: release and report it, and do not ask for it again soon."""
        state = self._topics[gap.topic]
        if self._inconclusive(state, gap, now, out):
            return
        released = self._release(state, gap, out, now)
        self._report(gap, released, reason, out)
        self._end(state, gap, now, out)
        until = now + self.config.retry_heads_after
        bounded_put(state.failed, gap.frontier, until, self.config.memo_limit)
        if reason == "invalid":
            return
        attempt = state.lost.get(gap.frontier, 0)
        if attempt < self.config.lost_retries:
            bounded_put(state.lost, gap.frontier, attempt + 1, self.config.memo_limit)
            delay = self.config.retry_heads_after * (1 << attempt)
            out.append(ev.SetTimer(delay, RetryLost(gap.topic, gap.frontier)))

    def _on_retry_lost(self, timer: RetryLost, now: float) -> Out:
        """Ask again for the missing event of a gap given up on: from a tree neighbour
        first (a different one each attempt), else the DHT."""
        state = self._topics.get(timer.topic)
        cid = timer.cid
        if state is None or cid in state.settled or cid in state.held or cid in state.frontier:
            return []
        if self._is_delivered(state.cid, cid):
            return []
        state.failed.pop(cid, None)
        neighbours = sorted(self._neighbours(state.cid), key=bytes) if self._neighbours else []
        peer = neighbours[state.lost.get(cid, 0) % len(neighbours)] if neighbours else None
        self._counts["lost_retried"] += 1
        out: Out = []
        self._open_gap(state, cid, peer, now, out)
        return out

    def _wait_for_vouching(self, gap: Gap, now: float, out: Out) -> None:
        """The frontier is a well-formed event whose publisher may no longer publish, and
        nothing vouches for it yet (:class:`Unvouched`). A walk from the head the revoking
        version recorded may still get there, and admitting that head's descendants vouches
        for it: so its children stay held and it is judged again (from the local store,
        where it is kept) after the fetch backoff, capped at its third step, for
        ``vouch_patience`` from the first refusal; the gap's timeout is put off as long
        (releasing the children would deliver them before their parent, which the walk
        may be about to vouch for: the 25-node seed 9 did so twice at the plain timeout).
        Then the gap times out like one whose block nobody has."""
        self._counts["unvouched"] += 1
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

    def _invalid(
        self, state: TopicState, cid: CID, peer: PeerId | None, now: float, out: Out
    ) -> None:
        """The block that *is* ``cid`` fails verification: nobody can give us a valid one,
        so the gap is dropped at once rather than at its timeout."""
        self._counts["rejected"] += 1
        out.append(ev.Rejected(peer, f"backfilled block {cid} is not a valid event of the topic"))
        gap = state.frontier.get(cid)
        if gap is not None:
            self._drop(gap, "invalid", now, out)
            state.failed[cid] = float("inf")

    def _make_room(self, now: float, out: Out) -> None:
        """``max_pending`` reached: release the oldest gaps that hold events until one
        fits. Their fetches go on; what arrives later is delivered when it connects."""
        while self._held >= self.config.max_pending:
            victim: Gap | None = None
            for gap in self._gaps.values():
                if self._topics[gap.topic].waiting.get(gap.frontier) and (
                    victim is None or gap.since < victim.since
                ):
                    victim = gap
            if victim is None:
                return
            if self._inconclusive(self._topics[victim.topic], victim, now, out):
                continue
            released = self._release(self._topics[victim.topic], victim, out, now)
            self._report(victim, released, "overflow", out)
            victim.since = now
            self._arm(victim, victim.patience, out)

    def _on_gap_timeout(self, timer: GapTimeout, now: float) -> Out:
        gap = self._gaps.get(timer.gap)
        if gap is None or timer.seq != gap.timer_seq:
            return []  # closed, or superseded by a timer for a moved deadline
        out: Out = []
        state = self._topics[gap.topic]
        if self._inconclusive(state, gap, now, out):
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
        released = self._release(state, gap, out, now)
        if released:
            self._report(gap, released, "timeout", out)
        gap.since = now  # still fetching: late ancestors are delivered when they come
        self._arm(gap, gap.patience, out)
        return out

    def _on_want_timeout(self, timer: WantTimeout, now: float) -> Out:
        state = self._topics.get(timer.topic)
        if state is None:
            return []
        key = (timer.peer, timer.head)
        gap = state.wants.get(key)
        if gap is None or gap.id != timer.gap:
            return []
        del state.wants[key]
        out: Out = []
        if not gap.closed and gap.asked == timer.head and gap.asked_peer == timer.peer:
            self._counts["want_timeouts"] += 1
            gap.asked = None
            gap.peer = None
            self._pump(state, gap, now, out)
        self._unpark(state, timer.peer, now, out)
        return out
