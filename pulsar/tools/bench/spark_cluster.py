"""The data source on a Spark standalone cluster: ``python -m pulsar.tools.bench.spark_cluster``.

Start the cluster first (``scripts/spark-cluster.sh start``: a master and two workers on
127.0.0.1). This process runs one node with its REST API on loopback and the Spark driver;
executors are JVMs started by the workers, each with its own Python workers, and reach the
node over HTTP like any job. It runs a batch read, a stream (``availableNow``) and a write,
checks each against the node's log, and asks executor tasks which modules the
executor-side code loads (the light client only: never the node, the DHT or kademlia).
The output is quoted in ``docs/spark.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEAVY = ("pulsar.node", "pulsar.net", "pulsar.proto", "dht", "kademlia", "api.server")


def _say(message: str) -> None:
    print(f"[cluster] {message}", flush=True)


def _probe(endpoint: str, topic: str) -> Any:
    """A task body: read positions 1..100 with the executor-side code, then report."""
    def run(_: Any) -> Any:
        import socket

        from pulsar.tools.spark.options import read_options
        from pulsar.tools.spark.source import BatchReader, RangePartition

        reader = BatchReader(read_options({"endpoint": endpoint, "topic": topic},
                                          streaming=False))
        rows = sum(b.num_rows for b in reader.read(RangePartition(topic, 1, 101)))
        ours = sorted(m for m in sys.modules if m.split(".")[0] in ("pulsar", "api", "dag"))
        yield {"pid": os.getpid(), "host": socket.gethostname(), "rows": rows,
               "executor_cwd": os.path.basename(os.getcwd()),
               "heavy_loaded": [m for m in HEAVY if m in sys.modules], "modules": ours}
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="spark://127.0.0.1:7077")
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()

    from dag import CID
    from dht import DhtConfig
    from pulsar.config import NodeConfig
    from pulsar.node import Node
    from pulsar.proto.core import LONE_NODE
    from pulsar.tools.spark.background import BackgroundLoop, ServedNode

    from .spark import _fill

    repo = str(Path(__file__).resolve().parents[3])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    bg = BackgroundLoop("cluster-demo-node")
    with tempfile.TemporaryDirectory(prefix="pulsarcast-cluster-") as tmp:
        node = bg.run(Node.start(NodeConfig(data_dir=Path(tmp) / "n0",
                                            dht=DhtConfig(rpc_timeout=1.0), core=LONE_NODE)))
        served = bg.run(ServedNode.serve(node))
        topic = bg.run(node.create_topic("cluster/history")).cid
        bg.run(_fill(node, topic, args.events))
        _say(f"node {served.url}: topic {topic} with {args.events:,} events")
        from pyspark.sql import SparkSession

        from pulsar.tools.spark import PulsarcastDataSource

        spark = (SparkSession.builder.master(args.master).appName("pulsarcast-cluster-demo")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.executor.cores", "1").config("spark.cores.max", "2")
                 .config("spark.executor.memory", "1g")
                 .config("spark.executorEnv.PYTHONPATH", repo)
                 .config("spark.pyspark.python", sys.executable)
                 .config("spark.sql.session.timeZone", "UTC")
                 .config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            spark.dataSource.register(PulsarcastDataSource)
            sc = spark.sparkContext
            executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
            _say(f"spark {spark.version}, master {sc.master}, {executors} executor(s); "
                 f"driver pid {os.getpid()}")
            options = {"endpoint": served.url, "topic": str(topic)}
            df = spark.read.format("pulsarcast").options(**options).load()
            df.write.format("noop").mode("overwrite").save()  # warm-up
            start = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            elapsed = time.perf_counter() - start
            seqs = df.selectExpr("min(seq)", "max(seq)", "count(*)").first()
            assert seqs is not None  # an aggregate always has one row
            _say(f"batch read: {seqs[2]:,} rows (seq {seqs[0]}..{seqs[1]}) in "
                 f"{df.rdd.getNumPartitions()} partitions; {args.events / elapsed:,.0f} "
                 "rows/s (noop sink)")
            assert seqs[2] == args.events == seqs[1]

            seen: list[int] = []
            query = (spark.readStream.format("pulsarcast")
                     .options(**options, startingOffsets="earliest",
                              maxEventsPerTrigger="5000").load()
                     .writeStream.foreachBatch(lambda b, _: seen.append(b.count()))
                     .option("checkpointLocation", str(Path(tmp) / "ck"))
                     .trigger(availableNow=True).start())
            query.awaitTermination(300)
            _say(f"stream (availableNow, maxEventsPerTrigger=5000): {sum(seen):,} rows in "
                 f"{len([n for n in seen if n])} micro-batches")
            assert sum(seen) == args.events

            target = bg.run(node.create_topic("cluster/written")).cid
            rows = spark.range(2000, numPartitions=2).selectExpr(
                "cast(cast(id as string) as binary) as value")
            start = time.perf_counter()
            (rows.write.format("pulsarcast").mode("append")
             .options(endpoint=served.url, token=served.token, topic=str(target)).save())
            written = bg.call(node.last_position, CID.parse(str(target)))
            _say(f"write: 2,000 rows ('value' column) in 2 tasks, {written:,} events in the "
                 f"topic, {2000 / (time.perf_counter() - start):,.0f} rows/s")
            assert written == 2000

            reports = sc.parallelize(range(2), 2).mapPartitions(
                _probe(served.url, str(topic))).collect()
            for report in reports:
                _say(f"executor task pid {report['pid']} (driver {os.getpid()}): read "
                     f"{report['rows']} rows; node/DHT modules loaded: "
                     f"{report['heavy_loaded'] or 'none'}")
            _say("executor-side modules of ours: " + ", ".join(reports[0]["modules"]))
            assert all(not r["heavy_loaded"] and r["pid"] != os.getpid() for r in reports)
        finally:
            spark.stop()
            bg.run(served.stop())
            bg.close()


if __name__ == "__main__":
    main()
