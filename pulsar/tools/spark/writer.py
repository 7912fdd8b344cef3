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

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from .commit import PublishedEvents
from .errors import PulsarcastSparkError
from .options import WriteOptions

__all__ = ["BatchWriter", "PublishedEvents", "StreamWriter", "check_columns"]

log = logging.getLogger("pulsar.tools.spark")


def check_columns(schema: StructType, options: WriteOptions) -> None:
    """``payload`` (binary or string; or ``value``, as Kafka's sink calls it) is required;
    ``topic`` is required unless the option is given; ``parent`` (string) is optional and
    used only for CUSTOM topics; ``content_type`` (string, optional) is each payload's
    media type; ``key`` (string, or binary in UTF-8 as Kafka's sink has it; optional) each
    event's key, which a compacted topic keeps the newest event of; other columns are
    ignored, so a DataFrame read from a topic — or shaped for Kafka — can be written as it
    is."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "payload" in fields and "value" in fields:
        raise PulsarcastSparkError("INVALID_COLUMN", "the rows have both 'payload' and "
                                   "'value' (its Kafka name): drop one of them")
    name = "payload" if "payload" in fields else "value"
    payload = fields.get(name)
    if payload is None:
        raise PulsarcastSparkError("INVALID_COLUMN", "the rows need a 'payload' column "
                                   "(binary or string; 'value' is taken as its alias); they "
                                   f"have {', '.join(fields)}")
    if not isinstance(payload, BinaryType | StringType):
        raise PulsarcastSparkError("INVALID_COLUMN", f"'{name}' must be binary or string, "
                                   f"not {payload.simpleString()}")
    for name in ("topic", "parent", "content_type"):
        if name in fields and not isinstance(fields[name], StringType):
            what = "a media type" if name == "content_type" else "a CID"
            raise PulsarcastSparkError("INVALID_COLUMN", f"'{name}' must be a string column "
                                       f"({what}), not {fields[name].simpleString()}")
    key = fields.get("key")
    if key is not None and not isinstance(key, BinaryType | StringType):
        raise PulsarcastSparkError("INVALID_COLUMN", "'key' must be a string or binary "
                                   f"column (UTF-8), not {key.simpleString()}")
    if options.topic is None and "topic" not in fields:
        raise PulsarcastSparkError("MISSING_OPTION", "say where to publish: option 'topic' "
                                   "or a 'topic' column (the option wins when both are there)")


def _check_node(options: WriteOptions, schema: StructType) -> None:
    """A wrong token, an unknown topic or an unreachable node fails the query when it is
    planned, not in every task after some rows were published; a ``parent`` column that
    the topic will not take is said once here (the tasks drop it)."""
    from .rest import NodeApi  # the HTTP client, only where a call is made

    api = NodeApi(options.endpoint)
    try:
        api.check_token()
        if options.topic is not None:
            api.topic_root(options.topic)
            if "parent" in schema.fieldNames() and not api.takes_parent(options.topic):
                log.warning("topic %s links its events itself (event_linking is not "
                            "CUSTOM): the 'parent' column is ignored", options.topic)
    finally:
        api.close()


def _summary(messages: list[Any]) -> tuple[int, int, int]:
    """Tasks that reported, events they published (failed tasks included), tasks that
    reported nothing (failed outside the publishing, e.g. killed)."""
    done = [m for m in messages if isinstance(m, PublishedEvents)]
    return len(done), sum(len(m.cids) for m in done), len(messages) - len(done)


def _raise_failures(messages: list[Any]) -> None:
    failed = [m for m in messages if isinstance(m, PublishedEvents) and m.error is not None]
    if failed:
        first = failed[0]
        more = f" ({len(failed)} tasks failed)" if len(failed) > 1 else ""
        raise PulsarcastSparkError(first.error_code or "PUBLISH_FAILED",
                                   f"{first.error}{more}")


def _aborted(messages: list[Any]) -> str:
    tasks, events, silent = _summary(messages)
    unknown = (f"; {silent} task(s) stopped without reporting and may have published more"
               if silent else "")
    return (f"{tasks} task(s) had already published {events} event(s){unknown}; published "
            "events stay in the topic")


class _Publishing:
    """What the batch and the streaming writer share: checked options, and a task that
    publishes its rows."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_columns(schema, options)
        _check_node(options, schema)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedEvents:
        from .publish import publish_task

        return publish_task(self.options, iterator)


class BatchWriter(_Publishing, DataSourceArrowWriter):
    """``df.write.format("pulsarcast").mode("append")``: rows arrive as Arrow batches."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _raise_failures(list(messages))  # Spark then calls abort with the same messages
        tasks, events, _ = _summary(list(messages))
        log.info("pulsarcast write committed: %d task(s) published %d event(s)", tasks, events)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("pulsarcast write aborted: %s", _aborted(list(messages)))


class StreamWriter(_Publishing, DataSourceStreamArrowWriter):
    """``writeStream.format("pulsarcast")``: each micro-batch's rows are published; a batch
    re-run after a failure publishes its rows again (at-least-once)."""

    def commit(self, messages: list[WriterCommitMessage | None],
               batchId: int) -> None:
        _raise_failures(list(messages))
        tasks, events, _ = _summary(list(messages))
        log.info("pulsarcast micro-batch %d committed: %d task(s) published %d event(s)",
                 batchId, tasks, events)

    def abort(self, messages: list[WriterCommitMessage | None],
              batchId: int) -> None:
        log.warning("pulsarcast micro-batch %d aborted: %s", batchId,
                    _aborted(list(messages)))
