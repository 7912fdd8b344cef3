"""The node runtime's tables in the node's SQLite file: subscriptions, heads, topic versions,
the publisher's outbox and the delivery log.

The runtime (:class:`pulsar.Node`) owns these tables; the file is the node's one database
(:mod:`dag.store`), whose schema (:mod:`dag.store_schema`) also holds their DDL and the
schema version (one per file, so the
tables of every layer are created and migrated in one place). :class:`NodeState` is the only
code that reads or writes them::

    subscriptions topic → created_at, active
    heads         (topic, event)                 the current heads of a topic's event DAG
    topic_latest  topic → version                the latest version of a topic the node knows
    outbox        (topic, event) → published_at  own published events not delivered here yet
    delivery_log  (topic, seq) → event, delivered_at; UNIQUE (topic, event)
    log_state     topic → last_seq, last_at      the per-topic high-water mark of the log

The delivery log's sequence numbers are what REST cursors, stream resume and Spark offsets
refer to. :meth:`NodeState.log_blocks` reads the log joined with the data model's ``blocks``
table in one query: one file is what makes that possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dag import CID
from dag.store import BlockStore

__all__ = ["NodeState"]


class NodeState:
    """The durable subscriptions, heads, topic versions, outbox and delivery log of one node,
    in ``store``'s file. Every method is one statement or one transaction
    (:meth:`BlockStore.connection`, :meth:`BlockStore.transaction`); multi-row writes are
    single transactions, so after a crash each is wholly present or wholly absent. Not
    thread-safe, like the store."""

    __slots__ = ("_store",)

    def __init__(self, store: BlockStore) -> None:
        self._store = store

    # -- subscriptions --------------------------------------------------------------------

    def add_subscription(self, topic: CID, now: float) -> bool:
        """Mark ``topic`` subscribed; True if it was not already active. Re-subscribing after
        :meth:`remove_subscription` resets ``created_at`` and keeps the old delivery log, so
        sequence numbers carry on where they stopped."""
        with self._store.connection() as conn:
            return (
                conn.execute(
                    "INSERT INTO subscriptions (topic, created_at, active) VALUES (?, ?, 1) "
                    "ON CONFLICT (topic) DO UPDATE SET active = 1, "
                    "created_at = excluded.created_at WHERE active = 0",
                    (topic.raw, now),
                ).rowcount
                == 1
            )

    def remove_subscription(self, topic: CID) -> bool:
        """Mark ``topic`` unsubscribed; True if it was active. The row, heads and delivery log
        are kept, so cursors handed out earlier stay meaningful."""
        with self._store.connection() as conn:
            return (
                conn.execute(
                    "UPDATE subscriptions SET active = 0 WHERE topic = ? AND active = 1",
                    (topic.raw,),
                ).rowcount
                == 1
            )

    def subscription_since(self, topic: CID) -> float | None:
        """When the active subscription to ``topic`` began (None if there is none)."""
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT created_at FROM subscriptions WHERE topic = ? AND active = 1",
                (topic.raw,),
            ).fetchone()
        return None if row is None else float(row[0])

    def subscriptions(self) -> list[CID]:
        """The active subscriptions, oldest first."""
        with self._store.connection() as conn:
            rows = conn.execute(
                "SELECT topic FROM subscriptions WHERE active = 1 ORDER BY created_at, topic"
            ).fetchall()
        return [CID.parse(bytes(raw)) for (raw,) in rows]

    # -- heads ----------------------------------------------------------------------------

    def set_heads(self, topic: CID, events: Iterable[CID]) -> None:
        """Replace the heads of ``topic`` with ``events``, atomically: a reader (or a restart)
        sees the old set or the new one, never a mixture."""
        rows = [(topic.raw, event.raw) for event in events]
        with self._store.transaction() as conn:
            conn.execute("DELETE FROM heads WHERE topic = ?", (topic.raw,))
            conn.executemany("INSERT OR IGNORE INTO heads (topic, event) VALUES (?, ?)", rows)

    def heads(self, topic: CID) -> list[CID]:
        """The heads of ``topic``, in binary CID order (deterministic); empty if none."""
        with self._store.connection() as conn:
            rows = conn.execute(
                "SELECT event FROM heads WHERE topic = ? ORDER BY event", (topic.raw,)
            ).fetchall()
        return [CID.parse(bytes(raw)) for (raw,) in rows]

    # -- topic versions -------------------------------------------------------------------

    def set_latest_version(self, topic: CID, version: CID) -> None:
        """Remember ``version`` as the latest known version of the topic ``topic`` (its
        first version's CID); the version's block is stored (pinned) by the caller."""
        with self._store.transaction() as conn:
            conn.execute(
                "INSERT INTO topic_latest (topic, version) VALUES (?, ?) "
                "ON CONFLICT (topic) DO UPDATE SET version = excluded.version",
                (topic.raw, version.raw),
            )

    def latest_version(self, topic: CID) -> CID | None:
        """The latest version of ``topic`` remembered by :meth:`set_latest_version`."""
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT version FROM topic_latest WHERE topic = ?", (topic.raw,)
            ).fetchone()
        return None if row is None else CID.parse(bytes(row[0]))

    # -- outbox ---------------------------------------------------------------------------

    def outbox_add(self, items: Iterable[tuple[CID, CID]], now: float) -> None:
        """Remember ``(topic, event)`` pairs this node published, in one transaction; the
        caller acknowledges the publishes only after this returns."""
        rows = [(topic.raw, event.raw, now) for topic, event in items]
        if not rows:
            return
        with self._store.transaction() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO outbox (topic, event, published_at) VALUES (?, ?, ?)",
                rows,
            )

    def outbox_remove(self, topic: CID, events: Iterable[CID]) -> None:
        """Forget published events of ``topic`` that no longer need announcing."""
        rows = [(topic.raw, event.raw) for event in events]
        if not rows:
            return
        with self._store.transaction() as conn:
            conn.executemany("DELETE FROM outbox WHERE topic = ? AND event = ?", rows)

    def outbox(self) -> dict[CID, list[CID]]:
        """Every topic's outbox, oldest publish first."""
        with self._store.connection() as conn:
            rows = conn.execute(
                "SELECT topic, event FROM outbox ORDER BY published_at, topic, event"
            ).fetchall()
        out: dict[CID, list[CID]] = {}
        for topic, event in rows:
            out.setdefault(CID.parse(bytes(topic)), []).append(CID.parse(bytes(event)))
        return out

    # -- delivery log ---------------------------------------------------------------------

    def log_append(self, topic: CID, events: Sequence[CID], now: float,
                   created: Sequence[int | None] | None = None) -> list[int]:
        """Append ``events`` (in delivery order) to the log of ``topic``, in one transaction,
        and return the sequence numbers given to the new ones. ``created``: each event's
        ``created`` time in milliseconds (what range reconciliation sorts by), if known.

        Events already in the log are skipped, so a redelivery after a restart is not seen
        twice. Numbers start at 1 and only grow; the high-water mark is kept apart from the
        entries, so a number is never reused, even after :meth:`log_prune`. ``delivered_at``
        never goes backwards within a topic (a clock stepped back records the previous time
        again), which keeps :meth:`log_seq_at_time` well defined.
        """
        if not events:
            return []
        t = topic.raw
        assigned: list[int] = []
        with self._store.transaction() as conn:
            row = conn.execute(
                "SELECT last_seq, last_at FROM log_state WHERE topic = ?", (t,)
            ).fetchone()
            last_seq, at = (0, now) if row is None else (int(row[0]), max(now, float(row[1])))
            for index, event in enumerate(events):
                e = event.raw
                if conn.execute(
                    "SELECT 1 FROM delivery_log WHERE topic = ? AND event = ?", (t, e)
                ).fetchone():
                    continue
                last_seq += 1
                conn.execute(
                    "INSERT INTO delivery_log (topic, seq, event, delivered_at, created_ms) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (t, last_seq, e, at, None if created is None else created[index]),
                )
                assigned.append(last_seq)
            if assigned:
                conn.execute(
                    "INSERT INTO log_state (topic, last_seq, last_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (topic) DO UPDATE SET last_seq = excluded.last_seq, "
                    "last_at = excluded.last_at",
                    (t, last_seq, at),
                )
        return assigned

    def log_range(
        self,
        topic: CID,
        after_seq: int = 0,
        limit: int | None = None,
        *,
        descending: bool = False,
        before_seq: int | None = None,
    ) -> list[tuple[int, CID, float]]:
        """Log entries ``(seq, event, delivered_at)`` with ``after_seq < seq < before_seq``,
        ascending (or descending), at most ``limit`` of them.

        Paging forward: pass the last seq seen as ``after_seq``. Paging backward from the
        newest: ``descending=True`` and the smallest seq seen as ``before_seq``.
        """
        rows = self._log_query("SELECT seq, event, delivered_at FROM delivery_log", topic,
                               after_seq, limit, descending, before_seq)
        return [(int(seq), CID.parse(bytes(raw)), float(at)) for seq, raw, at in rows]

    def log_blocks(
        self,
        topic: CID,
        after_seq: int = 0,
        limit: int | None = None,
        *,
        descending: bool = False,
        before_seq: int | None = None,
    ) -> list[tuple[int, CID, float, bytes | None]]:
        """Like :meth:`log_range`, each entry with its event's block from the ``blocks``
        table (None if the block is gone): one query per page instead of one per event, for
        replay."""
        rows = self._log_query(
            "SELECT l.seq, l.event, l.delivered_at, b.data FROM delivery_log AS l "
            "LEFT JOIN blocks AS b ON b.cid = l.event", topic, after_seq, limit, descending,
            before_seq, prefix="l.")
        return [
            (int(seq), CID.parse(bytes(raw)), float(at), None if data is None else bytes(data))
            for seq, raw, at, data in rows
        ]

    def _log_query(self, select: str, topic: CID, after_seq: int, limit: int | None,
                   descending: bool, before_seq: int | None, prefix: str = "") -> list[Any]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        sql = f"{select} WHERE {prefix}topic = ? AND {prefix}seq > ?"
        params: list[object] = [topic.raw, after_seq]
        if before_seq is not None:
            sql += f" AND {prefix}seq < ?"
            params.append(before_seq)
        order = "DESC" if descending else "ASC"
        sql += f" ORDER BY {prefix}seq {order} LIMIT ?"
        params.append(-1 if limit is None else limit)  # LIMIT -1: no limit
        with self._store.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def log_items(self, topic: CID, *, after: int = 0, before: int | None = None,
                  limit: int) -> list[tuple[int | None, bytes, int]]:
        """Entries of ``topic``'s log with ``after < seq < before``, newest first, at most
        ``limit``, as ``(created_ms, event CID bytes, seq)`` (``created_ms`` None for
        entries logged before schema 10): what range reconciliation indexes."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT created_ms, event, seq FROM delivery_log "
                                "WHERE topic = ? AND seq > ? AND seq < ? "
                                "ORDER BY seq DESC LIMIT ?",
                                (topic.raw, after, 2**62 if before is None else before,
                                 limit)).fetchall()
        return [(ms, bytes(raw), int(seq)) for ms, raw, seq in rows]

    def log_set_created(self, topic: CID, created: Sequence[tuple[int, int]]) -> None:
        """Record ``(seq, created_ms)`` for entries logged without it."""
        with self._store.transaction() as conn:
            conn.executemany("UPDATE delivery_log SET created_ms = ? WHERE topic = ? AND seq = ?",
                             [(ms, topic.raw, seq) for seq, ms in created])

    def log_last_seq(self, topic: CID) -> int:
        """The highest sequence number ever given in the log of ``topic``; 0 if none."""
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT last_seq FROM log_state WHERE topic = ?", (topic.raw,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def log_seq_of(self, topic: CID, event: CID) -> int | None:
        """The sequence number of ``event`` in the log of ``topic``, or None."""
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT seq FROM delivery_log WHERE topic = ? AND event = ?",
                (topic.raw, event.raw),
            ).fetchone()
        return None if row is None else int(row[0])

    def log_contains(self, topic: CID, event: CID) -> bool:
        """Whether ``event`` was delivered into the log of ``topic``: it is there, or a
        retention policy cut it lately (:meth:`log_prune`)."""
        # One query: this is the core's ``is_delivered``, asked of most events it meets.
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM delivery_log WHERE topic = ?1 AND event = ?2)"
                " OR EXISTS (SELECT 1 FROM log_cut WHERE topic = ?1 AND event = ?2)",
                (topic.raw, event.raw)).fetchone()
        return bool(row[0])

    def log_seq_at_time(self, topic: CID, ts: float) -> int:
        """The last sequence number delivered strictly before ``ts``; 0 if none. Reading the
        log after it yields exactly what was delivered at or after ``ts`` (a time-based
        cursor, e.g. a Spark starting offset). Entries removed by :meth:`log_prune` are
        forgotten, so for a time before every remaining entry the answer is 0."""
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT seq FROM delivery_log WHERE topic = ? AND delivered_at < ? "
                "ORDER BY delivered_at DESC, seq DESC LIMIT 1",
                (topic.raw, ts),
            ).fetchone()
        return 0 if row is None else int(row[0])

    def log_retained_from(self, topic: CID) -> int:
        """The first position of ``topic``'s log still held: 1 if nothing was ever cut,
        one past the last position handed out if everything was."""
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT MIN(seq) FROM delivery_log WHERE topic = ?", (topic.raw,)
            ).fetchone()
        if row is not None and row[0] is not None:
            return int(row[0])
        return self.log_last_seq(topic) + 1

    def log_prune(self, topic: CID, through_seq: int) -> int:
        """Delete the entries of ``topic`` with ``seq <= through_seq`` (a retention policy's
        tool); returns how many. The high-water mark stays, so new entries still get numbers
        above every number handed out before."""
        with self._store.transaction() as conn:
            # Remembered as cut (log_contains), so an event a backfill meets again is not
            # delivered a second time; forgotten by log_cut_expire.
            conn.execute(
                "INSERT OR IGNORE INTO log_cut (topic, event, delivered_at) SELECT topic, "
                "event, delivered_at FROM delivery_log WHERE topic = ? AND seq <= ?",
                (topic.raw, through_seq))
            return int(
                conn.execute(
                    "DELETE FROM delivery_log WHERE topic = ? AND seq <= ?",
                    (topic.raw, through_seq),
                ).rowcount
            )

    def log_cut_expire(self, before: float, topic: CID | None = None) -> int:
        """Forget the cut entries (of ``topic``, or of every topic) delivered before
        ``before`` (the backfill horizon has passed them); returns how many. The table has
        no time index (it would be as large as the data): each topic's entries are read by
        the primary key, topic after topic."""
        if topic is not None:
            return self._log_cut_expire(topic.raw, before)
        removed, after = 0, b""
        while True:
            with self._store.connection() as conn:
                row = conn.execute("SELECT topic FROM log_cut WHERE topic > ? ORDER BY topic "
                                   "LIMIT 1", (after,)).fetchone()
            if row is None:
                return removed
            after = bytes(row[0])
            removed += self._log_cut_expire(after, before)

    def _log_cut_expire(self, topic: bytes, before: float) -> int:
        with self._store.transaction() as conn:
            return int(conn.execute("DELETE FROM log_cut WHERE topic = ? AND delivered_at < ?",
                                    (topic, before)).rowcount)

    def log_last_at(self, topic: CID) -> float | None:
        """When the log of ``topic`` last grew (the delivery time of its newest position),
        or None if it never did."""
        with self._store.connection() as conn:
            row = conn.execute("SELECT last_at FROM log_state WHERE topic = ?",
                               (topic.raw,)).fetchone()
        return None if row is None else float(row[0])
