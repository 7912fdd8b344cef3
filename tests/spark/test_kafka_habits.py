"""What Kafka users bring to the data source: reading a topic the node does not follow,
copying a DataFrame as it is, ``value`` for ``payload``, offsets and timestamps written the
Kafka way, and the errors that tell them what to change (each with its line in
``docs/spark.md``)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from pulsar.tools.spark.errors import PulsarcastSparkError
from pulsar.tools.spark.offsets import OFFSET_FORMS
from pulsar.tools.spark.options import read_options
from pulsar.tools.spark.rest import NodeApi
from pulsar.tools.spark.source import BatchReader
from pulsar.tools.spark.writer import PublishedEvents, _aborted

from .conftest import SparkNet, wait_for

URL = "http://127.0.0.1:8701"
A = "bafyreigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"


def error_of(action: Any) -> str:
    with pytest.raises(Exception) as info:  # Spark wraps ours; the code is in the text
        action()
    return str(info.value)


def read(spark: Any, **options: str) -> Any:
    return spark.read.format("pulsarcast").options(**options).load()


def test_a_batch_read_of_a_topic_the_node_does_not_follow(source: Any, net: SparkNet) -> None:
    topic = net.create_topic("spark/kafka-unfollowed")
    net.publish(topic, [b"one", b"two", b"three"], window=1)
    # node 1 knows the topic (through the DHT) but holds none of it: no silent 0 rows
    message = error_of(lambda: read(source, **net.options(1, topic=topic)).count())
    assert "[PULSARCAST_NOT_SUBSCRIBED]" in message
    assert "subscribe=replay" in message and f"PUT /v1/subscriptions/{topic}" in message
    # subscribe=false: the log as it is, knowingly
    assert read(source, **net.options(1, topic=topic, subscribe="false")).count() == 0
    # subscribe=replay: the reader subscribes node 1, which backfills in the background
    assert read(source, **net.options(1, topic=topic, subscribe="replay",
                                      token=net.token(1))).count() <= 3
    wait_for(lambda: net.last(topic, 1) == 3, timeout=30)
    df = read(source, **net.options(1, topic=topic))  # followed now: no option needed
    assert sorted(bytes(r.payload) for r in df.collect()) == [b"one", b"three", b"two"]


def test_copying_a_topic_as_it_is_ignores_parents_unless_custom(source: Any,
                                                                net: SparkNet) -> None:
    origin = net.create_topic("spark/kafka-origin")
    copy = net.create_topic("spark/kafka-copy")  # LAST_SEEN: refuses a given parent
    sent = [b"%02d" % i for i in range(20)]
    net.publish(origin, sent, window=1)
    df = read(source, **net.options(0, topic=origin))
    assert df.where("parent is not null").count() == 19
    (df.write.format("pulsarcast").mode("append")
     .options(**net.options(0, topic=copy, token=net.token(0))).save())
    assert sorted(net.payloads(copy)) == sent


def test_the_token_is_checked_when_the_write_is_planned(source: Any, net: SparkNet) -> None:
    topic = net.create_topic("spark/kafka-token")
    df = source.createDataFrame([(b"a",), (b"b",)], "payload BINARY")
    message = error_of(lambda: df.write.format("pulsarcast").mode("append").options(
        **net.options(0, topic=topic, token="not-the-token-of-this-node")).save())
    assert "[PULSARCAST_UNAUTHORIZED]" in message and "checking the API token" in message
    assert net.last(topic) == 0  # nothing was published


def test_value_is_an_alias_of_payload(source: Any, net: SparkNet) -> None:
    topic = net.create_topic("spark/kafka-value")
    kafka_like = source.createDataFrame([("k", b"v1"), ("k", b"v2")],
                                        "key STRING, value BINARY").coalesce(1)
    (kafka_like.write.format("pulsarcast").mode("append")
     .options(**net.options(0, topic=topic, token=net.token(0))).save())
    assert net.payloads(topic) == [b"v1", b"v2"]
    both = source.createDataFrame([(b"p", b"v")], "payload BINARY, value BINARY")
    message = error_of(lambda: both.write.format("pulsarcast").mode("append").options(
        **net.options(0, topic=topic, token=net.token(0))).save())
    assert "[PULSARCAST_INVALID_COLUMN]" in message and "'value'" in message


def test_offset_errors_list_the_accepted_forms() -> None:
    for bad in ("first", "0", '{"topic-a": {"0": 23}}', '{"' + A + '": true}', "[1]"):
        with pytest.raises(PulsarcastSparkError) as info:
            read_options({"endpoint": URL, "topic": A, "startingoffsets": bad},
                         streaming=False)
        assert info.value.code == "INVALID_OPTION" and OFFSET_FORMS in str(info.value), bad
    with pytest.raises(PulsarcastSparkError, match="not partitions"):
        read_options({"endpoint": URL, "topic": A,
                      "startingoffsets": '{"' + A + '": {"0": 23}}'}, streaming=False)


def test_timestamps_in_seconds_are_caught() -> None:
    def start(value: str) -> float | None:
        return read_options({"endpoint": URL, "topic": A, "startingtimestamp": value},
                            streaming=False).starting_timestamp

    assert start("1767225600000") == 1767225600.0  # milliseconds, as in Kafka
    assert start("0") == 0.0
    assert start("2026-01-01T00:00:00Z") == 1767225600.0
    with pytest.raises(PulsarcastSparkError) as info:
        start("1767225600")
    assert "looks like seconds" in str(info.value) and "use 1767225600000" in str(info.value)
    with pytest.raises(PulsarcastSparkError, match="looks like microseconds"):
        read_options({"endpoint": URL, "topic": A, "endingtimestamp": "1767225600000000"},
                     streaming=False)


def test_a_timeout_names_request_timeout() -> None:
    """A node that accepts connections and never answers (a listening socket nobody
    reads): the call ends after ``requestTimeout`` with an error that names the option."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        options = read_options({"endpoint": f"http://127.0.0.1:{port}", "topic": A,
                                "requesttimeout": "0.5"}, streaming=False)
        with pytest.raises(PulsarcastSparkError) as info:
            BatchReader(options).plan()
    assert info.value.code == "TIMEOUT"
    assert "requestTimeout" in str(info.value) and "0.5 s" in str(info.value)


