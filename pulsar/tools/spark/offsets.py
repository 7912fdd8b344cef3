"""Offsets: what users write (Kafka's vocabulary), what they resolve to, and how a range of
the delivery log is cut into Spark partitions and micro-batches.

An offset here is a position in a node's delivery log of a topic, ``seq`` (1, 2, 3, ...),
and — as in Spark's Kafka source — it names the **next** position to read: a range is
``[start, end)``. ``startingOffsets=5`` reads from position 5 on (inclusive) and
``endingOffsets=9`` stops before 9 (exclusive), exactly how Kafka users read those options.
(REST cursors are exclusive instead — "after this position" — so the reader asks the node
for ``cursor=start - 1``.)

Parsing is pure (:func:`parse_offsets`, :func:`parse_timestamp`); resolving a bound against
a node (:func:`resolve_bound`) needs the three questions :class:`LogQueries` asks.
Splitting (:func:`split_ranges`) and admission control (:func:`admit`) are arithmetic on
ranges, so they are tested without a node.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, Protocol

from dag import CID

from .errors import PulsarcastSparkError

__all__ = [
    "Bound",
    "LogQueries",
    "OffsetsSpec",
    "Range",
    "admit",
    "normalise_cid",
    "parse_offsets",
    "parse_timestamp",
    "resolve_bound",
    "split_ranges",
]

BoundKind = Literal["earliest", "latest", "position", "event", "time"]
MAX_OFFSETS_TEXT: Final = 64 * 1024
"""Longest JSON offsets option accepted (a few hundred topics)."""
_KAFKA_EARLIEST: Final = -2
_KAFKA_LATEST: Final = -1
OFFSET_FORMS: Final = (
    "an offset is earliest, latest, a log position (1, 2, ...: the first position read), the "
    "CID of an event in the node's log, or a JSON object mapping topic CIDs to any of those "
    '(-2 for earliest, -1 for latest), e.g. {"bafyrei...": 5}')
"""Said by every error about an offset, so the fix is in the message (Kafka users arrive
with Kafka's partition-keyed JSON)."""
MIN_MILLIS: Final = 10**11
"""A bare-integer timestamp below this (3 March 1973 in milliseconds) is taken for seconds
and refused: nothing in a pulsarcast log is that old, and ``1700000000`` read as
milliseconds would silently select everything."""
MAX_MILLIS: Final = 10**14
"""Above this (year 5138 in milliseconds) a bare integer is taken for microseconds."""


@dataclass(frozen=True)
class Bound:
    """One end of a range for one topic, as the user wrote it: ``earliest``, ``latest``, a
    log position, the CID of an event in the log, or a delivery time (seconds)."""

    kind: BoundKind
    value: int | str | float | None = None


EARLIEST: Final = Bound("earliest")
LATEST: Final = Bound("latest")


@dataclass(frozen=True)
class OffsetsSpec:
    """``startingOffsets`` / ``endingOffsets``: one bound for every topic, or a bound per
    topic (JSON) with the option's default for the topics it does not name."""

    default: Bound
    per_topic: tuple[tuple[str, Bound], ...] = ()

    def for_topic(self, *names: str) -> Bound:
        """The bound for a topic known by any of ``names`` (the CID the user gave and the
        CID of the topic's first version, which names its log)."""
        for key, bound in self.per_topic:
            if key in names:
                return bound
        return self.default


@dataclass(frozen=True)
class Range:
    """Positions ``start <= seq < end`` of the log of ``topic`` (its first version's CID)."""

    topic: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


class LogQueries(Protocol):
    """What resolving a bound asks the node (implemented over REST by ``rest.NodeApi``)."""

    def position_before(self, topic: str, event: str) -> int:
        """The position of the entry just before ``event`` in the log (0 if none)."""
        ...

    def first_position_at(self, topic: str, when: float) -> int | None:
        """The first position delivered at or after ``when``; None if there is none."""
        ...

    def first_kept(self, topic: str) -> int:
        """The first position the log still holds (a topic's retention policy may have
        cut the ones before); ``last + 1`` if it holds none."""
        ...


def normalise_cid(value: str, what: str) -> str:
    """A CID string in its one canonical text form (so any base the user pasted matches)."""
    try:
        return str(CID.parse(value.strip()))
    except ValueError as exc:
        raise PulsarcastSparkError("INVALID_OPTION", f"{what}: {value!r} is not a CID "
                                   f"({exc})") from None


def _invalid(message: str) -> PulsarcastSparkError:
    return PulsarcastSparkError("INVALID_OPTION", f"{message}; {OFFSET_FORMS}")


def _bound_of(value: Any, option: str, *, in_json: bool) -> Bound:
    if isinstance(value, bool):
        raise _invalid(f"{option}: {value!r} is not an offset")
    if isinstance(value, int):
        if in_json and value == _KAFKA_EARLIEST:
            return EARLIEST
        if in_json and value == _KAFKA_LATEST:
            return LATEST
        if value < 1:
            raise _invalid(f"{option}: log positions start at 1, got {value}")
        return Bound("position", value)
    if not isinstance(value, str):
        raise _invalid(f"{option}: {value!r} is not an offset")
    text = value.strip()
    lowered = text.lower()
    if lowered in ("earliest", "latest"):
        return EARLIEST if lowered == "earliest" else LATEST
    if text.lstrip("-").isdigit():
        if len(text) > 19:
            raise _invalid(f"{option}: {text} is out of range")
        return _bound_of(int(text), option, in_json=in_json)
    try:
        return Bound("event", normalise_cid(text, option))
    except PulsarcastSparkError as exc:
        raise _invalid(exc.detail) from None


def parse_offsets(text: str, option: str, topics: Sequence[str], default: Bound) -> OffsetsSpec:
    """``earliest``, ``latest``, a position, an event CID, or a JSON object mapping topic
    CIDs to any of those (-2 and -1 meaning earliest and latest, as in Kafka's JSON)."""
    text = text.strip()
    if not text:
        raise _invalid(f"{option} is empty")
    if not text.startswith("{"):
        return OffsetsSpec(_bound_of(text, option, in_json=False))
    if len(text) > MAX_OFFSETS_TEXT:
        raise _invalid(f"{option} is longer than {MAX_OFFSETS_TEXT} characters")
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise _invalid(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise _invalid(f"{option} must be a JSON object")
    per_topic = []
    for key, value in parsed.items():
        if isinstance(value, dict):  # Kafka's {"topic": {"0": 23}}: no partitions here
            raise _invalid(f"{option}[{key}]: a topic has one log, not partitions, so its "
                           "offset is a single value, not an object")
        try:
            cid = normalise_cid(key, f"{option} key")
        except PulsarcastSparkError as exc:
            raise _invalid(f"{exc.detail} (keys are topic CIDs)") from None
        if cid not in topics:
            raise _invalid(f"{option} names {cid}, which is not among the topics read "
                           f"({', '.join(topics)})")
        per_topic.append((cid, _bound_of(value, f"{option}[{cid}]", in_json=True)))
    return OffsetsSpec(default, tuple(per_topic))


def parse_timestamp(text: str, option: str) -> float:
    """Seconds since the epoch. A bare integer is **milliseconds**, as Kafka's
    ``startingTimestamp`` is; one that can only be seconds (or microseconds) is refused
    with the value to use instead. Anything else must be an RFC 3339 date-time with a
    zone."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        if len(text) > 16:
            raise PulsarcastSparkError("INVALID_OPTION", f"{option} {text} is out of range")
        millis = int(text)
        if 0 < millis < MIN_MILLIS:
            raise PulsarcastSparkError(
                "INVALID_OPTION", f"{option} {text} looks like seconds since the epoch, but a "
                f"bare integer is milliseconds (as in Kafka): use {millis * 1000} for that "
                "second, or an RFC 3339 date-time such as 2026-01-31T12:00:00Z")
        if millis >= MAX_MILLIS:
            raise PulsarcastSparkError(
                "INVALID_OPTION", f"{option} {text} looks like microseconds since the epoch, "
                f"but a bare integer is milliseconds (as in Kafka): use {millis // 1000}")
        return millis / 1000.0
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise PulsarcastSparkError(
            "INVALID_OPTION", f"{option} must be milliseconds since the epoch (as in Kafka, "
            f"e.g. 1767225600000) or an RFC 3339 date-time, got {text!r}") from None
    if moment.tzinfo is None:
        raise PulsarcastSparkError("INVALID_OPTION", f"{option} needs a time zone (e.g. Z)")
    return moment.timestamp()


def resolve_bound(bound: Bound, topic: str, last: int, log: LogQueries, option: str) -> int:
    """The position ``bound`` stands for in the log of ``topic`` whose newest position is
    ``last``: earliest is the first position kept (1 unless the topic's retention policy
    cut older ones), latest is ``last + 1`` (nothing read yet), an event is its own
    position (the entry after its predecessor), a time the first position delivered at or
    after it. Positions beyond ``last + 1`` are refused rather than waited for."""
    if bound.kind == "earliest":
        # Asked after ``last`` was read: the log may have grown since; never past it.
        return min(log.first_kept(topic), last + 1)
    if bound.kind == "latest":
        return last + 1
    if bound.kind == "position":
        assert isinstance(bound.value, int)
        if bound.value > last + 1:
            raise PulsarcastSparkError(
                "INVALID_OFFSETS", f"{option}: position {bound.value} of {topic} is beyond the "
                f"node's log, whose newest position is {last}")
        return bound.value
    if bound.kind == "event":
        assert isinstance(bound.value, str)
        return log.position_before(topic, bound.value) + 1
    assert isinstance(bound.value, float)
    found = log.first_position_at(topic, bound.value)
    return last + 1 if found is None else found


def split_ranges(ranges: Sequence[Range], max_per_partition: int,
                 min_partitions: int = 1) -> list[Range]:
    """Cut ranges into pieces of at most ``max_per_partition`` positions, smaller if that
    makes fewer than ``min_partitions`` pieces overall (as Kafka's ``minPartitions``). Each
    piece becomes one Spark task reading one NDJSON response."""
    total = sum(r.size for r in ranges)
    if total == 0:
        return []
    size = min(max_per_partition, max(1, math.ceil(total / max(1, min_partitions))))
    pieces = []
    for r in ranges:
        for start in range(r.start, r.end, size):
            pieces.append(Range(r.topic, start, min(r.end, start + size)))
    return pieces


def admit(start: Mapping[str, int], latest: Mapping[str, int], max_rows: int | None
          ) -> dict[str, int]:
    """The end offset of the next micro-batch: everything up to ``latest``, or — with a
    ``ReadMaxRows`` limit — ``max_rows`` positions shared among the topics in proportion to
    what each has waiting (largest remainders first), as Kafka's ``maxOffsetsPerTrigger``
    does. Keys keep ``latest``'s order, which Spark's string comparison of offsets needs."""
    waiting = {t: max(0, latest[t] - start.get(t, latest[t])) for t in latest}
    total = sum(waiting.values())
    if max_rows is None or total <= max_rows:
        return {t: start.get(t, latest[t]) + waiting[t] for t in latest}
    shares = {t: max_rows * w / total for t, w in waiting.items()}
    given = {t: math.floor(s) for t, s in shares.items()}
    left = max_rows - sum(given.values())
    for t in sorted(waiting, key=lambda k: given[k] - shares[k]):
        if left <= 0:
            break
        if given[t] < waiting[t]:
            given[t] += 1
            left -= 1
    return {t: start.get(t, latest[t]) + given[t] for t in latest}
