"""``pulsarcast bench spark``: the Spark data source against one real node.

One node (UDP DHT, TCP transport, SQLite) with its REST API on loopback runs on an event
loop in a background thread of this process (:class:`BackgroundLoop`); Spark runs
``local[2]`` — its JVM and Python workers are other processes, and they reach the node over
HTTP like any Spark job would. Payloads are 256 bytes. Figures:

* ``batch_rows_per_s`` — ``spark.read.format("pulsarcast")`` of the whole history of
  ``events`` events, fully materialised by ``write.format("noop")`` (every row converted
  into Spark's internal rows in the JVM, nothing written): ``events`` divided by the time of
  that action, planning included; the mean of ``batch_runs`` runs after a warm-up read of
  1,000 events (``batch_cold_start_s``: the first Spark query of the session, starting its
  Python workers). ``batch_to_arrow_rows_per_s``: the same read collected to the driver
  with ``DataFrame.toArrow()``. Baseline: ``rest_ndjson_rows_per_s``, the same history read
  as one NDJSON response by a separate process that only counts lines (``python -m
  pulsar.tools.bench.api client``), so ``batch_vs_ndjson`` is what Spark keeps of what the REST API
  serves.
* ``stream_latency_p50_s`` (and p90, max) — a ``readStream`` query with ``foreachBatch``
  (default trigger: a micro-batch as soon as the previous one ends) while
  ``latency_events`` events are published one every ``latency_gap_s``: from just before
  ``node.publish()`` to the moment ``foreachBatch`` has the event's row on the driver.
  Baseline: ``sse_latency_p50_s``, the same events through the REST API's SSE stream
  (:meth:`PulsarcastClient.live`) read in the node's process.
* ``write_rows_per_s`` — ``df.write.format("pulsarcast")`` of ``write_rows`` (3,000) rows
  in 2 partitions with the writer's defaults (batches of 256 rows, 2 requests in flight per
  task), from ``save()`` to Spark's commit, so Spark's job start and commit are in it;
  checked against the log. ``write_single_rows_per_s``: the same with ``publishBatch=1``
  and ``maxInFlight=8`` (one request per row: the writer before batches). Baseline:
  ``rest_publish_per_s``, ``POST /v1/topics/{cid}/events`` of as many events with 8 in
  flight from a separate process (``python -m pulsar.tools.bench.api client``);
  ``write_vs_rest_publish``. The same again at 20,000 rows (keys ending ``_20000``): the
  job's fixed cost weighs less there. A write of 500 rows before them is not measured
  (``write_warmup_rows_per_s``): the session's first write starts the workers' writer code.

Progress goes to stderr; the figures are returned as one dict (printed as one JSON line by
the CLI).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from dag import CID
from dht import DhtConfig
from pulsar.config import NodeConfig
from pulsar.node import Node
from pulsar.proto.core import LONE_NODE
from pulsar.tools.spark.background import BackgroundLoop, ServedNode

__all__ = ["bench_spark"]

PAYLOAD_BYTES: Final = 256
FILL_WINDOW: Final = 64
WARM_EVENTS: Final = 1000
WARM_WRITE_ROWS: Final = 500
TOKEN: Final = "bench-token"


def _say(message: str) -> None:
    print(f"[bench spark] {message}", file=sys.stderr, flush=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _fill(node: Node, topic: CID, count: int) -> float:
    """Publish ``count`` events, ``FILL_WINDOW`` in flight; the seconds it took."""
    payload = os.urandom(PAYLOAD_BYTES)
    left = count
    done = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal left, done
        while left > 0:
            left -= 1
            await node.publish(topic, payload)
            done += 1
            if done % 20_000 == 0:
                _say(f"  published {done:,} of {count:,}")

    await asyncio.gather(*(worker() for _ in range(FILL_WINDOW)))
    return time.perf_counter() - start


def _api_client(spec: dict[str, Any]) -> dict[str, Any]:
    """The REST API bench's client process (``python -m pulsar.tools.bench.api client``): a separate
    interpreter, as a real client would be."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "pulsar.tools.bench.api", "client",
                           json.dumps(spec)],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pulsar.tools.bench.api client failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("pulsarcast-bench-spark")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from pulsar.tools.spark import PulsarcastDataSource

    spark.dataSource.register(PulsarcastDataSource)
    return spark


