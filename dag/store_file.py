"""Opening the node's database file: refusing what is not a pulsarcast database of a
schema this build understands, configuring the connection, and creating or migrating the
schema.

:func:`open_database` checks the file's header before SQLite touches it, then whose file it
is (``application_id``, ``user_version``) before changing anything in it, then sets WAL mode,
``synchronous`` and the other pragmas, and creates the schema of a new file or migrates an
older one (the statements are :mod:`dag.store_schema`'s). :class:`StoreError` is what a file
that cannot be used raises, and ``_CorruptionGuard`` turns SQLite's "corrupt" errors into
it on every later statement too. :func:`write_transaction` is the one way a write
transaction is run on the file. Kept apart from :class:`dag.store.BlockStore`'s block
methods: how a file is opened safely is one job, what is stored in it another.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Final

from .store_schema import (
    _MIGRATIONS,
    _SCHEMA,
    _SHA1_SQL,
    _TABLES,
    APPLICATION_ID,
    SCHEMA_VERSION,
    _sha1,
)

__all__ = ["StoreError", "check_synchronous", "open_database", "write_transaction"]

_SYNCHRONOUS: Final = frozenset({"NORMAL", "FULL", "EXTRA"})  # OFF is not crash-safe
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
_SQLITE_CORRUPT: Final = 11
_SQLITE_NOTADB: Final = 26


class StoreError(RuntimeError):
    """The database file cannot be used: it is not a pulsarcast database, it is corrupt or
    truncated, or it was written by a newer pulsarcast. Not a ``ValueError``: nothing a peer
    sends can cause it, only the state of the local disk."""


class _CorruptionGuard:
    """Turns SQLite's "corrupt" and "not a database" errors into :class:`StoreError` naming
    the file; entering it gives the connection (:meth:`dag.store.BlockStore.connection`).
    A reusable object rather than a ``@contextmanager`` because it wraps every read on the
    hot path, and ``__enter__``/``__exit__`` on a plain object cost far less."""

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


def check_synchronous(synchronous: str) -> str:
    """``synchronous`` in upper case; :class:`ValueError` unless it is a crash-safe setting."""
    sync = synchronous.upper()
    if sync not in _SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS)}, got {synchronous!r}")
    return sync


def open_database(path: str, synchronous: str) -> tuple[sqlite3.Connection, _CorruptionGuard]:
    """Open the database file ``path`` (``synchronous`` already checked by
    :func:`check_synchronous`): the connection and the guard that translates its corruption
    errors. Raises :class:`StoreError`, with the connection closed, if the file cannot be
    used."""
    in_memory = path == ":memory:"
    if not in_memory:
        _check_file_header(path)
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False
    )  # isolation_level=None: autocommit; every multi-statement write says BEGIN itself
    guard = _CorruptionGuard(conn, path)
    try:
        with guard:
            _open(conn, path, synchronous, in_memory)
    except BaseException:
        conn.close()
        raise
    return conn, guard


def _open(conn: sqlite3.Connection, path: str, synchronous: str, in_memory: bool) -> None:
    """Check whose file this is before changing anything in it, then configure the
    connection and create the schema if the file is new."""
    conn.execute("PRAGMA busy_timeout = 5000")  # a backup or sqlite3 shell may hold a lock
    fresh = _check_identity(conn, path)
    if not in_memory:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{path}: cannot use WAL mode (got {mode!r})")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA journal_size_limit = 67108864")  # truncate the WAL back to 64 MiB
    conn.execute("PRAGMA cache_size = -8192")  # 8 MiB of SQLite page cache
    conn.create_function(_SHA1_SQL, 1, _sha1, deterministic=True)
    if fresh:
        with write_transaction(conn):
            # Re-checked under the write lock: another process may have created it since.
            if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                for statement in _SCHEMA:
                    conn.execute(statement)
        _check_identity(conn, path)
    _migrate(conn)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if missing := _TABLES - tables:
        raise StoreError(f"{path}: pulsarcast database is missing tables {sorted(missing)}")


def _check_identity(conn: sqlite3.Connection, path: str) -> bool:
    """True if the file is empty (to be created); raise :class:`StoreError` unless it is a
    pulsarcast database of a schema this build understands."""
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
            f"{path} is an SQLite database but not a pulsarcast one "
            f"(application_id {app_id:#x}, expected {APPLICATION_ID:#x})"
        )
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer pulsarcast (schema version {version}; "
            f"this build understands up to {SCHEMA_VERSION}): upgrade pulsarcast, or use "
            "another data directory"
        )
    if version < SCHEMA_VERSION and version not in _MIGRATIONS:
        raise StoreError(f"{path}: unknown pulsarcast schema version {version}")
    return False


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring an older schema up to :data:`SCHEMA_VERSION`, one step per transaction."""
    while (version := conn.execute("PRAGMA user_version").fetchone()[0]) < SCHEMA_VERSION:
        with write_transaction(conn):
            for statement in _MIGRATIONS[version]:
                _apply(conn, statement)


_ADD_COLUMN: Final = re.compile(r"ALTER TABLE (?P<table>\w+) ADD COLUMN (?P<column>\w+) .*")


def _apply(conn: sqlite3.Connection, statement: str) -> None:
    """One migration statement. Adding a column that is already there is skipped, as
    ``CREATE TABLE IF NOT EXISTS`` skips a table: SQLite has no ``ADD COLUMN IF NOT
    EXISTS``, and a step must be safe to run on a file that already has what it adds."""
    added = _ADD_COLUMN.fullmatch(statement)
    if added is not None:
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({added['table']})")}
        if added["column"] in columns:
            return
    conn.execute(statement)


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: committed if the block finishes, rolled back otherwise.
    ``BEGIN IMMEDIATE`` takes the write lock up front, so a transaction never fails
    half-way because another connection started writing first."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite rolls back by itself on some errors
            conn.execute("ROLLBACK")
        raise


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
