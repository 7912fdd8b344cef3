"""The durable consumers' state machine (pulsar.runtime.consumers) on a real SQLite file,
driven with a fake clock: acknowledgements of every kind, redelivery after ack_wait and by
backoff, max_deliver, the ack and deliver and replay policies, retention, the bounds, and
what survives closing the file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dag import BlockStore, EventDescriptor, Identity, TopicDescriptor
from dag.store import SCHEMA_VERSION
from pulsar.runtime.consumer_config import (
    MAX_BATCH,
    MAX_CONSUMERS_PER_TOPIC,
    CommitRefused,
    ConsumerConfig,
    ConsumerConfigError,
    ConsumerExists,
    ConsumerLimit,
    ConsumerNotFound,
    NotFollowed,
)
from pulsar.runtime.consumers import ConsumerInfo, Consumers
from pulsar.runtime.delivery_log import DeliveryLog
from pulsar.runtime.node_state import NodeState
from pulsar.runtime.writes import WriteBehind

PUBLISHER = Identity.from_seed(b"c" * 32)
T0 = 10_000.0


class Env:
    """One node's file with one followed topic, its log fed like the node feeds it, and
    its consumers on a clock the test moves."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now = T0
        self.topic = TopicDescriptor.create(PUBLISHER, "orders", now=T0).cid
        self.events: list[EventDescriptor] = []
        self.open()
        self.state.add_subscription(self.topic, T0)

    def open(self) -> None:
        self.store = BlockStore(self.path)
        self.state = NodeState(self.store)
        self.writes = WriteBehind(self.store, self.state, heads=lambda _: [])
        self.log = DeliveryLog(self.state, self.writes)
        self.counters: dict[str, int] = {}
        self.consumers = Consumers(self.store, self.state, self.log, clock=lambda: self.now)

    def reopen(self) -> None:
        """Close the file and open it again: only what was committed is there."""
        self.writes.stopped = True
        self.store.close()
        self.open()

    def log_events(self, count: int, at: float | None = None) -> list[int]:
        """``count`` new events in the log (logged at ``at``); their positions."""
        new = [EventDescriptor.create(PUBLISHER, self.topic, b"event %d" % (len(self.events) + i),
                                      now=T0) for i in range(count)]
        self.events += new
        self.store.put_many([(e.cid, e.block) for e in new])
        return self.state.log_append(self.topic, [e.cid for e in new],
                                     self.now if at is None else at)

    def add(self, name: str = "billing", **settings: object) -> ConsumerInfo:
        info, created = self.consumers.create(
            self.topic, ConsumerConfig(name, **settings), self.now)  # type: ignore[arg-type]
        assert created
        return info

    def take(self, batch: int = 10, name: str = "billing") -> list[tuple[int, int]]:
        """``(id, count)`` of what a fetch of ``batch`` hands out now."""
        taken = self.consumers.take(self.topic, name, batch, self.now)
        return [(m.id, m.count) for m in taken.messages]

    def ack(self, ids: list[int], kind: str = "ack", delay: float | None = None,
            name: str = "billing") -> tuple[tuple[int, ...], tuple[int, ...]]:
        result = self.consumers.settle(self.topic, name, ids, kind, delay,  # type: ignore[arg-type]
                                       self.now)
        return result.done, result.unknown

    def info(self, name: str = "billing") -> ConsumerInfo:
        return self.consumers.describe(self.topic, name, self.now)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    made = Env(tmp_path / "node.sqlite3")
    try:
        yield made
    finally:
        made.writes.stopped = True
        made.store.close()


# -- settings ------------------------------------------------------------------------------


