"""Tests of dag.store.BlockStore on real SQLite files (under tmp_path)."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from dag import store as store_module
from dag.cid import CID, cid_of
from dag.errors import CIDMismatch
from dag.store import APPLICATION_ID, SCHEMA_VERSION, BlockStore, StoreError
from pulsar.tools.bench.store import bench_store
from tests.helpers.store_writer import batch_blocks

ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "tests" / "helpers" / "store_writer.py"


def block(i: int, size: int = 40) -> tuple[CID, bytes]:
    """A distinct valid DAG-CBOR block (a byte string) and its CID."""
    payload = i.to_bytes(8, "big") * (size // 8)
    data = b"\x59" + len(payload).to_bytes(2, "big") + payload  # byte string, 2-byte length
    return cid_of(data), data


def topic(i: int) -> CID:
    return block(1_000_000 + i)[0]


def sql(path: Path, query: str) -> list[tuple[object, ...]]:
    """Run one query on the file with a plain sqlite3 connection, outside the store."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(query).fetchall()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "node.sqlite3"


def test_public_surface() -> None:
    assert store_module.__all__ == ["APPLICATION_ID", "SCHEMA_VERSION", "BlockStore", "StoreError"]
    assert issubclass(StoreError, RuntimeError)


# -- blocks ---------------------------------------------------------------------------------


def test_block_round_trip(db: Path) -> None:
    with BlockStore(db) as store:
        items = [block(i) for i in range(5)]
        for cid, data in items:
            assert store.put(cid, data) is True
        assert store.put(*items[0]) is False
        assert len(store) == 5
        for cid, data in items:
            assert store.get(cid) == data
            assert store.has(cid)
        absent = block(99)[0]
        assert store.get(absent) is None and not store.has(absent)
        assert store.get_many([items[0][0], absent, items[3][0]]) == dict([items[0], items[3]])
        assert sorted(store.iter_cids(), key=bytes) == sorted((c for c, _ in items), key=bytes)
        assert store.delete(items[1][0]) is True
        assert store.delete(items[1][0]) is False
        assert store.get(items[1][0]) is None and len(store) == 4


def test_put_of_mismatching_block_stores_nothing(db: Path) -> None:
    with BlockStore(db) as store:
        cid, _ = block(1)
        with pytest.raises(CIDMismatch):
            store.put(cid, block(2)[1])
        # A CID with a hash the store cannot check (sha2-512) is refused, not trusted.
        sha512 = CID(bytes([1, 0x71, 0x13, 64]) + bytes(64))
        with pytest.raises(CIDMismatch):
            store.put(sha512, b"\xa0")
        with pytest.raises(TypeError):
            store.put(cid, "not bytes")  # type: ignore[arg-type]
        assert len(store) == 0 and not store.has(cid) and store.get(cid) is None
    assert sql(db, "SELECT count(*) FROM blocks") == [(0,)]


def test_put_many_is_all_or_nothing(db: Path) -> None:
    good = [block(i) for i in range(10)]
    bad = (block(100)[0], block(101)[1])
    with BlockStore(db) as store:
        with pytest.raises(CIDMismatch):
            store.put_many([*good[:5], bad, *good[5:]])
        assert len(store) == 0 and not any(store.has(c) for c, _ in good)
        assert store.put_many(good[:6]) == 6
        assert store.put_many(good) == 4  # only the new ones count
        assert store.put_many(good + good) == 0
        assert store.put_many([]) == 0
        assert store.get_many(c for c, _ in good) == dict(good)


def test_pinning_only_ever_upgrades(db: Path) -> None:
    a, b = block(1), block(2)
    with BlockStore(db) as store:
        store.put(*a, pinned=False)
        store.put_many([b], pinned=False)
        store.put(*b, pinned=False)
        store.put_many([a], pinned=True)
    assert sorted(sql(db, "SELECT cid, pinned FROM blocks")) == sorted(
        [(bytes(a[0]), 1), (bytes(b[0]), 0)]
    )


def test_lru_stays_within_cache_size(db: Path) -> None:
    items = [block(i, size=1000) for i in range(1500)]
    with BlockStore(db, cache_size=16) as store:
        store.put_many(items)
        assert len(store._cache) <= 16
        for cid, data in items[:40]:
            store.put(cid, data)
            assert len(store._cache) <= 16
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            for cid, data in items:  # 1.5 MB of blocks through a 16-block cache
                assert store.get(cid) == data
                assert len(store._cache) <= 16
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak - base < 200_000
        assert store.get_many(c for c, _ in items) == dict(items)
        assert len(store._cache) <= 16
    with BlockStore(db, cache_size=0) as store:  # no cache at all still works
        assert store.get(items[0][0]) == items[0][1] and len(store._cache) == 0


