"""The durable consumers' tables in the node's SQLite file: ``consumers``,
``consumer_pending`` and ``consumer_watched`` (their DDL and schema version are the
file's, in :mod:`dag.store_schema`).

:class:`ConsumerTable` is the only code that reads or writes them. Every change a consumer
makes — a fetch handing messages out, an acknowledgement, a redelivery, a message set aside
— is written by :meth:`ConsumerTable.save` in one transaction, committed before the caller
answers anyone: after a crash a consumer is exactly where its last answer said it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dag import CID
from dag.store import BlockStore

from .consumer_config import ConsumerConfig

__all__ = ["ConsumerRow", "ConsumerTable", "PendingStats", "Watched"]


@dataclass(slots=True)
class ConsumerRow:
    """One consumer's row: its settings, where it is and its counters. Mutable: the state
    machine changes a copy it read and hands it back to :meth:`ConsumerTable.save`."""

    topic: CID
    config: ConsumerConfig
    created_at: float
    start: int
    """The log position its deliver policy resolved to when it was made (it delivers
    what comes after)."""
    delivered: int
    """The last log position it handed out for the first time (``start`` before any)."""
    paced_at: float | None = None
    """``replay_policy=original``: when it last handed out a new message..."""
    paced_from: float | None = None
    """...and that message's ``delivered_at`` in the log."""
    redelivered: int = 0
    """Messages delivered again (every redelivery counts)."""
    terminated: int = 0
    """Messages dropped for good: by a ``term``, or set aside after ``max_deliver``."""
    set_aside: int = 0
    """Of those, the ones set aside after ``max_deliver`` deliveries."""
    skipped: int = 0
    """Log positions it never delivered because retention had cut them (or their block
    was gone) by the time it got to them."""
    skipped_from: int | None = None
    skipped_to: int | None = None
    """The last range of positions skipped, inclusive."""

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True, slots=True)
class PendingStats:
    """What a consumer's pending entries add up to."""

    count: int
    redelivered: int
    """Pending entries delivered more than once."""
    lowest: int | None
    """The lowest pending position (None when nothing is pending)."""
    next_due: float | None
    """When the earliest pending entry is due again."""


@dataclass(frozen=True, slots=True)
class Watched:
    """A group consumer's log entry that another member handles: kept until that member's
    acknowledgement is heard, or taken over if it goes first."""

    seq: int
    event: CID
    created: float
    owner: bytes
    """The member's key (:attr:`pulsar.proto.groups.view.MemberId.key`)."""


_ROW_COLUMNS = ("config, created_at, start, delivered, paced_at, paced_from, redelivered, "
                "terminated, set_aside, skipped, skipped_from, skipped_to")


