"""A topic's retention policy cuts every subscriber's delivery log, and a read from a
position it cut says so (docs/protocol.md 1.2, docs/api.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dag import CID, BlockStore, EventDescriptor, Identity, Retention, TopicDescriptor
from pulsar import BeforeRetention
from pulsar.runtime.node_state import NodeState
from pulsar.runtime.retention import APPLY_EVERY, CUT_MARGIN, LogRetention

from .conftest import Network, collect, eventually

PUBLISHER = Identity.from_seed(b"p" * 32)


class Log:
    """A node's tables with one topic's log (what :func:`_log_of` made)."""

    def __init__(self, store: BlockStore, topic: CID, events: list[CID]) -> None:
        self.store = store
        self.state = NodeState(store)
        self.topic = topic
        self.events = events

    def retention(self, policy: Retention | None) -> LogRetention:
        return LogRetention(self.state, self.store, lambda _: policy)


def _log_of(tmp_path: Path, created: list[float]) -> Log:
    """One topic's log holding events created at ``created``, their blocks stored."""
    store = BlockStore(tmp_path / "node.sqlite3")
    topic = TopicDescriptor.create(PUBLISHER, "t", now=1000.0)
    events = [EventDescriptor.create(PUBLISHER, topic.cid, b"%d" % i, now=at)
              for i, at in enumerate(created)]
    store.put_many([(e.cid, e.block) for e in events])
    log = Log(store, topic.cid, [e.cid for e in events])
    log.state.log_append(topic.cid, log.events, 5000.0)
    return log


def test_max_events_keeps_the_newest(tmp_path: Path) -> None:
    log = _log_of(tmp_path, [1000.0 + i for i in range(12)])
    log.state.set_heads(log.topic, [log.events[-1], log.events[2]])  # a cut head is kept
    retention = log.retention(Retention(max_events=5))
    assert retention.apply(log.topic, 6000.0) == 7
    assert [cid for _, cid, _ in log.state.log_range(log.topic)] == log.events[7:]
    assert log.state.log_retained_from(log.topic) == 8
    # The cut entries' event blocks went with them, but the head's.
    assert [log.store.has(cid) for cid in log.events] == [
        False, False, True, False, False, False, False, True, True, True, True, True]
    assert retention.apply(log.topic, 6000.0) == 0
    assert retention.pruned == 7


def test_a_cut_hands_the_blocks_it_removed_to_the_dht_holder(tmp_path: Path) -> None:
    log = _log_of(tmp_path, [1000.0 + i for i in range(6)])
    log.state.set_heads(log.topic, [log.events[-1], log.events[1]])
    forgotten: list[list[CID]] = []
    retention = LogRetention(log.state, log.store, lambda _: Retention(max_events=2),
                             forget_held=forgotten.append)
    assert retention.apply(log.topic, 6000.0) == 4
    assert forgotten == [[log.events[0], log.events[2], log.events[3]]]  # not the head


def test_max_age_cuts_the_oldest_run_only(tmp_path: Path) -> None:
    """Entries are in delivery order, not creation order: the cut stops at the first entry
    young enough, and an old one behind it waits for what is before it."""
    log = _log_of(tmp_path, [1000.0, 1001.0, 1002.0, 1500.0, 1003.0, 1501.0])
    assert log.retention(Retention(max_age=100)).apply(log.topic, 1550.0) == 3
    assert log.state.log_retained_from(log.topic) == 4
    # Both rules: max_events cuts further than age here.
    both = log.retention(Retention(max_age=10_000, max_events=1))
    assert both.apply(log.topic, 1550.0) == 2
    assert log.state.log_retained_from(log.topic) == 6


def test_no_policy_keeps_everything(tmp_path: Path) -> None:
    log = _log_of(tmp_path, [1000.0, 1001.0])
    assert log.retention(None).apply(log.topic, 9e9) == 0
    assert log.state.log_retained_from(log.topic) == 1
    assert all(log.store.has(cid) for cid in log.events)


