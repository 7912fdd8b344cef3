"""A topic's retention policy cuts every subscriber's delivery log, and a read from a
position it cut says so (docs/protocol.md 1.2, docs/api.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dag import CID, BlockStore, EventDescriptor, Identity, Retention, TopicDescriptor
from pulsar import BeforeRetention
from pulsar.runtime.node_state import NodeState
from pulsar.runtime.retention import LogRetention

from .conftest import Network, collect, eventually

PUBLISHER = Identity.from_seed(b"p" * 32)


def _log_of(tmp_path: Path, created: list[float]) -> tuple[NodeState, CID, list[CID]]:
    """A node's tables with one topic's log holding events created at ``created``."""
    store = BlockStore(tmp_path / "node.sqlite3")
    state = NodeState(store)
    topic = TopicDescriptor.create(PUBLISHER, "t", now=1000.0)
    events = [EventDescriptor.create(PUBLISHER, topic.cid, b"%d" % i, now=at)
              for i, at in enumerate(created)]
    store.put_many([(e.cid, e.block) for e in events])
    state.log_append(topic.cid, [e.cid for e in events], 5000.0)
    return state, topic.cid, [e.cid for e in events]


def test_max_events_keeps_the_newest(tmp_path: Path) -> None:
    state, topic, events = _log_of(tmp_path, [1000.0 + i for i in range(12)])
    retention = LogRetention(state, lambda _: Retention(max_events=5))
    assert retention.apply(topic, 6000.0) == 7
    assert [cid for _, cid, _ in state.log_range(topic)] == events[7:]
    assert state.log_retained_from(topic) == 8
    assert retention.apply(topic, 6000.0) == 0
    assert retention.pruned == 7


def test_max_age_cuts_the_oldest_run_only(tmp_path: Path) -> None:
    """Entries are in delivery order, not creation order: the cut stops at the first entry
    young enough, and an old one behind it waits for what is before it."""
    state, topic, _ = _log_of(tmp_path, [1000.0, 1001.0, 1002.0, 1500.0, 1003.0, 1501.0])
    assert LogRetention(state, lambda _: Retention(max_age=100)).apply(topic, 1550.0) == 3
    assert state.log_retained_from(topic) == 4
    # Both rules: max_events cuts further than age here.
    both = LogRetention(state, lambda _: Retention(max_age=10_000, max_events=1))
    assert both.apply(topic, 1550.0) == 2
    assert state.log_retained_from(topic) == 6


def test_no_policy_keeps_everything(tmp_path: Path) -> None:
    state, topic, _ = _log_of(tmp_path, [1000.0, 1001.0])
    assert LogRetention(state, lambda _: None).apply(topic, 9e9) == 0
    assert state.log_retained_from(topic) == 1


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
    # An update can lift the policy: nothing is cut any more.
    v2 = await author.update_topic(topic.cid, retention=None)
    assert v2.retention is None
    await eventually(lambda: reader.core.latest(topic.cid) == v2, timeout=10)
    await author.publish(topic.cid, b"kept")
    await collect(sub, 1)
    reader._driver.retention.sweep([topic.cid], time.time())
    assert reader.retained_from(topic.cid) == 6