def test_config_round_trips_and_refuses_bad_values() -> None:
    config = ConsumerConfig("audit-1", deliver_policy="start_seq", start_seq=7,
                            ack_policy="all", ack_wait=2.5, max_deliver=3,
                            backoff=(1.0, 4.0), replay_policy="original", max_ack_pending=5)
    assert ConsumerConfig.from_json(config.to_json()) == config
    assert config.to_json()["deliver_policy"] == {"start_seq": 7}
    assert ConsumerConfig.from_json({"name": "a", "deliver_policy": {"start_time": 5}}
                                    ).start_time == 5.0
    assert ConsumerConfig.from_json({"name": "a", "max_deliver": 2.0}).max_deliver == 2
    grouped = ConsumerConfig.from_json({"name": "a", "group": "billing"})
    assert grouped.group == "billing" and ConsumerConfig.from_json(grouped.to_json()) == grouped
    for bad in [{"name": ""}, {"name": "a" * 65}, {"name": "a b"}, {"name": "é"},
                {"name": "a", "ack_wait": 0}, {"name": "a", "ack_wait": "30"},
                {"name": "a", "ack_wait": 86_401}, {"name": "a", "max_deliver": 0},
                {"name": "a", "max_deliver": -2}, {"name": "a", "backoff": [1, 0]},
                {"name": "a", "backoff": [1] * 65}, {"name": "a", "ack_policy": "some"},
                {"name": "a", "replay_policy": "fast"}, {"name": "a", "deliver_policy": "x"},
                {"name": "a", "deliver_policy": {"start_seq": 0}},
                {"name": "a", "deliver_policy": {"start_time": "noon"}},
                {"name": "a", "max_ack_pending": 10_001}, {"name": "a", "colour": "g"},
                {"name": "a", "group": "a b"}, {"name": "a", "group": 7},
                {"name": "a", "group": "g", "ack_policy": "all"},
                {"name": "a", "group": "g", "ack_policy": "none"},
                {"name": "a", "max_deliver": True}]:
        with pytest.raises(ConsumerConfigError):
            ConsumerConfig.from_json(bad)
    assert ConsumerConfig("a", backoff=(1.0, 5.0)).wait_after(1) == 1.0
    assert ConsumerConfig("a", backoff=(1.0, 5.0)).wait_after(7) == 5.0
    assert ConsumerConfig("a", ack_wait=9.0).wait_after(3) == 9.0


async def test_create_is_idempotent_and_refuses_what_it_cannot_honour(env: Env) -> None:
    first = env.add(ack_wait=5.0)
    again, created = env.consumers.create(env.topic, ConsumerConfig("billing", ack_wait=5.0),
                                          env.now + 1)
    assert not created and again.created_at == first.created_at
    with pytest.raises(ConsumerExists):
        env.consumers.create(env.topic, ConsumerConfig("billing", ack_wait=6.0), env.now)
    other = TopicDescriptor.create(PUBLISHER, "not followed", now=T0).cid
    with pytest.raises(NotFollowed):
        env.consumers.create(other, ConsumerConfig("x"), env.now)
    with pytest.raises(ConsumerNotFound):
        env.info("nobody")
    with pytest.raises(ConsumerConfigError):
        env.info("no spaces")


# -- acknowledgements ------------------------------------------------------------------------


async def test_explicit_acks_settle_what_was_delivered(env: Env) -> None:
    env.log_events(4)
    env.add()
    assert env.take(3) == [(1, 1), (2, 1), (3, 1)]
    info = env.info()
    assert (info.delivered, info.ack_floor, info.num_ack_pending, info.num_pending) == (3, 0,
                                                                                       3, 1)
    assert env.ack([1, 3, 99, 3]) == ((1, 3), (99,))
    info = env.info()
    assert (info.ack_floor, info.num_ack_pending) == (1, 1)
    assert env.ack([1]) == ((), (1,))  # acknowledged already: nothing pending
    assert env.take() == [(4, 1)]
    assert env.ack([2, 4]) == ((2, 4), ())
    info = env.info()
    assert (info.delivered, info.ack_floor, info.num_ack_pending, info.num_pending) == (4, 4,
                                                                                       0, 0)
    # Nothing acknowledged is ever delivered again, however long we wait.
    env.now += 10_000
    assert env.take() == []
    with pytest.raises(ValueError, match="delay goes with kind nak"):
        env.ack([4], "ack", delay=1.0)
    with pytest.raises(ValueError):
        env.ack([])
    with pytest.raises(ValueError):
        env.ack([0])


async def test_unacknowledged_messages_come_back_after_ack_wait_before_new_ones(
        env: Env) -> None:
    env.log_events(2)
    env.add(ack_wait=30.0)
    assert env.take(1) == [(1, 1)]
    env.now += 29.75
    assert env.take(1) == [(2, 1)]
    env.now += 0.25  # 30 s after the first went out
    env.log_events(1)
    assert env.take(10) == [(1, 2), (3, 1)]
    info = env.info()
    assert (info.num_redelivered, info.redeliveries, info.num_ack_pending) == (1, 1, 3)
    env.now += 30.0
    assert env.take(10) == [(1, 3), (2, 2), (3, 2)]
    assert env.consumers.counters["consumer_redelivered"] == 4


