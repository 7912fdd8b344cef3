"""The checkpoints a node holds for the DHT are noted as they are written, and dropped with
their index once retention has passed them (pulsar.runtime.checkpoint_cut)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from dag import CID, BlockStore, EventDescriptor, Identity, PeerId, TopicDescriptor
from dag.checkpoints import INDEX_FANOUT, Checkpoint, Skip, make_checkpoint
from dag.store import SCHEMA_VERSION
from dht.keys import dht_key
from dht.stats import DhtStats
from dht.storage import RecordStorage
from pulsar.runtime.checkpoint_cut import HeldCheckpoints

AUTHOR = Identity.from_seed(b"a" * 32)
STRANGER = Identity.from_seed(b"s" * 32)


class Holder:
    """A node's block store and DHT records, with the hook wired as the driver does."""

    def __init__(self, tmp_path: Path, follows: dict[CID, PeerId]) -> None:
        self.store = BlockStore(tmp_path / "node.sqlite3")
        self.records = RecordStorage(self.store, max_records=10_000, stats=DhtStats())
        self.held = HeldCheckpoints(self.store, self.records, follows.get)
        self.records.on_written = self.held.noticed

    def holds(self, cid: CID) -> bool:
        return self.records.get(dht_key(cid)) is not None


def _segments(identity: Identity, topic: CID, sizes: list[int], start_ms: int,
              ) -> list[tuple[Checkpoint, list[tuple[CID, bytes]]]]:
    """Checkpoints over consecutive segments of ``sizes`` events, one ms apart."""
    made: list[tuple[Checkpoint, list[tuple[CID, bytes]]]] = []
    ms = start_ms
    for number, size in enumerate(sizes, start=1):
        entries = []
        for _ in range(size):
            event = EventDescriptor.create(identity, topic, b"%d" % ms, now=ms / 1000)
            entries.append((ms, event.cid))
            ms += 1
        skips = {c.number: Skip(c.number, c.count, c.last_ms, c.cid) for c, _ in made}
        made.append(make_checkpoint(identity, topic, number, entries, [entries[-1][1]],
                                    skips.__getitem__, now=ms / 1000))
    return made


def test_a_passed_checkpoint_goes_with_its_index_and_a_newer_one_stays(
        tmp_path: Path) -> None:
    topic = TopicDescriptor.create(AUTHOR, "t", now=1000.0).cid
    holder = Holder(tmp_path, {topic: AUTHOR.peer_id})
    # Two levels of index in the first segment (more than one leaf), one in the second.
    (old, old_blocks), (new, new_blocks) = _segments(
        AUTHOR, topic, [INDEX_FANOUT + 5, 3], start_ms=2_000_000)
    holder.records.offer_many([(dht_key(c), b) for c, b in old_blocks + new_blocks])
    assert holder.held.held(topic) == [old.cid, new.cid]
    assert len(old_blocks) == 4  # two leaves, their root, the checkpoint

    # Every event of the first segment was created before this; the second's were not.
    dropped = holder.held.cut(topic, (old.last_ms + 1) / 1000)
    assert dropped == 4
    assert [holder.holds(c) for c, _ in old_blocks] == [False] * 4
    assert all(holder.holds(c) for c, _ in new_blocks)
    assert holder.held.held(topic) == [new.cid]
    assert holder.held.cut(topic, (old.last_ms + 1) / 1000) == 0  # nothing more to do


def test_the_authors_own_copies_in_the_block_store_go_too(tmp_path: Path) -> None:
    topic = TopicDescriptor.create(AUTHOR, "t", now=1000.0).cid
    holder = Holder(tmp_path, {topic: AUTHOR.peer_id})
    ((checkpoint, blocks),) = _segments(AUTHOR, topic, [4], start_ms=2_000_000)
    holder.store.put_many(blocks)  # as CheckpointMaker does before its DHT put
    holder.records.offer_many([(dht_key(c), b) for c, b in blocks])
    assert holder.held.cut(topic, checkpoint.last_ms / 1000 + 1) == 2
    assert [holder.store.get(c) for c, _ in blocks] == [None, None]


def test_a_forged_checkpoint_or_one_of_an_unfollowed_topic_is_never_noted(
        tmp_path: Path) -> None:
    topic = TopicDescriptor.create(AUTHOR, "t", now=1000.0).cid
    other = TopicDescriptor.create(AUTHOR, "not followed", now=1000.0).cid
    holder = Holder(tmp_path, {topic: AUTHOR.peer_id})
    # A stranger signs a checkpoint of our topic whose index is the author's real one: if
    # it were noted, a cut would drop the author's index blocks for it.
    ((real, real_blocks),) = _segments(AUTHOR, topic, [3], start_ms=2_000_000)
    holder.records.offer_many([(dht_key(c), b) for c, b in real_blocks])
    forged = Checkpoint.create(STRANGER, topic, number=1, count=3, size=3,
                               first_ms=real.first_ms, last_ms=real.last_ms,
                               heads=real.heads, index=real.index, skips=[], now=2000.0)
    ((unfollowed, unfollowed_blocks),) = _segments(AUTHOR, other, [2], start_ms=2_000_000)
    holder.records.offer_many([(dht_key(forged.cid), forged.block)]
                              + [(dht_key(c), b) for c, b in unfollowed_blocks])
    assert holder.held.held(topic) == [real.cid]
    assert holder.held.held(other) == []
    # A cut of the followed topic before the real checkpoint's end drops nothing.
    assert holder.held.cut(topic, real.last_ms / 1000) == 0
    assert holder.holds(real.index) and holder.holds(forged.cid)
    assert holder.holds(unfollowed.cid)


def test_a_schema_7_database_gains_the_held_checkpoints_table(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    BlockStore(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE held_checkpoints")
        conn.execute("PRAGMA user_version = 7")
        conn.commit()
    topic = TopicDescriptor.create(AUTHOR, "t", now=1000.0).cid
    holder = Holder(tmp_path, {topic: AUTHOR.peer_id})
    ((checkpoint, blocks),) = _segments(AUTHOR, topic, [2], start_ms=2_000_000)
    holder.records.offer_many([(dht_key(c), b) for c, b in blocks])
    assert holder.held.held(topic) == [checkpoint.cid]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (10,)


def test_a_noted_checkpoint_that_no_longer_parses_loses_its_row_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = TopicDescriptor.create(AUTHOR, "t", now=1000.0).cid
    holder = Holder(tmp_path, {topic: AUTHOR.peer_id})
    ((checkpoint, blocks),) = _segments(AUTHOR, topic, [3], start_ms=2_000_000)
    holder.records.offer_many([(dht_key(c), b) for c, b in blocks])
    monkeypatch.setattr(holder.held, "_block", lambda cid: b"not a checkpoint")
    assert holder.held.cut(topic, checkpoint.last_ms / 1000 + 1) == 0
    assert holder.held.held(topic) == []
    assert all(holder.holds(c) for c, _ in blocks)  # nothing dropped on its word
