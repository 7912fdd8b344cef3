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
from dag.store_bench import bench_store
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


def test_reopen_keeps_everything(db: Path) -> None:
    items = [block(i) for i in range(50)]
    t, h = topic(1), [block(200)[0], block(201)[0]]
    with BlockStore(db) as store:
        store.put_many(items)
        store.dht_put(b"k", b"v", now=5.0)
        store.add_subscription(t, now=1.0)
        store.set_heads(t, h)
        store.log_append(t, h, now=2.0)
    assert not os.path.exists(f"{db}-wal")  # a clean close checkpoints the WAL away
    with BlockStore(db, synchronous="FULL") as store:
        assert store.get_many(c for c, _ in items) == dict(items)
        assert list(store.dht_iter()) == [(b"k", b"v", 5.0)]
        assert store.subscriptions() == [t]
        assert store.heads(t) == sorted(h, key=bytes)
        assert [(s, e) for s, e, _ in store.log_range(t)] == [(1, h[0]), (2, h[1])]
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


# -- DHT records ----------------------------------------------------------------------------


def test_dht_records(db: Path) -> None:
    with BlockStore(db) as store:
        assert store.dht_get(b"a") is None and store.dht_len() == 0
        store.dht_put(b"a", b"1", now=100.0)
        store.dht_put(b"b", b"2", now=200.0)
        store.dht_put(b"c", b"3", now=300.0)
        assert store.dht_get(b"a") == b"1" and store.dht_len() == 3
        store.dht_put(b"a", b"1'", now=250.0)  # overwrite: new value, both times reset
        assert store.dht_get(b"a") == b"1'" and store.dht_len() == 3
        assert list(store.dht_iter()) == [
            (b"a", b"1'", 250.0),
            (b"b", b"2", 200.0),
            (b"c", b"3", 300.0),
        ]
        assert store.dht_items_older_than(260.0) == [(b"b", b"2"), (b"a", b"1'")]
        store.dht_mark_republished([b"b", b"missing"], now=400.0)
        store.dht_mark_republished([], now=400.0)
        assert store.dht_items_older_than(260.0) == [(b"a", b"1'")]
        assert store.dht_items_older_than(0.0) == []
        # Expiry goes by stored_at, not republished_at: b was stored at 200.
        assert store.dht_expire(260.0) == 2
        assert store.dht_get(b"b") is None and store.dht_get(b"a") is None
        assert store.dht_expire(260.0) == 0
        assert [k for k, _, _ in store.dht_iter()] == [b"c"] and store.dht_len() == 1


def test_dht_iter_pages_through_many_records(db: Path) -> None:
    with BlockStore(db) as store:
        keys = [i.to_bytes(4, "big") for i in range(1200)]
        for k in keys:
            store.dht_put(k, k, now=1.0)
        assert [k for k, _, _ in store.dht_iter()] == keys


# -- subscriptions and heads ----------------------------------------------------------------


def test_subscriptions(db: Path) -> None:
    a, b = topic(1), topic(2)
    with BlockStore(db) as store:
        assert store.add_subscription(b, now=1.0) is True
        assert store.add_subscription(a, now=2.0) is True
        assert store.add_subscription(a, now=3.0) is False
        assert store.subscriptions() == [b, a]
        assert store.remove_subscription(b) is True
        assert store.remove_subscription(b) is False
        assert store.subscriptions() == [a]
        assert store.add_subscription(b, now=4.0) is True
        assert store.subscriptions() == [a, b]


def test_set_heads_replaces_atomically(db: Path) -> None:
    t, other = topic(1), topic(2)
    old = sorted((block(i)[0] for i in range(3)), key=bytes)
    new = sorted((block(i)[0] for i in range(10, 12)), key=bytes)
    with BlockStore(db) as store:
        assert store.heads(t) == []
        store.set_heads(t, old)
        store.set_heads(other, new)
        assert store.heads(t) == old

        def failing() -> object:
            yield new[0]
            raise RuntimeError("computing the heads failed")

        with pytest.raises(RuntimeError):
            store.set_heads(t, failing())  # type: ignore[arg-type]
        assert store.heads(t) == old
        store.set_heads(t, [*new, new[0]])
        assert store.heads(t) == new and store.heads(other) == new
        store.set_heads(t, [])
        assert store.heads(t) == []
    with BlockStore(db) as store:
        assert store.heads(t) == [] and store.heads(other) == new


def test_outbox_survives_a_reopen_and_forgets_what_is_removed(db: Path) -> None:
    t, other = topic(1), topic(2)
    events = [block(i)[0] for i in range(4)]
    with BlockStore(db) as store:
        assert store.outbox() == {}
        store.outbox_add([(t, events[0]), (other, events[1])], now=1.0)
        store.outbox_add([(t, events[2]), (t, events[0])], now=2.0)  # a repeat is ignored
    with BlockStore(db) as store:
        assert store.outbox() == {t: [events[0], events[2]], other: [events[1]]}
        store.outbox_remove(t, [events[0], events[3]])
        store.outbox_remove(other, [events[1]])
        assert store.outbox() == {t: [events[2]]}


