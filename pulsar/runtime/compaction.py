"""Compaction by key: a compacted topic's delivery log keeps the newest event of each key.

A topic whose retention says ``compact`` (:class:`dag.Retention`) keeps, of the events that
carry a key (``metadata.key``, signed by their author), only the newest of each key, like
Kafka's ``cleanup.policy=compact``; events without a key are left to ``max_age`` and
``max_events``. *Newer* is the later ``created`` (in milliseconds), then the larger CID
bytes: every node that holds the same events keeps the same ones, whatever order they
arrived in.

Two parts, both reading the ``log_keys`` table (the newest event of each key seen in the
log so far):

* :meth:`LogCompaction.stale`, at delivery: an event older than the newest of its key is
  not delivered at all (no log entry, no live subscriber). It arrived after a newer one of
  its key, or it was compacted here and a backfill met it again; either way the log already
  holds what supersedes it. This is also what keeps a compacted event from coming back as
  new, so compaction needs no memory of what it removed.
* :meth:`LogCompaction.apply`, after appends (from :mod:`pulsar.runtime.retention`): the
  entries appended since the last pass (``log_compaction.through``) are looked at in
  order; each keyed event becomes its key's newest, and the entry of the one it replaces
  is removed, or, if it is older than the newest already kept, its own entry is removed.
  Everything of one pass is one transaction.

Live subscribers see every event that was the newest of its key when it arrived; the log
has holes where replaced events were, and readers skip them (positions are never reused).
"""

from __future__ import annotations

from typing import Final

from dag import CID, BlockStore, EventDescriptor
from dag.descriptors import parse_timestamp
from dag.event_links import event_key

from .node_state import NodeState

__all__ = ["LogCompaction"]

SCAN_BATCH: Final = 10_000
"""Log entries one pass looks at most (the rest at the next pass)."""


def _ms(created: str) -> int:
    return round(parse_timestamp(created) * 1000)


class LogCompaction:
    """The ``log_keys`` and ``log_compaction`` tables of a node, and the pass over a log."""

    __slots__ = ("_state", "_store", "compacted", "stale_dropped")

    def __init__(self, state: NodeState, store: BlockStore) -> None:
        self._state = state
        self._store = store
        self.compacted = 0
        """Log entries removed because a newer event has their key (a metric)."""
        self.stale_dropped = 0
        """Events not delivered because a newer one of their key was logged (a metric)."""

    def stale(self, topic: CID, event: EventDescriptor) -> bool:
        """Whether ``event`` is older than the newest event of its key in the log of
        ``topic`` (it is then not delivered: see the module docstring)."""
        if event.key is None:
            return False
        with self._store.connection() as conn:
            row = conn.execute("SELECT created_ms, event FROM log_keys WHERE topic = ? "
                               "AND key = ?", (topic.raw, event.key)).fetchone()
        if row is None:
            return False
        if (int(row[0]), bytes(row[1])) > (_ms(event.created), event.cid.raw):
            self.stale_dropped += 1
            return True
        return False

    def newest(self, topic: CID) -> dict[str, CID]:
        """The newest event of each key seen in the log of ``topic``."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT key, event FROM log_keys WHERE topic = ?",
                                (topic.raw,)).fetchall()
        return {str(key): CID.parse(bytes(raw)) for key, raw in rows}

    def apply(self, topic: CID) -> list[CID]:
        """Compact the entries appended since the last pass; returns the events whose
        entries were removed (their blocks are the caller's to drop)."""
        t = topic.raw
        with self._store.connection() as conn:
            row = conn.execute("SELECT through FROM log_compaction WHERE topic = ?",
                               (t,)).fetchone()
        through = 0 if row is None else int(row[0])
        rows = self._state.log_blocks(topic, after_seq=through, limit=SCAN_BATCH)
        if not rows:
            return []
        kept: dict[str, tuple[int, bytes]] = {}
        removed: list[bytes] = []
        with self._store.connection() as conn:
            for _, cid, _, block in rows:
                read = None if block is None else event_key(block)
                if read is None:
                    continue
                key, created = read
                if key is None:
                    continue
                mine = (_ms(created), cid.raw)
                held = kept.get(key)
                if held is None:
                    found = conn.execute("SELECT created_ms, event FROM log_keys WHERE "
                                         "topic = ? AND key = ?", (t, key)).fetchone()
                    held = None if found is None else (int(found[0]), bytes(found[1]))
                if held is None or mine > held:
                    if held is not None:
                        removed.append(held[1])
                    kept[key] = mine
                else:
                    removed.append(mine[1])
        with self._store.transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO log_keys (topic, key, created_ms, event) "
                             "VALUES (?, ?, ?, ?)",
                             [(t, key, ms, raw) for key, (ms, raw) in kept.items()])
            gone = 0
            for raw in removed:
                gone += conn.execute("DELETE FROM delivery_log WHERE topic = ? AND event = ?",
                                     (t, raw)).rowcount
            conn.execute("INSERT OR REPLACE INTO log_compaction (topic, through) VALUES (?, ?)",
                         (t, rows[-1][0]))
        self.compacted += gone
        return [CID.parse(raw) for raw in removed]
