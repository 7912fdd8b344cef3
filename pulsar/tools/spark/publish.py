"""One writer task: its rows published through the node's REST API.

Kept apart from :mod:`.writer` so that the processes Spark starts only to commit or abort a
write (on the driver, one per job or micro-batch) do not import the HTTP client: each such
process pays for every import, and the client's was most of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark import TaskContext

from api.client import ApiError, PulsarcastClient

from .commit import PublishedEvents
from .errors import PulsarcastSparkError
from .options import WriteOptions
from .rest import UNREACHABLE_ERRORS, open_client, translate

__all__ = ["publish_batches", "publish_task"]

RETRY_BACKOFF_S: Final = 0.2


@dataclass(frozen=True)
class _Row:
    """One row to publish; ``index`` counts the task's rows, so errors can name the row."""

    index: int
    topic: str
    payload: bytes | str
    parent: str | None
    content_type: str | None = None
    key: str | None = None


def payload_column(names: list[str]) -> str:
    """``payload``, or Kafka's ``value`` when there is no ``payload`` (the writer refuses
    a DataFrame with both when the write is planned)."""
    return "payload" if "payload" in names else "value"


def _topics(batch: pa.RecordBatch, topic_option: str | None) -> list[Any] | None:
    if topic_option is not None:
        return None
    topics: list[Any] = batch.column(batch.schema.names.index("topic")).to_pylist()
    return topics


def _rows(batch: pa.RecordBatch, first: int, topic_option: str | None,
          takes_parent: Callable[[str], bool]) -> list[_Row]:
    """The rows of one Arrow batch; the ``topic`` option, when given, wins over the column
    (Kafka's rule), a ``parent`` is kept only for topics whose events name their parent
    (``takes_parent``: CUSTOM linking), and a row that cannot be published stops the task
    before any request for it is made."""
    names = batch.schema.names
    payloads = batch.column(names.index(payload_column(names))).to_pylist()
    topics = _topics(batch, topic_option)
    parents = (batch.column(names.index("parent")).to_pylist()
               if "parent" in names else None)
    types = (batch.column(names.index("content_type")).to_pylist()
             if "content_type" in names else None)
    keys = (batch.column(names.index("key")).to_pylist() if "key" in names else None)
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
        parent = None if parents is None or not takes_parent(topic) else parents[i]
        key = None if keys is None else _key(keys[i], index)
        rows.append(_Row(index, topic, payload, parent, None if types is None else types[i],
                         key))
    return rows


