"""The node's durable state: one SQLite database file per node.

One database holds the blocks, the DHT records, the subscriptions, the per-topic heads and
the per-subscription delivery log whose local sequence numbers are what REST cursors, stream
resume and Spark offsets refer to (``docs/architecture.md``, "The store"). Each layer owns the
code of its own tables; this module owns the file:

* opening it, checking it is a pulsarcast database this build understands, WAL mode and the
  ``synchronous`` setting, the schema version and its migrations, and the DDL of every table
  (a schema version is the whole file's, so its tables are created and migrated together);
* the data model's tables, ``blocks`` and ``block_keys``, and their methods on
  :class:`BlockStore`;
* the small interface the other owners use, :meth:`BlockStore.connection` and
  :meth:`BlockStore.transaction`.

The other owners are classes of the layers above, each made on the :class:`BlockStore` it
works on (they import this module; it imports neither)::

    dht.record_table.RecordTable          dht_records
    pulsar.runtime.node_state.NodeState   subscriptions, heads, topic_latest, outbox,
                                          delivery_log, log_state

Why one file and not one per layer: one WAL and one ``synchronous`` policy, one schema
version and one migration path, one file to back up or move, and statements and
transactions that may span the tables of several owners (``NodeState.log_blocks`` reads the
delivery log joined with ``blocks``, in one query).

Tables (schema version :data:`SCHEMA_VERSION`, kept in ``PRAGMA user_version``; the file is
marked as ours with ``PRAGMA application_id`` = :data:`APPLICATION_ID`)::

    blocks        cid → data, stored_at, pinned (1: the node needs it; 0: held for the DHT)
    block_keys    key → cid                      sha1 of each stored block's binary CID,
                                                 the DHT key it is looked up under
                                                 (schema 4): the node answers FIND_VALUE
                                                 for its own blocks (``block_for_key``)
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

# The DDL of every table in the file, whoever owns it (the module docstring): the schema
# version, creation and migrations are the file's, so they are kept in one place. An owner
# changing its tables bumps SCHEMA_VERSION and adds a step to _MIGRATIONS here.
_SCHEMA: Final = (
    # -- the data model's (this module): blocks, and block_keys below ----------------------
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
    # -- the DHT's (dht.record_table) ------------------------------------------------------
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
    # -- the node runtime's (pulsar.runtime.node_state), up to the outbox -----------------
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
    the file; entering it gives the connection (:meth:`BlockStore.connection`). A reusable
    object rather than a ``@contextmanager`` because it wraps every read on the hot path, and
    ``__enter__``/``__exit__`` on a plain object cost far less."""

    __slots__ = ("_conn", "_path")

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self._path = path

    def __enter__(self) -> sqlite3.Connection:
        return self._conn

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
        in_memory = self._path == ":memory:"
        if not in_memory:
            _check_file_header(self._path)
        self._conn = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False
        )  # isolation_level=None: autocommit; every multi-statement write says BEGIN itself
        self._guard = _CorruptionGuard(self._conn, self._path)
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
        with self._guard, self._transaction() as conn:
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