class ConsumerTable:
    """The consumers of every topic in ``store``'s file. Each method is one statement or
    one transaction. Not thread-safe, like the store."""

    __slots__ = ("_store",)

    def __init__(self, store: BlockStore) -> None:
        self._store = store

    # -- consumers ------------------------------------------------------------------------

    def get(self, topic: CID, name: str) -> ConsumerRow | None:
        with self._store.connection() as conn:
            row = conn.execute(f"SELECT {_ROW_COLUMNS} FROM consumers WHERE topic = ? AND "
                               "name = ?", (topic.raw, name)).fetchone()
        return None if row is None else _row(topic, row)

    def of_topic(self, topic: CID) -> list[ConsumerRow]:
        """The consumers of ``topic``, by name."""
        with self._store.connection() as conn:
            rows = conn.execute(f"SELECT {_ROW_COLUMNS} FROM consumers WHERE topic = ? "
                                "ORDER BY name", (topic.raw,)).fetchall()
        return [_row(topic, r) for r in rows]

    def grouped(self) -> list[ConsumerRow]:
        """Every consumer, of any topic, that belongs to a group."""
        with self._store.connection() as conn:
            rows = conn.execute(f"SELECT topic, {_ROW_COLUMNS} FROM consumers WHERE "
                                "json_extract(config, '$.group') IS NOT NULL").fetchall()
        return [_row(CID.parse(bytes(r[0])), r[1:]) for r in rows]

    def count(self, topic: CID) -> int:
        with self._store.connection() as conn:
            return int(conn.execute("SELECT count(*) FROM consumers WHERE topic = ?",
                                    (topic.raw,)).fetchone()[0])

    def insert(self, row: ConsumerRow) -> None:
        with self._store.transaction() as conn:
            conn.execute(
                f"INSERT INTO consumers (topic, name, {_ROW_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.topic.raw, row.name, *_values(row)))

    def delete(self, topic: CID, name: str) -> bool:
        """Remove the consumer and its pending entries; True if it existed."""
        with self._store.transaction() as conn:
            conn.execute("DELETE FROM consumer_pending WHERE topic = ? AND name = ?",
                         (topic.raw, name))
            conn.execute("DELETE FROM consumer_watched WHERE topic = ? AND name = ?",
                         (topic.raw, name))
            return conn.execute("DELETE FROM consumers WHERE topic = ? AND name = ?",
                                (topic.raw, name)).rowcount == 1

    def save(self, row: ConsumerRow, upserts: Sequence[tuple[int, int, float]] = (),
             deletes: Iterable[int] = (), watch: Sequence[Watched] = (),
             unwatch: Iterable[int] = ()) -> None:
        """Write ``row`` and its pending entries' changes in one transaction: ``upserts``
        are ``(seq, count, due)``, ``deletes`` positions no longer pending; ``watch``
        entries left to (or moved between) other members, ``unwatch`` positions no longer
        watched."""
        t = row.topic.raw
        with self._store.transaction() as conn:
            conn.executemany("DELETE FROM consumer_watched WHERE topic = ? AND name = ? AND "
                             "seq = ?", [(t, row.name, seq) for seq in unwatch])
            conn.executemany(
                "INSERT OR REPLACE INTO consumer_watched (topic, name, seq, event, created, "
                "owner) VALUES (?, ?, ?, ?, ?, ?)",
                [(t, row.name, w.seq, w.event.raw, w.created, w.owner) for w in watch])
            conn.execute(
                "UPDATE consumers SET config = ?, created_at = ?, start = ?, delivered = ?, "
                "paced_at = ?, paced_from = ?, redelivered = ?, terminated = ?, set_aside = ?, "
                "skipped = ?, skipped_from = ?, skipped_to = ? WHERE topic = ? AND name = ?",
                (*_values(row), t, row.name))
            conn.executemany("DELETE FROM consumer_pending WHERE topic = ? AND name = ? AND "
                             "seq = ?", [(t, row.name, seq) for seq in deletes])
            conn.executemany(
                "INSERT INTO consumer_pending (topic, name, seq, count, due) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (topic, name, seq) DO UPDATE SET "
                "count = excluded.count, due = excluded.due",
                [(t, row.name, seq, count, due) for seq, count, due in upserts])

    def with_due(self, now: float) -> list[tuple[CID, str]]:
        """Every consumer with a pending entry due at ``now``."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT DISTINCT topic, name FROM consumer_pending "
                                "WHERE due <= ? ORDER BY topic, name", (now,)).fetchall()
        return [(CID.parse(bytes(t)), str(n)) for t, n in rows]

    # -- pending entries ------------------------------------------------------------------

    def due(self, topic: CID, name: str, now: float) -> list[tuple[int, int]]:
        """``(seq, count)`` of the pending entries due at ``now``, lowest position first
        (at most ``max_ack_pending`` of them exist)."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT seq, count FROM consumer_pending WHERE topic = ? AND "
                                "name = ? AND due <= ? ORDER BY seq",
                                (topic.raw, name, now)).fetchall()
        return [(int(s), int(c)) for s, c in rows]

    def pending(self, topic: CID, name: str, seqs: Iterable[int]) -> dict[int, int]:
        """``seq -> count`` of those of ``seqs`` that are pending."""
        wanted = sorted(set(seqs))
        found: dict[int, int] = {}
        with self._store.connection() as conn:
            for i in range(0, len(wanted), 500):  # SQLite's bound on host parameters
                part = wanted[i:i + 500]
                marks = ", ".join("?" * len(part))
                for seq, count in conn.execute(
                        f"SELECT seq, count FROM consumer_pending WHERE topic = ? AND name = ? "
                        f"AND seq IN ({marks})", (topic.raw, name, *part)):
                    found[int(seq)] = int(count)
        return found

    def pending_through(self, topic: CID, name: str, through: int) -> list[int]:
        """The pending positions up to ``through`` (an ``ack_policy=all`` acknowledgement)."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT seq FROM consumer_pending WHERE topic = ? AND name = ? "
                                "AND seq <= ? ORDER BY seq", (topic.raw, name, through))
            return [int(s) for (s,) in rows.fetchall()]

    def stats(self, topic: CID, name: str) -> PendingStats:
        with self._store.connection() as conn:
            count, again, lowest, due = conn.execute(
                "SELECT count(*), total(count > 1), min(seq), min(due) FROM consumer_pending "
                "WHERE topic = ? AND name = ?", (topic.raw, name)).fetchone()
        return PendingStats(int(count), int(again), None if lowest is None else int(lowest),
                            None if due is None else float(due))

    # -- watched entries (group consumers) -----------------------------------------------

    def watched(self, topic: CID, name: str) -> list[Watched]:
        """Every entry the consumer left to another member, lowest position first."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT seq, event, created, owner FROM consumer_watched "
                                "WHERE topic = ? AND name = ? ORDER BY seq",
                                (topic.raw, name)).fetchall()
        return [Watched(int(s), CID.parse(bytes(e)), float(c), bytes(o))
                for s, e, c, o in rows]

    def watched_count(self, topic: CID, name: str) -> int:
        with self._store.connection() as conn:
            return int(conn.execute("SELECT count(*) FROM consumer_watched WHERE topic = ? "
                                    "AND name = ?", (topic.raw, name)).fetchone()[0])

    def unwatch_events(self, topic: CID, name: str, events: Sequence[CID]) -> set[CID]:
        """Forget the watched entries of ``events`` (their owner acknowledged them); the
        events there were entries of. One transaction."""
        removed: set[CID] = set()
        with self._store.transaction() as conn:
            for i in range(0, len(events), 500):
                part = [e.raw for e in events[i:i + 500]]
                marks = ", ".join("?" * len(part))
                where = f"topic = ? AND name = ? AND event IN ({marks})"
                removed.update(CID.parse(bytes(raw)) for (raw,) in conn.execute(
                    f"SELECT event FROM consumer_watched WHERE {where}",
                    (topic.raw, name, *part)))
                conn.execute(f"DELETE FROM consumer_watched WHERE {where}",
                             (topic.raw, name, *part))
        return removed

    def pending_events(self, topic: CID, name: str, events: Sequence[CID]) -> dict[CID, int]:
        """``event -> seq`` of those of ``events`` the consumer has pending."""
        found: dict[CID, int] = {}
        with self._store.connection() as conn:
            for i in range(0, len(events), 500):
                part = [e.raw for e in events[i:i + 500]]
                marks = ", ".join("?" * len(part))
                for seq, raw in conn.execute(
                        "SELECT p.seq, l.event FROM consumer_pending AS p JOIN delivery_log "
                        "AS l ON l.topic = p.topic AND l.seq = p.seq WHERE p.topic = ? AND "
                        f"p.name = ? AND l.event IN ({marks})", (topic.raw, name, *part)):
                    found[CID.parse(bytes(raw))] = int(seq)
        return found

    # -- the delivery log, as a consumer reads it -----------------------------------------

    def entries_at(self, topic: CID, seqs: Sequence[int]
                   ) -> dict[int, tuple[CID, float, bytes | None]]:
        """``seq -> (event, delivered_at, block)`` of those of ``seqs`` still in the
        delivery log (the block None where it is gone): redeliveries read their events by
        position, a batch in one query (the log is the runtime's table too, in this file)."""
        found: dict[int, tuple[CID, float, bytes | None]] = {}
        with self._store.connection() as conn:
            for i in range(0, len(seqs), 500):
                part = list(seqs[i:i + 500])
                marks = ", ".join("?" * len(part))
                for seq, raw, at, data in conn.execute(
                        "SELECT l.seq, l.event, l.delivered_at, b.data FROM delivery_log AS l "
                        f"LEFT JOIN blocks AS b ON b.cid = l.event WHERE l.topic = ? AND "
                        f"l.seq IN ({marks})", (topic.raw, *part)):
                    found[int(seq)] = (CID.parse(bytes(raw)), float(at),
                                       None if data is None else bytes(data))
        return found


def _values(row: ConsumerRow) -> tuple[object, ...]:
    return (json.dumps(row.config.to_json(), sort_keys=True), row.created_at, row.start,
            row.delivered, row.paced_at, row.paced_from, row.redelivered, row.terminated,
            row.set_aside, row.skipped, row.skipped_from, row.skipped_to)


def _row(topic: CID, row: Sequence[Any]) -> ConsumerRow:
    (config, created_at, start, delivered, paced_at, paced_from, redelivered, terminated,
     set_aside, skipped, skipped_from, skipped_to) = row
    return ConsumerRow(
        topic=topic, config=ConsumerConfig.from_json(json.loads(config)),
        created_at=float(created_at), start=int(start), delivered=int(delivered),
        paced_at=None if paced_at is None else float(paced_at),
        paced_from=None if paced_from is None else float(paced_from),
        redelivered=int(redelivered), terminated=int(terminated), set_aside=int(set_aside),
        skipped=int(skipped), skipped_from=None if skipped_from is None else int(skipped_from),
        skipped_to=None if skipped_to is None else int(skipped_to))