async def test_a_topic_policy_reaches_a_subscriber_and_reads_before_it_are_refused(
        network: Network) -> None:
    author, reader = await network.start(2)
    topic = await author.create_topic("ticks", retention={"max_events": 3})
    assert topic.retention == Retention(max_events=3)
    sub = await reader.subscribe(topic.cid)
    for i in range(8):
        await author.publish(topic.cid, b"tick %d" % i)
    await collect(sub, 8)
    await eventually(lambda: reader.last_position(topic.cid) == 8, timeout=10)
    # Cuts happen as the log grows (at most every few seconds per topic) and on the
    # node's periodic sweep; run the sweep now rather than wait for it.
    reader._driver.retention.sweep([topic.cid], time.time())
    assert reader.retained_from(topic.cid) == 6
    assert [e.seq for e in reader.log_entries(topic.cid)] == [6, 7, 8]
    assert [e.seq for e in reader.log_entries(topic.cid, after=5)] == [6, 7, 8]
    with pytest.raises(BeforeRetention) as refused:
        reader.log_entries(topic.cid, after=2)
    assert refused.value.retained_from == 6
    assert reader.metrics["log_entries_pruned"] == 5
    # The author cut its own log too; it still publishes (its last event is a head, and
    # heads keep their blocks) and the reader gets it next.
    author._driver.retention.sweep([topic.cid], time.time())
    assert author.retained_from(topic.cid) == 6
    await author.publish(topic.cid, b"after the cut")
    assert [e.payload for e in await collect(sub, 1)] == [b"after the cut"]
    # An update can lift the policy: nothing is cut any more.
    v2 = await author.update_topic(topic.cid, retention=None)
    assert v2.retention is None
    await eventually(lambda: reader.core.latest(topic.cid) == v2, timeout=10)
    await author.publish(topic.cid, b"kept")
    await collect(sub, 1)
    reader._driver.retention.sweep([topic.cid], time.time())
    assert reader.retained_from(topic.cid) == 6


async def test_a_subscriber_that_holds_the_cut_events_for_the_dht_drops_them_too(
        network: Network) -> None:
    """Two nodes: each holds every event as one of its DHT holders (r = 8). The cut of
    the log takes the node's DHT copies of the cut events with it; the kept ones stay."""
    from dht.keys import dht_key

    author, reader = await network.start(2)
    topic = await author.create_topic("cut at the holders", retention={"max_events": 3})
    sub = await reader.subscribe(topic.cid)
    events = [await author.publish(topic.cid, b"tick %d" % i) for i in range(8)]
    await collect(sub, 8)
    records = reader.dht.records

    def held(event: EventDescriptor) -> bool:
        return records.get(dht_key(event.cid)) is not None

    await eventually(lambda: all(held(e) for e in events), timeout=10,
                     what="every event stored at the reader")
    reader._driver.retention.sweep([topic.cid], time.time())
    assert reader.retained_from(topic.cid) == 6
    assert [held(e) for e in events] == [False] * 5 + [True] * 3
    assert reader.dht.stats.records_cut == 5 and reader.dht.stats.bytes_cut > 0


def test_cut_entries_stay_known_as_delivered_for_a_while(tmp_path: Path) -> None:
    """A backfill asks ``log_contains`` whether an event was delivered: a cut one still
    is (it must not be delivered a second time), until the memory of cuts expires."""
    log = _log_of(tmp_path, [1000.0, 1001.0, 1002.0])
    told: list[tuple[CID, float]] = []
    retention = LogRetention(log.state, log.store, lambda _: Retention(max_events=1),
                             on_cut=lambda topic, before: told.append((topic, before)))
    assert retention.apply(log.topic, 6000.0) == 2
    assert all(log.state.log_contains(log.topic, cid) for cid in log.events)
    assert told == [(log.topic, 1002.0)]  # the oldest entry kept: created 1002
    assert log.state.log_cut_expire(4000.0) == 0  # delivered at 5000: remembered
    assert log.state.log_cut_expire(5000.5) == 2
    assert [log.state.log_contains(log.topic, cid) for cid in log.events] == [
        False, False, True]


def test_cut_entries_far_behind_the_floor_are_forgotten_at_the_cut(tmp_path: Path) -> None:
    """The memory of cut entries is bounded by the policy, not by time: what was
    delivered more than CUT_MARGIN before the oldest entry kept is covered by the core's
    horizon, and goes at the cut; the entries just behind the floor stay known."""
    store = BlockStore(tmp_path / "node.sqlite3")
    state = NodeState(store)
    topic = TopicDescriptor.create(PUBLISHER, "t", now=1000.0)
    times = [1000.0, 1100.0, 1000.0 + 2 * CUT_MARGIN, 1000.0 + 3 * CUT_MARGIN]
    events = [EventDescriptor.create(PUBLISHER, topic.cid, b"%d" % i, now=at)
              for i, at in enumerate(times)]
    store.put_many([(e.cid, e.block) for e in events])
    for event, at in zip(events, times, strict=True):
        state.log_append(topic.cid, [event.cid], at)
    told: list[float] = []
    dropping: list[float] = []
    retention = LogRetention(state, store, lambda _: Retention(max_events=1),
                             on_cut=lambda _, floor: told.append(floor),
                             drop_checkpoints=lambda _, before: dropping.append(before))
    assert retention.apply(topic.cid, times[-1]) == 3
    assert told == [times[-1]]
    assert dropping == [times[-1] - CUT_MARGIN]  # checkpoints all before that go too
    # floor - CUT_MARGIN = 1000 + 2 * CUT_MARGIN: the first two are forgotten, the third
    # (delivered exactly there) and the kept entry are known as delivered.
    assert [state.log_contains(topic.cid, e.cid) for e in events] == [
        False, False, True, True]


