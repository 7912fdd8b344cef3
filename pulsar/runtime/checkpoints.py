"""The checkpoints an author makes of its topics (the format is :mod:`dag.checkpoints`).

A node that authored a topic and follows it cuts the topic's history into segments: when
``checkpoint_every`` events were delivered since the last checkpoint, or
``checkpoint_interval`` seconds passed with at least one, it takes the next entries of its
delivery log (in delivery order: parents first), builds the segment's index, signs the
checkpoint, stores the blocks in the DHT at the write quorum, and only then records it
(``checkpoints`` table) and tells the core, whose next heads record names it
(``CheckpointMade``). A store that misses the quorum is tried again at the topic's next
event or after the interval; the log does not move on until a checkpoint is stored. Only
topics whose log grew (:meth:`CheckpointMaker.appended`, told by the write-behind) or
whose interval ran out are looked at.

A segment is the author's delivery log between two checkpoints, so every event the author
delivered is in exactly one. An entry whose block is gone (cut by the topic's retention
before a checkpoint took it) is left out and counted in the log. The checkpoint's
``heads`` are the tips of everything it covers: the previous checkpoint's heads and the
segment's events, less everything those link to.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from dag import CID, BlockStore, Identity
from dag.checkpoints import MAX_CHECKPOINT_HEADS, Checkpoint, CheckpointError, Skip, make_checkpoint
from dag.descriptors import parse_timestamp
from dag.event_links import event_links
from dht import DhtNode

from .node_state import NodeState

__all__ = ["CHECK_EVERY", "CheckpointMaker", "CheckpointRow", "CheckpointTable"]

log = logging.getLogger(__name__)

CHECK_EVERY: Final = 1.0
"""Seconds between two looks at the authored topics' logs."""


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    number: int
    count: int
    last_ms: int
    cid: CID
    log_seq: int
    """The last log position the checkpoint's segment took."""
    made_at: float


class CheckpointTable:
    """The ``checkpoints`` table of the node's SQLite file: the only code that uses it."""

    def __init__(self, store: BlockStore) -> None:
        self._store = store

    def last(self, topic: CID) -> CheckpointRow | None:
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT number, count, last_ms, cid, log_seq, made_at FROM checkpoints "
                "WHERE topic = ? ORDER BY number DESC LIMIT 1", (topic.raw,)).fetchone()
        return None if row is None else _row(row)

    def skip(self, topic: CID, number: int) -> Skip:
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT number, count, last_ms, cid FROM checkpoints "
                "WHERE topic = ? AND number = ?", (topic.raw, number)).fetchone()
        if row is None:
            raise LookupError(f"no checkpoint {number} of {topic}")
        return Skip(int(row[0]), int(row[1]), int(row[2]), CID.parse(bytes(row[3])))

    def add(self, topic: CID, checkpoint: Checkpoint, log_seq: int, made_at: float) -> None:
        with self._store.connection() as conn, conn:
            conn.execute(
                "INSERT INTO checkpoints (topic, number, count, last_ms, cid, log_seq, made_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (topic.raw, checkpoint.number, checkpoint.count, checkpoint.last_ms,
                 checkpoint.cid.raw, log_seq, made_at))


def _row(row: tuple[object, ...]) -> CheckpointRow:
    number, count, last_ms, cid, log_seq, made_at = row
    assert isinstance(cid, bytes | memoryview)
    return CheckpointRow(int(str(number)), int(str(count)), int(str(last_ms)),
                         CID.parse(bytes(cid)), int(str(log_seq)), float(str(made_at)))