def test_a_failed_write_counts_every_event_it_published(source: Any, net: SparkNet) -> None:
    """A task publishes three rows and is refused the fourth: the write fails with that
    row's error and the count, and abort counts every task's events (a failing task's
    commit message carries its count)."""
    peer0 = str(net.nodes[0].node.peer_id)
    open_topic = net.create_topic("spark/kafka-open")
    closed = net.create_topic("spark/kafka-closed", allowed_publishers=[peer0])
    rows = [(b"a", open_topic), (b"b", open_topic), (b"c", open_topic), (b"d", closed)]
    df = source.createDataFrame(rows, "payload BINARY, topic STRING").coalesce(1)
    message = error_of(lambda: df.write.format("pulsarcast").mode("append").options(
        **net.options(1, token=net.token(1), maxInFlight="1")).save())
    assert "[PULSARCAST_PUBLISH_FAILED]" in message and "row 3" in message
    assert "had published 3 event(s)" in message
    wait_for(lambda: net.last(open_topic) == 3, timeout=30)
    # what abort logs for such a job: every task's events, and the tasks that said nothing
    messages = [PublishedEvents(0, 0, [open_topic] * 2, ["x", "y"]),
                PublishedEvents(1, 0, [open_topic], ["z"], "refused", "PUBLISH_FAILED"), None]
    assert _aborted(messages).startswith("2 task(s) had already published 3 event(s); 1 "
                                         "task(s) stopped without reporting")