def test_a_log_cut_entirely_reports_when_it_last_grew(tmp_path: Path) -> None:
    log = _log_of(tmp_path, [1000.0, 1001.0])
    told: list[float] = []
    retention = LogRetention(log.state, log.store, lambda _: Retention(max_age=10),
                             on_cut=lambda topic, before: told.append(before))
    assert retention.apply(log.topic, 9000.0) == 2
    assert log.state.log_retained_from(log.topic) == 3
    assert told == [5000.0]  # log_state.last_at: every cut event had arrived by then


def test_a_long_cut_is_spread_over_passes(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import pulsar.runtime.retention as retention_module

    monkeypatch.setattr(retention_module, "CUT_BATCH", 3)
    log = _log_of(tmp_path, [1000.0 + i for i in range(10)])
    by_count = log.retention(Retention(max_events=2))
    assert [by_count.apply(log.topic, 6000.0) for _ in range(4)] == [3, 3, 2, 0]
    (tmp_path / "age").mkdir()
    log = _log_of(tmp_path / "age", [1000.0 + i for i in range(10)])
    by_age = log.retention(Retention(max_age=10))
    assert [by_age.apply(log.topic, 1017.5) for _ in range(4)] == [3, 3, 2, 0]
    assert log.state.log_retained_from(log.topic) == 9  # created 1008: 9.5 s old


def test_a_head_spared_by_a_cut_goes_at_a_later_one(tmp_path: Path) -> None:
    log = _log_of(tmp_path, [1000.0 + i for i in range(6)])
    log.state.set_heads(log.topic, [log.events[1]])
    retention = log.retention(Retention(max_events=4))
    assert retention.apply(log.topic, 6000.0) == 2
    assert log.store.has(log.events[1]) and not log.store.has(log.events[0])
    log.state.set_heads(log.topic, [log.events[5]])  # no longer a head
    log.state.log_append(log.topic, [log.events[0]], 6001.0)  # one more entry: seq 7
    assert retention.apply(log.topic, 6002.0) == 1
    assert not log.store.has(log.events[1])


def test_the_hours_expiry_visits_every_topic_remembered(tmp_path: Path) -> None:
    """Without a time index the global expiry walks topic by topic: all of them."""
    store = BlockStore(tmp_path / "node.sqlite3")
    state = NodeState(store)
    topics = [TopicDescriptor.create(PUBLISHER, name, now=1000.0).cid for name in "abc"]
    for at, topic in zip((100.0, 200.0, 300.0), topics, strict=True):
        events = [EventDescriptor.create(PUBLISHER, topic, b"%d" % i, now=at) for i in range(2)]
        state.log_append(topic, [e.cid for e in events], at)
        state.log_prune(topic, 2)
    assert state.log_cut_expire(250.0) == 4  # the first two topics' entries
    assert state.log_cut_expire(1000.0) == 2
    assert state.log_cut_expire(1000.0) == 0


def test_what_arrives_just_after_a_cut_is_cut_once_apply_every_has_passed(
        tmp_path: Path) -> None:
    """A cut at most every APPLY_EVERY seconds per topic, but not never: entries appended
    right after one are cut by catch_up, without waiting for the next append or sweep."""
    log = _log_of(tmp_path, [1000.0, 1001.0, 1002.0])
    retention = log.retention(Retention(max_events=2))
    retention.appended(log.topic, 6000.0)  # the first append is cut at once
    assert log.state.log_retained_from(log.topic) == 2
    more = [EventDescriptor.create(PUBLISHER, log.topic, b"more %d" % i, now=1003.0 + i)
            for i in range(2)]
    log.store.put_many([(e.cid, e.block) for e in more])
    log.state.log_append(log.topic, [e.cid for e in more], 6001.0)
    retention.appended(log.topic, 6001.0)  # too soon after the last cut: left for later
    assert log.state.log_retained_from(log.topic) == 2
    assert retention.catch_up(6001.0 + APPLY_EVERY / 2) == 0  # still too soon
    assert retention.catch_up(6000.0 + APPLY_EVERY) == 1
    assert log.state.log_retained_from(log.topic) == 4
    assert retention.catch_up(6000.0 + 2 * APPLY_EVERY) == 0  # nothing pending any more
