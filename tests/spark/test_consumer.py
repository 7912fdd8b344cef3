"""A stream read as a node's durable consumer (option ``consumer``): it starts where the
consumer is, committed micro-batches are acknowledged on it, a service and a query take
turns on one position, and a restarted query follows its checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from dag import CID
from pulsar.tools.spark.errors import PulsarcastSparkError
from pulsar.tools.spark.options import read_options
from pulsar.tools.spark.source import StreamReader

from .conftest import SparkNet, wait_for
from .test_stream import Batches, stream

CID_TEXT = "bafyreigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"


def _followed_topic(net: SparkNet, name: str, events: int) -> str:
    """A topic of node 0 that node 1 follows, with ``events`` events in node 1's log."""
    topic = net.create_topic(name)
    net.subscribe(topic, 1)
    net.publish(topic, [b"%s-%d" % (name.encode(), i) for i in range(events)], window=1)
    wait_for(lambda: net.last(topic, 1) == events, timeout=30)
    return topic


def _add(net: SparkNet, topic: str, name: str, **settings: Any) -> None:
    net.bg.run(net.nodes[1].node.consumers.add(CID.parse(topic), {"name": name, **settings}))


def _info(net: SparkNet, topic: str, name: str) -> Any:
    return net.bg.run(net.nodes[1].node.consumers.info(CID.parse(topic), name))


def _service(net: SparkNet, topic: str, name: str, batch: int, *, ack: bool = True
             ) -> list[int]:
    """What a service using the consumer on node 1 fetches (and acknowledges)."""
    consumers = net.nodes[1].node.consumers
    messages = net.bg.run(consumers.fetch(CID.parse(topic), name, batch, 0.0))
    ids = [m.id for m in messages]
    if ack and ids:
        net.bg.run(consumers.ack(CID.parse(topic), name, [max(ids)]))
    return ids


def _reader(net: SparkNet, topic: str, name: str) -> StreamReader:
    return StreamReader(read_options({"endpoint": net.url(1), "topic": topic,
                                      "consumer": name, "token": net.token(1)},
                                     streaming=True))


def test_consumer_option_is_checked_before_any_call() -> None:
    base = {"endpoint": "http://127.0.0.1:1", "topic": CID_TEXT, "token": "pct_" + "x" * 20}
    for options, streaming, code, words in (
            ({**base, "consumer": "billing"}, False, "INVALID_OPTION", "streaming reads"),
            ({**base, "consumer": "bad name"}, True, "INVALID_OPTION", "1-64 of A-Z"),
            ({**base, "consumer": "billing", "startingoffsets": "earliest"}, True,
             "INVALID_OPTION", "consumer's position"),
            ({**base, "consumer": "billing", "startingtimestamp": "1767225600000"}, True,
             "INVALID_OPTION", "consumer's position"),
            ({"endpoint": base["endpoint"], "topic": CID_TEXT, "consumer": "billing"}, True,
             "MISSING_OPTION", "token")):
        with pytest.raises(PulsarcastSparkError) as info:
            read_options(options, streaming=streaming)
        assert info.value.code == code and words in str(info.value), options
    assert read_options({**base, "consumer": " billing "}, streaming=True).consumer == "billing"
    assert read_options({**base, "consumer": "billing"}, streaming=None).consumer == "billing"


def test_a_stream_takes_over_a_consumer_from_a_service_and_hands_it_back(
        net: SparkNet, caplog: pytest.LogCaptureFixture) -> None:
    """The stream reader's driver-side calls, in this process (the next test runs them in
    Spark)."""
    topic = _followed_topic(net, "spark/consumer-turns", 6)
    _add(net, topic, "explicit")
    refused = _reader(net, topic, "explicit")
    with pytest.raises(PulsarcastSparkError) as info:
        refused.initialOffset()
    assert info.value.code == "INVALID_CONSUMER" and "ack_policy all" in str(info.value)
    refused.stop()
    missing = _reader(net, topic, "nobody")
    with pytest.raises(PulsarcastSparkError) as info:
        missing.initialOffset()
    assert info.value.code == "CONSUMER_NOT_FOUND"
    missing.stop()

    _add(net, topic, "billing", ack_policy="all")
    assert _service(net, topic, "billing", 2) == [1, 2]
    assert _service(net, topic, "billing", 1, ack=False) == [3]  # handed out, not acked
    reader = _reader(net, topic, "billing")
    try:
        start = reader.initialOffset()
        assert start == {topic: 3}  # the first position the consumer has not settled
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {topic: 7}
        assert _info(net, topic, "billing").ack_floor == 2  # nothing committed yet
        rows = [r for p in reader.partitions(start, end) for b in reader.read(p)
                for r in b.to_pylist()]
        assert [r["seq"] for r in rows] == [3, 4, 5, 6]
        reader.commit(end)
        info = _info(net, topic, "billing")
        assert (info.ack_floor, info.delivered, info.num_ack_pending, info.num_pending) == (
            6, 6, 0, 0)
        # Back to the service: it goes on after what the query committed.
        net.publish(topic, [b"seven"])
        wait_for(lambda: net.last(topic, 1) == 7, timeout=30)
        assert _service(net, topic, "billing", 10) == [7]
    finally:
        reader.stop()

    # A checkpoint behind the consumer is followed all the same (and said so); the
    # consumer does not move back.
    behind = _reader(net, topic, "billing")
    try:
        with caplog.at_level(logging.WARNING, logger="pulsar.tools.spark.source"):
            assert behind.latestOffset({topic: 5}, ReadAllAvailable()) == {topic: 8}
        assert "positions 5-7 are read again" in caplog.text
        assert _info(net, topic, "billing").ack_floor == 7
        assert [p.start for p in behind.partitions({topic: 5}, {topic: 8})] == [5]
    finally:
        behind.stop()
    # A checkpoint ahead of the consumer (the query stopped before it acknowledged): the
    # consumer catches up when the next batch is planned.
    _add(net, topic, "late", ack_policy="all")
    ahead = _reader(net, topic, "late")
    try:
        assert ahead.latestOffset({topic: 5}, ReadAllAvailable()) == {topic: 8}
        assert _info(net, topic, "late").ack_floor == 4
    finally:
        ahead.stop()


def test_a_query_reads_as_a_consumer_and_restarts_from_its_checkpoint(
        source: Any, net: SparkNet, tmp_path: Path) -> None:
    topic = _followed_topic(net, "spark/consumer-query", 5)
    _add(net, topic, "spark", ack_policy="all")
    assert _service(net, topic, "spark", 2) == [1, 2]
    sink = Batches()
    options = {"endpoint": net.url(1), "topic": topic, "consumer": "spark",
               "token": net.token(1)}

    def run_available_now() -> None:
        query = stream(source, sink, tmp_path / "ck", **options) \
            .trigger(availableNow=True).start()
        assert query.awaitTermination(120), "availableNow did not finish"
        assert query.exception() is None

    run_available_now()
    log = [(seq, cid) for seq, cid, _ in net.log(topic, 1)]
    assert sink.all() == log[2:]  # from where the service left off
    # The last batch is acknowledged too, without waiting for another one.
    assert (_info(net, topic, "spark").ack_floor, _info(net, topic, "spark").num_pending) == (
        5, 0)
    net.publish(topic, [b"six", b"seven"], window=1)
    wait_for(lambda: net.last(topic, 1) == 7, timeout=30)
    run_available_now()
    assert sink.all() == [(seq, cid) for seq, cid, _ in net.log(topic, 1)][2:]
    assert _info(net, topic, "spark").ack_floor == 7
