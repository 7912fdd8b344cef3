"""Tests of dht.record_table.RecordTable: the DHT records in the node's SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dag.store import BlockStore
from dht.record_table import RecordTable


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "node.sqlite3"


def test_records_put_get_republish_and_expire(db: Path) -> None:
    with BlockStore(db) as store:
        records = RecordTable(store)
        assert records.get(b"a") is None and records.count() == 0
        records.put(b"a", b"1", now=100.0)
        records.put(b"b", b"2", now=200.0)
        records.put(b"c", b"3", now=300.0)
        assert records.get(b"a") == b"1" and records.count() == 3
        records.put(b"a", b"1'", now=250.0)  # overwrite: new value, both times reset
        assert records.get(b"a") == b"1'" and records.count() == 3
        assert list(records.iter_records()) == [
            (b"a", b"1'", 250.0),
            (b"b", b"2", 200.0),
            (b"c", b"3", 300.0),
        ]
        assert records.items_older_than(260.0) == [(b"b", b"2"), (b"a", b"1'")]
        records.mark_republished([b"b", b"missing"], now=400.0)
        records.mark_republished([], now=400.0)
        assert records.items_older_than(260.0) == [(b"a", b"1'")]
        assert records.items_older_than(0.0) == []
        # Expiry goes by stored_at, not republished_at: b was stored at 200.
        assert records.expire(260.0) == 2
        assert records.get(b"b") is None and records.get(b"a") is None
        assert records.expire(260.0) == 0
        assert [k for k, _, _ in records.iter_records()] == [b"c"] and records.count() == 1


def test_iter_records_pages_through_many_records(db: Path) -> None:
    with BlockStore(db) as store:
        records = RecordTable(store)
        keys = [i.to_bytes(4, "big") for i in range(1200)]
        for k in keys:
            records.put(k, k, now=1.0)
        assert [k for k, _, _ in records.iter_records()] == keys


def test_put_many_is_one_upsert_batch(tmp_path: Path) -> None:
    with BlockStore(tmp_path / "s.sqlite3") as store:
        records = RecordTable(store)
        records.put(b"k1", b"old", 1.0)
        records.put_many([(b"k1", b"new"), (b"k2", b"v2")], 5.0)
        assert records.get(b"k1") == b"new" and records.get(b"k2") == b"v2"
        assert sorted((k, t) for k, _, t in records.iter_records()) == [(b"k1", 5.0), (b"k2", 5.0)]
        records.put_many([], 6.0)
        assert records.count() == 2


def test_total_bytes_counts_the_values_only(db: Path) -> None:
    with BlockStore(db) as store:
        records = RecordTable(store)
        assert records.total_bytes() == 0
        records.put_many([(b"k1", b"abc"), (b"k2", b"de")], 1.0)
        records.put(b"k1", b"x", 2.0)  # an overwrite replaces the value's size
        assert records.total_bytes() == 3
