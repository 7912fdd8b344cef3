"""``PulsarcastDataSource``: the ``"pulsarcast"`` format, its batch and streaming readers.

Where each piece runs matters (Spark 4's Python data sources): ``schema()``, ``reader()``,
``partitions()`` run in a short-lived Python worker on the driver at planning; the reader is
then **pickled** with its partitions and ``read(partition)`` runs in executor workers; a
stream reader lives in one long-lived driver-side worker for the whole query
(``initialOffset``, ``latestOffset``, ``partitions``, ``commit``), while its ``read`` runs in
executors from a fresh copy. So readers hold options and plain data only, connections are
opened inside each call, and a partition is a picklable ``(topic, start, end)``.

The HTTP client (:mod:`.rest`) is imported where a call is made, not here: Spark starts a
fresh Python process for ``schema()`` at every ``load()`` and for every commit, and each
pays for every import of this module (the client was half of it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .errors import PulsarcastSparkError
from .offsets import Range, admit, resolve_bound, split_ranges
from .options import (
    ReadOptions,
    ending_bound,
    read_options,
    starting_bound,
    write_options,
)
from .schema import SCHEMA
from .writer import BatchWriter, StreamWriter

if TYPE_CHECKING:
    from .rest import NodeApi

__all__ = [
    "BatchReader",
    "PulsarcastDataSource",
    "RangePartition",
    "StreamReader",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark task's share of a read: positions ``start <= seq < end`` of ``topic``."""

    topic: str
    start: int
    end: int


def _partitions(ranges: Sequence[Range], options: ReadOptions) -> list[RangePartition]:
    return [RangePartition(r.topic, r.start, r.end)
            for r in split_ranges(ranges, options.max_events_per_partition,
                                  options.min_partitions)]