async def test_nak_term_and_progress(env: Env) -> None:
    env.log_events(4)
    env.add(ack_wait=30.0)
    assert env.take(4) == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert env.ack([1], "nak") == ((1,), ())
    assert env.take() == [(1, 2)]  # at once
    assert env.ack([2], "nak", delay=5.0) == ((2,), ())
    env.now += 4.5
    assert env.take() == []
    env.now += 0.5
    assert env.take() == [(2, 2)]
    assert env.ack([3, 7], "term") == ((3,), (7,))
    env.now += 20.0  # 25 s after 4 went out: it still waits
    assert env.ack([4], "progress") == ((4,), ())  # ...and now 30 s from here
    env.now += 29.0  # 1 (out again at 0) and 2 (at 5) are due; 4 is not yet
    assert env.take() == [(1, 3), (2, 3)]
    env.now += 1.0
    assert env.take() == [(4, 2)]
    assert env.take() == []  # 3 was terminated: never again
    info = env.info()
    assert info.num_terminated == 1 and info.num_max_deliver_reached == 0
    assert env.consumers.counters["consumer_terminated"] == 1
    (advisory,) = env.consumers.advisories.after(0)
    assert (advisory.kind, advisory.fields) == ("consumer.terminated", {
        "topic": str(env.topic), "consumer": "billing", "seqs": [3]})


async def test_backoff_replaces_ack_wait_step_by_step(env: Env) -> None:
    env.log_events(1)
    env.add(ack_wait=100.0, backoff=(1.0, 5.0))
    assert env.take() == [(1, 1)]
    env.now += 0.5
    assert env.take() == []
    env.now += 0.5
    assert env.take() == [(1, 2)]  # backoff[0] after the first delivery
    env.now += 4.5
    assert env.take() == []
    env.now += 0.5
    assert env.take() == [(1, 3)]  # backoff[1]
    env.now += 5.0
    assert env.take() == [(1, 4)]  # the last step repeats


async def test_max_deliver_sets_a_poison_message_aside_and_reports_it(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.log_events(2)
    env.add(ack_wait=10.0, max_deliver=2)
    assert env.take(1) == [(1, 1)]
    env.now += 10.0
    assert env.take(1) == [(1, 2)]
    env.now += 10.0
    with caplog.at_level(logging.WARNING, logger="pulsar.node"):
        # Delivered twice and timed out again: set aside, and the next one comes instead.
        assert env.take(1) == [(2, 1)]
    assert "position 1 set aside after 2 deliveries" in caplog.text
    # ... and advised, for whoever watches the node's advisories.
    (advisory,) = env.consumers.advisories.after(0)
    assert (advisory.kind, advisory.fields) == ("consumer.max_deliver", {
        "topic": str(env.topic), "consumer": "billing", "seq": 1, "deliveries": 2,
        "max_deliver": 2})
    info = env.info()
    assert (info.num_max_deliver_reached, info.num_terminated, info.num_ack_pending) == (1, 1,
                                                                                        1)
    assert info.ack_floor == 1
    assert env.consumers.counters["consumer_max_deliver_reached"] == 1
    # With nobody fetching, the sweep sets it aside all the same (after a nak too).
    assert env.ack([2], "nak") == ((2,), ())
    assert env.consumers.sweep(env.now) == 0  # 2 was delivered once: it may come back
    env.now += 10.0
    assert env.take() == [(2, 2)]
    env.now += 10.0
    assert env.consumers.sweep(env.now) == 1
    assert env.info().num_max_deliver_reached == 2 and env.take() == []


async def test_ack_policy_all_and_none(env: Env) -> None:
    env.log_events(5)
    env.add("all", ack_policy="all")
    assert [i for i, _ in env.take(4, "all")] == [1, 2, 3, 4]
    assert env.ack([3], name="all") == ((3,), ())
    info = env.info("all")
    assert (info.ack_floor, info.num_ack_pending) == (3, 1)
    assert env.ack([2], name="all") == ((), (2,))
    env.add("none", ack_policy="none")
    assert env.take(3, "none") == [(1, 1), (2, 1), (3, 1)]
    env.now += 10_000
    assert env.take(10, "none") == [(4, 1), (5, 1)]  # nothing to redeliver
    info = env.info("none")
    assert (info.delivered, info.ack_floor, info.num_ack_pending) == (5, 5, 0)
    assert env.ack([5], name="none") == ((), (5,))


async def test_commit_settles_every_position_up_to_one_handed_out_or_not(env: Env) -> None:
    """What a reader by position (a Spark query) does: it reads the log itself and says
    where it got to."""
    env.log_events(6)
    env.add(ack_policy="all", ack_wait=10.0)
    assert env.take(2) == [(1, 1), (2, 1)]
    info = env.consumers.settle_through(env.topic, "billing", 4, env.now)
    assert (info.delivered, info.ack_floor, info.num_ack_pending, info.num_pending) == (
        4, 4, 0, 2)
    env.now += 10.0
    assert env.take(10) == [(5, 1), (6, 1)]  # 1 and 2 are settled: nothing comes again
    # Below what is pending, or at the floor again: it settles what it names, no more.
    info = env.consumers.settle_through(env.topic, "billing", 5, env.now)
    assert (info.delivered, info.ack_floor, info.num_ack_pending) == (6, 5, 1)
    assert env.consumers.settle_through(env.topic, "billing", 3, env.now) == env.info()
    with pytest.raises(CommitRefused, match=r"beyond the log .* last position is 6"):
        env.consumers.settle_through(env.topic, "billing", 7, env.now)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="through"):
            env.consumers.settle_through(env.topic, "billing", bad, env.now)  # type: ignore[arg-type]
    # Only where acknowledging one position means every earlier one too.
    for policy in ("explicit", "none"):
        env.add(policy, ack_policy=policy)
        with pytest.raises(CommitRefused, match=f"ack_policy {policy}"):
            env.consumers.settle_through(env.topic, policy, 2, env.now)
        assert env.info(policy).delivered == 0
    with pytest.raises(ConsumerNotFound):
        env.consumers.settle_through(env.topic, "nobody", 1, env.now)
    # Committed before it answers.
    env.reopen()
    info = env.info()
    assert (info.delivered, info.ack_floor, info.num_ack_pending) == (6, 5, 1)


