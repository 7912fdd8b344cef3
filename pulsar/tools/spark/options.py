"""The data source's options, checked once into frozen dataclasses.

Spark hands options over as a case-insensitive map of strings. Everything is checked here,
before any network call, so a typo or a bad value fails at ``load()`` / ``save()`` with a
message naming the option — unknown options included, because a misspelt
``startingOffset`` silently reading from ``latest`` is worse than an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

from .errors import PulsarcastSparkError
from .offsets import (
    EARLIEST,
    LATEST,
    Bound,
    OffsetsSpec,
    normalise_cid,
    parse_offsets,
    parse_timestamp,
)

__all__ = [
    "Endpoint",
    "ReadOptions",
    "WriteOptions",
    "ending_bound",
    "read_options",
    "starting_bound",
    "write_options",
]

MAX_TOPICS: Final = 100
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_EVENTS_PER_PARTITION: Final = 50_000
"""Positions per Spark task by default. A task costs Spark a fixed few hundred milliseconds
(scheduling, the Python worker's hand-shake, one HTTP response) while a worker decodes
~70,000 bulk-history rows a second, so 10,000-row tasks spent more time starting than
reading (bench spark: 32,000 rows/s with 10 tasks of 10,000, 60,000-86,000 with 2 of
50,000). ``minPartitions`` still splits a read for a wider cluster."""
DEFAULT_MAX_IN_FLIGHT: Final = 2
"""Publish requests in flight per task, batches of rows: each keeps up to 64 publishes
under way in the node, and more than 2 of them only crowded it (bench spark, 2 tasks of
3,000-20,000 rows: 2,132 and 2,172 rows/s at 2, 1,614 and 1,800 at 4-8)."""
DEFAULT_MAX_IN_FLIGHT_SINGLE: Final = 8
"""The same when each request carries one row (``publishBatch=1``)."""
DEFAULT_PUBLISH_RETRIES: Final = 2
DEFAULT_PUBLISH_BATCH: Final = 256
"""Rows per publish request (one NDJSON batch, docs/api.md). One request per row cost the
node an HTTP request per event: bench spark wrote 778 rows/s with 16 single requests in
flight where the same node publishes 2,900 events/s from its own process."""
MAX_PUBLISH_BATCH: Final = 1000
"""The node's limit on the events of one batch (``api.publishing.BATCH_EVENTS``), stated
here so that an executor's imports stay clear of the API server."""

_COMMON: Final = {"endpoint", "token", "requesttimeout"}
_READ: Final = _COMMON | {
    "topic", "topics", "startingoffsets", "endingoffsets", "startingtimestamp",
    "endingtimestamp", "maxeventspertrigger", "maxeventsperpartition", "minpartitions",
    "subscribe", "historyformat", "consumer",
}
_WRITE: Final = _COMMON | {"topic", "maxinflight", "publishretries", "publishbatch",
                           "checkpointlocation"}
_SPELLING: Final = {name.lower(): name for name in (
    "endpoint", "token", "requestTimeout", "topic", "topics", "startingOffsets",
    "endingOffsets", "startingTimestamp", "endingTimestamp", "maxEventsPerTrigger",
    "maxEventsPerPartition", "minPartitions", "subscribe", "historyFormat", "maxInFlight",
    "publishRetries", "publishBatch", "checkpointLocation", "consumer")}
CONSUMER_NAME: Final = re.compile("[A-Za-z0-9_-]{1,64}")
"""A consumer's name as the node takes it (letters, digits, ``_`` and ``-``; the node's rule,
stated here so that an executor's imports stay clear of the node)."""

Subscribe = Literal["unset", "no", "yes", "replay"]
"""``subscribe`` as given; ``unset`` (the default) refuses a topic the node does not follow,
``no`` (``subscribe=false``) lets a batch read take whatever the node's log holds."""
HistoryFormat = Literal["blocks", "ndjson"]


@dataclass(frozen=True)
class Endpoint:
    """Where a node's REST API is and how to talk to it; picklable, so it travels to the
    executors inside partitions and writers (the token with it, inside Spark's own task
    serialisation)."""

    url: str
    token: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S

    def __repr__(self) -> str:  # never print the token into Spark's logs
        return f"Endpoint({self.url!r}, token={'***' if self.token else None})"


@dataclass(frozen=True)
class ReadOptions:
    endpoint: Endpoint
    topics: tuple[str, ...]
    """The topic CIDs as given (canonical text form), in the order given."""
    starting: OffsetsSpec
    ending: OffsetsSpec
    starting_timestamp: float | None
    ending_timestamp: float | None
    max_events_per_trigger: int | None
    max_events_per_partition: int
    min_partitions: int
    subscribe: Subscribe
    history_format: HistoryFormat = "blocks"
    """How tasks read the log: the node's stored blocks, decoded in the workers (fast), or
    its NDJSON (for nodes older than the bulk format)."""
    consumer: str | None = None
    """A stream read as this durable consumer of the node (``ack_policy=all``): it starts
    at the consumer's position, and committed micro-batches are acknowledged on it."""


@dataclass(frozen=True)
class WriteOptions:
    endpoint: Endpoint
    topic: str | None
    """The ``topic`` option; when set it wins over a ``topic`` column, as in Kafka's sink."""
    max_in_flight: int
    """Publish requests outstanding per task."""
    publish_retries: int
    publish_batch: int = DEFAULT_PUBLISH_BATCH
    """Rows per publish request: 1 publishes each row with its own JSON request."""


def _folded(options: Mapping[str, str]) -> dict[str, str]:
    """Option names are case-insensitive, as Spark's are: ``maxInFlight`` is
    ``maxinflight`` (Spark hands a data source its options lower-cased; a caller of these
    functions may not)."""
    return {name.lower(): value for name, value in options.items()}


def _check_known(options: Mapping[str, str], known: frozenset[str] | set[str],
                 what: str) -> None:
    unknown = sorted(k for k in options if k.lower() not in known)
    if unknown:
        names = ", ".join(sorted(_SPELLING[k] for k in known))
        raise PulsarcastSparkError("INVALID_OPTION", f"unknown {what} option(s) "
                                   f"{', '.join(unknown)}; the options are: {names}")


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return None if value is None else str(value)


def _int(options: Mapping[str, str], name: str, default: int | None, low: int, high: int
         ) -> int | None:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise PulsarcastSparkError("INVALID_OPTION", f"{name} must be an integer, got "
                                   f"{raw!r}") from None
    if not low <= value <= high:
        raise PulsarcastSparkError("INVALID_OPTION", f"{name} must be in {low}..{high}, got "
                                   f"{value}")
    return value


def _endpoint(options: Mapping[str, str]) -> Endpoint:
    url = _get(options, "endpoint")
    if url is None or not url.strip():
        raise PulsarcastSparkError("MISSING_OPTION", "option 'endpoint' is required: the base "
                                   "URL of a node's REST API, e.g. http://127.0.0.1:8701")
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment:
        raise PulsarcastSparkError("INVALID_OPTION", f"endpoint must be an http(s) URL such "
                                   f"as http://127.0.0.1:8701, got {url!r}")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise PulsarcastSparkError("INVALID_OPTION", f"endpoint has a bad port: "
                                   f"{url!r}") from None
    token = _get(options, "token")
    raw_timeout = _get(options, "requestTimeout")
    timeout = DEFAULT_TIMEOUT_S
    if raw_timeout is not None:
        try:
            timeout = float(raw_timeout)
        except ValueError:
            timeout = -1.0
        if not 0 < timeout <= 3600:
            raise PulsarcastSparkError("INVALID_OPTION", "requestTimeout must be seconds in "
                                       f"(0, 3600], got {raw_timeout!r}")
    return Endpoint(url, token.strip() if token and token.strip() else None, timeout)


def _topics(options: Mapping[str, str]) -> tuple[str, ...]:
    one, many = _get(options, "topic"), _get(options, "topics")
    if one is not None and many is not None:
        raise PulsarcastSparkError("INVALID_OPTION", "give either 'topic' or 'topics', not "
                                   "both")
    if one is None and many is None:
        raise PulsarcastSparkError("MISSING_OPTION", "option 'topic' (a topic CID) or "
                                   "'topics' (comma-separated CIDs) is required")
    raw = [one] if one is not None else (many or "").split(",")
    names = [r.strip() for r in raw if r.strip()]
    if not names:
        raise PulsarcastSparkError("MISSING_OPTION", "'topic'/'topics' names no topic")
    if len(names) > MAX_TOPICS:
        raise PulsarcastSparkError("INVALID_OPTION", f"at most {MAX_TOPICS} topics per query")
    topics: list[str] = []
    for name in names:
        cid = normalise_cid(name, "topic")
        if cid not in topics:
            topics.append(cid)
    return tuple(topics)


def read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Check the options of a read; ``streaming`` None checks what both kinds accept (Spark
    asks for the schema before it says which kind of read it plans)."""
    options = _folded(options)
    _check_known(options, _READ, "read")
    endpoint = _endpoint(options)
    topics = _topics(options)
    start_default = LATEST if streaming else EARLIEST
    raw_start = _get(options, "startingOffsets")
    starting = (OffsetsSpec(start_default) if raw_start is None
                else parse_offsets(raw_start, "startingOffsets", topics, start_default))
    raw_end = _get(options, "endingOffsets")
    raw_end_ts = _get(options, "endingTimestamp")
    if streaming and (raw_end is not None or raw_end_ts is not None):
        raise PulsarcastSparkError("INVALID_OPTION", "endingOffsets/endingTimestamp are for "
                                   "batch reads; a stream has no end")
    ending = (OffsetsSpec(LATEST) if raw_end is None
              else parse_offsets(raw_end, "endingOffsets", topics, LATEST))
    if any(b.kind == "earliest" for b in (ending.default, *(b for _, b in ending.per_topic))):
        raise PulsarcastSparkError("INVALID_OPTION", "endingOffsets cannot be earliest (as in "
                                   "Kafka): the range would be empty")
    raw_ts = _get(options, "startingTimestamp")
    per_trigger = _int(options, "maxEventsPerTrigger", None, 1, 10**9)
    if per_trigger is not None and streaming is False:
        raise PulsarcastSparkError("INVALID_OPTION", "maxEventsPerTrigger is for streaming "
                                   "reads")
    subscribe = (_get(options, "subscribe") or "").strip().lower()
    if subscribe not in ("", "false", "true", "replay"):
        raise PulsarcastSparkError("INVALID_OPTION", "subscribe must be false, true or replay")
    mode: Subscribe = {"": "unset", "false": "no", "true": "yes",  # type: ignore[assignment]
                       "replay": "replay"}[subscribe]
    if mode in ("yes", "replay") and endpoint.token is None:
        raise PulsarcastSparkError("MISSING_OPTION", "subscribe needs the node's API 'token' "
                                   "(subscribing changes the node's state)")
    consumer = _consumer(options, streaming, endpoint, raw_start is not None or raw_ts
                         is not None)
    history_format = (_get(options, "historyFormat") or "blocks").strip().lower()
    if history_format not in ("blocks", "ndjson"):
        raise PulsarcastSparkError("INVALID_OPTION", "historyFormat must be blocks (the "
                                   "default) or ndjson")
    return ReadOptions(
        endpoint=endpoint,
        topics=topics,
        starting=starting,
        ending=ending,
        starting_timestamp=None if raw_ts is None else parse_timestamp(raw_ts,
                                                                       "startingTimestamp"),
        ending_timestamp=None if raw_end_ts is None else parse_timestamp(raw_end_ts,
                                                                         "endingTimestamp"),
        max_events_per_trigger=per_trigger,
        max_events_per_partition=_int(options, "maxEventsPerPartition",
                                      DEFAULT_EVENTS_PER_PARTITION, 1, 10**9) or 1,
        min_partitions=_int(options, "minPartitions", 1, 1, 10_000) or 1,
        subscribe=mode,
        history_format=history_format,  # type: ignore[arg-type]
        consumer=consumer,
    )


def _consumer(options: Mapping[str, str], streaming: bool | None, endpoint: Endpoint,
              starting_given: bool) -> str | None:
    """The ``consumer`` option: a stream only (a batch read commits nothing), with the
    token (acknowledging changes the node's state), and without a starting offset (the
    consumer's position is where the stream starts)."""
    raw = _get(options, "consumer")
    if raw is None:
        return None
    name = raw.strip()
    if not CONSUMER_NAME.fullmatch(name):
        raise PulsarcastSparkError("INVALID_OPTION", "consumer must be the name of one of "
                                   "the node's durable consumers: 1-64 of A-Z, a-z, 0-9, "
                                   f"'_' and '-', got {raw!r}")
    if streaming is False:
        raise PulsarcastSparkError("INVALID_OPTION", "consumer is for streaming reads: a "
                                   "batch read has no committed micro-batches to "
                                   "acknowledge (read by offsets instead)")
    if starting_given:
        raise PulsarcastSparkError("INVALID_OPTION", "consumer and startingOffsets/"
                                   "startingTimestamp do not go together: a stream read as "
                                   "a consumer starts at the consumer's position")
    if endpoint.token is None:
        raise PulsarcastSparkError("MISSING_OPTION", "consumer needs the node's API 'token': "
                                   "committed micro-batches are acknowledged on the consumer")
    return name


def write_options(options: Mapping[str, str]) -> WriteOptions:
    options = _folded(options)
    _check_known(options, _WRITE, "write")
    endpoint = _endpoint(options)
    if endpoint.token is None:
        raise PulsarcastSparkError("MISSING_OPTION", "option 'token' is required to write: "
                                   "publishing needs the node's API token")
    topic = _get(options, "topic")
    batch = _int(options, "publishBatch", DEFAULT_PUBLISH_BATCH, 1, MAX_PUBLISH_BATCH) or 1
    return WriteOptions(
        endpoint=endpoint,
        topic=None if topic is None else normalise_cid(topic, "topic"),
        max_in_flight=_int(options, "maxInFlight", DEFAULT_MAX_IN_FLIGHT_SINGLE
                           if batch == 1 else DEFAULT_MAX_IN_FLIGHT, 1, 64) or 1,
        publish_retries=_int(options, "publishRetries", DEFAULT_PUBLISH_RETRIES, 0, 10) or 0,
        publish_batch=batch,
    )


def starting_bound(options: ReadOptions, given: str, root: str) -> Bound:
    """The start of one topic: ``startingTimestamp`` wins over ``startingOffsets`` (Kafka's
    precedence)."""
    if options.starting_timestamp is not None:
        return Bound("time", options.starting_timestamp)
    return options.starting.for_topic(given, root)


def ending_bound(options: ReadOptions, given: str, root: str) -> Bound:
    if options.ending_timestamp is not None:
        return Bound("time", options.ending_timestamp)
    return options.ending.for_topic(given, root)