def _read(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    # Spark reads a placeholder partition when planning returned none (an empty range).
    if isinstance(partition, RangePartition):
        from .rest import read_range

        yield from read_range(options.endpoint, partition.topic, partition.start,
                              partition.end, options.history_format)


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise PulsarcastSparkError("INVALID_OPTION", "the pulsarcast source has a fixed "
                                   f"schema ({SCHEMA.simpleString()}); do not pass .schema()")


def _followed(options: ReadOptions, api: NodeApi, topics: list[tuple[str, str, int]],
              *, streaming: bool) -> list[tuple[str, str, int]]:
    """Check that the node follows every topic, or subscribe it (option ``subscribe``): a
    node's log holds only what it delivered while it followed a topic, and only grows while
    it does, so reading a topic it does not follow silently gives 0 rows (or a stale
    part). ``subscribe=false`` on a batch read takes the log as it is. Returns the topics
    with their newest positions, read again after subscribing."""
    followed = api.subscribed()
    missing = [(given, root) for given, root, _ in topics if root not in followed]
    if not missing or (options.subscribe == "no" and not streaming):
        return topics
    if options.subscribe in ("unset", "no"):
        given, root = missing[0]
        last = next(last for g, _, last in topics if g == given)
        other = ("" if streaming else " or subscribe=false to read only what this node's log "
                 f"already holds ({last} position(s))")
        raise PulsarcastSparkError(
            "NOT_SUBSCRIBED", f"the node at {options.endpoint.url} does not follow topic "
            f"{given}, so its log of it {'would not grow' if streaming else 'may be empty'}: "
            f"subscribe it (PUT /v1/subscriptions/{given}?replay=true) or set option "
            f"subscribe=replay (with the token) to have the reader do it{other}")
    for _, root in missing:
        api.subscribe(root, replay=options.subscribe == "replay")
    return _roots(options, api)


def _roots(options: ReadOptions, api: NodeApi) -> list[tuple[str, str, int]]:
    """``(given CID, root CID, newest position)`` per topic, versions of one topic read
    once (a log is per topic, named by its first version)."""
    seen: dict[str, tuple[str, str, int]] = {}
    for given in options.topics:
        root, last = api.topic_root(given)
        seen.setdefault(root, (given, root, last))
    return list(seen.values())


class BatchReader(DataSourceReader):
    """``spark.read.format("pulsarcast")``: the ranges are fixed when the query is planned
    (``latest`` means the newest position at that moment), so every task, and every retry
    of a task, reads exactly the same positions."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def plan(self) -> list[Range]:
        """One range per topic, resolved against the node."""
        from .rest import NodeApi

        api = NodeApi(self.options.endpoint)
        try:
            ranges = []
            for given, root, last in _followed(self.options, api, _roots(self.options, api),
                                               streaming=False):
                start = resolve_bound(starting_bound(self.options, given, root), root, last,
                                      api, "startingOffsets")
                end = resolve_bound(ending_bound(self.options, given, root), root, last, api,
                                    "endingOffsets")
                if start > end:
                    raise PulsarcastSparkError(
                        "INVALID_OFFSETS", f"{root}: the starting offset {start} is after the "
                        f"ending offset {end}")
                ranges.append(Range(root, start, end))
            return ranges
        finally:
            api.close()

    def partitions(self) -> list[RangePartition]:
        return _partitions(self.plan(), self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("pulsarcast")``: offsets are ``{topic root CID: next
    position}``; a micro-batch reads ``[start, end)`` of each topic's log.

    The log is durable and its positions are never reused, so any range can be read again
    after a failure or a restart and gives the same events: with Spark's checkpoint that
    is exactly-once from the log into the query. Without the ``consumer`` option the node
    keeps no state for the query (the position lives in the checkpoint), as with Kafka.

    **Read as a named consumer** (option ``consumer``, an ``ack_policy=all`` consumer of
    each topic at the node): a query with a new checkpoint starts at the consumer's first
    unsettled position, and every micro-batch committed to the checkpoint is acknowledged
    on the consumer up to its last position (``POST .../consumers/{name}/commit``). Spark
    calls ``commit(end)`` for a batch only when it plans the one after, so the source also
    acknowledges when Spark asks for the next batch's end (``latestOffset(start)``): Spark
    asks only once the batch ending at ``start`` is in the checkpoint's commit log. The
    consumer is therefore never ahead of the checkpoint, and catches up with it at the next
    trigger. A restarted query follows its checkpoint, not the consumer (docs/spark.md,
    "Reading as a named consumer").
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._api: NodeApi | None = None
        self._topics: list[tuple[str, str, int]] | None = None
        self._target: dict[str, int] | None = None
        self._last: dict[str, int] = {}
        """The newest position of each log, as last read."""
        self._starts: dict[str, int] | None = None
        """With ``consumer``: where a new query starts in each topic, read once."""
        self._acked: dict[str, int] = {}
        """With ``consumer``: its ack floor in each topic, as last known here."""
        self._compared = False

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_api": None, "_topics": None, "_target": None,
                "_last": {}, "_starts": None, "_acked": {}, "_compared": False}

    @property
    def api(self) -> NodeApi:
        if self._api is None:
            from .rest import NodeApi

            self._api = NodeApi(self.options.endpoint)
        return self._api

    def _roots(self) -> list[tuple[str, str, int]]:
        """Topics resolved once per query, subscription checked (or made, with
        ``subscribe``): a node's log only grows for topics it follows."""
        if self._topics is None:
            self._topics = _followed(self.options, self.api,
                                     _roots(self.options, self.api), streaming=True)
        return self._topics

    def _latest(self) -> dict[str, int]:
        topics = self._roots()
        last = self.api.last_positions([root for _, root, _ in topics])
        self._last.update(last)
        latest = {root: last[root] + 1 for _, root, _ in topics}
        if self._target is not None:  # Trigger.AvailableNow: never beyond the target
            latest = {t: min(p, self._target.get(t, p)) for t, p in latest.items()}
        return latest

    def _consumer_starts(self) -> dict[str, int]:
        """With ``consumer``: per topic, the first position the consumer has not settled
        (after its ack floor; the first position the log keeps if retention cut beyond
        it). Read once per query; a consumer whose ``ack_policy`` is not ``all`` is
        refused, as acknowledging by position means nothing else."""
        if self._starts is None:
            name = self.options.consumer
            assert name is not None
            starts: dict[str, int] = {}
            for _, root, _ in self._roots():
                policy, floor = self.api.consumer_position(root, name)
                if policy != "all":
                    raise PulsarcastSparkError(
                        "INVALID_CONSUMER", f"consumer {name} of topic {root} has ack_policy "
                        f"{policy}: a stream acknowledges each committed micro-batch up to "
                        "its last position, which needs ack_policy all; make one with "
                        f"`pulsarcast consumer add {root} NAME --ack all` (or POST "
                        f'/v1/topics/{root}/consumers with "ack_policy": "all")')
                self._acked[root] = floor
                starts[root] = max(floor + 1, self.api.first_kept(root))
            self._starts = starts
        return self._starts

    def _first(self, topic: str) -> int:
        """Where a topic missing from a start offset begins: its consumer's position with
        ``consumer``, else its first position (a topic added to ``topics`` since the
        checkpoint was written, as a new Kafka partition)."""
        if self.options.consumer is None:
            return 1
        return self._consumer_starts()[topic]

    def _acknowledge(self, through: Mapping[str, int]) -> None:
        """With ``consumer``: settle each topic's positions up to ``through`` on the
        consumer; only what moves its ack floor is sent, never past the log's end (a
        checkpoint taken against another node's log may be ahead of it)."""
        name = self.options.consumer
        if name is None:
            return
        self._consumer_starts()  # the ack floors, read once
        for topic, position in through.items():
            if topic not in self._acked:
                continue
            if position > self._last.get(topic, 0):
                self._last.update(self.api.last_positions([topic]))
            position = min(position, self._last[topic])
            if position > self._acked[topic]:
                floor = self.api.commit_consumer(topic, name, position)
                self._acked[topic] = max(position, floor)

    def _compare(self, start: Mapping[str, int]) -> None:
        """With ``consumer``, once per query: say so when the checkpoint is behind the
        consumer (another reader settled further while the query was stopped). The
        checkpoint wins, so those positions are read again."""
        if self._compared or self.options.consumer is None:
            return
        self._compared = True
        floors = dict(self._acked)
        for topic, position in start.items():
            floor = floors.get(topic)
            if floor is not None and int(position) - 1 < floor:
                log.warning("the checkpoint of this query is at position %d of topic %s, "
                            "behind consumer %s, which settled up to %d: positions %d-%d are "
                            "read again (the checkpoint wins; start the query with a new "
                            "checkpoint location to follow the consumer instead)",
                            position, topic, self.options.consumer, floor, position, floor)

    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts (``startingOffsets``, default ``latest``, or
        ``startingTimestamp``; with ``consumer``, the consumer's position); a query
        restarted from its checkpoint does not ask."""
        if self.options.consumer is not None:
            return dict(self._consumer_starts())
        topics = self._roots()
        last = self.api.last_positions([root for _, root, _ in topics])
        return {root: resolve_bound(starting_bound(self.options, given, root), root,
                                    last[root], self.api, "startingOffsets")
                for given, root, _ in topics}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_events_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_events_per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The end of the next micro-batch, within ``limit`` (``maxEventsPerTrigger``
        counts log positions). A topic missing from ``start`` — added to ``topics`` since
        the checkpoint was written — starts from its earliest position (as a new Kafka
        partition does), or its consumer's position.

        Spark asks only once the batch that ended at ``start`` is committed to its
        checkpoint, so with ``consumer`` what comes before ``start`` is acknowledged here."""
        latest = self._latest()
        if self.options.consumer is not None:
            self._consumer_starts()
            self._compare(start)
            self._acknowledge({t: int(p) - 1 for t, p in start.items() if t in latest})
        # A start beyond the log (a checkpoint from another node's log) stays where it is:
        # nothing is read until the log reaches it, and no position is read twice.
        begin = {t: int(start.get(t, self._first(t))) for t in latest}
        if isinstance(limit, ReadMinRows):
            waiting = sum(latest[t] - begin[t] for t in latest)
            return begin if waiting < limit.min_rows else latest
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return admit(begin, latest, max_rows)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest()

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the target of ``trigger(availableNow=True)``: what the logs hold now; events
        delivered later wait for the next run."""
        self._target = None
        self._target = self._latest()

    def partitions(self, start: dict[str, int], end: dict[str, int]
                   ) -> Sequence[RangePartition]:
        ranges = [Range(t, int(start.get(t, self._first(t))), int(e)) for t, e in end.items()]
        return _partitions(ranges, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Spark is done with everything before ``end``: with ``consumer``, acknowledge it
        on the consumer (usually done already, when the next batch was planned)."""
        if self.options.consumer is not None:
            self._acknowledge({t: int(p) - 1 for t, p in end.items()})

    def stop(self) -> None:
        if self._api is not None:
            self._api.close()


class PulsarcastDataSource(DataSource):
    """Topic histories and live events as DataFrames, and rows published as events.

    ``spark.dataSource.register(PulsarcastDataSource)``, then ``format("pulsarcast")``
    with ``endpoint`` (a node's REST URL), ``topic``/``topics`` and the options of
    ``docs/spark.md``.
    """

    @classmethod
    def name(cls) -> str:
        return "pulsarcast"

    def schema(self) -> StructType:
        read_options(self.options, streaming=None)  # fail at load() on a bad option
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return BatchReader(read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return StreamReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise PulsarcastSparkError("INVALID_OPTION", "a topic is append-only: write with "
                                       "mode('append')")
        return BatchWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Complete output mode (overwrite) publishes the whole result table every trigger,
        # as Kafka's sink does: the topic keeps every version, readers take the newest.
        return StreamWriter(write_options(self.options), schema)