async def test_deliver_policies_resolve_when_the_consumer_is_made(env: Env) -> None:
    assert env.add("empty-last", deliver_policy="last").start == 0
    env.log_events(3, at=T0)
    env.log_events(3, at=T0 + 60)
    env.add("all")
    env.add("last", deliver_policy="last")
    env.add("new", deliver_policy="new")
    env.add("seq", deliver_policy="start_seq", start_seq=5)
    env.add("time", deliver_policy="start_time", start_time=T0 + 30)
    env.log_events(1)
    assert [i for i, _ in env.take(10, "all")] == [1, 2, 3, 4, 5, 6, 7]
    assert [i for i, _ in env.take(10, "last")] == [6, 7]
    assert [i for i, _ in env.take(10, "new")] == [7]
    assert [i for i, _ in env.take(10, "seq")] == [5, 6, 7]
    assert [i for i, _ in env.take(10, "time")] == [4, 5, 6, 7]
    assert [i for i, _ in env.take(10, "empty-last")] == [1, 2, 3, 4, 5, 6, 7]


async def test_replay_original_paces_by_the_logged_gaps(env: Env) -> None:
    env.log_events(1, at=T0)
    env.log_events(1, at=T0 + 2)
    env.log_events(1, at=T0 + 3)
    env.add(replay_policy="original", ack_policy="none")
    env.now = T0 + 500  # long after: the pace is kept from each hand-out, not caught up
    taken = env.consumers.take(env.topic, "billing", 10, env.now)
    assert [m.id for m in taken.messages] == [1] and taken.wake_at == env.now + 2
    env.now += 1.5
    assert env.take() == []
    env.now += 0.5
    assert env.take() == [(2, 1)]
    env.now += 1.0
    assert env.take() == [(3, 1)]
    env.add("instant", ack_policy="none")
    assert [i for i, _ in env.take(10, "instant")] == [1, 2, 3]


async def test_retention_skips_are_counted_and_shown(env: Env) -> None:
    env.log_events(6)
    env.add(ack_wait=10.0)
    assert env.take(2) == [(1, 1), (2, 1)]
    env.state.log_prune(env.topic, 4)  # retention cuts 1..4: 3 and 4 were never read
    assert env.info().num_skipped == 2 and env.info().last_skipped == (3, 4)
    assert env.take(10) == [(5, 1), (6, 1)]
    assert env.ack([2]) == ((2,), ())  # what went out before the cut can still be settled
    env.now += 10.0
    assert env.take(10) == [(5, 2), (6, 2)]  # 1 came due, but its event is gone: skipped
    info = env.info()
    assert (info.num_skipped, info.num_ack_pending, info.ack_floor) == (3, 2, 4)
    assert env.consumers.counters["consumer_skipped"] == 3
    # A consumer made after the cut starts at what is kept, with nothing skipped; one that
    # asks for a position retention cut says so.
    assert env.add("late").num_skipped == 0
    assert [i for i, _ in env.take(10, "late")] == [5, 6]
    env.add("from-2", deliver_policy="start_seq", start_seq=2)
    assert [i for i, _ in env.take(10, "from-2")] == [5, 6]
    assert env.info("from-2").last_skipped == (2, 4)


