"""Rows published as events: ``df.write.format("pulsarcast")`` and the streaming sink.

Each task publishes its rows through the node's REST API (``POST /v1/topics/{cid}/events``)
with up to ``maxInFlight`` requests outstanding, and returns the CIDs it published as its
commit message. Delivery is **at-least-once**: an event cannot be unpublished, so a task
that fails half-way leaves what it published, and Spark's retry of the task (or the re-run
of a failed micro-batch from the checkpoint) publishes every row of the task again, as new
events with new CIDs. The error a failing task raises says which row failed, why, and how
many events the task had already published.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from api.client import ApiError, PulsarcastClient

from .errors import PulsarcastSparkError
from .options import WriteOptions
from .rest import UNREACHABLE_ERRORS, NodeApi, open_client, translate

__all__ = ["BatchWriter", "PublishedEvents", "StreamWriter", "publish_batches"]

log = logging.getLogger("pulsar.spark")

RETRY_BACKOFF_S: Final = 0.2


@dataclass
class PublishedEvents(WriterCommitMessage):
    """What one task published: ``cids[i]`` went to ``topics[i]``, in row order."""

    partition: int
    attempt: int
    topics: list[str] = field(default_factory=list)
    cids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Row:
    index: int
    topic: str
    payload: bytes | str
    parent: str | None


def check_columns(schema: StructType, options: WriteOptions) -> None:
    """``payload`` (binary or string) is required; ``topic`` is required unless the option
    is given; ``parent`` (string) is optional; other columns are ignored, so a DataFrame
    read from a topic can be written as it is."""
    fields = {f.name: f.dataType for f in schema.fields}
    payload = fields.get("payload")
    if payload is None:
        raise PulsarcastSparkError("INVALID_COLUMN", "the rows need a 'payload' column "
                                   f"(binary or string); they have {', '.join(fields)}")
    if not isinstance(payload, BinaryType | StringType):
        raise PulsarcastSparkError("INVALID_COLUMN", "'payload' must be binary or string, "
                                   f"not {payload.simpleString()}")
    for name in ("topic", "parent"):
        if name in fields and not isinstance(fields[name], StringType):
            raise PulsarcastSparkError("INVALID_COLUMN", f"'{name}' must be a string column "
                                       f"(a CID), not {fields[name].simpleString()}")
    if options.topic is None and "topic" not in fields:
        raise PulsarcastSparkError("MISSING_OPTION", "say where to publish: option 'topic' "
                                   "or a 'topic' column (the option wins when both are there)")


def _rows(batch: pa.RecordBatch, first: int, topic_option: str | None) -> list[_Row]:
    names = batch.schema.names
    payloads = batch.column(names.index("payload")).to_pylist()
    topics = (batch.column(names.index("topic")).to_pylist()
              if topic_option is None else None)
    parents = (batch.column(names.index("parent")).to_pylist()
               if "parent" in names else None)
    rows = []
    for i, payload in enumerate(payloads):
        index = first + i
        if payload is None:
            raise PulsarcastSparkError("INVALID_ROW", f"row {index} of this task has a null "
                                       "payload")
        topic = topic_option if topics is None else topics[i]
        if not topic:
            raise PulsarcastSparkError("INVALID_ROW", f"row {index} of this task has no "
                                       "topic (null 'topic' column and no 'topic' option)")
        rows.append(_Row(index, topic, payload, None if parents is None else parents[i]))
    return rows


def _retryable(exc: BaseException) -> bool:
    """A dropped connection or a 5xx may be transient; a 4xx will not change on retry."""
    if isinstance(exc, ApiError):
        return exc.status >= 500
    return isinstance(exc, UNREACHABLE_ERRORS)


class _Publisher:
    """Publishes rows with a window of requests in flight; stops taking new rows at the
    first failure and reports it once the requests in flight have finished."""

    def __init__(self, client: PulsarcastClient, options: WriteOptions) -> None:
        self.client = client
        self.options = options
        self.published: dict[int, tuple[str, str]] = {}
        self.failure: tuple[_Row, BaseException] | None = None

    async def _one(self, row: _Row) -> None:
        attempt = 0
        while True:
            try:
                event = await self.client.publish(row.topic, row.payload, parent=row.parent)
                cid = event.get("cid") if isinstance(event, dict) else None
                if type(cid) is not str:
                    raise ValueError("the publish answer carries no event CID")
                self.published[row.index] = (row.topic, cid)
                return
            except Exception as exc:
                if attempt >= self.options.publish_retries or not _retryable(exc):
                    raise
                attempt += 1
                await asyncio.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))

    async def run(self, rows: list[_Row]) -> None:
        pending = iter(rows)

        async def worker() -> None:
            for row in pending:
                if self.failure is not None:
                    return
                try:
                    await self._one(row)
                except Exception as exc:
                    if self.failure is None or row.index < self.failure[0].index:
                        self.failure = (row, exc)
                    return

        await asyncio.gather(*(worker() for _ in range(self.options.max_in_flight)))


def publish_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]
                    ) -> PublishedEvents:
    """Publish every row of one task; the commit message lists what was published."""
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else -1
    attempt = context.attemptNumber() if context is not None else 0
    where = f"task for partition {partition} (attempt {attempt})"
    loop = asyncio.new_event_loop()
    client: PulsarcastClient | None = None
    publisher: _Publisher | None = None
    try:
        client = loop.run_until_complete(open_client(options.endpoint))
        publisher = _Publisher(client, options)
        first = 0
        for batch in batches:
            rows = _rows(batch, first, options.topic)
            first += batch.num_rows
            loop.run_until_complete(publisher.run(rows))
            if publisher.failure is not None:
                row, exc = publisher.failure
                cause = translate(exc, options.endpoint, f"publishing to {row.topic}")
                raise PulsarcastSparkError(
                    "PUBLISH_FAILED", f"{where}: row {row.index} could not be published: "
                    f"{cause.detail}; this task had published {len(publisher.published)} "
                    "event(s) before it stopped, and a retry publishes all its rows again "
                    "(at-least-once)")
        order = sorted(publisher.published)
        return PublishedEvents(partition, attempt,
                               [publisher.published[i][0] for i in order],
                               [publisher.published[i][1] for i in order])
    except PulsarcastSparkError as exc:
        if exc.code == "PUBLISH_FAILED" or publisher is None:
            raise
        done = 0 if publisher is None else len(publisher.published)
        raise PulsarcastSparkError(exc.code, f"{where}: {exc.detail} ({done} event(s) of this "
                                   "task were published before)") from None
    except Exception as exc:
        raise translate(exc, options.endpoint, where) from None
    finally:
        if client is not None:
            loop.run_until_complete(client.session.close())
        loop.close()


def _check_topic(options: WriteOptions) -> None:
    """An unknown topic or an unreachable node fails the query when it is planned, not in
    every task."""
    if options.topic is not None:
        api = NodeApi(options.endpoint)
        try:
            api.topic_root(options.topic)
        finally:
            api.close()


def _summary(messages: list[Any]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, PublishedEvents)]
    return len(done), sum(len(m.cids) for m in done)


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("pulsarcast").mode("append")``: rows arrive as Arrow batches."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_columns(schema, options)
        _check_topic(options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedEvents:
        return publish_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        tasks, events = _summary(list(messages))
        log.info("pulsarcast write committed: %d task(s) published %d event(s)", tasks, events)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        tasks, events = _summary(list(messages))
        log.warning("pulsarcast write aborted: %d task(s) had already published %d event(s); "
                    "published events stay in the topic", tasks, events)


class StreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("pulsarcast")``: each micro-batch's rows are published; a batch
    re-run after a failure publishes its rows again (at-least-once)."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_columns(schema, options)
        _check_topic(options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedEvents:
        return publish_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None],  # type: ignore[override]
               batchId: int) -> None:
        tasks, events = _summary(list(messages))
        log.info("pulsarcast micro-batch %d committed: %d task(s) published %d event(s)",
                 batchId, tasks, events)

    def abort(self, messages: list[WriterCommitMessage | None],  # type: ignore[override]
              batchId: int) -> None:
        tasks, events = _summary(list(messages))
        log.warning("pulsarcast micro-batch %d aborted: %d task(s) had already published %d "
                    "event(s)", batchId, tasks, events)
