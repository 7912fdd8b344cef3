"""Durable named consumers of a topic's delivery log: acknowledgement, redelivery, and a
place of their own that survives restarts (what NATS JetStream calls a durable pull
consumer, over this node's log instead of a broker's stream).

Every event the node delivers is appended to its topic's delivery log; a consumer reads
that log in order, and remembers per entry it handed out whether it was acknowledged. Its
state is three things, all in the node's SQLite file (:mod:`pulsar.runtime.consumer_table`):

* ``delivered``: the last log position handed out for the first time. Everything after it
  is the consumer's backlog (``num_pending``); it starts where the deliver policy said.
* the pending entries: positions handed out and not acknowledged yet, each with how often
  it was delivered and when it is due again (after ``ack_wait``, or the ``backoff`` step).
  A due entry is delivered again by the next fetch, before anything new; one delivered
  ``max_deliver`` times that times out once more is set aside instead (dropped, counted,
  logged: not retried for ever). Acknowledged ones are simply gone, so the *ack floor*
  (every position up to it is done) is the lowest pending position less one.
* counters: redeliveries, terminations, messages set aside, positions skipped.

**Durable before it answers.** A fetch writes what it hands out (the new ``delivered`` and
the pending entries) and an acknowledgement what it settles, each in one transaction,
before it returns: after a restart or a SIGKILL nothing acknowledged is delivered again,
and nothing handed out unacknowledged is lost — it is due again at the time stored with
it, with its delivery count. (Due times are wall-clock times, so they mean the same after
a restart.)

**Retention.** A topic may cut its log's oldest entries. A consumer whose next position was
cut skips to the first position kept, and counts and logs the positions it skipped
(``num_skipped``, ``last_skipped``), so a gap is never silent; a pending entry whose event
was cut cannot be delivered again, and is counted the same way when it comes due.

**Commit.** A reader that reads the log itself, by position (a Spark query, whose reads
must be replayable), settles what it has processed with :meth:`Consumers.commit`: every
position up to one, handed out or not, at once (Kafka's committed offset). Only an
``ack_policy=all`` consumer takes it, since that is what acknowledging one position
already means there.

The sync methods (:meth:`Consumers.create`, :meth:`~Consumers.take`,
:meth:`~Consumers.settle`, :meth:`~Consumers.settle_through`, :meth:`~Consumers.describe`,
:meth:`~Consumers.sweep`) are the state machine: they take the time as an argument, so a
test drives them with a fake clock. The async ones (``add``, ``info``, ``list``,
``delete``, ``fetch``, ``ack``, ``commit``) are the API
``Node.consumers`` offers; ``fetch`` waits, like a long poll, for the log to grow, a
redelivery to come due or an acknowledgement to make room.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dag import CID, BlockStore, EventDescriptor, InvalidDescriptor, TopicDescriptor

from .advisories import Advisories
from .consumer_answers import AckResult, ConsumerInfo, ConsumerMessage
from .consumer_config import (
    ACK_KINDS,
    MAX_ACK_IDS,
    MAX_BATCH,
    MAX_CONSUMERS_PER_TOPIC,
    MAX_EXPIRES,
    MAX_SEQ,
    MAX_WAIT,
    AckKind,
    CommitRefused,
    ConsumerConfig,
    ConsumerExists,
    ConsumerLimit,
    ConsumerNotFound,
    NotFollowed,
    check_name,
)
from .consumer_groups import ConsumerGroups
from .consumer_share import GroupShare
from .consumer_table import ConsumerRow, ConsumerTable, Watched
from .delivery_log import DeliveryLog
from .node_state import NodeState

__all__ = ["COUNTERS", "SWEEP_EVERY", "AckResult", "ConsumerInfo", "ConsumerMessage",
           "Consumers", "Taken"]

# The node's logger: these lines are the node's, and operators filter them by that name.
log = logging.getLogger("pulsar.node")

SWEEP_EVERY: Final = 5.0
"""Seconds between two passes that set aside, for every consumer, the entries that came due
after their last delivery: a consumer whose application is gone still reports them."""
COUNTERS: Final = ("consumer_delivered", "consumer_redelivered", "consumer_terminated",
                   "consumer_max_deliver_reached", "consumer_skipped")
"""The node's metrics this module counts (``Node.metrics``; ``/metrics`` adds
``pulsarcast_`` and ``_total``)."""
_NEVER: Final = 2**62
"""A log position no log reaches: waiting for it wakes on any growth and on the stop."""
Lineage = Callable[[CID], Awaitable[tuple[TopicDescriptor, tuple[TopicDescriptor, ...]]]]


class Runtime(Protocol):
    """What the consumers need of the node's driver: its counters, its task set, and the
    consumer groups its node's beats carry."""

    counters: dict[str, int]
    groups: ConsumerGroups

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