def test_node_api_token_check(net: SparkNet) -> None:
    from pulsar.tools.spark.options import Endpoint

    api = NodeApi(Endpoint(net.url(0), net.token(0)))
    try:
        api.check_token()  # the right token: no error, no state changed
    finally:
        api.close()
    assert "token-check" not in {str(t) for t in net.nodes[0].node.subscribed()}


def test_content_type_is_read_and_written_back(source: Any, net: SparkNet) -> None:
    """Each row carries the media type its author signed, in both history formats, and the
    writer publishes a ``content_type`` column: a copied topic keeps its types."""
    from dag import CID

    origin = net.create_topic("spark/typed-origin")
    copy = net.create_topic("spark/typed-copy")
    node = net.nodes[0].node
    sent = [(b'{"n":1}', "application/json"), (b"hi", "text/plain; charset=utf-8"),
            (b"\x00\x01", None)]

    async def publish() -> None:
        for payload, kind in sent:
            await node.publish(CID.parse(origin), payload, content_type=kind)

    net.bg.run(publish())
    for history in ("blocks", "ndjson"):
        rows = read(source, **net.options(0, topic=origin, historyFormat=history)
                    ).orderBy("seq").collect()
        assert [(bytes(r.payload), r.content_type) for r in rows] == sent, history
    df = read(source, **net.options(0, topic=origin)).select("payload", "content_type")
    (df.coalesce(1).write.format("pulsarcast").mode("append")
     .options(**net.options(0, topic=copy, token=net.token(0))).save())
    copied = read(source, **net.options(0, topic=copy)).collect()
    assert sorted((bytes(r.payload), r.content_type or "") for r in copied) == sorted(
        (p, k or "") for p, k in sent)


def test_keys_are_read_and_written_back_also_as_kafkas_binary_keys(
        source: Any, net: SparkNet) -> None:
    """Each row carries the key its author signed, in both history formats; the writer
    publishes a ``key`` column, string or (as Kafka's sink has it) binary UTF-8."""
    from pyspark.sql import functions as F

    from dag import CID

    origin = net.create_topic("spark/keyed-origin")
    copy = net.create_topic("spark/keyed-copy")
    node = net.nodes[0].node
    sent = [(b"1", "user/1"), (b"2", None), (b"3", "user/\u00e9")]

    async def publish() -> None:
        for payload, key in sent:
            await node.publish(CID.parse(origin), payload, key=key)

    net.bg.run(publish())
    for history in ("blocks", "ndjson"):
        rows = read(source, **net.options(0, topic=origin, historyFormat=history)
                    ).orderBy("seq").collect()
        assert [(bytes(r.payload), r.key) for r in rows] == sent, history
    df = read(source, **net.options(0, topic=origin)).select(
        F.col("payload").alias("value"), F.encode("key", "utf-8").alias("key"))
    (df.coalesce(1).write.format("pulsarcast").mode("append")
     .options(**net.options(0, topic=copy, token=net.token(0))).save())
    copied = read(source, **net.options(0, topic=copy)).collect()
    assert sorted((bytes(r.payload), r.key or "") for r in copied) == sorted(
        (p, k or "") for p, k in sent)


def test_earliest_starts_at_what_retention_kept(source: Any, net: SparkNet) -> None:
    """A topic whose retention policy cut its log: a batch read from earliest (the
    default) starts at the first position kept; split in parts, none of them starts at a
    cut position (which would answer 410)."""
    import time

    from dag import CID

    topic = net.create_topic("spark/kafka-retained", retention={"max_events": 3})
    net.publish(topic, [b"%d" % i for i in range(8)], window=1)
    wait_for(lambda: net.last(topic) == 8, timeout=30)
    node = net.nodes[0].node
    net.bg.call(node._driver.retention.sweep, [CID.parse(topic)], time.time())
    assert net.bg.call(node.retained_from, CID.parse(topic)) == 6
    rows = read(source, **net.options(0, topic=topic, minPartitions="4")).collect()
    assert sorted(bytes(r.payload) for r in rows) == [b"5", b"6", b"7"]
