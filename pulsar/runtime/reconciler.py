"""Catch-up by range-based set reconciliation: the node's side of RECON / RWANT / RBLOCKS
(docs/protocol.md §12; the pure step is :mod:`pulsar.proto.reconcile.ranges`).

The core decides *when*: backfill emits :class:`~pulsar.proto.events.Reconcile` when a
WANT answer showed a gap too deep to walk (``BackfillConfig.reconcile_after``), and the
topic's gaps wait. This room carries it out: it indexes the topic's delivery log by
``(created_ms, CID)``, exchanges RECON rounds with the peer until it knows which of the
peer's events it lacks, fetches them with RWANT in the peer's delivery order (a window of
requests in flight, so the transfer is not one round trip per batch), and hands each
answer's blocks to the core (:class:`~pulsar.proto.events.Reconciled`), which verifies
and delivers them as it does backfilled blocks. Whatever happens — done, a timeout, the
peer gone, a bad answer — the core is told ``done``, and the gaps walk for what is still
missing. The room also answers other nodes' RECON and RWANT, from the same index and the
local block store, within a per-peer rate.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from dag import CID, EventDescriptor, InvalidDescriptor, PeerId, cid_of
from dag.descriptor_wire import parse_timestamp
from pulsar.proto import events as ev
from pulsar.proto.codec import Frame
from pulsar.proto.reconcile.items import INFINITY, ItemIndex
from pulsar.proto.reconcile.messages import MAX_ROUNDS, RBlocks, Recon, RWant
from pulsar.proto.reconcile.ranges import answer, opening
from pulsar.proto.repair.messages import MAX_ANSWER_BYTES

from .node_state import NodeState

__all__ = ["Reconciler"]

log = logging.getLogger("pulsar.node")

WANT_BATCH: Final = 256
"""CIDs per RWANT: ~320 KiB of 1 KiB events, within one answer's byte budget."""
WINDOW: Final = 16
"""RWANTs in flight per session: ~5 MiB of 1 KiB events, so a distant peer's answers
arrive back to back instead of one batch per round trip."""
ROUND_TIMEOUT: Final = 10.0
"""A session whose peer answered nothing this long ends (the gaps walk on)."""
MAX_NEED: Final = 500_000
"""Most missing events one session collects; the rest are left to the next one."""
INDEX_MAX_AGE: Final = 600.0
"""A topic's index is rebuilt from the log this often (between, it only takes in appends)."""
INDEX_PAGE: Final = 20_000
"""Log entries read per loop turn while an index is built."""
INDEXES: Final = 8
"""Topic indexes kept in memory."""
INDEX_LIMIT: Final = 1_000_000
"""Most log entries one index holds (the newest): ~150 MiB of memory at most per index.
A longer history is reconciled over its newest entries only; older holes are the walk's."""
PEER_RATE: Final = 50.0
"""RECON and RWANT answered per second per peer (burst twice that)."""
ANSWER_BYTES: Final = MAX_ANSWER_BYTES // 2


@dataclass(slots=True)
class _Asking:
    """A reconciliation this node opened."""

    topic: CID
    peer: PeerId
    session: int
    index: ItemIndex
    heard: float
    round: int = 0
    need: dict[bytes, tuple[int, CID]] = field(default_factory=dict)
    queue: deque[CID] = field(default_factory=deque)
    asked: deque[list[CID]] = field(default_factory=deque)
    fetching: bool = False
    inbox: asyncio.Queue[list[tuple[CID, bytes]] | None] = field(
        default_factory=asyncio.Queue)
    """Answers' blocks waiting to be parsed and handed to the core, in order; None ends."""
    superseded: bool = False
    """A newer session of the topic replaced it: its end is not the core's business."""


@dataclass(slots=True)
class _Cached:
    index: ItemIndex
    last_seq: int
    """The newest log position the index holds."""
    built: float
    stale: bool = False


