"""The ``dht_records`` table: the DHT records a node holds for the network, in its SQLite file.

The DHT owns this table; the file is the node's one database (:mod:`dag.store`), whose schema
(:mod:`dag.store_schema`) also holds the table's DDL, its indexes and the schema version
(one per file, so the tables of
every layer are created and migrated in one place). :class:`RecordTable` is the only code
that reads or writes the table. It knows nothing of verification, quotas or group commit:
:class:`dht.storage.RecordStorage` decides what is written, this class how.

Columns: ``key`` (the 20-byte Kademlia key) → ``value``, ``stored_at`` (when anyone, this
node included, last stored it here: expiry counts from it) and ``republished_at`` (when it
was last pushed out, or pushed to us: republishing counts from it); both wall-clock, so they
keep their meaning across a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from dag.store import BlockStore

__all__ = ["RecordTable"]

_PAGE: Final = 1000  # rows per query when iterating, so iteration memory stays bounded
_EVICT_BATCH: Final = 256  # candidates read per query when making room
HEADS_PREFIX: Final = b"\x61t\x72pulsarcast/heads/1"
"""What follows the map header of every heads record (``dag.records``): its first key in
canonical order, ``t``, and the record type. Heads records are never evicted."""
_OWN_FIRST: Final = (
    "SELECT r.key, length(r.value) FROM dht_records AS r "
    "JOIN block_keys AS k ON k.key = r.key JOIN blocks AS b ON b.cid = k.cid "
    "WHERE b.pinned = 1 AND substr(r.value, 2, 21) != ? ORDER BY r.stored_at LIMIT ?")
_OLDEST: Final = ("SELECT key, length(value) FROM dht_records "
                  "WHERE substr(value, 2, 21) != ? ORDER BY stored_at LIMIT ?")
_IN_CHUNK: Final = 500  # keys per ``IN (...)`` query, well under SQLite's variable limit


class RecordTable:
    """The DHT records in ``store``'s file. Every method is one statement or one transaction
    (:meth:`BlockStore.connection`, :meth:`BlockStore.transaction`); not thread-safe, like the
    store."""

    __slots__ = ("_store",)

    def __init__(self, store: BlockStore) -> None:
        self._store = store

    def put(self, key: bytes, value: bytes, now: float) -> None:
        """Store or overwrite a DHT record. Both ``stored_at`` and ``republished_at`` become
        ``now``: a record just stored here was just stored on the other closest nodes too, so
        it needs no republishing for another interval (the Kademlia paper's optimisation), and
        its expiry counts from the latest store."""
        with self._store.connection() as conn:
            conn.execute(
                "INSERT INTO dht_records (key, value, stored_at, republished_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "stored_at = excluded.stored_at, republished_at = excluded.republished_at",
                (bytes(key), bytes(value), now, now),
            )

    def put_many(self, items: Iterable[tuple[bytes, bytes]], now: float) -> None:
        """:meth:`put` for many records in one transaction: a commit costs ~185 us on
        disk here, which would cap a node at a few thousand received STOREs per second."""
        rows = [(bytes(k), bytes(v), now, now) for k, v in items]
        if not rows:
            return
        with self._store.transaction() as conn:
            conn.executemany(
                "INSERT INTO dht_records (key, value, stored_at, republished_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "stored_at = excluded.stored_at, republished_at = excluded.republished_at",
                rows,
            )

    def get(self, key: bytes) -> bytes | None:
        """The value of a DHT record, or None."""
        with self._store.connection() as conn:
            row = conn.execute(
                "SELECT value FROM dht_records WHERE key = ?", (bytes(key),)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def held(self, keys: Iterable[bytes]) -> set[bytes]:
        """Those of ``keys`` under which a DHT record is stored, without reading the
        values (one query per 500 keys)."""
        wanted = list(dict.fromkeys(bytes(k) for k in keys))
        held: set[bytes] = set()
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start : start + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            with self._store.connection() as conn:
                rows = conn.execute(
                    f"SELECT key FROM dht_records WHERE key IN ({marks})", chunk
                ).fetchall()
            held.update(bytes(k) for (k,) in rows)
        return held

    def items_older_than(self, cutoff: float) -> list[tuple[bytes, bytes]]:
        """``(key, value)`` of the records last republished before ``cutoff``, oldest first:
        the ones due for republishing."""
        with self._store.connection() as conn:
            rows = conn.execute(
                "SELECT key, value FROM dht_records WHERE republished_at < ? "
                "ORDER BY republished_at",
                (cutoff,),
            ).fetchall()
        return [(bytes(k), bytes(v)) for k, v in rows]

    def mark_republished(self, keys: Iterable[bytes], now: float) -> None:
        """Record that ``keys`` were republished at ``now`` (one transaction). Keys that are
        not stored are ignored."""
        params = [(now, bytes(key)) for key in keys]
        if not params:
            return
        with self._store.transaction() as conn:
            conn.executemany("UPDATE dht_records SET republished_at = ? WHERE key = ?", params)

    def expire(self, cutoff: float) -> int:
        """Delete the records stored before ``cutoff``; returns how many."""
        with self._store.connection() as conn:
            cursor = conn.execute("DELETE FROM dht_records WHERE stored_at < ?", (cutoff,))
        return int(cursor.rowcount)

    def iter_records(self) -> Iterator[tuple[bytes, bytes, float]]:
        """Every record as ``(key, value, stored_at)``, in key order. Pages through the table
        1000 rows at a time rather than holding a cursor open (as ``BlockStore.iter_cids``
        does), so writes made while iterating are safe and memory stays bounded."""
        last = b""
        first = True
        while True:
            with self._store.connection() as conn:
                rows = conn.execute(
                    "SELECT key, value, stored_at FROM dht_records "
                    + ("" if first else "WHERE key > ? ")
                    + "ORDER BY key LIMIT ?",
                    (_PAGE,) if first else (last, _PAGE),
                ).fetchall()
            for key, value, stored_at in rows:
                yield bytes(key), bytes(value), float(stored_at)
            if len(rows) < _PAGE:
                return
            last, first = rows[-1][0], False

    def forget(self, keys: Iterable[bytes]) -> tuple[int, int]:
        """Delete the records of ``keys`` (those held); returns ``(rows, bytes)``
        deleted. Heads records are not deleted this way either."""
        wanted = [bytes(k) for k in keys]
        freed_rows = freed_bytes = 0
        with self._store.transaction() as conn:
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i:i + _IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT key, length(value) FROM dht_records WHERE key IN ({marks}) "
                    "AND substr(value, 2, 21) != ?", (*chunk, HEADS_PREFIX)).fetchall()
                conn.executemany("DELETE FROM dht_records WHERE key = ?",
                                 [(bytes(key),) for key, _ in rows])
                freed_rows += len(rows)
                freed_bytes += sum(int(length) for _, length in rows)
        return freed_rows, freed_bytes

    def evict(self, rows: int, size: int) -> tuple[int, int]:
        """Delete records until at least ``rows`` of them and ``size`` bytes are gone (or
        nothing is left to delete), in this order: records whose block the node also
        holds as its own (pinned: it serves them from there anyway), then the records
        stored longest ago. Heads records are never deleted. Returns ``(rows, bytes)``
        deleted."""
        freed_rows = freed_bytes = 0

        def short() -> bool:
            return freed_rows < rows or freed_bytes < size

        with self._store.transaction() as conn:
            for query in (_OWN_FIRST, _OLDEST):
                while short():
                    batch = conn.execute(query, (HEADS_PREFIX, _EVICT_BATCH)).fetchall()
                    if not batch:
                        break
                    chosen: list[tuple[bytes]] = []
                    for key, length in batch:
                        if not short():
                            break
                        chosen.append((bytes(key),))
                        freed_rows += 1
                        freed_bytes += int(length)
                    conn.executemany("DELETE FROM dht_records WHERE key = ?", chosen)
        return freed_rows, freed_bytes

    def count(self) -> int:
        """How many DHT records are stored (an SQL ``count``: O(n), for stats and quotas)."""
        with self._store.connection() as conn:
            return int(conn.execute("SELECT count(*) FROM dht_records").fetchone()[0])

    def total_bytes(self) -> int:
        """Total size of the stored DHT record values (SQLite reads blob sizes from the row
        headers, without loading the values)."""
        with self._store.connection() as conn:
            row = conn.execute("SELECT total(length(value)) FROM dht_records").fetchone()
        return int(row[0])