def test_cache_never_serves_deleted_blocks(db: Path) -> None:
    cid, data = block(1)
    with BlockStore(db) as store:
        store.put(cid, data)
        assert store.get(cid) == data
        store.delete(cid)
        assert store.get(cid) is None and not store.has(cid)


# -- persistence ----------------------------------------------------------------------------


def test_reopen_keeps_the_blocks(db: Path) -> None:
    # With the other owners' tables: tests/runtime/test_node_state.py.
    items = [block(i) for i in range(50)]
    with BlockStore(db) as store:
        store.put_many(items)
    assert not os.path.exists(f"{db}-wal")  # a clean close checkpoints the WAL away
    with BlockStore(db, synchronous="FULL") as store:
        assert store.get_many(c for c, _ in items) == dict(items)
    assert sql(db, "PRAGMA journal_mode") == [("wal",)]
    assert sql(db, "PRAGMA application_id") == [(APPLICATION_ID,)]
    assert sql(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


def test_options_are_checked(db: Path) -> None:
    with pytest.raises(ValueError):
        BlockStore(db, synchronous="OFF")
    with pytest.raises(ValueError):
        BlockStore(db, cache_size=-1)
    with BlockStore(db, synchronous="full") as store:
        assert store._conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    with BlockStore(db) as store:
        assert store._conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert store._conn.execute("PRAGMA foreign_keys").fetchone() == (1,)


def test_in_memory_store_for_other_layers_tests() -> None:
    with BlockStore(":memory:") as store:
        cid, data = block(1)
        assert store.put(cid, data) and store.get(cid) == data


def test_close_twice_and_use_after_close(db: Path) -> None:
    store = BlockStore(db)
    cid, data = block(1)
    store.put(cid, data)
    store.close()
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        store.get(cid)  # the cache was dropped too: nothing is served from a closed store


# -- the interface of the other tables' owners ---------------------------------------------


def test_owners_statements_commit_at_once_and_their_transactions_all_or_nothing(
    db: Path,
) -> None:
    with BlockStore(db) as store:
        assert store.connection() is store.connection()  # one reusable guard, no new object
        with store.connection() as conn:
            conn.execute("INSERT INTO topic_latest (topic, version) VALUES (?, ?)", (b"t1", b"v"))
        assert sql(db, "SELECT topic FROM topic_latest") == [(b"t1",)]  # autocommit
        with pytest.raises(RuntimeError), store.transaction() as conn:
            conn.execute("INSERT INTO topic_latest (topic, version) VALUES (?, ?)", (b"t2", b"v"))
            raise RuntimeError("the owner's write failed half-way")
        with store.transaction() as conn:  # two tables, one transaction
            conn.execute("INSERT INTO topic_latest (topic, version) VALUES (?, ?)", (b"t3", b"v"))
            conn.execute("DELETE FROM topic_latest WHERE topic = ?", (b"t1",))
            conn.execute("INSERT INTO heads (topic, event) VALUES (?, ?)", (b"t3", b"e"))
        assert not store._conn.in_transaction
    assert sql(db, "SELECT topic FROM topic_latest") == [(b"t3",)]
    assert sql(db, "SELECT topic, event FROM heads") == [(b"t3", b"e")]


@pytest.mark.parametrize("code", [11, 26], ids=["corrupt", "not-a-database"])
def test_owners_see_damage_as_store_error(db: Path, code: int) -> None:
    damage = sqlite3.DatabaseError("database disk image is malformed")
    damage.sqlite_errorcode = code  # what SQLite sets on the errors it raises
    with BlockStore(db) as store:
        with pytest.raises(StoreError, match="damaged"), store.connection():
            raise damage
        with pytest.raises(StoreError, match="damaged"), store.transaction():
            raise damage
        assert not store._conn.in_transaction  # rolled back
        with pytest.raises(sqlite3.OperationalError), store.connection() as conn:
            conn.execute("SELECT * FROM no_such_table")  # other errors pass through


# -- files that are not ours, damaged, or too new -------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not a database\n" * 100, b"SQLite format 3\x00", os.urandom(8192)],
    ids=["text", "short-header", "random"],
)
def test_not_a_database(db: Path, content: bytes) -> None:
    db.write_bytes(content)
    with pytest.raises(StoreError, match="not"):
        BlockStore(db)
    assert db.read_bytes() == content  # refused without touching it