class Reconciler:
    """Reconciliations this node asks for and answers (see the module docstring).
    ``known(topic, cid)`` is backfill's: an event delivered or held here is not fetched;
    ``horizon(topic)`` is where the topic's delivered history begins; ``linked(topic)`` the
    tree and lazy neighbours of a topic, the only peers whose RECON and RWANT are answered
    (indexing a long history costs: a stranger may not make us do it)."""

    def __init__(self, state: NodeState, local_block: Callable[[CID], bytes | None],
                 flush: Callable[[], None], send: Callable[[PeerId, Frame], None],
                 handle: Callable[[ev.InEvent], None],
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
                 known: Callable[[CID, CID], bool], horizon: Callable[[CID], str | None],
                 linked: Callable[[CID], set[PeerId]], counters: dict[str, int]) -> None:
        self._state = state
        self._local_block = local_block
        self._flush = flush
        self._send = send
        self._handle = handle
        self._spawn = spawn
        self._known = known
        self._horizon = horizon
        self._linked = linked
        self._asking: dict[tuple[PeerId, int], _Asking] = {}
        self._indexes: OrderedDict[CID, _Cached] = OrderedDict()
        self._building: dict[CID, asyncio.Task[Any]] = {}
        self._buckets: dict[PeerId, tuple[float, float]] = {}
        self.counts = counters
        for name in ("reconcile_sessions", "reconcile_rounds", "reconcile_missing",
                     "reconcile_fetched", "reconcile_answers", "reconcile_bad_blocks"):
            counters.setdefault(name, 0)

    # ------------------------------------------------------------------ asking

    def start(self, topic: CID, peer: PeerId) -> None:
        """The core's :class:`~pulsar.proto.events.Reconcile`: open a session (once the
        topic's index is ready)."""
        for key, old in list(self._asking.items()):
            if old.topic == topic:  # superseded: the core no longer waits for it
                del self._asking[key]
                old.superseded = True
                old.inbox.put_nowait(None)
        self._spawn(self._open(topic, peer))

    async def _open(self, topic: CID, peer: PeerId) -> None:
        session = secrets.randbits(32)
        try:
            index = await self._index(topic)
        except Exception:
            log.exception("reconciliation of %s: could not index the log", topic)
            self._handle(ev.Reconciled(peer, topic, (), done=True))
            return
        horizon = self._horizon(topic)
        lo = (0 if horizon is None else max(0, round(parse_timestamp(horizon) * 1000)), b"")
        asking = _Asking(topic, peer, session, index, time.monotonic())
        self._asking[(peer, session)] = asking
        self._spawn(self._hand_over(asking))
        self.counts["reconcile_sessions"] += 1
        step = opening(index, lo, INFINITY)
        self._send(peer, Recon(topic, session, 0, tuple(step.fps), tuple(step.ids)))

    def _on_reply(self, asking: _Asking, msg: Recon) -> None:
        asking.heard = time.monotonic()
        asking.round = msg.round
        self.counts["reconcile_rounds"] += 1
        step = answer(asking.index, msg.fps, msg.ids, asker=True)
        for position, cid in step.need:
            if (len(asking.need) < MAX_NEED and cid.raw not in asking.need
                    and not self._known(asking.topic, cid)):
                asking.need[cid.raw] = (position, cid)
        if step.empty or msg.round + 1 >= MAX_ROUNDS or len(asking.need) >= MAX_NEED:
            self._fetch(asking)
            return
        self._send(asking.peer, Recon(asking.topic, asking.session, msg.round + 1,
                                      tuple(step.fps), tuple(step.ids)))

    def _fetch(self, asking: _Asking) -> None:
        """The ranges are settled: fetch what is missing, in the peer's delivery order."""
        asking.fetching = True
        self.counts["reconcile_missing"] += len(asking.need)
        asking.queue.extend(cid for _, cid in sorted(asking.need.values(),
                                                     key=lambda item: item[0]))
        asking.need.clear()
        self._pump(asking)

    def _pump(self, asking: _Asking) -> None:
        while asking.queue and len(asking.asked) < WINDOW:
            batch = [asking.queue.popleft() for _ in range(min(WANT_BATCH, len(asking.queue)))]
            asking.asked.append(batch)
            self._send(asking.peer, RWant(asking.topic, asking.session, tuple(batch)))
        if not asking.queue and not asking.asked:
            self._end(asking)

    def _on_blocks(self, asking: _Asking, msg: RBlocks) -> None:
        if not asking.fetching or not asking.asked:
            return
        asking.heard = time.monotonic()
        asked = asking.asked.popleft()
        settled, rest = asked[:msg.n], asked[msg.n:]
        blocks: list[tuple[CID, bytes]] = []
        at = 0
        for block in msg.blocks:
            cid = cid_of(block)
            while at < len(settled) and settled[at] != cid:
                at += 1
            if at == len(settled):  # not asked for, or out of order: a faulty answer
                self.counts["reconcile_bad_blocks"] += 1
                asking.inbox.put_nowait(blocks)
                self._end(asking)
                return
            blocks.append((cid, block))
            at += 1
        self.counts["reconcile_fetched"] += len(blocks)
        asking.queue.extendleft(reversed(rest))
        if msg.n == 0:  # the peer cannot send even one: the walk takes over
            asking.queue.clear()
        asking.inbox.put_nowait(blocks)
        self._pump(asking)

    async def _hand_over(self, asking: _Asking) -> None:
        """Parse each answer's blocks and check their signatures on a worker thread (the
        parsing holds the interpreter lock, libsodium's checks do not: they run beside
        the event loop on the second core), then hand the events to the core in the order
        they were asked for; last, tell it the session is done."""
        try:
            while (blocks := await asking.inbox.get()) is not None:
                events = await asyncio.to_thread(_parse, blocks)
                self.counts["reconcile_bad_blocks"] += len(blocks) - len(events)
                self._handle(ev.Reconciled(asking.peer, asking.topic, tuple(events)))
        finally:
            if not asking.superseded:
                self._handle(ev.Reconciled(asking.peer, asking.topic, (), done=True))

    def _end(self, asking: _Asking) -> None:
        if self._asking.pop((asking.peer, asking.session), None) is not None:
            asking.inbox.put_nowait(None)

    # ------------------------------------------------------------------ answering

    def on_frame(self, peer: PeerId, msg: Recon | RWant | RBlocks) -> None:
        asking = self._asking.get((peer, msg.session))
        if asking is not None and asking.topic == msg.topic:
            if isinstance(msg, Recon):
                self._on_reply(asking, msg)
            elif isinstance(msg, RBlocks):
                self._on_blocks(asking, msg)
            return
        if isinstance(msg, RBlocks) or (isinstance(msg, Recon) and msg.round % 2):
            return  # an answer to a session of ours that ended: nothing to answer
        if peer not in self._linked(msg.topic) or not self._admit(peer):
            return  # only a tree or lazy neighbour of the topic is answered
        if not self._state.log_last_seq(msg.topic):
            return  # a topic this node keeps no history of: nothing to answer from
        self.counts["reconcile_answers"] += 1
        if isinstance(msg, Recon):
            self._spawn(self._answer(peer, msg))
            return
        blocks: list[bytes] = []
        size = 0
        settled = 0
        for cid in msg.cids:
            block = self._local_block(cid)
            if block is not None:
                if size + len(block) > ANSWER_BYTES and settled:
                    break
                size += len(block)
                blocks.append(block)
            settled += 1
        self._send(peer, RBlocks(msg.topic, msg.session, settled, tuple(blocks)))

    async def _answer(self, peer: PeerId, msg: Recon) -> None:
        step = None
        if msg.round + 1 < MAX_ROUNDS:
            try:
                index = await self._index(msg.topic)
            except Exception:
                log.exception("could not index %s to answer %s", msg.topic, peer)
                return
            step = answer(index, msg.fps, msg.ids, asker=False)
        self._send(peer, Recon(msg.topic, msg.session, min(msg.round + 1, MAX_ROUNDS),
                               () if step is None else tuple(step.fps),
                               () if step is None else tuple(step.ids)))

    def _admit(self, peer: PeerId) -> bool:
        """A token bucket per peer: answering costs reads, and a peer may not make us
        index and read without end."""
        now = time.monotonic()
        tokens, last = self._buckets.get(peer, (2 * PEER_RATE, now))
        tokens = min(2 * PEER_RATE, tokens + (now - last) * PEER_RATE)
        if tokens < 1:
            self._buckets[peer] = (tokens, now)
            return False
        self._buckets[peer] = (tokens - 1, now)
        return True

    # ------------------------------------------------------------------ the index

    def appended(self, topic: CID) -> None:
        """The log of ``topic`` grew (a write-behind hook): its index takes the new entries
        in when next used."""
        cached = self._indexes.get(topic)
        if cached is not None:
            cached.stale = True

    async def _index(self, topic: CID) -> ItemIndex:
        """The topic's index, cached: brought up to date with what was logged since (new
        entries are mostly the newest: cheap), rebuilt from the log every
        :data:`INDEX_MAX_AGE` (what retention and compaction removed goes then). A build
        reads the log a page at a time and sorts on a worker thread, so indexing a long
        history never stalls the event loop."""
        self._flush()
        cached = self._indexes.get(topic)
        now = time.monotonic()
        if cached is not None and now - cached.built < INDEX_MAX_AGE:
            if cached.stale:
                cached.stale = False
                rows = self._dated(topic, self._state.log_items(
                    topic, after=cached.last_seq, limit=INDEX_LIMIT))
                if rows:
                    cached.index.add(rows)
                    cached.last_seq = max(seq for _, _, seq in rows)
            self._indexes.move_to_end(topic)
            return cached.index
        building = self._building.get(topic)
        if building is None:
            building = self._spawn(self._build(topic))
            self._building[topic] = building
        try:
            index: ItemIndex = await asyncio.shield(building)
        finally:
            if building.done():
                self._building.pop(topic, None)
        return index

    async def _build(self, topic: CID) -> ItemIndex:
        rows: list[tuple[int, bytes, int]] = []
        before: int | None = None
        while len(rows) < INDEX_LIMIT:
            page = self._state.log_items(topic, before=before,
                                         limit=min(INDEX_PAGE, INDEX_LIMIT - len(rows)))
            if not page:
                break
            rows += self._dated(topic, page)
            before = page[-1][2]
            await asyncio.sleep(0)  # one page per loop turn: other work goes on between
        index = await asyncio.to_thread(ItemIndex, rows)
        self._indexes[topic] = _Cached(index, max((seq for _, _, seq in rows), default=0),
                                       time.monotonic())
        self._indexes.move_to_end(topic)
        while len(self._indexes) > INDEXES:
            self._indexes.popitem(last=False)
        return index

    def _dated(self, topic: CID, page: list[tuple[int | None, bytes, int]]
               ) -> list[tuple[int, bytes, int]]:
        """``page`` with every entry's ``created_ms`` (entries logged before schema 10
        have their block read once, and the time recorded)."""
        rows: list[tuple[int, bytes, int]] = []
        dated: list[tuple[int, int]] = []
        for created_ms, raw, seq in page:
            if created_ms is None:
                created_ms = self._created_ms(CID(raw))
                if created_ms is None:
                    continue
                dated.append((seq, created_ms))
            rows.append((created_ms, raw, seq))
        if dated:
            self._state.log_set_created(topic, dated)
        return rows

    def _created_ms(self, cid: CID) -> int | None:
        block = self._local_block(cid)
        if block is None:
            return None
        event = EventDescriptor.from_block(block, cid, verify_signature=False)
        return round(event.created_at * 1000)

    # ------------------------------------------------------------------ upkeep

    def peer_down(self, peer: PeerId) -> None:
        for asking in [a for a in self._asking.values() if a.peer == peer]:
            self._end(asking)
        self._buckets.pop(peer, None)

    def expire(self) -> None:
        """End sessions whose peer went quiet."""
        now = time.monotonic()
        for asking in [a for a in self._asking.values() if now - a.heard > ROUND_TIMEOUT]:
            log.info("reconciliation of %s with %s timed out", asking.topic, asking.peer)
            self._end(asking)

    async def run(self, stopped: Callable[[], bool]) -> None:
        while not stopped():
            await asyncio.sleep(1.0)
            self.expire()

    def stop(self) -> None:
        self._asking.clear()


def _parse(blocks: list[tuple[CID, bytes]]) -> list[EventDescriptor]:
    """The blocks that parse as events whose CIDs and signatures check (a worker thread)."""
    events = []
    for cid, block in blocks:
        try:
            events.append(EventDescriptor.from_block(block, cid))
        except InvalidDescriptor:
            continue
    return events
