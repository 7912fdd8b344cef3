"""Batch reads on the shared local Spark session against real nodes: the whole history,
offset ranges of every kind, several topics, and the documented errors."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql.functions import spark_partition_id

from pulsar.tools.spark.errors import PulsarcastSparkError
from pulsar.tools.spark.options import read_options
from pulsar.tools.spark.source import BatchReader

from .conftest import HISTORY, SparkNet


def read(spark: Any, **options: str) -> Any:
    return spark.read.format("pulsarcast").options(**options).load()


def seqs_of(df: Any) -> list[int]:
    return [r.seq for r in df.select("seq").orderBy("seq").collect()]


def rfc3339(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.UTC).isoformat()


def between(log: list[tuple[int, str, float]], near: int) -> tuple[float, int]:
    """A delivery time strictly between two log entries at or after position ``near``
    (entries written in one transaction share a time), and the first position after it."""
    for (_, _, before), (seq, _, after) in zip(log[near - 1:], log[near:], strict=False):
        if after > before:
            return (before + after) / 2, seq
    raise AssertionError("the log has no distinct delivery times")


def test_history_equals_the_nodes_log(source: Any, net: SparkNet) -> None:
    df = read(source, **net.options(0, topic=net.history_topic, maxEventsPerPartition="1500"))
    rows = df.select("topic", "seq", "cid", "parent", "timestamp", "payload",
                     spark_partition_id().alias("part")).collect()
    assert len({r.part for r in rows}) == 4  # 5,000 positions in pieces of 1,500
    log = net.log(net.history_topic)
    assert len(log) == HISTORY
    # exactly the node's log: every CID, in the order of its positions, nothing else
    assert sorted((r.seq, r.cid) for r in rows) == [(seq, cid) for seq, cid, _ in log]
    assert {r.topic for r in rows} == {net.history_topic}
    by_seq = {r.seq: r for r in rows}
    first, last = by_seq[1], by_seq[HISTORY]
    assert first.parent is None and last.parent is not None
    assert int.from_bytes(bytes(first.payload)[-4:], "big") < HISTORY
    assert all(len(r.payload) == 68 for r in rows)
    delivered = {seq: at for seq, _, at in log}
    assert all(abs(r.timestamp.timestamp() - delivered[r.seq]) < 1e-5 for r in rows[:50])


def test_offset_ranges_positions_cids_json_and_times(source: Any, net: SparkNet) -> None:
    topic = net.history_topic
    log = net.log(topic)
    cid_at = {seq: cid for seq, cid, _ in log}
    # positions: start inclusive, end exclusive, as Kafka's offsets
    assert seqs_of(read(source, **net.options(0, topic=topic, startingOffsets="101",
                                             endingOffsets="201"))) == list(range(101, 201))
    # event CIDs stand for their own positions
    assert seqs_of(read(source, **net.options(0, topic=topic, startingOffsets=cid_at[4001],
                                             endingOffsets=cid_at[4011]))) \
        == list(range(4001, 4011))
    # JSON per topic, over two topics read together; -2 / -1 as in Kafka
    small = net.create_topic("spark/small")
    net.publish(small, [b"a", b"b", b"c", b"d", b"e"], window=1)
    rows = read(source, **net.options(
        0, topics=f"{topic},{small}",
        startingOffsets=f'{{"{topic}": 4990, "{small}": -2}}',
        endingOffsets=f'{{"{topic}": -1, "{small}": 4}}',
    )).select("topic", "seq", "payload").collect()
    assert sorted(r.seq for r in rows if r.topic == topic) == list(range(4990, HISTORY + 1))
    assert sorted((r.seq, bytes(r.payload)) for r in rows if r.topic == small) \
        == [(1, b"a"), (2, b"b"), (3, b"c")]
    # delivery times: startingTimestamp / endingTimestamp select on the log's time
    start_at, start_seq = between(log, 2500)
    end_at, end_seq = between(log, 2600)
    assert seqs_of(read(source, **net.options(0, topic=topic,
                                             startingTimestamp=rfc3339(start_at),
                                             endingTimestamp=rfc3339(end_at)))) \
        == list(range(start_seq, end_seq))
    # planning alone (this process): the timestamp wins over startingOffsets, as in Kafka;
    # "latest" as a start is an empty range
    plan = BatchReader(read_options({"endpoint": net.url(0), "topic": topic,
                                     "startingoffsets": "earliest",
                                     "startingtimestamp": rfc3339(end_at)},
                                    streaming=False)).plan()
    assert [(r.start, r.end) for r in plan] == [(end_seq, HISTORY + 1)]
    plan = BatchReader(read_options({"endpoint": net.url(0), "topic": topic,
                                     "startingoffsets": "latest"}, streaming=False)).plan()
    assert [r.size for r in plan] == [0]


def error_of(action: Any) -> str:
    with pytest.raises(Exception) as info:  # Spark wraps ours; the code is in the text
        action()
    return str(info.value)


def test_bad_options_give_the_documented_errors(source: Any, net: SparkNet) -> None:
    """Through Spark, one case of each place an error can arise (load, planning against
    the node, a user schema); the other cases run the planner's code in this process."""
    topic = net.history_topic
    not_a_topic = net.log(topic)[0][1]  # an event CID
    through_spark = [
        ("MISSING_OPTION", {"topic": topic}),                       # at load()
        ("UNREACHABLE", {"endpoint": "http://127.0.0.1:9", "topic": topic}),
        ("TOPIC_NOT_FOUND", net.options(0, topic=not_a_topic)),      # at planning
    ]
    for code, options in through_spark:
        message = error_of(lambda o=options: read(source, **o).collect())
        assert f"[PULSARCAST_{code}]" in message, (code, options, message[-2000:])
    message = error_of(lambda: source.read.format("pulsarcast").schema("x STRING")
                       .options(**net.options(0, topic=topic)).load().collect())
    assert "[PULSARCAST_INVALID_OPTION]" in message and "fixed schema" in message

    unknown_event = "bafyreihnscd63kkbtj33fl6egfbqhjgavumtw5uhp5miwckhear7l3mece"
    in_process = [
        ("MISSING_OPTION", net.options(0)),
        ("INVALID_OPTION", net.options(0, topic=topic, startingOffset="earliest")),
        ("EVENT_NOT_FOUND", net.options(0, topic=topic, startingOffsets=unknown_event)),
        ("INVALID_OFFSETS", net.options(0, topic=topic, startingOffsets="300",
                                        endingOffsets="200")),
        ("INVALID_OFFSETS", net.options(0, topic=topic, endingOffsets=str(HISTORY + 2))),
    ]
    for code, options in in_process:
        with pytest.raises(PulsarcastSparkError) as info:
            BatchReader(read_options({k.lower(): v for k, v in options.items()},
                                     streaming=False)).partitions()
        assert info.value.code == code, (options, info.value)


def test_large_payloads_and_both_history_formats(source: Any, net: SparkNet) -> None:
    """A payload over the inline limit lives in a chunk tree the event block only links:
    the bulk reader asks the node for it; NDJSON carries it. Both give the same rows."""
    topic = net.create_topic("spark/large")
    sent = [b"small", bytes(range(256)) * 40, b"x" * 5000]  # 10 KiB and 5 KB: linked
    net.publish(topic, sent, window=1)
    rows = {}
    for form in ("blocks", "ndjson"):
        df = read(source, **net.options(0, topic=topic, historyFormat=form))
        rows[form] = [r.asDict() for r in df.orderBy("seq").collect()]
    assert [bytes(r["payload"]) for r in rows["blocks"]] == sent
    assert rows["blocks"] == rows["ndjson"]
