"""The rows a read produces — a fixed schema modelled on Spark's Kafka source — and the
building of Arrow record batches from the events a node sends.

Whatever the node sends is untrusted: every field is type-checked and bounded before it
becomes a column, and a malformed event fails the task with a message saying what was
wrong, rather than a row of garbage. The NDJSON is parsed by Arrow's JSON reader straight
into columns, and the checks run on whole columns; the only per-event Python left is the
base64 decode of the payloads (profiled: a ``json.loads`` and a dict walk per event cost
several times more than the rest of the read on the client side).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import io
import itertools
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dag import check_content_type, check_event_key
from dag.errors import SchemaError

from .errors import PulsarcastSparkError

__all__ = ["ARROW_SCHEMA", "SCHEMA", "ParsedBlock", "parse_block", "rows_in_range", "seq_of"]

SCHEMA: Final = StructType([
    StructField("topic", StringType(), False),
    StructField("seq", LongType(), False),
    StructField("cid", StringType(), False),
    StructField("parent", StringType(), True),
    StructField("author", StringType(), False),
    StructField("publisher", StringType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("created", TimestampType(), False),
    StructField("payload", BinaryType(), False),
    StructField("content_type", StringType(), True),
    StructField("key", StringType(), True),
])
"""``topic``: CID of the topic's first version (the name of its tree and log, whichever
version CID was given); ``seq``: the event's delivery-log position at the node, the offset;
``cid``, ``parent``: the event and its parent event; ``author``, ``publisher``: peer ids;
``timestamp``: when the node delivered the event (its log time, what ``startingTimestamp``
selects on); ``created``: the author's clock; ``payload``: the bytes published;
``content_type``: the media type its author signed (``application/json``, ``text/plain;
charset=utf-8``, ...), null when none was given; ``key``: the key its author signed (what a
compacted topic keeps the newest event of), null when none."""

ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
"""Exactly what Spark expects of a Python data source's record batches (it compares)."""

MAX_ID_CHARS: Final = 256
"""CIDs and peer ids are under 100 characters; anything longer is not from a node."""
MAX_TIME_CHARS: Final = 40


_WIRE: Final = pa.schema([
    ("seq", pa.int64()),
    ("cid", pa.string()),
    ("parent", pa.string()),
    ("author", pa.string()),
    ("publisher", pa.string()),
    ("delivered_at", pa.float64()),
    ("created", pa.string()),
    ("payload", pa.string()),
    ("content_type", pa.string()),
    ("key", pa.string()),
])
"""The fields of an event's JSON (``docs/api.md``) the rows are made of; others ignored."""
_JSON_PARSE: Final = pa_json.ParseOptions(explicit_schema=_WIRE,
                                          unexpected_field_behavior="ignore")
_REQUIRED: Final = ("seq", "cid", "author", "publisher", "delivered_at", "created", "payload")
_IDS: Final = ("cid", "parent", "author", "publisher")


def _bad(why: str) -> PulsarcastSparkError:
    return PulsarcastSparkError("NODE_ERROR", f"the node sent a malformed event: {why}")


def seq_of(event: Any) -> int:
    """The position of one event of a JSON page, checked."""
    if type(event) is not dict:
        raise _bad("an event that is not a JSON object")
    seq = event.get("seq")
    if type(seq) is not int or seq < 1:
        raise _bad(f"seq {seq!r} is not a positive integer")
    return seq


@dataclass(frozen=True)
class ParsedBlock:
    """Rows of one chunk of a history (NDJSON lines or bulk records) that fall in the range
    read, and where the chunk ended."""

    batch: pa.RecordBatch | None
    last_seq: int
    reached_end: bool


def _check(table: pa.Table) -> None:
    for name in _REQUIRED:
        if table.column(name).null_count:
            raise _bad(f"{name} is missing")
    for name in _IDS:
        longest = pc.max(pc.utf8_length(table.column(name))).as_py()
        if longest is not None and longest > MAX_ID_CHARS:
            raise _bad(f"{name} is not a CID or peer id ({longest} characters)")
    if pc.max(pc.utf8_length(table.column("created"))).as_py() > MAX_TIME_CHARS:
        raise _bad("created is not a timestamp")
    delivered = table.column("delivered_at")
    if not pc.all(pc.is_finite(delivered)).as_py() or pc.min(delivered).as_py() < 0 \
            or pc.max(delivered).as_py() >= 1e11:
        raise _bad("delivered_at is not a time in seconds")


def _content_types(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Media types as the node sent them, each checked like the node checks an event's
    (a node older than media types sends none: nulls)."""
    for value in pc.unique(column).to_pylist():  # a topic uses a handful of types
        if value is not None:
            try:
                check_content_type(value)
            except SchemaError as exc:
                raise _bad(str(exc)) from None
    return column


def _keys(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Event keys as the node sent them, each checked like the node checks an event's."""
    for value in pc.unique(column).to_pylist():
        if value is not None:
            try:
                check_event_key(value)
            except SchemaError as exc:
                raise _bad(str(exc)) from None
    return column


def rows_in_range(seqs: list[int], previous: int, end: int) -> tuple[int, bool]:
    """How many of a chunk's positions ``seqs`` fall before ``end``, and whether the
    range's end was reached. Positions must increase strictly, continuing from
    ``previous``: anything else is a node error."""
    if seqs[0] <= previous or any(b <= a for a, b in itertools.pairwise(seqs)):
        raise _bad(f"positions are not increasing (after {previous}: {seqs[:3]}...)")
    keep = bisect.bisect_left(seqs, end)  # rows at or beyond the end are not ours
    return keep, keep < len(seqs)


def parse_block(block: bytes, topic: str, previous: int, end: int) -> ParsedBlock:
    """Complete NDJSON lines of a history into a record batch of the rows with positions
    ``previous < seq < end``. Parsing runs in Arrow's C++ JSON reader against the wire
    schema (a field of the wrong JSON type fails there); then each column is checked at
    once and only the base64 payloads are decoded one by one. Positions must increase
    strictly, continuing from ``previous``."""
    try:
        table = pa_json.read_json(
            io.BytesIO(block),
            read_options=pa_json.ReadOptions(block_size=len(block) + 1, use_threads=False),
            parse_options=_JSON_PARSE,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _bad(f"{exc}") from None
    if table.num_rows == 0:
        return ParsedBlock(None, previous, False)
    _check(table)
    seqs: list[int] = table.column("seq").to_pylist()
    keep, reached = rows_in_range(seqs, previous, end)
    if keep == 0:
        return ParsedBlock(None, previous, True)
    table = table.slice(0, keep)
    payloads = []
    for text in table.column("payload").to_pylist():
        try:
            payloads.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise _bad("a payload is not valid base64") from None
    try:
        created = table.column("created").cast(pa.timestamp("us", tz="UTC"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _bad(f"created does not parse as a time: {exc}") from None
    micros = pc.cast(pc.round(pc.multiply(table.column("delivered_at"), 1e6)), pa.int64())
    columns = [
        pa.array([topic] * keep, pa.string()),
        table.column("seq"),
        table.column("cid"),
        table.column("parent"),
        table.column("author"),
        table.column("publisher"),
        micros.cast(pa.timestamp("us", tz="UTC")),
        created,
        pa.array(payloads, pa.binary()),
        _content_types(table.column("content_type")),
        _keys(table.column("key")),
    ]
    batch = pa.Table.from_arrays(columns, schema=ARROW_SCHEMA).combine_chunks().to_batches()
    return ParsedBlock(batch[0] if batch else None, int(seqs[keep - 1]), reached)