@dataclass(frozen=True, slots=True)
class Taken:
    """What :meth:`Consumers.take` handed out, and when waiting could bring more."""

    messages: tuple[ConsumerMessage, ...]
    position: int
    """``delivered`` afterwards."""
    wake_at: float | None
    """The earliest time a timer (a redelivery due, the next paced message) could hand out
    more; None if only the log or an acknowledgement can."""
    waits_for_log: bool
    """True when the consumer read to the end of the log and had room for more."""


class Consumers:
    """The durable consumers of this node's topics (``Node.consumers``).

    ``lineage`` maps any version of a topic to its first (trees and logs are named by
    it); without it topics are taken as given. ``runtime`` gives the counters to count in
    and runs the periodic sweep; ``clock`` is the wall clock due times are kept in.
    """

    def __init__(self, store: BlockStore, state: NodeState, log: DeliveryLog,
                 lineage: Lineage | None = None, runtime: Runtime | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._table = ConsumerTable(store)
        self._state = state
        self._log = log
        self._lineage = lineage
        self.clock = clock
        self.counters: dict[str, int] = {} if runtime is None else runtime.counters
        for key in COUNTERS:
            self.counters.setdefault(key, 0)
        self._signals: dict[tuple[CID, str], asyncio.Event] = {}
        self.advisories = Advisories(clock)
        """Messages set aside, terminated or skipped, as they happen (see
        :mod:`pulsar.runtime.advisories`)."""
        if runtime is not None:
            runtime.spawn(self._sweep_forever())
        self._share: GroupShare | None = None
        """The group side, when the node has consumer groups."""
        if runtime is not None:
            self._share = GroupShare(self._table, runtime.groups, self._poke, _event)
            self._share.rejoin()

    # ------------------------------------------------------------------ the embedded API

    async def add(self, topic: CID, config: ConsumerConfig | Mapping[str, Any]
                  ) -> ConsumerInfo:
        """Make a durable consumer of ``topic`` (a topic this node follows). Adding one
        that exists with the same settings changes nothing; with other settings it raises
        :class:`ConsumerExists` (reconfiguring could lose or repeat messages)."""
        if not isinstance(config, ConsumerConfig):
            config = ConsumerConfig.from_json(config)
        info, _ = self.create(await self._root(topic), config, self.clock())
        return info

    async def info(self, topic: CID, name: str) -> ConsumerInfo:
        """Where the consumer is; :class:`ConsumerNotFound` if there is none."""
        return self.describe(await self._root(topic), name, self.clock())

    async def list(self, topic: CID) -> builtins.list[ConsumerInfo]:
        """Every consumer of ``topic`` at this node, by name."""
        root = await self._root(topic)
        now = self.clock()
        return [self.describe(root, row.name, now) for row in self._table.of_topic(root)]

    async def delete(self, topic: CID, name: str) -> None:
        """Remove the consumer and what it had pending; waiting fetches end."""
        root = await self._root(topic)
        if not self._table.delete(root, check_name(name)):
            raise ConsumerNotFound(f"no consumer {name!r} of topic {root}")
        if self._share is not None:
            self._share.left(root, name)
        self._poke(root, name)

    async def fetch(self, topic: CID, name: str, batch: int = 1, expires: float = 0.0
                    ) -> builtins.list[ConsumerMessage]:
        """Up to ``batch`` messages (redeliveries first, then new ones), waiting up to
        ``expires`` seconds for at least one. What it returns is committed as handed out
        before it returns: unacknowledged, each is delivered again after ``ack_wait``."""
        _check_batch(batch)
        if isinstance(expires, bool) or not isinstance(expires, int | float) \
                or not 0 <= expires <= MAX_EXPIRES:
            raise ValueError(f"expires must be 0..{MAX_EXPIRES:g} seconds")
        root = await self._root(topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + expires
        while not self._log.stopped:
            now = self.clock()
            taken = self.take(root, name, batch, now)
            if taken.messages:
                return list(taken.messages)
            left = deadline - loop.time()
            if left <= 0:
                break
            if taken.wake_at is not None:
                left = min(left, max(taken.wake_at - now, 0.001))
            # Taken after take() (which raises for a consumer that does not exist, so only
            # real consumers get a signal), with no await in between: no poke is missed.
            signal = self._signals.setdefault((root, name), asyncio.Event())
            await self._wait(root, taken.position if taken.waits_for_log else _NEVER,
                             signal, left)
        return []

    async def ack(self, topic: CID, name: str, ids: Iterable[int], kind: AckKind = "ack",
                  delay: float | None = None) -> AckResult:
        """Settle delivered messages by id: ``ack`` (done; with ``ack_policy=all``, every
        earlier one too), ``nak`` (deliver again now, or after ``delay`` seconds), ``term``
        (never deliver again) or ``progress`` (still working: restart its ``ack_wait``).
        Committed before it returns."""
        return self.settle(await self._root(topic), name, list(ids), kind, delay,
                           self.clock())

    async def commit(self, topic: CID, name: str, through: int) -> ConsumerInfo:
        """Settle every log position up to ``through``, handed out or not: the consumer
        goes on after it. For a reader that reads the log itself by position (a Spark
        query) and says where it got to; ``ack_policy=all`` consumers only
        (:class:`CommitRefused` otherwise, and for a position beyond the log). A position
        the consumer has settled already changes nothing. Committed before it returns."""
        return self.settle_through(await self._root(topic), name, through, self.clock())

    # ------------------------------------------------------------------ the state machine

    def create(self, topic: CID, config: ConsumerConfig, now: float
               ) -> tuple[ConsumerInfo, bool]:
        """Make the consumer (``topic`` is a first version); ``(info, True)`` when made,
        ``(info, False)`` when one with the same settings existed."""
        existing = self._table.get(topic, config.name)
        if existing is not None:
            if existing.config != config:
                raise ConsumerExists(f"consumer {config.name!r} of topic {topic} exists with "
                                     "other settings; delete it first to change them")
            return self.describe(topic, config.name, now), False
        if topic not in self._state.subscriptions():
            raise NotFollowed(f"this node does not follow topic {topic}: subscribe first")
        if self._table.count(topic) >= MAX_CONSUMERS_PER_TOPIC:
            raise ConsumerLimit(f"topic {topic} has {MAX_CONSUMERS_PER_TOPIC} consumers here, "
                                "the most it may have")
        last = self._log.last_position(topic)  # writes pending log entries first
        kept = self._state.log_retained_from(topic) - 1
        match config.deliver_policy:
            case "all":
                start = kept  # what the log holds: nothing cut is skipped for it
            case "last":
                start = max(kept, last - 1) if last else 0
            case "new":
                start = last
            case "start_seq":
                assert config.start_seq is not None
                start = config.start_seq - 1  # before what was kept: skipped, and counted
            case "start_time":
                assert config.start_time is not None
                start = self._state.log_seq_at_time(topic, config.start_time)
        row = ConsumerRow(topic, config, now, start, start)
        self._table.insert(row)
        if self._share is not None:
            self._share.joined(row)
        return self.describe(topic, config.name, now), True

    def describe(self, topic: CID, name: str, now: float) -> ConsumerInfo:
        """The consumer's info, after what is due at ``now`` without a fetch (positions
        retention cut, entries past ``max_deliver``) is applied and committed."""
        row = self._get(topic, name)
        self._step(row, now, 0)
        stats = self._table.stats(topic, row.name)
        last = self._state.log_last_seq(topic)
        kept = self._state.log_retained_from(topic) - 1
        skipped = None if row.skipped_from is None or row.skipped_to is None else (
            row.skipped_from, row.skipped_to)
        return ConsumerInfo(
            topic=topic, config=row.config, created_at=row.created_at, start=row.start,
            delivered=row.delivered,
            ack_floor=row.delivered if stats.lowest is None else stats.lowest - 1,
            num_pending=max(0, last - max(row.delivered, kept)),
            num_ack_pending=stats.count, num_redelivered=stats.redelivered,
            num_terminated=row.terminated, num_max_deliver_reached=row.set_aside,
            num_skipped=row.skipped, last_skipped=skipped, redeliveries=row.redelivered,
            group=None if self._share is None else self._share.info(row))

    def take(self, topic: CID, name: str, batch: int, now: float) -> Taken:
        """Hand out up to ``batch`` messages at ``now`` without waiting: due redeliveries
        first (lowest position first), then new log entries, as room under
        ``max_ack_pending`` and the replay pace allow. Committed before it returns."""
        _check_batch(batch)
        return self._step(self._get(topic, name), now, batch)

    def settle(self, topic: CID, name: str, ids: builtins.list[int], kind: AckKind,
               delay: float | None, now: float) -> AckResult:
        """Apply an acknowledgement of ``kind`` to ``ids`` at ``now`` (see :meth:`ack`)."""
        if kind not in ACK_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ACK_KINDS)}")
        if not ids or len(ids) > MAX_ACK_IDS:
            raise ValueError(f"ids must name 1..{MAX_ACK_IDS} delivery ids")
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= MAX_SEQ:
                raise ValueError(f"every id must be an integer in 1..{MAX_SEQ}")
        if delay is not None:
            if kind != "nak":
                raise ValueError("delay goes with kind nak only")
            if isinstance(delay, bool) or not isinstance(delay, int | float) \
                    or not 0 <= delay <= MAX_WAIT:
                raise ValueError(f"delay must be 0..{MAX_WAIT:g} seconds")
        row = self._get(topic, name)
        config = row.config
        given = builtins.list(dict.fromkeys(ids))
        if config.ack_policy == "none":
            return AckResult(kind, (), tuple(given))
        pending = self._table.pending(topic, row.name, given)
        done = [i for i in given if i in pending]
        unknown = tuple(i for i in given if i not in pending)
        upserts: builtins.list[tuple[int, int, float]] = []
        deletes: builtins.list[int] = []
        if kind == "ack" and config.ack_policy == "all" and done:
            deletes = self._table.pending_through(topic, row.name, max(done))
        elif kind in ("ack", "term"):
            deletes = done
        elif kind == "nak":
            upserts = [(i, pending[i], now + (delay or 0.0)) for i in done]
        else:  # progress: its ack_wait (or backoff step) starts again now
            upserts = [(i, pending[i], now + config.wait_after(pending[i])) for i in done]
        if kind == "term":
            row.terminated += len(done)
        if done:
            self._table.save(row, upserts, deletes)
            if kind in ("ack", "term"):
                self._settled(row, deletes)
            if kind == "term":
                self.counters["consumer_terminated"] += len(done)
                self.advisories.emit("consumer.terminated", topic=str(topic),
                                     consumer=row.name, seqs=list(done))
            self._poke(topic, row.name)
        return AckResult(kind, tuple(done), unknown)

    def settle_through(self, topic: CID, name: str, through: int, now: float
                       ) -> ConsumerInfo:
        """Apply a commit through log position ``through`` at ``now`` (see :meth:`commit`):
        ``delivered`` moves up to it, and what was pending up to it is acknowledged."""
        if isinstance(through, bool) or not isinstance(through, int) \
                or not 1 <= through <= MAX_SEQ:
            raise ValueError(f"through must be a log position in 1..{MAX_SEQ}")
        row = self._get(topic, name)
        if row.config.ack_policy != "all":
            raise CommitRefused(
                f"consumer {row.name!r} of topic {topic} has ack_policy "
                f"{row.config.ack_policy}: a commit settles every position up to one, which "
                "is what acknowledging means only with ack_policy all")
        self._step(row, now, 0)  # what is due first: positions cut, messages set aside
        last = self._state.log_last_seq(topic)
        if through > last:
            raise CommitRefused(f"position {through} is beyond the log of topic {topic}, "
                                f"whose last position is {last}")
        deletes = self._table.pending_through(topic, row.name, through)
        if through > row.delivered or deletes:
            row.delivered = max(row.delivered, through)
            self._table.save(row, [], deletes)
            self._poke(topic, row.name)
        return self.describe(topic, row.name, now)

    def sweep(self, now: float) -> int:
        """Set aside, for every consumer, the entries past ``max_deliver`` that came due by
        ``now`` (what a fetch would do); returns how many."""
        before = self.counters["consumer_max_deliver_reached"]
        for topic, name in self._table.with_due(now):
            row = self._table.get(topic, name)
            if row is not None and row.config.max_deliver != -1:
                self._step(row, now, 0)
        return self.counters["consumer_max_deliver_reached"] - before

    # ------------------------------------------------------------------ one step

    def _step(self, row: ConsumerRow, now: float, batch: int) -> Taken:
        """What a fetch of ``batch`` does at ``now`` (``batch`` 0: only the bookkeeping
        that is due), written in one transaction before it returns."""
        topic, config = row.topic, row.config
        share = self._share
        member = None if share is None else share.member(row)
        joining_until = None if member is None or share is None else \
            share.joining_until(member, now)
        if joining_until is not None:
            batch = 0  # joining: the others may not know it yet, so it hands nothing out
        before = dataclasses.replace(row)
        self._log.last_position(topic)  # write pending log entries: read them as committed
        kept = self._state.log_retained_from(topic) - 1
        if row.delivered < kept:  # retention cut what it had not read yet
            self._skip(row, row.delivered + 1, kept)
            row.delivered = kept
        messages: builtins.list[ConsumerMessage] = []
        upserts: builtins.list[tuple[int, int, float]] = []
        deletes: builtins.list[int] = []
        set_aside: builtins.list[tuple[int, int]] = []
        tracked = config.ack_policy != "none"
        ack_pending = 0
        if tracked:
            ack_pending = self._table.stats(topic, row.name).count
            again: builtins.list[tuple[int, int]] = []
            for seq, count in self._table.due(topic, row.name, now):
                if config.exhausted(count):
                    deletes.append(seq)
                    set_aside.append((seq, count))
                elif len(again) < batch:
                    again.append((seq, count))
            found = self._table.entries_at(topic, [seq for seq, _ in again])
            for seq, count in again:
                event = _event(found.get(seq))
                if event is None:  # retention cut it (or its block) since it went out
                    deletes.append(seq)
                    self._skip(row, seq, seq)
                    continue
                messages.append(ConsumerMessage(seq, event, found[seq][1], count + 1))
                upserts.append((seq, count + 1, now + config.wait_after(count + 1)))
                row.redelivered += 1
            row.terminated += len(set_aside)
            row.set_aside += len(set_aside)
            ack_pending -= len(deletes)
        redelivered = len(messages)
        room = batch - len(messages)
        if tracked:
            room = min(room, config.max_ack_pending - ack_pending)
        wake_at: float | None = joining_until
        waits_for_log = False
        watch: builtins.list[Watched] = []
        while room > 0 and wake_at is None:
            asked = room
            entries = self._state.log_blocks(topic, row.delivered, asked)
            for seq, cid, delivered_at, block in entries:
                if config.replay_policy == "original" and row.paced_at is not None \
                        and row.paced_from is not None:
                    due = row.paced_at + max(0.0, delivered_at - row.paced_from)
                    if due > now:
                        wake_at = due
                        break
                row.delivered = seq
                event = _event((cid, delivered_at, block))
                if event is None:  # its block is gone: nothing to hand out
                    self._skip(row, seq, seq)
                    continue
                if member is not None and share is not None:
                    elsewhere = share.elsewhere(member, seq, event)
                    if isinstance(elsewhere, Watched):  # another's: watched until settled
                        watch.append(elsewhere)
                        continue
                    if elsewhere:  # another member settled it before we got here
                        continue
                messages.append(ConsumerMessage(seq, event, delivered_at, 1))
                room -= 1
                if tracked:
                    upserts.append((seq, 1, now + config.wait_after(1)))
                if config.replay_policy == "original":
                    row.paced_at, row.paced_from = now, delivered_at
            else:
                if len(entries) < asked:  # read to the end of the log
                    waits_for_log = True
                    break
                continue  # a group member left some to others: read on
            break  # paced
        if row != before or upserts or deletes or watch:
            self._table.save(row, upserts, deletes, watch)
        if set_aside:
            self._settled(row, [seq for seq, _ in set_aside])
        self.counters["consumer_delivered"] += len(messages)
        self.counters["consumer_redelivered"] += redelivered
        skipped = row.skipped - before.skipped
        if skipped:
            self.counters["consumer_skipped"] += skipped
            self.advisories.emit("consumer.skipped", topic=str(topic), consumer=row.name,
                                 first=row.skipped_from, last=row.skipped_to, count=skipped)
            log.warning("consumer %s of topic %s: skipped %d log position(s) retention cut "
                        "before it read them (last %s..%s)", row.name, topic, skipped,
                        row.skipped_from, row.skipped_to)
        for seq, count in set_aside:
            # The advisory: a message that keeps failing is reported, not retried forever.
            self.counters["consumer_terminated"] += 1
            self.counters["consumer_max_deliver_reached"] += 1
            self.advisories.emit("consumer.max_deliver", topic=str(topic), consumer=row.name,
                                 seq=seq, deliveries=count, max_deliver=config.max_deliver)
            log.warning("consumer %s of topic %s: position %d set aside after %d deliveries "
                        "(max_deliver %d)", row.name, topic, seq, count, config.max_deliver)
        if not messages and tracked and wake_at is None:
            wake_at = self._table.stats(topic, row.name).next_due
        return Taken(tuple(messages), row.delivered, wake_at, waits_for_log)

    def _settled(self, row: ConsumerRow, seqs: builtins.list[int]) -> None:
        if self._share is not None:
            self._share.settled(row, seqs)

    @staticmethod
    def _skip(row: ConsumerRow, first: int, last: int) -> None:
        """Count positions ``first..last`` as skipped (joined to the last range skipped
        when they follow it)."""
        row.skipped += last - first + 1
        if row.skipped_to is not None and row.skipped_to == first - 1:
            row.skipped_to = last
        else:
            row.skipped_from, row.skipped_to = first, last

    # ------------------------------------------------------------------ plumbing

    def _get(self, topic: CID, name: str) -> ConsumerRow:
        row = self._table.get(topic, check_name(name))
        if row is None:
            raise ConsumerNotFound(f"no consumer {name!r} of topic {topic}")
        return row

    async def _root(self, topic: CID) -> CID:
        if self._lineage is None:
            return topic
        first, _ = await self._lineage(topic)
        return first.cid

    def _poke(self, topic: CID, name: str) -> None:
        """Wake the fetches waiting on this consumer: an acknowledgement made room, a nak
        made something due, or it was deleted."""
        signal = self._signals.pop((topic, name), None)
        if signal is not None:
            signal.set()

    async def _wait(self, topic: CID, after: int, signal: asyncio.Event, timeout: float
                    ) -> None:
        """Until the log grows past ``after``, the consumer is poked, the node stops, or
        ``timeout`` seconds pass."""
        waits = [asyncio.ensure_future(signal.wait()),
                 asyncio.ensure_future(self._log.wait(topic, after, timeout))]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _sweep_forever(self) -> None:
        while not self._log.stopped:
            await asyncio.sleep(SWEEP_EVERY)
            try:
                self.sweep(self.clock())
            except Exception as exc:  # a full disk, a closed store: again next time
                log.warning("consumer sweep failed: %s", exc)


def _check_batch(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 < batch <= MAX_BATCH:
        raise ValueError(f"batch must be 1..{MAX_BATCH}")


def _event(entry: tuple[CID, float, bytes | None] | None) -> EventDescriptor | None:
    """The log entry's event, parsed from its stored block (verified when it was
    delivered; parsing re-checks its CID); None when the entry or its block is gone."""
    if entry is None or entry[2] is None:
        return None
    try:
        return EventDescriptor.from_block(entry[2], entry[0], verify_signature=False)
    except InvalidDescriptor:
        return None