def _key(value: Any, index: int) -> str | None:
    """A row's event key: a string, or bytes in UTF-8 (a DataFrame shaped for Kafka, whose
    keys are binary); null for none."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise PulsarcastSparkError("INVALID_ROW", f"row {index} of this task has a key "
                                       "that is not UTF-8") from None
    if value is None or isinstance(value, str):
        return value
    raise PulsarcastSparkError("INVALID_ROW", f"row {index} of this task has a key that is "
                               "not a string")


def _retryable(exc: BaseException) -> bool:
    """A dropped connection or a 5xx may be transient; a 4xx will not change on retry."""
    if isinstance(exc, ApiError):
        return exc.status >= 500
    return isinstance(exc, UNREACHABLE_ERRORS)


class _RowFailed(Exception):
    """``row`` cannot be published (``cause`` says why); rows before it may have been."""

    def __init__(self, row: _Row, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.row = row
        self.cause = cause


def _chunks(rows: list[_Row], size: int) -> list[list[_Row]]:
    """Consecutive rows for one topic, at most ``size`` each: one publish request each."""
    chunks: list[list[_Row]] = []
    for row in rows:
        if chunks and len(chunks[-1]) < size and chunks[-1][-1].topic == row.topic:
            chunks[-1].append(row)
        else:
            chunks.append([row])
    return chunks


class _Publisher:
    """Publishes rows with a window of requests in flight, ``publish_batch`` rows a request;
    stops taking new rows at the first failure and reports it once the requests in flight
    have finished."""

    def __init__(self, client: PulsarcastClient, options: WriteOptions) -> None:
        self.client = client
        self.options = options
        self.published: dict[int, tuple[str, str]] = {}
        self.failure: tuple[_Row, BaseException] | None = None
        self.custom: dict[str, bool] = {}

    async def learn_linking(self, topics: set[str]) -> None:
        """Whether each topic's events name their parent (CUSTOM, in its newest version):
        other topics link events themselves and refuse a ``parent``, so a ``parent`` column
        (a DataFrame read from another topic, copied as it is) is ignored for them."""
        for topic in topics - set(self.custom):
            versions = await self.client.topic_versions(topic)
            linking = versions[0].get("event_linking") if versions else None  # newest first
            if type(linking) is not str:
                raise ValueError(f"topic {topic} came without its event_linking")
            self.custom[topic] = linking == "CUSTOM"

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))

    async def _one(self, row: _Row) -> None:
        attempt = 0
        while True:
            try:
                event = await self.client.publish(row.topic, row.payload, parent=row.parent,
                                                  content_type=row.content_type, key=row.key)
                cid = event.get("cid") if isinstance(event, dict) else None
                if type(cid) is not str:
                    raise ValueError("the publish answer carries no event CID")
                self.published[row.index] = (row.topic, cid)
                return
            except Exception as exc:
                if attempt >= self.options.publish_retries or not _retryable(exc):
                    raise _RowFailed(row, exc) from None
                attempt += 1
                await self._backoff(attempt)

    async def _batch(self, rows: list[_Row]) -> None:
        """Publish ``rows`` (one topic) in one request. Rows the node refused for a reason
        that may pass (a 5xx) go again, up to ``publish_retries`` times, in a smaller
        request; a whole request that failed that way (a dropped connection) goes again
        whole. Every row the node acknowledged is recorded before a failure is raised."""
        attempt = 0
        todo = rows
        while todo:
            items = [{"payload": r.payload, "parent": r.parent,
                      "content_type": r.content_type, "key": r.key} for r in todo]
            try:
                outcomes = await self.client.publish_batch(todo[0].topic, items)
                if len(outcomes) != len(todo):
                    raise ValueError(f"the batch answer has {len(outcomes)} lines for "
                                     f"{len(todo)} rows")
            except Exception as exc:
                if attempt >= self.options.publish_retries or not _retryable(exc):
                    raise _RowFailed(todo[0], exc) from None
                attempt += 1
                await self._backoff(attempt)
                continue
            failed: list[tuple[_Row, BaseException]] = []
            final = False
            for row, outcome in zip(todo, outcomes, strict=True):
                cid = outcome.get("cid")
                if type(cid) is str:
                    self.published[row.index] = (row.topic, cid)
                    continue
                problem = outcome.get("error")
                error: BaseException = (ApiError.from_problem(problem)
                                        if isinstance(problem, dict) else
                                        ValueError("a batch answer line carries no event CID"))
                failed.append((row, error))
                final = final or attempt >= self.options.publish_retries or not _retryable(error)
            if final:
                # The task stops: it reports the first row the node did not take (every row
                # it took is recorded above).
                raise _RowFailed(*failed[0])
            again = [row for row, _ in failed]
            if again:
                attempt += 1
                await self._backoff(attempt)
            todo = again

    async def run(self, rows: list[_Row]) -> None:
        size = self.options.publish_batch
        chunks = iter([[row] for row in rows] if size == 1 else _chunks(rows, size))

        async def worker() -> None:
            for chunk in chunks:
                if self.failure is not None:
                    return
                try:
                    await (self._one(chunk[0]) if size == 1 else self._batch(chunk))
                except _RowFailed as failed:
                    if self.failure is None or failed.row.index < self.failure[0].index:
                        self.failure = (failed.row, failed.cause)
                    return

        await asyncio.gather(*(worker() for _ in range(self.options.max_in_flight)))


def publish_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]
                    ) -> PublishedEvents:
    """Publish every row of one task; the commit message lists what was published, and a
    failure is raised (:func:`publish_task` returns it instead)."""
    message = publish_task(options, batches)
    if message.error is not None:
        raise PulsarcastSparkError(message.error_code or "PUBLISH_FAILED", message.error)
    return message


def publish_task(options: WriteOptions, batches: Iterator[pa.RecordBatch]
                 ) -> PublishedEvents:
    """One writer task. A failure does not fail the task: it comes back in the commit
    message with what the task had published, and the driver's commit raises it. Spark
    gives a failed task's message to nobody, so that is the only way ``abort`` can count
    every event the write published (and Spark does not retry the task: a retry would
    publish its rows again)."""
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else -1
    attempt = context.attemptNumber() if context is not None else 0
    where = f"task for partition {partition} (attempt {attempt})"
    loop = asyncio.new_event_loop()
    client: PulsarcastClient | None = None
    publisher: _Publisher | None = None

    def result(error: PulsarcastSparkError | None = None) -> PublishedEvents:
        done = {} if publisher is None else publisher.published
        order = sorted(done)
        return PublishedEvents(partition, attempt, [done[i][0] for i in order],
                               [done[i][1] for i in order],
                               None if error is None else error.detail,
                               None if error is None else error.code)

    try:
        client = loop.run_until_complete(open_client(options.endpoint))
        publisher = _Publisher(client, options)
        first = 0
        for batch in batches:
            if "parent" in batch.schema.names:
                topics = _topics(batch, options.topic)
                wanted = {options.topic} if topics is None else {t for t in topics if t}
                try:
                    loop.run_until_complete(publisher.learn_linking(wanted))  # type: ignore[arg-type]
                except Exception as exc:
                    raise translate(exc, options.endpoint, "reading the topic's settings"
                                    ) from None
            rows = _rows(batch, first, options.topic, publisher.custom.__getitem__)
            first += batch.num_rows
            loop.run_until_complete(publisher.run(rows))
            if publisher.failure is not None:
                row, error = publisher.failure
                cause = translate(error, options.endpoint, f"publishing to {row.topic}")
                raise PulsarcastSparkError(
                    "PUBLISH_FAILED", f"{where}: row {row.index} could not be published: "
                    f"{cause.detail}; this task had published {len(publisher.published)} "
                    "event(s) before it stopped (they stay in the topic)")
        return result()
    except PulsarcastSparkError as exc:
        if exc.code == "PUBLISH_FAILED":
            return result(exc)
        done = 0 if publisher is None else len(publisher.published)
        return result(PulsarcastSparkError(exc.code, f"{where}: {exc.detail} ({done} "
                                           "event(s) of this task were published before)"))
    except Exception as exc:
        return result(translate(exc, options.endpoint, where))
    finally:
        if client is not None:
            loop.run_until_complete(client.session.close())
        loop.close()
