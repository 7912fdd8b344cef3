"""The node's durable state: one SQLite database file per node.

One database holds the blocks, the DHT records, the subscriptions, the per-topic heads and
the per-subscription delivery log whose local sequence numbers are what REST cursors, stream
resume and Spark offsets refer to (``docs/architecture.md``, "The store"). Each layer owns the
code of its own tables; this module, with the two beside it, owns the file:

* opening it, checking it is a pulsarcast database this build understands, WAL mode and the
  ``synchronous`` setting (:mod:`dag.store_file`), the schema version and its migrations,
  and the DDL of every table (:mod:`dag.store_schema`; a schema version is the whole
  file's, so its tables are created and migrated together);
* the data model's tables, ``blocks`` and ``block_keys``, and their methods on
  :class:`BlockStore` (here);
* the small interface the other owners use, :meth:`BlockStore.connection` and
  :meth:`BlockStore.transaction` (here).

The opening and the schema are modules of their own so that this one holds what the node
calls at run time; :class:`BlockStore` opens its file through :mod:`dag.store_file`, and
:data:`SCHEMA_VERSION`, :data:`APPLICATION_ID` and :class:`StoreError` are re-exported here.

The other owners are classes of the layers above, each made on the :class:`BlockStore` it
works on (they import this module; it imports neither)::

    dht.record_table.RecordTable          dht_records
    pulsar.runtime.node_state.NodeState   subscriptions, heads, topic_latest, outbox,
                                          delivery_log, log_state

Why one file and not one per layer: one WAL and one ``synchronous`` policy, one schema
version and one migration path, one file to back up or move, and statements and
transactions that may span the tables of several owners (``NodeState.log_blocks`` reads the
delivery log joined with ``blocks``, in one query).

The tables of every owner, and the schema version that added each, are listed in
:mod:`dag.store_schema`.

Crash safety. The database runs in WAL mode with ``synchronous=NORMAL`` by default. A commit
appends its pages to the ``-wal`` file and ends with a commit frame; every frame carries a
checksum chained to the previous one. With NORMAL the WAL is fsynced only at checkpoints (the
WAL is fsynced before any page is copied back into the main file, and the main file after),
not at every commit. So:

* a crash of the process (SIGKILL, OOM, an exception) loses nothing that was committed: the
  frames are already in the operating system's cache, and the next open replays them;
* a power loss or kernel crash may lose the last few commits (WAL frames not yet on disk), but
  on recovery SQLite replays only frames up to the last commit frame whose checksums chain
  correctly, so the database comes back as it was after some earlier commit: never torn, never
  corrupt, never with half a transaction.

Losing the last few deliveries on power loss is harmless here: the node backfills what it is
missing when it rejoins its trees. Pass ``synchronous="FULL"`` to fsync the WAL at every commit
when each commit must survive power loss, at the price of one fsync per transaction.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import Final, Self

from .cid import CID
from .errors import CIDMismatch
from .store_file import StoreError, check_synchronous, open_database, write_transaction
from .store_schema import APPLICATION_ID, SCHEMA_VERSION, _sha1

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "BlockStore", "StoreError"]

_PAGE: Final = 1000  # rows per query when iterating, so iteration memory stays bounded
_IN_CHUNK: Final = 500  # CIDs per ``IN (...)`` query, well under SQLite's variable limit


class BlockStore:
    """The database file of one node, and the blocks in it.

    The file also holds the tables of the layers above (the DHT's records, the node
    runtime's subscriptions, heads and delivery log); their owners work on them through
    :meth:`connection` and :meth:`transaction` (see the module docstring for who owns what).

    Every block is checked against its CID before it is written, so the store never holds a
    block that does not hash to its key. Multi-row writes are single transactions: after a
    crash each is either wholly present or wholly absent (see the module docstring for what
    ``synchronous`` means on power loss).

    A bounded LRU (``cache_size`` blocks, 0 disables it) keeps recently read or written blocks
    out of SQLite; memory is bounded by ``cache_size`` times the largest block, whatever the
    size of the database. Iterators page through the tables, so they too stay bounded.

    Not thread-safe, and neither are the owners working through it: the node uses it from
    its one asyncio thread. The connection is opened with ``check_same_thread=False`` only
    so that the runtime may hand the whole store to a single worker thread (e.g. a
    one-thread executor); two threads must never use it at once.

    ``path`` may be ``":memory:"`` for tests of other layers (no durability, no WAL).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        cache_size: int = 2048,
    ) -> None:
        sync = check_synchronous(synchronous)
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self._path = os.fspath(path)
        self._cache_size = cache_size
        self._cache: OrderedDict[CID, bytes] = OrderedDict()
        self._conn, self._guard = open_database(self._path, sync)

    # -- the file, for the owners of the other tables ---------------------------------------

    def connection(self) -> AbstractContextManager[sqlite3.Connection]:
        """The connection, for statements outside :meth:`transaction`::

            with store.connection() as conn:
                row = conn.execute("SELECT ...", params).fetchone()

        The layers that own tables in this file (the module docstring lists them) run their
        SQL through here rather than opening connections of their own: one connection per
        file keeps every write of the node in one sequence of transactions (a second one
        would contend with this one for the file's write lock), and a ``":memory:"`` store
        is reachable only through its own connection.

        The connection is in autocommit mode: each statement is its own transaction. SQLite's
        "corrupt" and "not a database" errors raised inside the ``with`` become
        :class:`StoreError` naming the file, as in this class's own methods; fetch the rows
        inside it, since a corrupt page may be met only while stepping through them. The
        object returned is the same each time (no generator made per call): it wraps reads
        on hot paths, a DHT ``get`` or a delivery-log page.
        """
        return self._guard

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the connection, for writes of more than one statement::

            with store.transaction() as conn:
                conn.execute(...)
                conn.executemany(...)

        Committed if the block finishes, rolled back if it raises: after a crash the writes
        are all present or all absent. ``BEGIN IMMEDIATE`` takes the write lock up front, so
        it never fails half-way because another connection started writing first. It may
        touch the tables of any owner: they are in one file, under one WAL. Errors are
        translated as in :meth:`connection`. Not reentrant (SQLite has no nested ``BEGIN``).
        """
        with self._guard, write_transaction(self._conn) as conn:
            yield conn

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The database file this store was opened on."""
        return self._path

    def close(self) -> None:
        """Close the database. The last connection to close checkpoints the WAL into the main
        file and removes it. Safe to call twice."""
        self._cache.clear()
        try:
            self._conn.execute("PRAGMA optimize")  # keeps the query planner's statistics fresh
        except sqlite3.ProgrammingError:  # already closed
            return
        except sqlite3.DatabaseError:
            pass  # a damaged file must still be closable
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- blocks ---------------------------------------------------------------------------

    def put(self, cid: CID, block: bytes, *, pinned: bool = True) -> bool:
        """Store ``block`` under ``cid``; True if it was not stored before.

        The block is checked against its CID first and :class:`CIDMismatch` raised, with
        nothing written, if it does not hash to it: a store keyed by content must never hold
        content under the wrong key. ``pinned`` says the node itself needs the block (the
        default); False marks a block held only to serve the DHT. Storing an already-present
        block pinned pins it; storing it unpinned never unpins it.
        """
        block = _verified(cid, block)
        with self._guard, write_transaction(self._conn) as conn:
            new = (
                conn.execute(
                    "INSERT OR IGNORE INTO blocks (cid, data, stored_at, pinned) "
                    "VALUES (?, ?, ?, ?)",
                    (cid.raw, block, time.time(), int(pinned)),
                ).rowcount
                == 1
            )
            if not new and pinned:
                conn.execute(
                    "UPDATE blocks SET pinned = 1 WHERE cid = ? AND pinned = 0", (cid.raw,)
                )
            conn.execute(
                "INSERT OR IGNORE INTO block_keys (key, cid) VALUES (?, ?)",
                (_sha1(cid.raw), cid.raw),
            )
        self._remember(cid, block)
        return new

    def put_many(self, items: Iterable[tuple[CID, bytes]], *, pinned: bool = True) -> int:
        """Store many blocks in one transaction; returns how many were new.

        All or nothing: every block is checked against its CID before anything is written, and
        one :class:`CIDMismatch` stores none of them. One transaction per batch is also what
        makes bulk writes fast (one WAL commit instead of one per block).
        """
        now = time.time()
        rows: list[tuple[bytes, bytes, float, int]] = []
        checked: list[tuple[CID, bytes]] = []
        for cid, block in items:
            block = _verified(cid, block)
            rows.append((cid.raw, block, now, int(pinned)))
            checked.append((cid, block))
        if not rows:
            return 0
        with self._guard, write_transaction(self._conn) as conn:
            new = conn.executemany(
                "INSERT OR IGNORE INTO blocks (cid, data, stored_at, pinned) VALUES (?, ?, ?, ?)",
                rows,
            ).rowcount
            if pinned and new < len(rows):
                conn.executemany(
                    "UPDATE blocks SET pinned = 1 WHERE cid = ? AND pinned = 0",
                    [(row[0],) for row in rows],
                )
            conn.executemany(
                "INSERT OR IGNORE INTO block_keys (key, cid) VALUES (?, ?)",
                [(_sha1(row[0]), row[0]) for row in rows],
            )
        if self._cache_size:
            for cid, block in checked[-self._cache_size :]:
                self._remember(cid, block)
        return new

    def get(self, cid: CID) -> bytes | None:
        """The block stored under ``cid``, or None. Blocks were verified when written, so they
        are returned as they are."""
        block = self._cache.get(cid)
        if block is not None:
            self._cache.move_to_end(cid)
            return block
        with self._guard:
            row = self._conn.execute("SELECT data FROM blocks WHERE cid = ?", (cid.raw,)).fetchone()
        if row is None:
            return None
        block = bytes(row[0])
        self._remember(cid, block)
        return block

    def get_many(self, cids: Iterable[CID]) -> dict[CID, bytes]:
        """The blocks present among ``cids``; absent ones are simply not in the result. One
        query per 500 CIDs instead of one per CID."""
        found: dict[CID, bytes] = {}
        missing: dict[bytes, CID] = {}
        for cid in cids:
            block = self._cache.get(cid)
            if block is not None:
                self._cache.move_to_end(cid)
                found[cid] = block
            else:
                missing[cid.raw] = cid
        keys = list(missing)
        for start in range(0, len(keys), _IN_CHUNK):
            chunk = keys[start : start + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            with self._guard:
                rows = self._conn.execute(
                    f"SELECT cid, data FROM blocks WHERE cid IN ({marks})", chunk
                ).fetchall()
            for raw, data in rows:
                cid = missing[bytes(raw)]
                found[cid] = bytes(data)
                self._remember(cid, found[cid])
        return found

    def has(self, cid: CID) -> bool:
        """Whether a block is stored under ``cid``."""
        if cid in self._cache:
            return True
        with self._guard:
            row = self._conn.execute("SELECT 1 FROM blocks WHERE cid = ?", (cid.raw,)).fetchone()
        return row is not None

    def delete(self, cid: CID) -> bool:
        """Remove the block under ``cid``; True if there was one."""
        return self.delete_many([cid]) == 1

    def delete_many(self, cids: Iterable[CID]) -> int:
        """Remove the blocks under ``cids`` in one transaction; how many there were."""
        listed = list(cids)
        for cid in listed:
            self._cache.pop(cid, None)
        raws = [cid.raw for cid in listed]
        with self._guard, write_transaction(self._conn) as conn:
            conn.executemany("DELETE FROM block_keys WHERE key = ?",
                             [(_sha1(raw),) for raw in raws])
            removed = 0
            for raw in raws:
                removed += conn.execute("DELETE FROM blocks WHERE cid = ?", (raw,)).rowcount
            return removed

    def __len__(self) -> int:
        """How many blocks are stored. SQLite counts by walking the primary-key index, so this
        is O(n): fine for stats and tests, not for a hot path."""
        with self._guard:
            return int(self._conn.execute("SELECT count(*) FROM blocks").fetchone()[0])

    def iter_cids(self) -> Iterator[CID]:
        """Every stored CID, in binary order. Pages through the table 1000 rows at a time
        rather than holding a cursor open, so writes made while iterating are safe and memory
        stays bounded."""
        last = b""
        while True:
            with self._guard:
                rows = self._conn.execute(
                    "SELECT cid FROM blocks WHERE cid > ? ORDER BY cid LIMIT ?", (last, _PAGE)
                ).fetchall()
            for (raw,) in rows:
                yield CID.parse(bytes(raw))
            if len(rows) < _PAGE:
                return
            last = rows[-1][0]

    # -- blocks by DHT key ------------------------------------------------------------------

    def block_for_key(self, key: bytes) -> bytes | None:
        """The stored block whose binary CID hashes (sha1) to ``key`` — the key the DHT
        looks it up under —, or None. Pinned or not: every block here was verified against
        its CID when it was written."""
        with self._guard:
            row = self._conn.execute(
                "SELECT b.data FROM block_keys AS k JOIN blocks AS b ON b.cid = k.cid "
                "WHERE k.key = ?",
                (bytes(key),),
            ).fetchone()
        return None if row is None else bytes(row[0])

    def pinned_keys(self, after: bytes = b"", limit: int = _PAGE) -> list[bytes]:
        """DHT keys of pinned blocks greater than ``after``, in key order, at most
        ``limit``: a cursor over the node's own blocks, page by page."""
        with self._guard:
            rows = self._conn.execute(
                "SELECT k.key FROM block_keys AS k JOIN blocks AS b ON b.cid = k.cid "
                "WHERE k.key > ? AND b.pinned = 1 ORDER BY k.key LIMIT ?",
                (bytes(after), limit),
            ).fetchall()
        return [bytes(k) for (k,) in rows]

    def _remember(self, cid: CID, block: bytes) -> None:
        if not self._cache_size:
            return
        cache = self._cache
        cache[cid] = block
        cache.move_to_end(cid)
        if len(cache) > self._cache_size:
            cache.popitem(last=False)


def _verified(cid: CID, block: bytes) -> bytes:
    """``block`` as ``bytes`` if it hashes to ``cid``; raise :class:`CIDMismatch` otherwise."""
    if not isinstance(cid, CID):
        raise TypeError(f"expected a CID, got {type(cid).__name__}")
    if not isinstance(block, bytes):
        if not isinstance(block, bytearray | memoryview):
            raise TypeError(f"expected bytes, got {type(block).__name__}")
        block = bytes(block)
    raw = cid.raw
    if len(raw) == 36 and raw[0] == 1 and raw[1] < 0x80 and raw[2:4] == b"\x12\x20":
        # CIDv1 with a one-byte codec and a sha2-256 digest: every CID pulsarcast makes. The
        # same check as CID.verifies without re-parsing the varints, which cost 6x the hash
        # itself and a quarter of put_many's time.
        ok = hashlib.sha256(block).digest() == raw[4:]
    else:
        ok = cid.verifies(block)
    if not ok:
        raise CIDMismatch(f"block of {len(block)} bytes does not hash to {cid}")
    return block
