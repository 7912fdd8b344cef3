"""The durable IStorage: verification, group commit, quota, republish and expiry stamps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dag import Identity
from dag.cid import cid_of, cid_of_raw
from dag.records import HeadsRecord
from dag.store import BlockStore
from dht import DhtStats, dht_key
from dht.storage import RecordStorage


def record(size: int = 100) -> tuple[bytes, bytes]:
    value = os.urandom(size)
    return dht_key(cid_of_raw(value)), value


@pytest.fixture
def store(tmp_path: Path) -> BlockStore:
    with BlockStore(tmp_path / "node.db") as s:
        yield s


def storage_on(store: BlockStore, **kwargs: object) -> RecordStorage:
    return RecordStorage(store, max_records=kwargs.pop("max_records", 1000),  # type: ignore[arg-type]
                         stats=DhtStats(), **kwargs)  # type: ignore[arg-type]


def test_only_values_that_hash_to_their_key_are_stored(store: BlockStore) -> None:
    storage = storage_on(store)
    key, value = record()
    assert not storage.offer(key, value + b"!")
    assert not storage.offer(key, "text")
    with pytest.raises(ValueError):
        storage[key] = b"not it"  # the package's entry point refuses too
    assert storage.get(key) is None and key not in storage
    assert storage.offer(key, value)
    assert storage[key] == value and storage.get(key) == value
    dag_value = b"\xa1ab\x01"
    assert storage.offer(dht_key(cid_of(dag_value)), dag_value)
    assert storage._stats.stores_refused == 3
    assert dict(storage) == {key: value, dht_key(cid_of(dag_value)): dag_value}


def test_records_survive_reopening_the_store(tmp_path: Path) -> None:
    key, value = record()
    with BlockStore(tmp_path / "n.db") as first:
        storage_on(first).offer(key, value)
    with BlockStore(tmp_path / "n.db") as again:
        assert storage_on(again).get(key) == value


async def test_submitted_values_are_acknowledged_after_one_group_commit(
        store: BlockStore) -> None:
    storage = storage_on(store)
    good = [record() for _ in range(5)]
    first = storage.submit(good[:3])
    second = storage.submit([good[3], (good[4][0], b"forged"), good[4]])
    assert storage.get(good[0][0]) is None  # not yet committed
    assert await first == [True, True, True]
    assert await second == [True, False, True]
    assert all(storage.get(k) == v for k, v in good)


async def test_a_full_batch_commits_without_waiting(store: BlockStore) -> None:
    storage = storage_on(store, commit_delay=60.0, commit_batch=4)
    done = storage.submit([record() for _ in range(4)])
    assert done.done() and done.result() == [True] * 4


async def test_close_commits_what_is_queued(store: BlockStore) -> None:
    storage = storage_on(store, commit_delay=60.0)
    key, value = record()
    pending = storage.submit([(key, value)])
    storage.close()
    assert pending.result() == [True] and storage.get(key) == value


def test_a_full_storage_evicts_the_oldest_record_but_never_a_heads_record(
        store: BlockStore) -> None:
    clock = [1000.0]
    storage = RecordStorage(store, max_records=3, stats=DhtStats(), clock=lambda: clock[0])
    identity = Identity.from_seed(b"h" * 32)
    heads = HeadsRecord.create(identity, cid_of(b"\x00" * 8), 1, cid_of(b"\x00" * 8), [])
    assert storage.offer(heads.key, heads.block)  # the oldest, but a heads record
    clock[0] += 1
    older, old = record(), record()
    assert storage.offer_many([older, old]) == [True, True]
    clock[0] += 1
    assert storage.offer(*older)  # refreshing a held key evicts nothing
    assert storage._stats.records_evicted == 0
    clock[0] += 1
    new = record()
    assert storage.offer(*new)  # full: the oldest evictable record goes, not the record
    assert storage._stats.records_evicted == 1 and storage._stats.stores_over_quota == 0
    assert storage.get(old[0]) is None and storage.get(heads.key) == heads.block
    assert storage.get(older[0]) == older[1] and storage.get(new[0]) == new[1]
    assert len(storage) == 3


def test_copies_of_the_nodes_own_blocks_go_first(store: BlockStore) -> None:
    clock = [1000.0]
    storage = RecordStorage(store, max_records=3, stats=DhtStats(), clock=lambda: clock[0])
    first = record()
    storage.offer(*first)
    clock[0] += 1
    own_block = b"\x41" + bytes(40)
    own = cid_of_raw(own_block)
    store.put(own, own_block)  # pinned: the node's own (published, delivered)
    assert storage.offer(dht_key(own), own_block)
    clock[0] += 1
    storage.offer(*record())
    clock[0] += 1
    assert storage.offer(*record())
    # The copy of the node's own block went, though newer than the first record: the node
    # still serves it from its store.
    assert storage.get(dht_key(own)) is None and storage.get(first[0]) == first[1]
    assert storage.local_block(dht_key(own)) == own_block


def test_a_storage_holding_only_heads_records_refuses(store: BlockStore) -> None:
    storage = storage_on(store, max_records=2)
    identity = Identity.from_seed(b"r" * 32)
    records = [HeadsRecord.create(identity, cid_of(bytes([i]) * 8), 1, cid_of(b"v"), [])
               for i in range(2)]
    assert storage.offer_many([(r.key, r.block) for r in records]) == [True, True]
    assert not storage.offer(*record())
    assert storage._stats.stores_over_quota == 1 and len(storage) == 2


def test_republish_and_expiry_use_their_own_stamps(store: BlockStore) -> None:
    clock = [1000.0]
    storage = RecordStorage(store, max_records=10, stats=DhtStats(), clock=lambda: clock[0])
    old, fresh = record(), record()
    storage.offer(*old)
    clock[0] = 2000.0
    storage.offer(*fresh)
    assert storage.due_for_republish(1500.0) == [old]
    assert storage.iter_older_than(500) == [old]  # the package's hook, by republished_at
    storage.mark_republished([old[0]], now=2500.0)
    assert storage.due_for_republish(2200.0) == [fresh]
    # marking a republish does not make the record younger: it still expires by stored_at
    assert storage.expire(1500.0) == 1
    assert storage.get(old[0]) is None and storage.get(fresh[0]) == fresh[1]
    storage.touch(*fresh, now=5000.0)  # a closest holder keeps its record fresh
    assert storage.expire(4000.0) == 0