class CheckpointMaker:
    """Makes the checkpoints of the topics this node authored (see the module docstring)."""

    def __init__(
        self,
        identity: Identity,
        state: NodeState,
        store: BlockStore,
        dht: DhtNode,
        authored: Callable[[], Iterable[CID]],
        is_authored: Callable[[CID], bool],
        made: Callable[[CID, CID], None],
        *,
        every: int,
        interval: float,
        quorum: int,
    ) -> None:
        if every < 1 or interval <= 0:
            raise ValueError("checkpoint_every must be >= 1 and checkpoint_interval > 0")
        self._identity = identity
        self._state = state
        self._store = store
        self._dht = dht
        self._authored = authored
        self._is_authored = is_authored
        self._made = made
        self._every = every
        self._interval = interval
        self._quorum = quorum
        self.table = CheckpointTable(store)
        self._since: dict[CID, float] = {}
        self._dirty: set[CID] = set()
        """Topics whose log grew since the last pass (``appended``)."""
        self._waiting: dict[CID, float] = {}
        """Topics with entries no checkpoint took yet, and since when they wait: cut once
        ``interval`` passed even if no more come."""
        self.made = 0
        """Checkpoints made since the node started (a metric)."""
        self.failed = 0
        """Checkpoint stores that missed the write quorum (tried again later)."""

    def appended(self, topic: CID) -> None:
        """``topic``'s delivery log grew: look at it at the next pass."""
        self._dirty.add(topic)

    async def run_forever(self, clock: Callable[[], float]) -> None:
        """Every :data:`CHECK_EVERY` seconds, cut what is due: in the topics whose log grew
        since the last pass and those whose wait reached ``interval`` — not every topic
        this node follows (10,000 would cost two queries each, every second). The first
        pass looks at every authored topic (entries logged before a restart)."""
        self._dirty.update(self._authored())
        while True:
            await asyncio.sleep(CHECK_EVERY)
            now = clock()
            due = [t for t, since in self._waiting.items() if now - since >= self._interval]
            dirty, self._dirty = self._dirty, set()
            for topic in dict.fromkeys([*dirty, *due]):
                if not self._is_authored(topic):
                    self._waiting.pop(topic, None)
                    continue
                try:
                    while await self.cut(topic, now) is not None:
                        pass
                except (sqlite3.Error, LookupError, CheckpointError, OSError) as exc:
                    log.warning("checkpoint of %s: %s", topic, exc)
                    self._waiting.setdefault(topic, now)  # tried again after the interval
                except Exception:  # a bug: logged, and the other topics still checkpointed
                    self.failed += 1
                    log.exception("checkpoint of %s failed", topic)
                    self._waiting.setdefault(topic, now)

    def announce(self) -> None:
        """Tell the core the newest checkpoint of every authored topic (after a restart,
        so its heads records name them again)."""
        for topic in self._authored():
            last = self.table.last(topic)
            if last is not None:
                self._made(topic, last.cid)

    async def cut(self, topic: CID, now: float) -> Checkpoint | None:
        """Make ``topic``'s next checkpoint if one is due; None if none is (or the store
        missed the quorum: tried again at the next call)."""
        last = self.table.last(topic)
        start = 0 if last is None else last.log_seq
        waiting = self._state.log_last_seq(topic) - start
        if waiting <= 0:
            self._since.pop(topic, None)
            self._waiting.pop(topic, None)
            return None
        since = self._since.setdefault(topic, now) if last is None else last.made_at
        if waiting < self._every and now - since < self._interval:
            self._waiting[topic] = since
            return None
        rows = self._state.log_blocks(topic, after_seq=start, limit=self._every)
        entries: list[tuple[int, CID]] = []
        links: set[CID] = set()
        for _, event, _, block in rows:
            read = None if block is None else event_links(block)
            if read is None:
                log.info("checkpoint of %s leaves out %s: its block is gone", topic, event)
                continue
            entries.append((round(parse_timestamp(read.created) * 1000), event))
            links.update(c for c in (read.parent, *read.merges) if c is not None)
        end = rows[-1][0]
        number = 1 if last is None else last.number + 1
        if not entries:  # everything in range was cut: move on without a checkpoint
            log.info("checkpoint of %s: log positions %d..%d are gone", topic, start + 1, end)
            return None
        heads = self._heads(last, entries, links)
        checkpoint, blocks = make_checkpoint(
            self._identity, topic, number, entries, heads,
            lambda n: self.table.skip(topic, n), now=now)
        self._store.put_many(blocks)
        results = await self._dht.put_many([block for _, block in blocks],
                                           quorum=self._quorum or None)
        short = [r for r in results if r.acks < self._quorum]
        if short:
            self.failed += 1
            self._waiting.setdefault(topic, now)
            log.warning("checkpoint %d of %s stored on fewer than %d DHT nodes; trying again",
                        number, topic, self._quorum)
            return None
        self.table.add(topic, checkpoint, end, now)
        self.made += 1
        self._made(topic, checkpoint.cid)
        return checkpoint

    def _heads(self, last: CheckpointRow | None, entries: list[tuple[int, CID]],
               links: set[CID]) -> list[CID]:
        """The tips of everything up to this segment: the previous checkpoint's heads and
        this segment's events, less what they link to (the newest kept if too many)."""
        before: list[CID] = []
        if last is not None:
            block = self._store.get(last.cid)
            if block is not None:
                before = list(Checkpoint.from_block(block, last.cid).heads)
        tips = [c for c in before if c not in links]
        tips += [cid for _, cid in entries if cid not in links]
        return list(dict.fromkeys(tips))[-MAX_CHECKPOINT_HEADS:]
