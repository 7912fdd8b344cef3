"""Streaming reads: ``trigger(availableNow=True)`` in bounded micro-batches, a stream from
a subscriber while events are being published, stopped and restarted from its checkpoint
(no gap, no duplicate), and the subscription rules."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from dag import CID
from pulsar.tools.spark.errors import PulsarcastSparkError
from pulsar.tools.spark.options import read_options
from pulsar.tools.spark.source import StreamReader

from .conftest import SparkNet, wait_for


class Batches:
    """What a ``foreachBatch`` sink saw, by batch id. A batch that Spark runs again after a
    restart (it was planned but not committed) keeps its id and must have the same rows."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[int, str]]] = {}
        self.reruns: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = sorted((r.seq, r.cid) for r in df.select("seq", "cid").collect())
        with self._lock:
            if batch_id in self.rows:
                assert self.rows[batch_id] == rows, f"batch {batch_id} re-ran differently"
                self.reruns.append(batch_id)
            self.rows[batch_id] = rows

    def all(self) -> list[tuple[int, str]]:
        with self._lock:
            return [row for b in sorted(self.rows) for row in self.rows[b]]

    def count(self) -> int:
        return len(self.all())


def stream(spark: Any, sink: Batches, checkpoint: Path, **options: str) -> Any:
    return (spark.readStream.format("pulsarcast").options(**options).load()
            .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)))


def test_available_now_reads_in_bounded_batches_and_resumes(source: Any, net: SparkNet,
                                                            tmp_path: Path) -> None:
    topic = net.create_topic("spark/stream-backlog")
    net.publish(topic, [b"%d" % i for i in range(1000)])
    sink = Batches()
    options = net.options(0, topic=topic, startingOffsets="earliest",
                          maxEventsPerTrigger="400")

    def run_available_now() -> None:
        query = stream(source, sink, tmp_path / "ck", **options) \
            .trigger(availableNow=True).start()
        assert query.awaitTermination(120), "availableNow did not finish"
        assert query.exception() is None

    run_available_now()
    assert [len(sink.rows[b]) for b in sorted(sink.rows)] == [400, 400, 200]
    log = [(seq, cid) for seq, cid, _ in net.log(topic)]
    assert sink.all() == log
    # restarted from the checkpoint: exactly what was published since
    new = net.publish(topic, [b"x", b"y", b"z"], window=1)
    run_available_now()
    assert [cid for _, cid in sink.all()[1000:]] == new
    assert sink.all() == [(seq, cid) for seq, cid, _ in net.log(topic)]


def test_live_stream_restarted_from_checkpoint_has_no_gap_and_no_duplicate(
        source: Any, net: SparkNet, tmp_path: Path) -> None:
    topic = net.create_topic("spark/live")
    net.subscribe(topic, 1)
    first = net.publish(topic, [b"first"])
    wait_for(lambda: net.last(topic, 1) == 1, timeout=20)  # node 1 is in the tree
    published = list(first)
    stop = asyncio.Event()
    node0 = net.nodes[0].node

    async def publish_until_stopped() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            published.append(str((await node0.publish(CID.parse(topic), b"live-%d" % i)).cid))
            await asyncio.sleep(0.02)  # a steady stream, not a synchronisation

    publishing = asyncio.run_coroutine_threadsafe(publish_until_stopped(), net.bg.loop)
    sink = Batches()
    options = net.options(1, topic=topic, startingOffsets="earliest")
    try:
        query = stream(source, sink, tmp_path / "ck", **options).start()
        wait_for(lambda: sink.count() >= 30, timeout=60)
        query.stop()
        before = max(sink.rows)
        query = stream(source, sink, tmp_path / "ck", **options).start()
        wait_for(lambda: max(sink.rows) > before + 1 and sink.count() >= 60, timeout=60)
    finally:
        net.bg.loop.call_soon_threadsafe(stop.set)
        publishing.result(30)
    try:
        wait_for(lambda: net.last(topic, 1) == len(published), timeout=30)
        wait_for(lambda: sink.count() >= len(published), timeout=60)
    finally:
        query.stop()
    log = [(seq, cid) for seq, cid, _ in net.log(topic, 1)]
    assert len(log) == len(published) and {c for _, c in log} == set(published)
    rows = sink.all()
    assert rows == log  # every position once, in order, none missing, none twice
    assert query.exception() is None


def test_a_stream_needs_the_node_to_follow_the_topic(net: SparkNet) -> None:
    """The stream reader's driver-side calls, in this process (Spark runs the same calls in
    its long-lived stream worker; the other tests cover that path)."""
    topic = net.create_topic("spark/unfollowed")
    sent = net.publish(topic, [b"one", b"two"], window=1)
    options = {"endpoint": net.url(1), "topic": topic, "startingoffsets": "earliest"}
    refused = StreamReader(read_options(options, streaming=True))
    with pytest.raises(PulsarcastSparkError) as info:
        refused.initialOffset()
    assert info.value.code == "NOT_SUBSCRIBED" and "subscribe=replay" in str(info.value)
    refused.stop()
    # subscribe=replay: the reader subscribes node 1, which backfills the topic's past
    reader = StreamReader(read_options({**options, "subscribe": "replay",
                                        "token": net.token(1)}, streaming=True))
    try:
        start = reader.initialOffset()
        assert start == {topic: 1}
        wait_for(lambda: reader.latestOffset(start, ReadAllAvailable()) == {topic: 3},
                 timeout=30)
        parts = reader.partitions(start, {topic: 3})
        rows = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
        assert [r["cid"] for r in rows] == sent and [r["seq"] for r in rows] == [1, 2]
        assert reader.latestOffset(start, ReadMaxRows(1)) == {topic: 2}
    finally:
        reader.stop()
