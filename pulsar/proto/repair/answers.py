"""The answers to gap fetching's requests: a neighbour's BLOCKS, a block the DHT found
(or did not), a WANT that timed out, a neighbour gone. Each is matched to the gap that
asked, its blocks are verified and taken in (only a block that *is* a frontier: a peer
cannot make us verify or hold what we did not ask for), and the gap asks again where its
chain still does not connect. Requests go out from :mod:`.gaps`; this part only calls
into it, never the other way."""

from __future__ import annotations

from dag import CID, EventDescriptor, PeerId, cid_of
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .gap_table import Fetching
from .gaps import GapFetching
from .messages import Blocks
from .state import REPAIR_HOP, Gap, Repaired, RepairOut, Unvouched
from .timers import ReconcileTimeout, RetryFetch, WantTimeout

__all__ = ["Answers"]


class Answers:
    """Answers to the WANTs and DHT fetches of one node's gaps."""

    def __init__(self, gaps: GapFetching) -> None:
        self._gaps = gaps

    def on_blocks(self, peer: PeerId, msg: Blocks, now: float) -> RepairOut:
        """A BLOCKS answer: take each block that is a frontier (newest first), then ask
        again where the chain still does not connect."""
        f = self._gaps.topics.get(msg.topic)
        if f is None:
            return []
        out: Out = []
        gap = f.wants.pop((peer, msg.head), None)
        if gap is not None and not gap.closed and gap.asked == msg.head and gap.asked_peer == peer:
            gap.asked = None
        else:
            gap = None  # a late answer: its blocks still count, the request is over
        bad = False
        taken = taken_bytes = 0
        touched: list[Gap] = []
        repaired: list[Repaired] = []
        for block in msg.blocks:
            cid = cid_of(block)
            if cid not in f.frontier:
                break  # connected, stale, or not a chain: nothing more we asked for
            event = self._gaps.verify(msg.topic, block)
            if isinstance(event, Unvouched):
                out.append(ev.StoreLocal(cid, block))  # judged again from here
                if gap is not None and gap.frontier == cid:
                    gap.asked = None  # the retry below is its next request
                self._gaps.wait_for_vouching(f.frontier[cid], now, out)
                bad = True
                break
            if event is None or event.cid != cid:
                self._gaps.invalid(f, cid, peer, now, out)
                bad = True
                break
            out.append(ev.StoreLocal(cid, block))
            self._gaps.counts["backfilled"] += 1
            taken += 1
            taken_bytes += len(block)
            moved, new = self._gaps.take(f, event, REPAIR_HOP, peer, now, out, fetched=True)
            if new:
                repaired.append(Repaired(msg.topic, event))
            if moved is not None and moved is not gap:
                touched.append(moved)
        config = self._gaps.config
        still_open = any(not g.closed for g in (gap, *touched) if g is not None)
        if (still_open and not bad and f.reconciling is None and config.reconcile
                and (taken >= config.reconcile_after
                     or taken_bytes >= config.reconcile_after_bytes)):
            # (A late answer — its WANT timed out while a version was fetched — counts too.)
            self._start_reconciling(f, msg.topic, peer, out)
        if gap is not None and not gap.closed:
            if bad or gap.frontier == msg.head:
                gap.peer = None  # this peer cannot help with this chain: the DHT can
            self._gaps.pump(f, gap, now, out)
        for other in touched:
            self._gaps.pump(f, other, now, out)
        self._gaps.unpark(f, peer, now, out)
        return [*out, *repaired]

    def _start_reconciling(self, f: Fetching, topic: CID, peer: PeerId, out: Out) -> None:
        """The gap is deeper than a walk should go: its topic reconciles with ``peer``,
        and its gaps wait (:meth:`GapFetching.pump` asks nothing while it runs)."""
        f.reconciling = peer
        f.reconcile_seq += 1
        self._gaps.counts["reconciliations"] += 1
        out.append(ev.Reconcile(topic, peer))
        out.append(ev.SetTimer(self._gaps.config.reconcile_timeout,
                               ReconcileTimeout(topic, f.reconcile_seq)))

    def on_reconciled(self, msg: ev.Reconciled, now: float) -> RepairOut:
        """Events a reconciliation fetched, in the peer's delivery order (parents first,
        so each is normally delivered at once): each is judged and taken in like a
        backfilled block. The driver passes only events whose CIDs the reconciliation
        found missing here, parsed and signature-checked. One the topic's rules refuse
        here — most often because it names a topic version this node does not know yet,
        or was published by a since-revoked publisher and nothing vouches for it yet — is
        left to the walk: the newest refused events of the answer are opened as gaps on
        that peer, and their WANTs, once the reconciliation is done, go through what
        BLOCKS answers get (the version fetched, the vouching walk; an invalid event
        dropped for good)."""
        f = self._gaps.topics.get(msg.topic)
        if f is None:
            return []
        out: Out = []
        repaired: list[Repaired] = []
        refused: list[EventDescriptor] = []
        order = f.order
        for parsed in msg.events:
            cid = parsed.cid
            if (cid in order.held or cid in order.settled
                    or (order.restored and self._gaps.causal.delivered_before(order, cid))):
                continue
            event = self._gaps.verify(msg.topic, parsed)
            if not isinstance(event, EventDescriptor):
                self._gaps.counts["reconcile_refused"] += 1
                refused.append(parsed)
                if isinstance(event, Unvouched):
                    # Kept, as a BLOCKS answer's is: history comes oldest first here, so
                    # the event that vouches for it (the revoking version's recorded
                    # head, admitted later in the session) vouches down the local store.
                    out.append(ev.StoreLocal(cid, parsed.block))
                continue
            out.append(ev.StoreLocal(cid, event.block))
            self._gaps.counts["reconciled"] += 1
            _, new = self._gaps.take(f, event, REPAIR_HOP, msg.peer, now, out, fetched=True)
            if new:
                repaired.append(Repaired(msg.topic, event))
        if refused:
            linked = {c for e in refused for c in (e.parent, *e.merges) if c is not None}
            tips = [e.cid for e in refused if e.cid not in linked]
            out += self._gaps.learn_heads(msg.topic, tips, msg.peer, now)
        if msg.done and f.reconciling == msg.peer:
            self._stop_reconciling(f, now, out)
        return [*out, *repaired]

    def on_reconcile_timeout(self, timer: ReconcileTimeout, now: float) -> Out:
        f = self._gaps.topics.get(timer.topic)
        if f is None or f.reconciling is None or timer.seq != f.reconcile_seq:
            return []
        self._gaps.counts["reconcile_timeouts"] += 1
        out: Out = []
        self._stop_reconciling(f, now, out)
        return out

    def _stop_reconciling(self, f: Fetching, now: float, out: Out) -> None:
        """The gaps that waited ask for what is still missing, as they would have."""
        f.reconciling = None
        topic = f.order.cid
        for gap in [g for g in self._gaps.table.by_id.values() if g.topic == topic]:
            if not gap.closed:
                self._gaps.pump(f, gap, now, out)

    def on_fetched(self, cid: CID, block: bytes | None, now: float) -> RepairOut:
        """The driver's answer to our ``Fetch(cid)`` (``block`` None: nobody had it)."""
        gap = self._gaps.table.fetches.pop(cid, None)
        if gap is None:
            return []
        f = self._gaps.topics.get(gap.topic)
        if f is None:
            return []
        out: Out = []
        own = not gap.closed and gap.asked == cid and gap.asked_peer is None
        if own:
            gap.asked = None
        moved: Gap | None = None
        repaired: list[Repaired] = []
        if block is not None and cid in f.frontier and cid.verifies(block):
            event = self._gaps.verify(gap.topic, block)
            if isinstance(event, Unvouched):
                out.append(ev.StoreLocal(cid, block))  # judged again from here
                waiting = f.frontier[cid]
                self._gaps.wait_for_vouching(waiting, now, out)
                if own and waiting is not gap and not gap.closed:
                    self._gaps.pump(f, gap, now, out)
                return [*out]
            if event is None or event.cid != cid:
                self._gaps.invalid(f, cid, None, now, out)
                return [*out]
            out.append(ev.StoreLocal(cid, block))
            self._gaps.counts["backfilled"] += 1
            moved, new = self._gaps.take(f, event, REPAIR_HOP, None, now, out, fetched=True)
            if new:
                repaired.append(Repaired(gap.topic, event))
        if own and not gap.closed:
            if gap.frontier != cid:
                gap.failures = 0
            else:
                gap.failures += 1
                if gap.failures > self._gaps.config.fetch_retries:
                    gap.stalled = True  # wait for the gap timeout, or a tree arrival
                else:
                    gap.retry_armed = True
                    delay = self._gaps.config.fetch_retry_delay * 2 ** (gap.failures - 1)
                    out.append(ev.SetTimer(delay, RetryFetch(gap.topic, gap.id)))
            self._gaps.pump(f, gap, now, out)
        if moved is not None and moved is not gap:
            self._gaps.pump(f, moved, now, out)
        return [*out, *repaired]

    def peer_down(self, peer: PeerId, now: float) -> Out:
        """``peer`` is gone: its WANTs will not be answered, ask the DHT instead."""
        out: Out = []
        for gap in list(self._gaps.table.by_id.values()):
            if gap.closed:
                continue
            if gap.peer == peer:
                gap.peer = None
                if gap.parked:
                    gap.parked = False
                    self._gaps.pump(self._gaps.topics[gap.topic], gap, now, out)
            if gap.asked is not None and gap.asked_peer == peer:
                f = self._gaps.topics[gap.topic]
                f.wants.pop((peer, gap.asked), None)
                gap.asked = None
                self._gaps.pump(f, gap, now, out)
        return out

    def on_want_timeout(self, timer: WantTimeout, now: float) -> Out:
        f = self._gaps.topics.get(timer.topic)
        if f is None:
            return []
        key = (timer.peer, timer.head)
        gap = f.wants.get(key)
        if gap is None or gap.id != timer.gap:
            return []
        del f.wants[key]
        out: Out = []
        if not gap.closed and gap.asked == timer.head and gap.asked_peer == timer.peer:
            self._gaps.counts["want_timeouts"] += 1
            gap.asked = None
            gap.peer = None
            self._gaps.pump(f, gap, now, out)
        self._gaps.unpark(f, timer.peer, now, out)
        return out
