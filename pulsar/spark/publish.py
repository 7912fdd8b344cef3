"""One writer task: its rows published through the node's REST API.

Kept apart from :mod:`.writer` so that the processes Spark starts only to commit or abort a
write (on the driver, one per job or micro-batch) do not import the HTTP client: each such
process pays for every import, and the client's was most of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark import TaskContext

from api.client import ApiError, PulsarcastClient

from .errors import PulsarcastSparkError
from .options import WriteOptions
from .rest import UNREACHABLE_ERRORS, open_client, translate
from .writer import PublishedEvents

__all__ = ["publish_batches"]

RETRY_BACKOFF_S: Final = 0.2


@dataclass(frozen=True)
class _Row:
    """One row to publish; ``index`` counts the task's rows, so errors can name the row."""

    index: int
    topic: str
    payload: bytes | str
    parent: str | None


def _rows(batch: pa.RecordBatch, first: int, topic_option: str | None) -> list[_Row]:
    """The rows of one Arrow batch; the ``topic`` option, when given, wins over the column
    (Kafka's rule), and a row that cannot be published stops the task before any request
    for it is made."""
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


