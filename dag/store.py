"""The node's durable state: one SQLite database file per node.

DESIGN.md ("Durability") asks for one database holding the blocks, the DHT records, the
subscriptions, the per-topic heads and the per-subscription delivery log whose local sequence
numbers are what REST cursors, stream resume and Spark offsets refer to. This module owns that
file and every SQL statement that touches it; the layers above see only :class:`BlockStore`.

Tables (schema version :data:`SCHEMA_VERSION`, kept in ``PRAGMA user_version``; the file is
marked as ours with ``PRAGMA application_id`` = :data:`APPLICATION_ID`)::

    blocks        cid → data, stored_at, pinned (1: the node needs it; 0: held for the DHT)
    dht_records   key → value, stored_at, republished_at
    subscriptions topic → created_at, active
    heads         (topic, event)                 the current heads of a topic's event DAG
    delivery_log  (topic, seq) → event, delivered_at; UNIQUE (topic, event)
    log_state     topic → last_seq, last_at      the per-topic high-water mark of the log
    topic_latest  topic → version                the latest version of a topic the node
                                                 knows (schema 2), so a restart judges and
                                                 updates by it
    outbox        (topic, event) → published_at  this node's own published events not yet
                                                 delivered (logged) here (schema 3): a
                                                 restart announces them again
    block_keys    key → cid                      sha1 of each stored block's binary CID,
                                                 the DHT key it is looked up under
                                                 (schema 4): the node answers FIND_VALUE
                                                 for its own blocks (``block_for_key``)

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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final, Self

from .cid import CID
from .errors import CIDMismatch

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "BlockStore", "StoreError"]

SCHEMA_VERSION: Final = 4
"""The schema this build writes; a file with a higher ``user_version`` is refused."""

APPLICATION_ID: Final = int.from_bytes(b"PLSR", "big")
"""Written to ``PRAGMA application_id`` so a pulsarcast database can be told from any other
SQLite file (``file(1)`` also shows it)."""

_SYNCHRONOUS: Final = frozenset({"NORMAL", "FULL", "EXTRA"})  # OFF is not crash-safe
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
_SQLITE_CORRUPT: Final = 11
_SQLITE_NOTADB: Final = 26
_PAGE: Final = 1000  # rows per query when iterating, so iteration memory stays bounded
_IN_CHUNK: Final = 500  # CIDs per ``IN (...)`` query, well under SQLite's variable limit

# The publisher's own acknowledged events until it has delivered them itself. A publish is
# acknowledged once the DHT quorum stored the event; if the one copy sent down the tree is
# lost and the node is killed before HEADS or IHAVE told anyone, nothing but this row names
# the event: a restart learns these as heads and announces them.
_OUTBOX: Final = """CREATE TABLE IF NOT EXISTS outbox (
        topic        BLOB NOT NULL,
        event        BLOB NOT NULL,
        published_at REAL NOT NULL,
        PRIMARY KEY (topic, event)
    ) WITHOUT ROWID"""

# The DHT looks blocks up by key, ``sha1(bytes(cid))`` (``dht.keys.dht_key``), and a hash
# cannot be inverted: this index maps each stored block's key back to its CID, so a node
# serves its own blocks (the events it delivered or published, pinned) to FIND_VALUE like
# the records it holds for the network. Written in the same transaction as the block.
_BLOCK_KEYS: Final = """CREATE TABLE IF NOT EXISTS block_keys (
        key BLOB PRIMARY KEY,
        cid BLOB NOT NULL
    ) WITHOUT ROWID"""
_SHA1_SQL: Final = "pulsarcast_sha1"
"""A function the connection defines (``_open``) for the schema 3 -> 4 migration only;
nothing stored in the schema refers to it, so other SQLite clients can still write."""

_SCHEMA: Final = (
    # A rowid table, not WITHOUT ROWID: measured on 20,000 random 300-byte blocks in 500-block
    # batches, WITHOUT ROWID put 3x slower (≈20k/s vs ≈60k/s) and got no faster (≈70k/s both);
    # with 2 kB and 16 kB blocks it was slower at both. SQLite's own advice is that WITHOUT
    # ROWID pays only for rows under ~1/20 of a page, and blocks are bigger than that.
    """CREATE TABLE blocks (
        cid       BLOB PRIMARY KEY,
        data      BLOB NOT NULL,
        stored_at REAL NOT NULL,
        pinned    INTEGER NOT NULL DEFAULT 1 CHECK (pinned IN (0, 1))
    )""",
    """CREATE TABLE dht_records (
        key            BLOB PRIMARY KEY,
        value          BLOB NOT NULL,
        stored_at      REAL NOT NULL,
        republished_at REAL NOT NULL
    )""",
    # Expiry and republishing scan by time every few minutes; the indexes make those scans
    # proportional to what they return, not to the table.
    "CREATE INDEX dht_records_stored_at ON dht_records (stored_at)",
    "CREATE INDEX dht_records_republished_at ON dht_records (republished_at)",
    """CREATE TABLE subscriptions (
        topic      BLOB PRIMARY KEY,
        created_at REAL NOT NULL,
        active     INTEGER NOT NULL CHECK (active IN (0, 1))
    )""",
    # Small rows keyed by a composite primary key: the case WITHOUT ROWID is made for (no
    # hidden rowid and no second index for the key).
    """CREATE TABLE heads (
        topic BLOB NOT NULL,
        event BLOB NOT NULL,
        PRIMARY KEY (topic, event)
    ) WITHOUT ROWID""",
    """CREATE TABLE delivery_log (
        topic        BLOB NOT NULL,
        seq          INTEGER NOT NULL CHECK (seq > 0),
        event        BLOB NOT NULL,
        delivered_at REAL NOT NULL,
        PRIMARY KEY (topic, seq)
    ) WITHOUT ROWID""",
    "CREATE UNIQUE INDEX delivery_log_event ON delivery_log (topic, event)",
    "CREATE INDEX delivery_log_time ON delivery_log (topic, delivered_at, seq)",
    # The high-water mark lives apart from the log so that a sequence number is never handed
    # out twice, even after the latest entries have been pruned.
    """CREATE TABLE log_state (
        topic    BLOB PRIMARY KEY,
        last_seq INTEGER NOT NULL,
        last_at  REAL NOT NULL
    )""",
    """CREATE TABLE topic_latest (
        topic   BLOB PRIMARY KEY,
        version BLOB NOT NULL
    )""",
    _OUTBOX,
    _BLOCK_KEYS,
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
_MIGRATIONS: Final = {
    # 1 -> 2: durable topic versions.
    1: (
        "CREATE TABLE IF NOT EXISTS topic_latest (topic BLOB PRIMARY KEY, version BLOB NOT NULL)",
        "PRAGMA user_version = 2",
    ),
    # 2 -> 3: the publisher's outbox.
    2: (_OUTBOX, "PRAGMA user_version = 3"),
    # 3 -> 4: blocks by DHT key.
    3: (
        _BLOCK_KEYS,
        f"INSERT OR IGNORE INTO block_keys (key, cid) SELECT {_SHA1_SQL}(cid), cid FROM blocks",
        "PRAGMA user_version = 4",
    ),
}
_TABLES: Final = frozenset(
    {"blocks", "dht_records", "subscriptions", "heads", "delivery_log", "log_state",
     "topic_latest", "outbox", "block_keys"}
)


class StoreError(RuntimeError):
    """The database file cannot be used: it is not a pulsarcast database, it is corrupt or
    truncated, or it was written by a newer pulsarcast. Not a ``ValueError``: nothing a peer
    sends can cause it, only the state of the local disk."""


class _CorruptionGuard:
    """Turns SQLite's "corrupt" and "not a database" errors into :class:`StoreError` naming
    the file. A reusable object rather than a ``@contextmanager`` because it wraps every read
    on the hot path, and ``__enter__``/``__exit__`` on a plain object cost far less."""

    __slots__ = ("_path",)

    def __init__(self, path: str) -> None:
        self._path = path

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, sqlite3.DatabaseError):
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # extended → primary code
            if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
                raise StoreError(f"{self._path}: damaged pulsarcast database: {exc}") from exc


class BlockStore:
    """Durable blocks, DHT records, subscriptions, heads and delivery log of one node.

    Every block is checked against its CID before it is written, so the store never holds a
    block that does not hash to its key. Multi-row writes are single transactions: after a
    crash each is either wholly present or wholly absent (see the module docstring for what
    ``synchronous`` means on power loss).

    A bounded LRU (``cache_size`` blocks, 0 disables it) keeps recently read or written blocks
    out of SQLite; memory is bounded by ``cache_size`` times the largest block, whatever the
    size of the database. Iterators page through the tables, so they too stay bounded.

    Not thread-safe: the node uses it from its one asyncio thread. The connection is opened
    with ``check_same_thread=False`` only so that the runtime may hand the whole store to a
    single worker thread (e.g. a one-thread executor); two threads must never use it at once.

    ``path`` may be ``":memory:"`` for tests of other layers (no durability, no WAL).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        cache_size: int = 2048,
    ) -> None:
        sync = synchronous.upper()
        if sync not in _SYNCHRONOUS:
            raise ValueError(
                f"synchronous must be one of {sorted(_SYNCHRONOUS)}, got {synchronous!r}"
            )
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self._path = os.fspath(path)
        self._cache_size = cache_size
        self._cache: OrderedDict[CID, bytes] = OrderedDict()
        self._guard = _CorruptionGuard(self._path)
        in_memory = self._path == ":memory:"
        if not in_memory:
            _check_file_header(self._path)
        self._conn = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False
        )  # isolation_level=None: autocommit; every multi-statement write says BEGIN itself
        try:
            with self._guard:
                self._open(sync, in_memory)
        except BaseException:
            self._conn.close()
            raise

    def _open(self, synchronous: str, in_memory: bool) -> None:
        """Check whose file this is before changing anything in it, then configure the
        connection and create the schema if the file is new."""
        conn = self._conn
        conn.execute("PRAGMA busy_timeout = 5000")  # a backup or sqlite3 shell may hold a lock
        fresh = self._check_identity()
        if not in_memory:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self._path}: cannot use WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_size_limit = 67108864")  # truncate the WAL back to 64 MiB
        conn.execute("PRAGMA cache_size = -8192")  # 8 MiB of SQLite page cache
        conn.create_function(_SHA1_SQL, 1, _sha1, deterministic=True)
        if fresh:
            with self._transaction():
                # Re-checked under the write lock: another process may have created it since.
                if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                    for statement in _SCHEMA:
                        conn.execute(statement)
            self._check_identity()
        self._migrate()
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if missing := _TABLES - tables:
            raise StoreError(
                f"{self._path}: pulsarcast database is missing tables {sorted(missing)}"
            )

    def _check_identity(self) -> bool:
        """True if the file is empty (to be created); raise :class:`StoreError` unless it is a
        pulsarcast database of a schema this build understands."""
        conn = self._conn
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if (
            app_id == 0
            and version == 0
            and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        ):
            return True
        if app_id != APPLICATION_ID:
            raise StoreError(
                f"{self._path} is an SQLite database but not a pulsarcast one "
                f"(application_id {app_id:#x}, expected {APPLICATION_ID:#x})"
            )
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self._path} was written by a newer pulsarcast (schema version {version}; "
                f"this build understands up to {SCHEMA_VERSION}): upgrade pulsarcast, or use "
                "another data directory"
            )
        if version < SCHEMA_VERSION and version not in _MIGRATIONS:
            raise StoreError(f"{self._path}: unknown pulsarcast schema version {version}")
        return False

    def _migrate(self) -> None:
        """Bring an older schema up to :data:`SCHEMA_VERSION`, one step per transaction."""
        conn = self._conn
        while (version := conn.execute("PRAGMA user_version").fetchone()[0]) < SCHEMA_VERSION:
            with self._transaction():
                for statement in _MIGRATIONS[version]:
                    conn.execute(statement)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed if the block finishes, rolled back otherwise.
        ``BEGIN IMMEDIATE`` takes the write lock up front, so a transaction never fails
        half-way because another connection started writing first."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite rolls back by itself on some errors
                conn.execute("ROLLBACK")
            raise

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
        with self._guard, self._transaction() as conn:
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
        with self._guard, self._transaction() as conn:
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
        self._cache.pop(cid, None)
        with self._guard, self._transaction() as conn:
            conn.execute("DELETE FROM block_keys WHERE key = ?", (_sha1(cid.raw),))
            return conn.execute("DELETE FROM blocks WHERE cid = ?", (cid.raw,)).rowcount == 1

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

    # -- DHT records ----------------------------------------------------------------------

    def dht_put(self, key: bytes, value: bytes, now: float) -> None:
        """Store or overwrite a DHT record. Both ``stored_at`` and ``republished_at`` become
        ``now``: a record just stored here was just stored on the other closest nodes too, so
        it needs no republishing for another interval (the Kademlia paper's optimisation), and
        its expiry counts from the latest store."""
        with self._guard:
            self._conn.execute(
                "INSERT INTO dht_records (key, value, stored_at, republished_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "stored_at = excluded.stored_at, republished_at = excluded.republished_at",
                (bytes(key), bytes(value), now, now),
            )

    def dht_put_many(self, items: Iterable[tuple[bytes, bytes]], now: float) -> None:
        """:meth:`dht_put` for many records in one transaction: a commit costs ~185 us on
        disk here, which would cap a node at a few thousand received STOREs per second."""
        rows = [(bytes(k), bytes(v), now, now) for k, v in items]
        if not rows:
            return
        with self._guard, self._transaction() as conn:
            conn.executemany(
                "INSERT INTO dht_records (key, value, stored_at, republished_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "stored_at = excluded.stored_at, republished_at = excluded.republished_at",
                rows,
            )

    def dht_get(self, key: bytes) -> bytes | None:
        """The value of a DHT record, or None."""
        with self._guard:
            row = self._conn.execute(
                "SELECT value FROM dht_records WHERE key = ?", (bytes(key),)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def dht_held(self, keys: Iterable[bytes]) -> set[bytes]:
        """Those of ``keys`` under which a DHT record is stored, without reading the
        values (one query per 500 keys)."""
        wanted = list(dict.fromkeys(bytes(k) for k in keys))
        held: set[bytes] = set()
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start : start + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            with self._guard:
                rows = self._conn.execute(
                    f"SELECT key FROM dht_records WHERE key IN ({marks})", chunk
                ).fetchall()
            held.update(bytes(k) for (k,) in rows)
        return held

    def dht_items_older_than(self, cutoff: float) -> list[tuple[bytes, bytes]]:
        """``(key, value)`` of the records last republished before ``cutoff``, oldest first:
        the ones due for republishing."""
        with self._guard:
            rows = self._conn.execute(
                "SELECT key, value FROM dht_records WHERE republished_at < ? "
                "ORDER BY republished_at",
                (cutoff,),
            ).fetchall()
        return [(bytes(k), bytes(v)) for k, v in rows]

    def dht_mark_republished(self, keys: Iterable[bytes], now: float) -> None:
        """Record that ``keys`` were republished at ``now`` (one transaction). Keys that are
        not stored are ignored."""
        params = [(now, bytes(key)) for key in keys]
        if not params:
            return
        with self._guard, self._transaction() as conn:
            conn.executemany("UPDATE dht_records SET republished_at = ? WHERE key = ?", params)

    def dht_expire(self, cutoff: float) -> int:
        """Delete the records stored before ``cutoff``; returns how many."""
        with self._guard:
            cursor = self._conn.execute("DELETE FROM dht_records WHERE stored_at < ?", (cutoff,))
        return int(cursor.rowcount)

    def dht_iter(self) -> Iterator[tuple[bytes, bytes, float]]:
        """Every record as ``(key, value, stored_at)``, in key order, paged like
        :meth:`iter_cids`."""
        last = b""
        first = True
        while True:
            with self._guard:
                rows = self._conn.execute(
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

    def dht_len(self) -> int:
        """How many DHT records are stored."""
        with self._guard:
            return int(self._conn.execute("SELECT count(*) FROM dht_records").fetchone()[0])

    def dht_bytes(self) -> int:
        """Total size of the stored DHT record values (SQLite reads blob sizes from the row
        headers, without loading the values)."""
        with self._guard:
            row = self._conn.execute("SELECT total(length(value)) FROM dht_records").fetchone()
        return int(row[0])

    # -- subscriptions --------------------------------------------------------------------

    def add_subscription(self, topic: CID, now: float) -> bool:
        """Mark ``topic`` subscribed; True if it was not already active. Re-subscribing after
        :meth:`remove_subscription` resets ``created_at`` and keeps the old delivery log, so
        sequence numbers carry on where they stopped."""
        with self._guard:
            return (
                self._conn.execute(
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
        with self._guard:
            return (
                self._conn.execute(
                    "UPDATE subscriptions SET active = 0 WHERE topic = ? AND active = 1",
                    (topic.raw,),
                ).rowcount
                == 1
            )

    def subscription_since(self, topic: CID) -> float | None:
        """When the active subscription to ``topic`` began (None if there is none)."""
        with self._guard:
            row = self._conn.execute(
                "SELECT created_at FROM subscriptions WHERE topic = ? AND active = 1",
                (topic.raw,),
            ).fetchone()
        return None if row is None else float(row[0])

    def subscriptions(self) -> list[CID]:
        """The active subscriptions, oldest first."""
        with self._guard:
            rows = self._conn.execute(
                "SELECT topic FROM subscriptions WHERE active = 1 ORDER BY created_at, topic"
            ).fetchall()
        return [CID.parse(bytes(raw)) for (raw,) in rows]

    # -- heads ----------------------------------------------------------------------------

    def set_heads(self, topic: CID, events: Iterable[CID]) -> None:
        """Replace the heads of ``topic`` with ``events``, atomically: a reader (or a restart)
        sees the old set or the new one, never a mixture."""
        rows = [(topic.raw, event.raw) for event in events]
        with self._guard, self._transaction() as conn:
            conn.execute("DELETE FROM heads WHERE topic = ?", (topic.raw,))
            conn.executemany("INSERT OR IGNORE INTO heads (topic, event) VALUES (?, ?)", rows)

    def heads(self, topic: CID) -> list[CID]:
        """The heads of ``topic``, in binary CID order (deterministic); empty if none."""
        with self._guard:
            rows = self._conn.execute(
                "SELECT event FROM heads WHERE topic = ? ORDER BY event", (topic.raw,)
            ).fetchall()
        return [CID.parse(bytes(raw)) for (raw,) in rows]

    # -- topic versions -------------------------------------------------------------------

    def set_latest_version(self, topic: CID, version: CID) -> None:
        """Remember ``version`` as the latest known version of the topic ``topic`` (its
        first version's CID); the version's block is stored (pinned) by the caller."""
        with self._guard, self._transaction() as conn:
            conn.execute(
                "INSERT INTO topic_latest (topic, version) VALUES (?, ?) "
                "ON CONFLICT (topic) DO UPDATE SET version = excluded.version",
                (topic.raw, version.raw),
            )

    def latest_version(self, topic: CID) -> CID | None:
        """The latest version of ``topic`` remembered by :meth:`set_latest_version`."""
        with self._guard:
            row = self._conn.execute(
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
        with self._guard, self._transaction() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO outbox (topic, event, published_at) VALUES (?, ?, ?)",
                rows,
            )

    def outbox_remove(self, topic: CID, events: Iterable[CID]) -> None:
        """Forget published events of ``topic`` that no longer need announcing."""
        rows = [(topic.raw, event.raw) for event in events]
        if not rows:
            return
        with self._guard, self._transaction() as conn:
            conn.executemany("DELETE FROM outbox WHERE topic = ? AND event = ?", rows)

    def outbox(self) -> dict[CID, list[CID]]:
        """Every topic's outbox, oldest publish first."""
        with self._guard:
            rows = self._conn.execute(
                "SELECT topic, event FROM outbox ORDER BY published_at, topic, event"
            ).fetchall()
        out: dict[CID, list[CID]] = {}
        for topic, event in rows:
            out.setdefault(CID.parse(bytes(topic)), []).append(CID.parse(bytes(event)))
        return out

    # -- delivery log ---------------------------------------------------------------------

    def log_append(self, topic: CID, events: Sequence[CID], now: float) -> list[int]:
        """Append ``events`` (in delivery order) to the log of ``topic``, in one transaction,
        and return the sequence numbers given to the new ones.

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
        with self._guard, self._transaction() as conn:
            row = conn.execute(
                "SELECT last_seq, last_at FROM log_state WHERE topic = ?", (t,)
            ).fetchone()
            last_seq, at = (0, now) if row is None else (int(row[0]), max(now, float(row[1])))
            for event in events:
                e = event.raw
                if conn.execute(
                    "SELECT 1 FROM delivery_log WHERE topic = ? AND event = ?", (t, e)
                ).fetchone():
                    continue
                last_seq += 1
                conn.execute(
                    "INSERT INTO delivery_log (topic, seq, event, delivered_at) "
                    "VALUES (?, ?, ?, ?)",
                    (t, last_seq, e, at),
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
        """Like :meth:`log_range`, each entry with its event's block (None if the block
        is gone): one query per page instead of one per event, for replay."""
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
        with self._guard:
            return self._conn.execute(sql, params).fetchall()

    def log_last_seq(self, topic: CID) -> int:
        """The highest sequence number ever given in the log of ``topic``; 0 if none."""
        with self._guard:
            row = self._conn.execute(
                "SELECT last_seq FROM log_state WHERE topic = ?", (topic.raw,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def log_seq_of(self, topic: CID, event: CID) -> int | None:
        """The sequence number of ``event`` in the log of ``topic``, or None."""
        with self._guard:
            row = self._conn.execute(
                "SELECT seq FROM delivery_log WHERE topic = ? AND event = ?",
                (topic.raw, event.raw),
            ).fetchone()
        return None if row is None else int(row[0])

    def log_contains(self, topic: CID, event: CID) -> bool:
        """Whether ``event`` is in the log of ``topic``."""
        return self.log_seq_of(topic, event) is not None

    def log_seq_at_time(self, topic: CID, ts: float) -> int:
        """The last sequence number delivered strictly before ``ts``; 0 if none. Reading the
        log after it yields exactly what was delivered at or after ``ts`` (a time-based
        cursor, e.g. a Spark starting offset). Entries removed by :meth:`log_prune` are
        forgotten, so for a time before every remaining entry the answer is 0."""
        with self._guard:
            row = self._conn.execute(
                "SELECT seq FROM delivery_log WHERE topic = ? AND delivered_at < ? "
                "ORDER BY delivered_at DESC, seq DESC LIMIT 1",
                (topic.raw, ts),
            ).fetchone()
        return 0 if row is None else int(row[0])

    def log_prune(self, topic: CID, through_seq: int) -> int:
        """Delete the entries of ``topic`` with ``seq <= through_seq`` (a retention policy's
        tool); returns how many. The high-water mark stays, so new entries still get numbers
        above every number handed out before."""
        with self._guard:
            return int(
                self._conn.execute(
                    "DELETE FROM delivery_log WHERE topic = ? AND seq <= ?",
                    (topic.raw, through_seq),
                ).rowcount
            )


def _sha1(data: bytes) -> bytes:
    """The DHT key of a binary CID (``dht.keys.dht_key``, which this layer cannot import)."""
    return hashlib.sha1(bytes(data)).digest()


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


def _check_file_header(path: str) -> None:
    """Refuse, before SQLite touches it, a file that is not an SQLite database or is shorter
    than its own header says (a truncated copy). Cheap: reads 100 bytes and a file size.

    The size check is skipped when a non-empty ``-wal`` file exists: the WAL may legitimately
    hold pages the main file does not have yet. A missing or empty file is a new database.
    """
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise StoreError(f"{path} is not a pulsarcast database (not an SQLite file)")
    page_size = int.from_bytes(header[16:18], "big")
    if page_size == 1:
        page_size = 65536
    if page_size < 512 or page_size & (page_size - 1):
        raise StoreError(f"{path}: damaged SQLite header (page size {page_size})")
    try:
        if os.path.getsize(path + "-wal") > 0:
            return
    except FileNotFoundError:
        pass
    if size % page_size:
        raise StoreError(
            f"{path} is truncated: {size} bytes is not a whole number of {page_size}-byte pages"
        )
    pages = int.from_bytes(header[28:32], "big")
    # The in-header page count is trusted only when the change counter matches the
    # "version-valid-for" number (https://www.sqlite.org/fileformat.html#in_header_database_size).
    if pages and header[24:28] == header[92:96] and size < pages * page_size:
        raise StoreError(f"{path} is truncated: {size} bytes, its header says {pages * page_size}")