def test_a_schema_2_database_gains_the_outbox(db: Path) -> None:
    with BlockStore(db) as store:
        store.set_heads(topic(1), [block(1)[0]])
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("DROP TABLE outbox")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    with BlockStore(db) as store:
        assert store.heads(topic(1)) == [block(1)[0]]
        store.outbox_add([(topic(1), block(2)[0])], now=1.0)
        assert store.outbox() == {topic(1): [block(2)[0]]}
    assert sql(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


# -- delivery log ---------------------------------------------------------------------------


def test_log_append_assigns_seqs_and_deduplicates(db: Path) -> None:
    t, u = topic(1), topic(2)
    e = [block(i)[0] for i in range(6)]
    with BlockStore(db) as store:
        assert store.log_last_seq(t) == 0
        assert store.log_append(t, [], now=1.0) == []
        assert store.log_append(t, [e[0], e[1], e[0]], now=1.0) == [1, 2]
        assert store.log_append(t, [e[1], e[2], e[3]], now=2.0) == [3, 4]
        assert store.log_append(t, [e[2]], now=3.0) == []
        assert store.log_append(u, [e[2]], now=3.0) == [1]  # per topic
        assert store.log_last_seq(t) == 4 and store.log_last_seq(u) == 1
        assert store.log_seq_of(t, e[3]) == 4 and store.log_seq_of(t, e[5]) is None
        assert store.log_contains(t, e[0]) and not store.log_contains(u, e[0])
        assert [ev for _, ev, _ in store.log_range(t)] == e[:4]


def test_log_seq_never_reused_across_reopen_and_pruning(db: Path) -> None:
    t = topic(1)
    e = [block(i)[0] for i in range(8)]
    with BlockStore(db) as store:
        assert store.log_append(t, e[:3], now=1.0) == [1, 2, 3]
    with BlockStore(db) as store:
        assert store.log_last_seq(t) == 3
        assert store.log_append(t, e[3:5], now=2.0) == [4, 5]
        assert store.log_prune(t, 5) == 5  # even the latest entries gone...
        assert store.log_range(t) == [] and store.log_last_seq(t) == 5
        assert store.log_append(t, [e[5]], now=3.0) == [6]  # ...numbers carry on
    with BlockStore(db) as store:
        assert store.log_append(t, [e[6], e[7]], now=4.0) == [7, 8]
        assert [s for s, _, _ in store.log_range(t)] == [6, 7, 8]


def test_log_range_paging(db: Path) -> None:
    t = topic(1)
    events = [block(i)[0] for i in range(25)]
    with BlockStore(db) as store:
        store.log_append(t, events[:10], now=1.0)
        store.log_append(t, events[10:], now=2.0)
        store.log_append(topic(2), events, now=2.0)  # another topic's log stays apart

        pages, after = [], 0
        while page := store.log_range(t, after, limit=10):
            pages.append([s for s, _, _ in page])
            after = page[-1][0]
        assert pages == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]

        pages, before = [], None
        while page := store.log_range(t, limit=10, descending=True, before_seq=before):
            pages.append([s for s, _, _ in page])
            before = page[-1][0]
        assert pages == [list(range(25, 15, -1)), list(range(15, 5, -1)), list(range(5, 0, -1))]

        assert [s for s, _, _ in store.log_range(t, 3, before_seq=7)] == [4, 5, 6]
        assert store.log_range(t, limit=0) == []
        assert store.log_range(t, 25) == []
        first = store.log_range(t, limit=1)
        assert first == [(1, events[0], 1.0)]
        with pytest.raises(ValueError):
            store.log_range(t, limit=-1)


def test_log_blocks_reads_entries_with_their_blocks_in_one_page(db: Path) -> None:
    t = topic(1)
    stored = [block(i) for i in range(6)]
    with BlockStore(db) as store:
        store.put_many(stored[:5])  # the last one's block is missing
        store.log_append(t, [cid for cid, _ in stored], now=3.0)
        rows = store.log_blocks(t, 1, limit=10)
        assert [(s, c, b) for s, c, _, b in rows] == [
            (i + 1, cid, data if i < 5 else None) for i, (cid, data) in enumerate(stored)
        ][1:]
        back = store.log_blocks(t, limit=2, descending=True, before_seq=5)
        assert [(s, b) for s, _, _, b in back] == [(4, stored[3][1]), (3, stored[2][1])]
        assert [r[:3] for r in store.log_blocks(t)] == store.log_range(t)


def test_log_seq_at_time(db: Path) -> None:
    t = topic(1)
    e = [block(i)[0] for i in range(5)]
    with BlockStore(db) as store:
        assert store.log_seq_at_time(t, 100.0) == 0
        store.log_append(t, e[:2], now=10.0)  # seqs 1, 2
        store.log_append(t, [e[2]], now=20.0)  # seq 3
        assert store.log_seq_at_time(t, 10.0) == 0  # strictly before
        assert store.log_seq_at_time(t, 10.5) == 2
        assert store.log_seq_at_time(t, 20.0) == 2
        assert store.log_seq_at_time(t, 99.0) == 3
        # The clock stepping back does not make the log's times go backwards.
        store.log_append(t, [e[3]], now=15.0)
        assert store.log_range(t, 3) == [(4, e[3], 20.0)]
        assert store.log_seq_at_time(t, 20.5) == 4


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


def test_dht_put_many_is_one_upsert_batch(tmp_path: Path) -> None:
    with BlockStore(tmp_path / "s.sqlite3") as store:
        store.dht_put(b"k1", b"old", 1.0)
        store.dht_put_many([(b"k1", b"new"), (b"k2", b"v2")], 5.0)
        assert store.dht_get(b"k1") == b"new" and store.dht_get(b"k2") == b"v2"
        assert sorted((k, t) for k, _, t in store.dht_iter()) == [(b"k1", 5.0), (b"k2", 5.0)]
        store.dht_put_many([], 6.0)
        assert store.dht_len() == 2