def _batch(spark: Any, served: ServedNode, topic: str, events: int, runs: int
           ) -> dict[str, Any]:
    options = {"endpoint": served.url, "topic": topic}
    start = time.perf_counter()
    (spark.read.format("pulsarcast").options(**options, endingOffsets=str(WARM_EVENTS + 1))
     .load().write.format("noop").mode("overwrite").save())
    cold = time.perf_counter() - start
    _say(f"warm-up read of {WARM_EVENTS} events (first query): {cold:.1f} s")
    df = spark.read.format("pulsarcast").options(**options).load()
    partitions = df.rdd.getNumPartitions()
    rates = []
    for run in range(runs):
        start = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        elapsed = time.perf_counter() - start
        rates.append(events / elapsed)
        _say(f"batch read {run + 1}/{runs}: {events:,} rows in {elapsed:.2f} s "
             f"({rates[-1]:,.0f} rows/s, {partitions} partitions)")
    start = time.perf_counter()
    table = df.toArrow()
    arrow_s = time.perf_counter() - start
    if table.num_rows != events:
        raise RuntimeError(f"toArrow() gave {table.num_rows} rows, expected {events}")
    _say(f"toArrow(): {events / arrow_s:,.0f} rows/s")
    ndjson = _api_client({"op": "read", "url": served.url, "token": TOKEN, "count": events,
                          "path": f"/v1/topics/{topic}/events?format=ndjson", "marker": "\n"})
    ndjson_rate = ndjson["count"] / ndjson["seconds"]
    _say(f"REST NDJSON baseline: {ndjson_rate:,.0f} rows/s")
    mean = statistics.fmean(rates)
    return {
        "batch_rows_per_s": round(mean, 1),
        "batch_runs_rows_per_s": [round(r, 1) for r in rates],
        "batch_partitions": partitions,
        "batch_cold_start_s": round(cold, 2),
        "batch_to_arrow_rows_per_s": round(events / arrow_s, 1),
        "rest_ndjson_rows_per_s": round(ndjson_rate, 1),
        "batch_vs_ndjson": round(mean / ndjson_rate, 3),
    }