async def test_bounds(env: Env) -> None:
    env.log_events(5)
    env.add(max_ack_pending=2)
    assert [i for i, _ in env.take(5)] == [1, 2]
    assert env.take(5) == []  # two wait for their acknowledgement
    env.ack([1])
    assert [i for i, _ in env.take(5)] == [3]
    with pytest.raises(ValueError, match="batch"):
        env.take(MAX_BATCH + 1)
    with pytest.raises(ValueError, match="batch"):
        env.take(0)
    with pytest.raises(ValueError, match="ids"):
        env.ack(list(range(1, 1002)))
    for i in range(1, MAX_CONSUMERS_PER_TOPIC):
        env.add(f"c{i}")
    with pytest.raises(ConsumerLimit):
        env.add("one-too-many")


async def test_delete_forgets_the_consumer_and_what_it_had_pending(env: Env) -> None:
    env.log_events(2)
    env.add()
    env.take()
    await env.consumers.delete(env.topic, "billing")
    with pytest.raises(ConsumerNotFound):
        env.take()
    with pytest.raises(ConsumerNotFound):
        await env.consumers.delete(env.topic, "billing")
    assert env.add().delivered == 0  # a new one of the same name starts afresh
    assert env.take() == [(1, 1), (2, 1)]


# -- durability ----------------------------------------------------------------------------


async def test_state_survives_reopening_the_file(env: Env) -> None:
    env.log_events(3)
    env.add(ack_wait=30.0)
    assert env.take(2) == [(1, 1), (2, 1)]
    env.ack([1])
    env.reopen()
    env.now += 30.0
    # 1 was acknowledged: never again; 2 was not: back, with its count; then the rest.
    assert env.take() == [(2, 2), (3, 1)]
    info = env.info()
    assert (info.delivered, info.redeliveries, info.ack_floor) == (3, 1, 1)


async def test_a_schema_5_database_gains_the_consumer_tables(env: Env) -> None:
    env.add()
    env.reopen()
    env.writes.stopped = True
    env.store.close()
    with contextlib.closing(sqlite3.connect(env.path)) as conn:
        conn.execute("DROP TABLE consumer_pending")
        conn.execute("DROP TABLE consumers")
        conn.execute("PRAGMA user_version = 5")
        conn.commit()
    env.open()
    with contextlib.closing(sqlite3.connect(env.path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (10,)
    with pytest.raises(ConsumerNotFound):
        env.info()
    assert env.add().delivered == 0


# -- waiting ---------------------------------------------------------------------------------


async def test_fetch_waits_for_the_log_an_ack_or_its_expiry(tmp_path: Path) -> None:
    env = Env(tmp_path / "node.sqlite3")
    try:
        env.add(max_ack_pending=1)
        consumers = env.consumers
        # Nothing there: it answers empty once ``expires`` has passed.
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await consumers.fetch(env.topic, "billing", 5, 0.2) == []
        assert loop.time() - started >= 0.2
        # It waits for the log to grow: delivered through the write-behind, like the node.
        waiting = asyncio.create_task(consumers.fetch(env.topic, "billing", 5, 30.0))
        await asyncio.sleep(0)  # it runs until it waits
        assert not waiting.done()
        event = EventDescriptor.create(PUBLISHER, env.topic, b"late", now=T0)
        env.writes.store_block(event.cid, event.block)
        env.writes.deliver(env.topic, event.cid)
        async with asyncio.timeout(10):
            messages = await waiting
        assert [(m.id, m.event.cid, m.count) for m in messages] == [(1, event.cid, 1)]
        # The consumer is full (max_ack_pending 1): a fetch waits for the acknowledgement.
        second = EventDescriptor.create(PUBLISHER, env.topic, b"second", now=T0)
        env.writes.store_block(second.cid, second.block)
        env.writes.deliver(env.topic, second.cid)
        waiting = asyncio.create_task(consumers.fetch(env.topic, "billing", 5, 30.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        assert (await consumers.ack(env.topic, "billing", [1])).done == (1,)
        async with asyncio.timeout(10):
            assert [m.id for m in await waiting] == [2]
        # A waiting fetch ends with the node (the write-behind stops, waiters are woken).
        waiting = asyncio.create_task(consumers.fetch(env.topic, "billing", 5, 30.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        env.writes.stopped = True
        env.writes.wake_all()
        async with asyncio.timeout(10):
            assert await waiting == []
        with pytest.raises(ValueError, match="expires"):
            await consumers.fetch(env.topic, "billing", 1, 301.0)
    finally:
        env.writes.stopped = True
        env.store.close()