def test_other_sqlite_database_is_refused_untouched(db: Path) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    with pytest.raises(StoreError, match="not a pulsarcast one"):
        BlockStore(db)
    assert sql(db, "PRAGMA journal_mode") == [("delete",)]  # not switched to WAL


def test_truncated_file(db: Path) -> None:
    with BlockStore(db) as store:
        store.put_many(block(i, size=200) for i in range(2000))
    size = db.stat().st_size
    for cut in (size // 2 // 4096 * 4096, size // 2 + 100, 60):
        with open(db, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(StoreError, match=r"truncated|not a pulsarcast"):
            BlockStore(db)


def test_corrupt_pages_give_store_error(db: Path) -> None:
    with BlockStore(db) as store:
        store.put_many(block(i, size=200) for i in range(2000))
    with open(db, "r+b") as f:  # keep page 1 (the header and schema), scramble the rest
        f.seek(4096)
        f.write(random.Random(1).randbytes(db.stat().st_size - 4096))
    with pytest.raises(StoreError, match="damaged"), BlockStore(db) as store:
        list(store.iter_cids())


def test_newer_schema_is_refused(db: Path) -> None:
    BlockStore(db).close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.commit()
    with pytest.raises(StoreError, match="newer pulsarcast"):
        BlockStore(db)


def test_bench_store_reports_both_rates(tmp_path: Path) -> None:
    results = bench_store(tmp_path / "bench.sqlite3", n=300, batch=100)
    assert set(results) == {"store_put_per_s", "store_get_per_s"}
    assert all(rate > 0 for rate in results.values())
    with pytest.raises(FileExistsError):
        bench_store(tmp_path / "bench.sqlite3", n=10)


# -- crash safety ---------------------------------------------------------------------------

BATCH = 1000  # blocks per put_many in the writer process


def _read_commits(
    proc: subprocess.Popen[bytes], want: int, deadline: float
) -> list[tuple[int, float]]:
    """Read ``committed i seconds`` lines from the writer until ``want`` of them arrived."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = b""
    commits: list[tuple[int, float]] = []
    while len(commits) < want:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"writer reported only {len(commits)} batches in time")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            proc.wait()
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            pytest.fail(f"writer exited early ({proc.returncode}): {stderr}")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            word, index, seconds = line.decode().split()
            assert word == "committed"
            commits.append((int(index), float(seconds)))
    return commits


def _check_after_crash(db: Path, reported: set[int]) -> int:
    """The checks after a kill; returns how many batches are in the store."""
    with BlockStore(db, cache_size=0) as store:  # reopening replays the WAL
        assert sql(db, "PRAGMA integrity_check") == [("ok",)]
        complete = 0
        for index in range(max(reported) + 4):
            cids = [cid for cid, _ in batch_blocks(index, BATCH)]
            present = len(store.get_many(cids))
            assert present in (0, BATCH), f"batch {index} is partly stored ({present}/{BATCH})"
            if present:
                assert index == complete, f"batch {index} stored but an earlier one is not"
                complete += 1
        assert reported <= set(range(complete)), "a batch reported committed was lost"
        # Nothing else is stored (no stray part of a later batch), and every block is whole.
        assert len(store) == complete * BATCH
        for cid in store.iter_cids():
            data = store.get(cid)
            assert data is not None and cid.verifies(data)
    return complete


def test_sigkill_mid_write_loses_no_committed_batch(db: Path) -> None:
    """Kill a writing process three times; after each kill the store must be intact, hold every
    batch the writer reported committed, and hold each batch wholly or not at all."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    rng = random.Random(20240601)
    reported: set[int] = set()
    first = 0
    for _ in range(3):
        with subprocess.Popen(
            [sys.executable, str(WRITER), str(db), str(first), str(BATCH)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        ) as proc:
            try:
                commits = _read_commits(proc, want=3, deadline=time.monotonic() + 20)
                # The writer is now in put_many of the next batch. Kill it at a random point
                # of the time a put_many takes, so over the rounds the kill lands in the
                # verification, the inserts and the commit. (A jitter, not a wait for progress.)
                time.sleep(rng.uniform(0, commits[-1][1]))
                proc.send_signal(signal.SIGKILL)
            finally:
                proc.kill()
                proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        assert os.path.exists(f"{db}-wal"), "the writer must have died with its WAL open"
        reported |= {index for index, _ in commits}
        first = _check_after_crash(db, reported)
        assert first >= max(reported) + 1
