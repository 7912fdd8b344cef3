"""Compaction by key: a compacted topic's log keeps the newest event of each key
(pulsar.runtime.compaction; docs/protocol.md 1.9)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dag import BlockStore, EventDescriptor, Identity, Retention, TopicDescriptor
from dag.errors import SchemaError
from pulsar.runtime import topic_settings
from pulsar.runtime.compaction import LogCompaction
from pulsar.runtime.node_state import NodeState
from pulsar.runtime.retention import LogRetention

from .conftest import Network, collect, eventually

PUBLISHER = Identity.from_seed(b"p" * 32)


class Log:
    """One topic's log on a node's tables, compacted by a LogRetention as the driver's."""

    def __init__(self, tmp_path: Path, policy: Retention) -> None:
        self.store = BlockStore(tmp_path / "node.sqlite3")
        self.state = NodeState(self.store)
        self.topic = TopicDescriptor.create(PUBLISHER, "t", now=1000.0).cid
        self.compaction = LogCompaction(self.state, self.store)
        self.retention = LogRetention(self.state, self.store, lambda _: policy,
                                      compaction=self.compaction)

    def append(self, *events: EventDescriptor) -> None:
        self.store.put_many([(e.cid, e.block) for e in events])
        self.state.log_append(self.topic, [e.cid for e in events], 5000.0)

    def event(self, key: str | None, at: float, payload: bytes = b"v") -> EventDescriptor:
        return EventDescriptor.create(PUBLISHER, self.topic, payload, key=key, now=at)

    def kept(self) -> list[EventDescriptor]:
        return [EventDescriptor.from_block(b) for _, _, _, b in
                self.state.log_blocks(self.topic) if b is not None]


def test_the_newest_event_of_each_key_is_kept_and_unkeyed_events_stay(tmp_path: Path) -> None:
    log = Log(tmp_path, Retention(compact=True))
    a1, b1, a2, c1, free, b2 = (log.event("a", 1001), log.event("b", 1002),
                                log.event("a", 1003), log.event("c", 1004),
                                log.event(None, 1005), log.event("b", 1006))
    log.append(a1, b1, a2, c1, free, b2)
    log.retention.apply(log.topic, 6000.0)
    assert [e.cid for e in log.kept()] == [a2.cid, c1.cid, free.cid, b2.cid]
    assert log.compaction.compacted == 2
    # The replaced events' blocks went with their entries (neither is a head).
    assert log.store.get(a1.cid) is None and log.store.get(b1.cid) is None
    assert log.compaction.newest(log.topic) == {"a": a2.cid, "b": b2.cid, "c": c1.cid}
    # Positions are never reused: the holes stay holes.
    assert [seq for seq, _, _ in log.state.log_range(log.topic)] == [3, 4, 5, 6]


def test_a_pass_takes_only_what_was_appended_since_the_last(tmp_path: Path) -> None:
    log = Log(tmp_path, Retention(compact=True))
    a1 = log.event("a", 1001)
    log.append(a1)
    log.retention.apply(log.topic, 6000.0)
    assert [e.cid for e in log.kept()] == [a1.cid]
    a2 = log.event("a", 1002)
    log.append(a2)
    log.retention.apply(log.topic, 6010.0)
    assert [e.cid for e in log.kept()] == [a2.cid]


def test_an_event_older_than_its_keys_newest_is_removed_or_never_delivered(
        tmp_path: Path) -> None:
    log = Log(tmp_path, Retention(compact=True))
    new, old = log.event("k", 1010), log.event("k", 1001)
    log.append(new)
    log.retention.apply(log.topic, 6000.0)
    # At delivery: the log already holds a newer one of its key.
    assert log.compaction.stale(log.topic, old)
    assert not log.compaction.stale(log.topic, new)  # the same one again is not stale
    assert not log.compaction.stale(log.topic, log.event("k", 1020))
    assert not log.compaction.stale(log.topic, log.event("other", 1000))
    # Appended anyway (it came before the pass saw the newer one): the pass removes it.
    log.append(old)
    log.retention.apply(log.topic, 6010.0)
    assert [e.cid for e in log.kept()] == [new.cid]


def test_same_created_time_is_decided_by_the_cid(tmp_path: Path) -> None:
    log = Log(tmp_path, Retention(compact=True))
    x, y = log.event("k", 1001, b"x"), log.event("k", 1001, b"y")
    winner = max((x, y), key=lambda e: e.cid.raw)
    log.append(x, y)
    log.retention.apply(log.topic, 6000.0)
    assert [e.cid for e in log.kept()] == [winner.cid]
    (tmp_path / "other").mkdir()
    other = Log(tmp_path / "other", Retention(compact=True))
    other.append(y, x)  # arrived the other way round: the same one is kept
    other.retention.apply(other.topic, 6000.0)
    assert [e.cid for e in other.kept()] == [winner.cid]


def test_compaction_without_the_policy_does_nothing(tmp_path: Path) -> None:
    log = Log(tmp_path, Retention(max_events=100))
    log.append(log.event("a", 1001), log.event("a", 1002))
    log.retention.apply(log.topic, 6000.0)
    assert len(log.kept()) == 2


def test_the_policy_and_the_key_on_the_wire() -> None:
    assert Retention(compact=True).to_wire() == {"compact": True}
    assert Retention.from_wire({"compact": True}) == Retention(compact=True)
    assert Retention.from_wire({"maxEvents": 5}).compact is False
    for bad in ({"compact": False}, {"compact": 1}):
        with pytest.raises(SchemaError):
            Retention.from_wire(bad)
    with pytest.raises(SchemaError):
        Retention()
    topic = TopicDescriptor.create(PUBLISHER, "t", now=1000.0).cid
    event = EventDescriptor.create(PUBLISHER, topic, b"v", key="user/42")
    assert EventDescriptor.from_block(event.block).key == "user/42"
    for bad_key in ("", "x" * 257, "a\nb", "\x7f"):
        with pytest.raises(SchemaError):
            EventDescriptor.create(PUBLISHER, topic, b"v", key=bad_key)


async def test_subscribers_keep_the_newest_per_key_and_say_what_they_compacted(
        network: Network) -> None:
    author, reader = await network.start(2)
    topic = await author.create_topic("compacted", retention={"compact": True})
    sub = await reader.subscribe(topic.cid)
    keys = ["a", "b", "c"]
    published = [await author.publish(topic.cid, b"%d" % i, key=keys[i % 3])
                 for i in range(12)]
    got = await collect(sub, 12)  # live: every event, each the newest of its key then
    assert [e.cid for e in got] == [e.cid for e in published]
    newest = {e.key: e.cid for e in published}
    for node in (author, reader):
        node._driver.retention.sweep([topic.cid], time.time())

        def kept(node=node) -> set:  # type: ignore[no-untyped-def]
            first = node.retained_from(topic.cid)
            return {cid for _, cid, _ in node._driver._state.log_range(topic.cid, first - 1)}

        await eventually(lambda kept=kept: kept() == set(newest.values()), timeout=10,
                         what="the log compacted to one event per key")
    assert reader.metrics["log_entries_compacted"] == 9
    assert reader.store.get(published[0].cid) is None


def test_the_embedded_api_takes_compact_as_a_boolean_only() -> None:
    changes = topic_settings.topic_changes({"retention": {"compact": True, "max_age": 60}})
    assert changes.retention == Retention(max_age=60, compact=True)
    for bad in ({"compact": "yes"}, {"compact": 1}, {"compact": False}):
        with pytest.raises((ValueError, SchemaError)):
            topic_settings.topic_changes({"retention": bad})
