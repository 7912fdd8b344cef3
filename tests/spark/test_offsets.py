"""Options and offsets without a node or Spark: parsing, precedence, splitting, admission."""

from __future__ import annotations

import pytest

from pulsar.tools.spark.errors import PulsarcastSparkError
from pulsar.tools.spark.offsets import (
    EARLIEST,
    LATEST,
    Bound,
    Range,
    admit,
    parse_offsets,
    parse_timestamp,
    resolve_bound,
    split_ranges,
)
from pulsar.tools.spark.options import read_options, starting_bound, write_options

A = "bafyreifdez6wl67lsqg64rlc2r5quy2icwosfzbslh53ffnqttw6yax5ba"
B = "bafyreihnscd63kkbtj33fl6egfbqhjgavumtw5uhp5miwckhear7l3mece"
URL = "http://127.0.0.1:8701"


def code_of(call: object) -> str:
    with pytest.raises(PulsarcastSparkError) as info:
        call()  # type: ignore[operator]
    assert str(info.value).startswith(f"[PULSARCAST_{info.value.code}] ")
    return info.value.code


def test_offsets_as_kafka_users_write_them() -> None:
    assert parse_offsets("earliest", "o", [A], LATEST).default == EARLIEST
    assert parse_offsets(" LATEST ", "o", [A], EARLIEST).default == LATEST
    assert parse_offsets("42", "o", [A], EARLIEST).default == Bound("position", 42)
    assert parse_offsets(B, "o", [A], EARLIEST).default == Bound("event", B)
    spec = parse_offsets(f'{{"{A}": -2, "{B}": 17}}', "o", [A, B], LATEST)
    assert spec.for_topic(A) == EARLIEST and spec.for_topic(B) == Bound("position", 17)
    spec = parse_offsets(f'{{"{A}": -1}}', "o", [A, B], EARLIEST)
    assert spec.for_topic(A) == LATEST and spec.for_topic(B) == EARLIEST  # the default
    spec = parse_offsets(f'{{"{A}": "{B}"}}', "o", [A], EARLIEST)
    assert spec.for_topic("other", A) == Bound("event", B)  # matched by root CID too


@pytest.mark.parametrize("text", ["0", "-3", "{", "[1]", f'{{"{B}": 3}}', "nonsense",
                                  f'{{"{A}": true}}', f'{{"{A}": 0}}', "", "9" * 20])
def test_bad_offsets_are_refused(text: str) -> None:
    assert code_of(lambda: parse_offsets(text, "startingOffsets", [A], EARLIEST)) \
        == "INVALID_OPTION"


def test_timestamps_are_kafka_milliseconds_or_rfc3339() -> None:
    assert parse_timestamp("1795439893500", "t") == 1795439893.5
    assert parse_timestamp("2026-11-23T13:18:13.5Z", "t") == 1795439893.5
    for bad in ("2026-11-23T13:18:13", "yesterday", "1.5"):
        assert code_of(lambda bad=bad: parse_timestamp(bad, "t")) == "INVALID_OPTION"


class FakeLog:
    def position_before(self, topic: str, event: str) -> int:
        return 41

    def first_position_at(self, topic: str, when: float) -> int | None:
        return 7 if when < 100 else None

    def first_kept(self, topic: str) -> int:
        return 1 if topic == A else 30  # B's log was cut by its retention policy


def test_bounds_resolve_to_next_positions() -> None:
    log = FakeLog()
    assert resolve_bound(EARLIEST, A, 50, log, "o") == 1
    assert resolve_bound(EARLIEST, B, 50, log, "o") == 30  # earliest: the first one kept
    assert resolve_bound(EARLIEST, B, 10, log, "o") == 11  # never past the planned last
    assert resolve_bound(LATEST, A, 50, log, "o") == 51
    assert resolve_bound(Bound("position", 51), A, 50, log, "o") == 51
    assert resolve_bound(Bound("event", B), A, 50, log, "o") == 42  # the event itself
    assert resolve_bound(Bound("time", 5.0), A, 50, log, "o") == 7
    assert resolve_bound(Bound("time", 500.0), A, 50, log, "o") == 51  # nothing that late
    assert code_of(lambda: resolve_bound(Bound("position", 52), A, 50, log, "o")) \
        == "INVALID_OFFSETS"


