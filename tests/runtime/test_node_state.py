"""Tests of pulsar.runtime.node_state.NodeState on real SQLite files (under tmp_path): the
node's subscriptions, heads, topic versions, outbox and delivery log."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from dag.cid import CID, cid_of
from dag.store import APPLICATION_ID, SCHEMA_VERSION, BlockStore
from dht.record_table import RecordTable
from pulsar.runtime.node_state import NodeState


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


@contextlib.contextmanager
def opened(path: Path) -> Iterator[NodeState]:
    """The node state in the database file at ``path``, closed at the end."""
    with BlockStore(path) as store:
        yield NodeState(store)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "node.sqlite3"


# -- one file for every owner ---------------------------------------------------------------


def test_reopen_keeps_every_owners_tables(db: Path) -> None:
    """The blocks, the DHT's records and the node state share one file and survive a
    reopen together."""
    items = [block(i) for i in range(50)]
    t, h = topic(1), [block(200)[0], block(201)[0]]
    with BlockStore(db) as store:
        records, state = RecordTable(store), NodeState(store)
        store.put_many(items)
        records.put(b"k", b"v", now=5.0)
        state.add_subscription(t, now=1.0)
        state.set_heads(t, h)
        state.log_append(t, h, now=2.0)
    assert not os.path.exists(f"{db}-wal")  # a clean close checkpoints the WAL away
    with BlockStore(db, synchronous="FULL") as store:
        records, state = RecordTable(store), NodeState(store)
        assert store.get_many(c for c, _ in items) == dict(items)
        assert list(records.iter_records()) == [(b"k", b"v", 5.0)]
        assert state.subscriptions() == [t]
        assert state.heads(t) == sorted(h, key=bytes)
        assert [(s, e) for s, e, _ in state.log_range(t)] == [(1, h[0]), (2, h[1])]
    assert sql(db, "PRAGMA journal_mode") == [("wal",)]
    assert sql(db, "PRAGMA application_id") == [(APPLICATION_ID,)]
    assert sql(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


# -- subscriptions, heads and outbox --------------------------------------------------------


def test_subscriptions(db: Path) -> None:
    a, b = topic(1), topic(2)
    with opened(db) as state:
        assert state.add_subscription(b, now=1.0) is True
        assert state.add_subscription(a, now=2.0) is True
        assert state.add_subscription(a, now=3.0) is False
        assert state.subscriptions() == [b, a]
        assert state.remove_subscription(b) is True
        assert state.remove_subscription(b) is False
        assert state.subscriptions() == [a]
        assert state.add_subscription(b, now=4.0) is True
        assert state.subscriptions() == [a, b]


def test_set_heads_replaces_atomically(db: Path) -> None:
    t, other = topic(1), topic(2)
    old = sorted((block(i)[0] for i in range(3)), key=bytes)
    new = sorted((block(i)[0] for i in range(10, 12)), key=bytes)
    with opened(db) as state:
        assert state.heads(t) == []
        state.set_heads(t, old)
        state.set_heads(other, new)
        assert state.heads(t) == old

        def failing() -> object:
            yield new[0]
            raise RuntimeError("computing the heads failed")

        with pytest.raises(RuntimeError):
            state.set_heads(t, failing())  # type: ignore[arg-type]
        assert state.heads(t) == old
        state.set_heads(t, [*new, new[0]])
        assert state.heads(t) == new and state.heads(other) == new
        state.set_heads(t, [])
        assert state.heads(t) == []
    with opened(db) as state:
        assert state.heads(t) == [] and state.heads(other) == new


def test_outbox_survives_a_reopen_and_forgets_what_is_removed(db: Path) -> None:
    t, other = topic(1), topic(2)
    events = [block(i)[0] for i in range(4)]
    with opened(db) as state:
        assert state.outbox() == {}
        state.outbox_add([(t, events[0]), (other, events[1])], now=1.0)
        state.outbox_add([(t, events[2]), (t, events[0])], now=2.0)  # a repeat is ignored
    with opened(db) as state:
        assert state.outbox() == {t: [events[0], events[2]], other: [events[1]]}
        state.outbox_remove(t, [events[0], events[3]])
        state.outbox_remove(other, [events[1]])
        assert state.outbox() == {t: [events[2]]}


def test_a_schema_2_database_gains_the_outbox(db: Path) -> None:
    with opened(db) as state:
        state.set_heads(topic(1), [block(1)[0]])
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("DROP TABLE outbox")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    with opened(db) as state:
        assert state.heads(topic(1)) == [block(1)[0]]
        state.outbox_add([(topic(1), block(2)[0])], now=1.0)
        assert state.outbox() == {topic(1): [block(2)[0]]}
    assert sql(db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


# -- delivery log ---------------------------------------------------------------------------


def test_log_append_assigns_seqs_and_deduplicates(db: Path) -> None:
    t, u = topic(1), topic(2)
    e = [block(i)[0] for i in range(6)]
    with opened(db) as state:
        assert state.log_last_seq(t) == 0
        assert state.log_append(t, [], now=1.0) == []
        assert state.log_append(t, [e[0], e[1], e[0]], now=1.0) == [1, 2]
        assert state.log_append(t, [e[1], e[2], e[3]], now=2.0) == [3, 4]
        assert state.log_append(t, [e[2]], now=3.0) == []
        assert state.log_append(u, [e[2]], now=3.0) == [1]  # per topic
        assert state.log_last_seq(t) == 4 and state.log_last_seq(u) == 1
        assert state.log_seq_of(t, e[3]) == 4 and state.log_seq_of(t, e[5]) is None
        assert state.log_contains(t, e[0]) and not state.log_contains(u, e[0])
        assert [ev for _, ev, _ in state.log_range(t)] == e[:4]


def test_log_seq_never_reused_across_reopen_and_pruning(db: Path) -> None:
    t = topic(1)
    e = [block(i)[0] for i in range(8)]
    with opened(db) as state:
        assert state.log_append(t, e[:3], now=1.0) == [1, 2, 3]
    with opened(db) as state:
        assert state.log_last_seq(t) == 3
        assert state.log_append(t, e[3:5], now=2.0) == [4, 5]
        assert state.log_prune(t, 5) == 5  # even the latest entries gone...
        assert state.log_range(t) == [] and state.log_last_seq(t) == 5
        assert state.log_append(t, [e[5]], now=3.0) == [6]  # ...numbers carry on
    with opened(db) as state:
        assert state.log_append(t, [e[6], e[7]], now=4.0) == [7, 8]
        assert [s for s, _, _ in state.log_range(t)] == [6, 7, 8]


def test_log_range_paging(db: Path) -> None:
    t = topic(1)
    events = [block(i)[0] for i in range(25)]
    with opened(db) as state:
        state.log_append(t, events[:10], now=1.0)
        state.log_append(t, events[10:], now=2.0)
        state.log_append(topic(2), events, now=2.0)  # another topic's log stays apart

        pages, after = [], 0
        while page := state.log_range(t, after, limit=10):
            pages.append([s for s, _, _ in page])
            after = page[-1][0]
        assert pages == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]

        pages, before = [], None
        while page := state.log_range(t, limit=10, descending=True, before_seq=before):
            pages.append([s for s, _, _ in page])
            before = page[-1][0]
        assert pages == [list(range(25, 15, -1)), list(range(15, 5, -1)), list(range(5, 0, -1))]

        assert [s for s, _, _ in state.log_range(t, 3, before_seq=7)] == [4, 5, 6]
        assert state.log_range(t, limit=0) == []
        assert state.log_range(t, 25) == []
        first = state.log_range(t, limit=1)
        assert first == [(1, events[0], 1.0)]
        with pytest.raises(ValueError):
            state.log_range(t, limit=-1)


def test_log_blocks_reads_entries_with_their_blocks_in_one_page(db: Path) -> None:
    t = topic(1)
    stored = [block(i) for i in range(6)]
    with BlockStore(db) as store:
        state = NodeState(store)
        store.put_many(stored[:5])  # the last one's block is missing
        state.log_append(t, [cid for cid, _ in stored], now=3.0)
        rows = state.log_blocks(t, 1, limit=10)
        assert [(s, c, b) for s, c, _, b in rows] == [
            (i + 1, cid, data if i < 5 else None) for i, (cid, data) in enumerate(stored)
        ][1:]
        back = state.log_blocks(t, limit=2, descending=True, before_seq=5)
        assert [(s, b) for s, _, _, b in back] == [(4, stored[3][1]), (3, stored[2][1])]
        assert [r[:3] for r in state.log_blocks(t)] == state.log_range(t)


def test_log_seq_at_time(db: Path) -> None:
    t = topic(1)
    e = [block(i)[0] for i in range(5)]
    with opened(db) as state:
        assert state.log_seq_at_time(t, 100.0) == 0
        state.log_append(t, e[:2], now=10.0)  # seqs 1, 2
        state.log_append(t, [e[2]], now=20.0)  # seq 3
        assert state.log_seq_at_time(t, 10.0) == 0  # strictly before
        assert state.log_seq_at_time(t, 10.5) == 2
        assert state.log_seq_at_time(t, 20.0) == 2
        assert state.log_seq_at_time(t, 99.0) == 3
        # The clock stepping back does not make the log's times go backwards.
        state.log_append(t, [e[3]], now=15.0)
        assert state.log_range(t, 3) == [(4, e[3], 20.0)]
        assert state.log_seq_at_time(t, 20.5) == 4
