"""The writer: rows published and read back, the topic option winning over the column,
parents for CUSTOM topics, commit messages, failures reported per task, and the streaming
sink."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pulsar.tools.spark.errors import PulsarcastSparkError
from pulsar.tools.spark.options import write_options
from pulsar.tools.spark.publish import publish_batches
from pulsar.tools.spark.writer import PublishedEvents

from .conftest import SparkNet


def test_rows_round_trip_and_the_topic_option_wins(source: Any, net: SparkNet) -> None:
    target = net.create_topic("spark/written")
    elsewhere = net.create_topic("spark/not-written")
    rows = [(f"row-{i}".encode(), elsewhere) for i in range(40)]
    df = source.createDataFrame(rows, "payload BINARY, topic STRING").coalesce(1)
    (df.write.format("pulsarcast").mode("append")
     .options(**net.options(0, topic=target, token=net.token(0), maxInFlight="1")).save())
    assert net.payloads(target) == [p for p, _ in rows]  # one task, in order
    assert net.last(elsewhere) == 0  # the option won over the column
    # the task function in this process: with no option, the topic column decides, and
    # string payloads are published as UTF-8 text
    options = write_options({"endpoint": net.url(0), "token": net.token(0)})
    message = publish_batches(options, iter([pa.RecordBatch.from_pydict(
        {"payload": ["héllo", "wörld"], "topic": [elsewhere, target]})]))
    assert message.topics == [elsewhere, target]
    assert net.payloads(elsewhere) == ["héllo".encode()]
    assert net.payloads(target)[40:] == ["wörld".encode()]


def test_parents_for_custom_topics_and_commit_messages(net: SparkNet) -> None:
    """The task function itself, in this process (no TaskContext: partition -1)."""
    topic = net.create_topic("spark/custom", event_linking="CUSTOM")
    root = net.publish(topic, [b"root"])[0]
    options = write_options({"endpoint": net.url(0), "token": net.token(0), "topic": topic,
                             "maxinflight": "4"})
    batch = pa.RecordBatch.from_pydict({
        "payload": [b"a", b"b", b"c", b"d", b"e"],
        "parent": [root, root, None, root, root],
    })
    message = publish_batches(options, iter([batch, batch.slice(0, 2)]))
    assert isinstance(message, PublishedEvents) and message.partition == -1
    log = {cid: seq for seq, cid, _ in net.log(topic)}
    assert len(message.cids) == 7 and set(message.cids) <= set(log)
    assert message.topics == [topic] * 7
    events = {cid: net.bg.run(net.nodes[0].node.get_event(_cid(cid))) for cid in message.cids}
    parents = [None if events[c].parent is None else str(events[c].parent)
               for c in message.cids]
    assert [p == root for p in parents] == [True, True, False, True, True, True, True]
    assert [bytes(events[c].payload) for c in message.cids] == [b"a", b"b", b"c", b"d", b"e",
                                                                 b"a", b"b"]


def _cid(text: str) -> Any:
    from dag import CID

    return CID.parse(text)


def test_failures_are_reported_per_task(source: Any, net: SparkNet) -> None:
    peer0 = str(net.nodes[0].node.peer_id)
    closed = net.create_topic("spark/closed", allowed_publishers=[peer0])
    df = source.createDataFrame([(b"nope",)], "payload BINARY")
    with pytest.raises(Exception) as info:  # node 1 may not publish on it
        df.write.format("pulsarcast").mode("append").options(
            **net.options(1, topic=closed, token=net.token(1))).save()
    message = str(info.value)
    assert "[PULSARCAST_PUBLISH_FAILED]" in message and "task for partition" in message
    assert "publish-refused" in message and "had published 0 event(s)" in message
    # in this process: a null payload stops the task with the row named
    options = write_options({"endpoint": net.url(0), "token": net.token(0), "topic": closed})
    with pytest.raises(PulsarcastSparkError, match="row 1 of this task has a null payload"):
        publish_batches(options, iter([pa.RecordBatch.from_pydict(
            {"payload": pa.array([b"ok", None], pa.binary())})]))
    # modes and columns are checked when the write is planned
    with pytest.raises(Exception, match=r"\[PULSARCAST_INVALID_OPTION\].*append-only"):
        df.write.format("pulsarcast").mode("overwrite").options(
            **net.options(0, topic=closed, token=net.token(0))).save()
    with pytest.raises(Exception, match=r"\[PULSARCAST_INVALID_COLUMN\]"):
        source.createDataFrame([(1,)], "value INT").write.format("pulsarcast").mode(
            "append").options(**net.options(0, topic=closed, token=net.token(0))).save()


def test_streaming_sink_copies_a_topic(source: Any, net: SparkNet, tmp_path: Path) -> None:
    origin = net.create_topic("spark/origin")
    copy = net.create_topic("spark/copy")
    sent = [b"%03d" % i for i in range(25)]
    net.publish(origin, sent, window=1)
    query = (source.readStream.format("pulsarcast")
             .options(**net.options(0, topic=origin, startingOffsets="earliest")).load()
             .select("payload")
             .writeStream.format("pulsarcast")
             .options(**net.options(0, topic=copy, token=net.token(0)))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert sorted(net.payloads(copy)) == sent


def test_rows_go_in_batches_in_order_and_a_refused_row_stops_the_task(net: SparkNet) -> None:
    """``publishBatch`` rows a request: with one request in flight the rows follow each
    other in the topic in row order, across batches and topics. A row the node refuses
    stops the task; the rows of its batch the node took are counted as published."""
    first = net.create_topic("spark/batched-a")
    second = net.create_topic("spark/batched-b")
    payloads = [b"%02d" % i for i in range(10)]
    topics = [first] * 4 + [second] * 2 + [first] * 4
    options = write_options({"endpoint": net.url(0), "token": net.token(0),
                             "maxInFlight": "1", "publishBatch": "3"})
    message = publish_batches(options, iter([pa.RecordBatch.from_pydict(
        {"payload": payloads, "topic": topics})]))
    assert message.topics == topics and len(set(message.cids)) == 10
    assert net.payloads(first) == payloads[:4] + payloads[6:]
    assert net.payloads(second) == payloads[4:6]
    assert [cid for _, cid, _ in net.log(first)] == message.cids[:4] + message.cids[6:]

    custom = net.create_topic("spark/batched-custom", event_linking="CUSTOM")
    root = net.publish(custom, [b"root"])[0]
    stranger = net.publish(first, [b"not of this topic"])[0]
    options = write_options({"endpoint": net.url(0), "token": net.token(0), "topic": custom})
    with pytest.raises(PulsarcastSparkError) as info:
        publish_batches(options, iter([pa.RecordBatch.from_pydict(
            {"payload": [b"a", b"b", b"c"], "parent": [root, stranger, root]})]))
    assert "row 1 could not be published" in info.value.detail
    assert "publish-refused" in info.value.detail
    assert "had published 2 event(s)" in info.value.detail
    assert sorted(net.payloads(custom)) == [b"a", b"c", b"root"]


class _ScriptedClient:
    """Answers ``publish_batch`` from a script: a 503 for a row the first time it comes,
    what the node answers when a store found too few DHT nodes."""

    def __init__(self, flaky: set[bytes], refused: frozenset[bytes] = frozenset()) -> None:
        self.flaky = flaky
        self.refused = refused
        self.requests: list[list[bytes]] = []

    async def publish_batch(self, topic: str, items: list[dict[str, Any]]) -> list[Any]:
        self.requests.append([item["payload"] for item in items])
        outcomes: list[Any] = []
        for item in items:
            if item["payload"] in self.refused:
                outcomes.append({"error": {
                    "type": "https://pulsarcast.dev/problems/publish-refused", "status": 403,
                    "detail": "not an allowed publisher"}})
            elif item["payload"] in self.flaky:
                self.flaky.discard(item["payload"])
                outcomes.append({"error": {
                    "type": "https://pulsarcast.dev/problems/not-persisted", "status": 503,
                    "detail": "too few DHT nodes stored it"}})
            else:
                outcomes.append({"cid": "cid-" + item["payload"].decode()})
        return outcomes


def test_a_row_refused_for_a_reason_that_may_pass_is_sent_again_alone() -> None:
    from pulsar.tools.spark.publish import _Publisher, _Row

    client = _ScriptedClient({b"b", b"d"})
    options = write_options({"endpoint": "http://127.0.0.1:1", "token": "t",
                             "maxInFlight": "1", "publishBatch": "4"})
    publisher = _Publisher(client, options)  # type: ignore[arg-type]
    rows = [_Row(i, "topic", p, None) for i, p in enumerate([b"a", b"b", b"c", b"d", b"e"])]
    asyncio.run(publisher.run(rows))
    assert publisher.failure is None
    assert client.requests == [[b"a", b"b", b"c", b"d"], [b"b", b"d"], [b"e"]]
    assert publisher.published == {i: ("topic", f"cid-{p}") for i, p in enumerate("abcde")}

    client = _ScriptedClient({b"b"})
    options = write_options({"endpoint": "http://127.0.0.1:1", "token": "t",
                             "publishRetries": "0", "publishBatch": "4"})
    publisher = _Publisher(client, options)  # type: ignore[arg-type]
    asyncio.run(publisher.run(rows[:3]))
    assert publisher.failure is not None and publisher.failure[0].index == 1
    assert sorted(publisher.published) == [0, 2]

    # A refusal for good stops the task at once, and it names the first row not taken
    # (here one refused for a reason that might have passed on a retry).
    client = _ScriptedClient({b"b"}, frozenset({b"c"}))
    options = write_options({"endpoint": "http://127.0.0.1:1", "token": "t",
                             "publishBatch": "4"})  # two retries left for b
    publisher = _Publisher(client, options)  # type: ignore[arg-type]
    asyncio.run(publisher.run(rows))
    assert publisher.failure is not None and publisher.failure[0].index == 1
    assert sorted(publisher.published) == [0, 3]
    assert len(client.requests) == 1


def test_the_writer_knows_the_nodes_limit_on_a_batch() -> None:
    """The writer states the limit itself (its executors do not import the API server)."""
    from api.limits import BATCH_EVENTS
    from pulsar.tools.spark.options import MAX_PUBLISH_BATCH

    assert MAX_PUBLISH_BATCH == BATCH_EVENTS
    with pytest.raises(PulsarcastSparkError, match=r"publishBatch must be in 1\.\.1000"):
        write_options({"endpoint": "http://127.0.0.1:1", "token": "t", "publishbatch": "1001"})