def test_split_ranges_bounds_partitions_and_honours_min_partitions() -> None:
    ranges = [Range(A, 1, 10_001), Range(B, 5, 5)]
    pieces = split_ranges(ranges, 3000, 1)
    assert [(p.start, p.end) for p in pieces] == [(1, 3001), (3001, 6001), (6001, 9001),
                                                  (9001, 10_001)]
    assert len(split_ranges(ranges, 10**9, 8)) == 8
    assert sum(p.size for p in split_ranges(ranges, 10**9, 8)) == 10_000
    assert split_ranges([Range(A, 3, 3)], 10, 4) == []


def test_admit_shares_max_rows_in_proportion_and_keeps_key_order() -> None:
    start = {A: 1, B: 1}
    latest = {A: 301, B: 101}
    assert admit(start, latest, None) == latest
    assert admit(start, latest, 1000) == latest
    end = admit(start, latest, 100)
    assert list(end) == [A, B] and end == {A: 76, B: 26}
    assert sum(end[t] - start[t] for t in end) == 100
    assert admit({A: 9, B: 101}, latest, 1) == {A: 10, B: 101}
    assert admit({A: 400}, {A: 301}, 10) == {A: 400}  # never backwards


def test_read_options_are_checked_before_any_call() -> None:
    ok = read_options({"endpoint": URL + "/", "topic": A}, streaming=False)
    assert ok.endpoint.url == URL and ok.topics == (A,)
    assert starting_bound(ok, A, A) == EARLIEST
    stream = read_options({"endpoint": URL, "topics": f"{A}, {B},{A}",
                           "startingtimestamp": "1767225600000"}, streaming=True)
    assert stream.topics == (A, B) \
        and starting_bound(stream, A, A) == Bound("time", 1767225600.0)
    assert read_options({"endpoint": URL, "topic": A}, streaming=True).starting.default \
        == LATEST
    cases = {
        "MISSING_OPTION": [{"topic": A}, {"endpoint": URL}],
        "INVALID_OPTION": [
            {"endpoint": "ftp://x", "topic": A},
            {"endpoint": URL, "topic": "not-a-cid"},
            {"endpoint": URL, "topic": A, "topics": B},
            {"endpoint": URL, "topic": A, "startingoffset": "earliest"},  # misspelt
            {"endpoint": URL, "topic": A, "endingoffsets": "earliest"},
            {"endpoint": URL, "topic": A, "maxeventsperpartition": "0"},
            {"endpoint": URL, "topic": A, "requesttimeout": "forever"},
            {"endpoint": URL, "topic": A, "subscribe": "maybe", "token": "s3cret"},
        ],
    }
    for code, options in cases.items():
        for opts in options:
            assert code_of(lambda o=opts: read_options(o, streaming=False)) == code, opts
    assert code_of(lambda: read_options({"endpoint": URL, "topic": A,
                                         "endingoffsets": "5"}, streaming=True)) \
        == "INVALID_OPTION"
    assert code_of(lambda: read_options({"endpoint": URL, "topic": A,
                                         "maxeventspertrigger": "5"}, streaming=False)) \
        == "INVALID_OPTION"
    assert code_of(lambda: read_options({"endpoint": URL, "topic": A, "subscribe": "true"},
                                        streaming=True)) == "MISSING_OPTION"  # no token


def test_write_options_need_a_token() -> None:
    assert code_of(lambda: write_options({"endpoint": URL, "topic": A})) == "MISSING_OPTION"
    opts = write_options({"endpoint": URL, "token": "s3cret", "topic": A, "maxinflight": "1",
                          "checkpointlocation": "/tmp/x"})
    assert opts.topic == A and opts.max_in_flight == 1 and "s3cret" not in repr(opts.endpoint)