def _stream(spark: Any, bg: BackgroundLoop, served: ServedNode, count: int, gap: float,
            checkpoint: Path) -> dict[str, Any]:
    from api.client import PulsarcastClient

    topic = bg.run(served.node.create_topic("bench/spark-stream")).cid
    seen: dict[str, float] = {}
    lock = threading.Lock()

    def on_batch(df: Any, batch_id: int) -> None:
        cids = [r.cid for r in df.select("cid").collect()]
        now = time.time()
        with lock:
            for cid in cids:
                seen.setdefault(cid, now)

    query = (spark.readStream.format("pulsarcast")
             .options(endpoint=served.url, topic=str(topic)).load()
             .writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", str(checkpoint)).start())
    sse_seen: dict[str, float] = {}

    async def sse() -> None:
        async with PulsarcastClient(served.url) as client:
            async for event in client.live(str(topic), "earliest"):
                sse_seen[event["cid"]] = time.time()
                if len(sse_seen) >= count:
                    return

    sse_task = asyncio.run_coroutine_threadsafe(sse(), bg.loop)
    deadline = time.monotonic() + 120
    while query.lastProgress is None:  # the query has planned and run its first trigger
        if time.monotonic() > deadline or query.exception() is not None:
            raise RuntimeError(f"the stream did not start: {query.exception()}")
        time.sleep(0.05)
    sent: dict[str, float] = {}

    async def publish() -> None:
        for i in range(count):
            before = time.time()
            event = await served.node.publish(topic, b"%0*d" % (PAYLOAD_BYTES, i))
            sent[str(event.cid)] = before
            await asyncio.sleep(gap)  # a paced stream: latency, not throughput

    _say(f"stream: publishing {count} events, one every {gap} s")
    bg.run(publish())
    deadline = time.monotonic() + 120
    while True:
        with lock:
            if len(seen) >= count:
                break
        if time.monotonic() > deadline or query.exception() is not None:
            raise RuntimeError(f"the stream saw {len(seen)} of {count} events: "
                               f"{query.exception()}")
        time.sleep(0.05)
    query.stop()
    sse_task.result(60)
    latencies = [seen[c] - t for c, t in sent.items()]
    sse_latencies = [sse_seen[c] - t for c, t in sent.items()]
    batches = [p for p in query.recentProgress if p.numInputRows]
    p50 = statistics.median(latencies)
    _say(f"stream latency p50 {p50:.3f} s (SSE {statistics.median(sse_latencies):.3f} s), "
         f"{len(batches)} micro-batches with rows")
    return {
        "stream_latency_p50_s": round(p50, 3),
        "stream_latency_p90_s": round(_percentile(latencies, 0.9), 3),
        "stream_latency_max_s": round(max(latencies), 3),
        "stream_events": count,
        "stream_gap_s": gap,
        "stream_microbatches_with_rows": len(batches),
        "sse_latency_p50_s": round(statistics.median(sse_latencies), 4),
    }


def _spark_write(spark: Any, bg: BackgroundLoop, served: ServedNode, rows: int,
                 **options: str) -> float:
    """``df.write.format("pulsarcast")`` of ``rows`` rows in 2 partitions, from ``save()``
    to Spark's commit, into a new topic; rows/s. The topic's log is checked to hold them."""
    topic = str(bg.run(served.node.create_topic(f"bench/spark-written-{time.time_ns()}")).cid)
    df = spark.range(rows, numPartitions=2).selectExpr(
        f"cast(lpad(cast(id as string), {PAYLOAD_BYTES}, 'x') as binary) as payload")
    df.cache().count()  # the input is built before the clock starts
    start = time.perf_counter()
    (df.write.format("pulsarcast").mode("append")
     .options(endpoint=served.url, token=TOKEN, topic=topic, **options).save())
    elapsed = time.perf_counter() - start
    written = bg.call(served.node.last_position, CID.parse(topic))
    if written != rows:
        raise RuntimeError(f"the topic holds {written} events, {rows} rows were written")
    df.unpersist()
    return rows / elapsed


def _rest_publish(bg: BackgroundLoop, served: ServedNode, rows: int) -> float:
    """``POST /v1/topics/{cid}/events`` of ``rows`` events, 8 in flight, from a separate
    process; requests/s."""
    topic = str(bg.run(served.node.create_topic(f"bench/spark-rest-{time.time_ns()}")).cid)
    published = _api_client({"op": "publish", "url": served.url, "token": TOKEN,
                             "topic": topic, "count": rows, "concurrency": 8})
    return float(published["count"] / published["seconds"])


def _write(spark: Any, bg: BackgroundLoop, served: ServedNode, sizes: tuple[int, ...]
           ) -> dict[str, Any]:
    """The writer with its defaults (batches of 256 rows, 2 requests in flight per task)
    and with ``publishBatch=1`` (one request per row, 8 in flight: the writer before
    batches), each against the REST baseline of as many events, at every size."""
    # The session's first write starts the Python workers' writer code (imports, the HTTP
    # client): 827 rows/s for the first 3,000 rows against 1,297 for the same code right
    # after. Not measured, so that neither mode pays it.
    warm = _spark_write(spark, bg, served, WARM_WRITE_ROWS)
    figures: dict[str, Any] = {"write_sizes": list(sizes),
                               "write_warmup_rows_per_s": round(warm, 1)}
    for rows in sizes:
        rate = _spark_write(spark, bg, served, rows)
        single = _spark_write(spark, bg, served, rows, publishBatch="1", maxInFlight="8")
        rest_rate = _rest_publish(bg, served, rows)
        _say(f"write {rows:,} rows: {rate:,.0f} rows/s in batches, {single:,.0f} one request "
             f"a row; REST publish (8 in flight) {rest_rate:,.0f} req/s")
        suffix = "" if rows == sizes[0] else f"_{rows}"
        figures |= {
            f"write_rows_per_s{suffix}": round(rate, 1),
            f"write_single_rows_per_s{suffix}": round(single, 1),
            f"rest_publish_per_s{suffix}": round(rest_rate, 1),
            f"write_vs_rest_publish{suffix}": round(rate / rest_rate, 3),
            f"write_single_vs_rest_publish{suffix}": round(single / rest_rate, 3),
        }
    figures["write_rows"] = sizes[0]
    return figures


def bench_spark(events: int = 100_000, *, batch_runs: int = 2, latency_events: int = 60,
                latency_gap_s: float = 0.2, write_sizes: tuple[int, ...] = (3000, 20_000),
                data_dir: Path | None = None) -> dict[str, Any]:
    """Run the benchmark; figures as described in the module docstring."""
    import logging

    # The SSE baseline's handler outlives its client; aiohttp logs that as an error.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    load_before = os.getloadavg()[0]
    bg = BackgroundLoop("bench-spark-node")
    with tempfile.TemporaryDirectory(prefix="pulsarcast-bench-spark-") as tmp:
        root = data_dir or Path(tmp)
        served: ServedNode | None = None
        spark = None
        try:
            node = bg.run(Node.start(NodeConfig(data_dir=root / "n0",
                                                dht=DhtConfig(rpc_timeout=1.0),
                                                core=LONE_NODE)))
            served = bg.run(ServedNode.serve(node, token=TOKEN))
            topic = bg.run(node.create_topic("bench/spark-history")).cid
            _say(f"filling a history of {events:,} events")
            fill_s = bg.run(_fill(node, topic, events))
            _say(f"filled in {fill_s:.1f} s; starting Spark local[2]")
            start = time.perf_counter()
            spark = _session()
            session_s = time.perf_counter() - start
            figures: dict[str, Any] = {
                "benchmark": "spark",
                "events": events,
                "payload_bytes": PAYLOAD_BYTES,
                "spark": f"pyspark {spark.version}, local[2]",
                "spark_session_start_s": round(session_s, 1),
            }
            figures |= _batch(spark, served, str(topic), events, batch_runs)
            figures |= _stream(spark, bg, served, latency_events, latency_gap_s,
                               Path(tmp) / "stream-checkpoint")
            figures |= _write(spark, bg, served, write_sizes)
        finally:
            if spark is not None:
                spark.stop()
            if served is not None:
                bg.run(served.stop())
            bg.close()
    figures["load_average_before"] = round(load_before, 2)
    figures["load_average_after"] = round(os.getloadavg()[0], 2)
    figures["targets"] = {"batch_rows_per_s": 20_000, "stream_latency_p50_s": 2.0}
    return figures
