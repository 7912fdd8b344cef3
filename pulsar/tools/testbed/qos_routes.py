"""How each delivered expected pair got its first copy: by the tree (or flood), by a
WANT/BLOCKS backfill, or by a DHT fetch — overall and in the latency tail.

The headline of a run says what its p99 is made of only if the traces show it; this is
where that is read. The route of a pair is the ``msg`` of the node's earliest ``receive``
record of the event (docs/testbed.md), so a copy brought by a graft counts as "event" (a
GRAFT is answered with an EVENT message) and only BLOCKS and DHT fetches count as repair
(``pulsar.tools.testbed.trace.REPAIR_MSGS``).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .qos_read import KEY

__all__ = ["UNRECORDED", "first_copies", "route_counts"]

UNRECORDED = "unrecorded"
"""Route of a delivered pair with no ``receive`` record at its node (lost in a crash)."""


def first_copies(facts: DataFrame) -> DataFrame:
    """(part, node, event, via): the ``msg`` of each node's earliest copy of each event."""
    return (facts.filter(F.col("kind") == "receive")
            .filter(F.col("event").isNotNull() & F.col("node").isNotNull())
            .groupBy(*KEY, "node", "event")
            .agg(F.min_by("msg", "t").alias("via")))


def route_counts(pairs: DataFrame, copies: DataFrame,
                 tail_from: dict[int, float]) -> dict[int, dict[str, Any]]:
    """Per part: delivered pairs by route, and the same for the tail — the pairs whose
    latency is at least ``tail_from[part]`` (the run's p99). Parts with no deliveries are
    absent."""
    schema = T.StructType([T.StructField("part", T.IntegerType(), False),
                           T.StructField("tail_from", T.DoubleType(), False)])
    thresholds = pairs.sparkSession.createDataFrame(sorted(tail_from.items()), schema)
    delivered = (pairs.filter(F.col("latency").isNotNull())
                 .select(*KEY, "node", "event", "latency")
                 .join(copies, on=[*KEY, "node", "event"], how="left")
                 .join(F.broadcast(thresholds), on=[*KEY], how="left"))
    in_tail = F.coalesce(F.col("latency") >= F.col("tail_from"), F.lit(False))
    rows = (delivered.groupBy(*KEY, "via")
            .agg(F.count("*").alias("pairs"), F.count_if(in_tail).alias("tail"))
            .collect())
    result: dict[int, dict[str, Any]] = {}
    for row in rows:
        entry = result.setdefault(int(row["part"]), {"by_via": {}, "tail_by_via": {}})
        via = row["via"] if row["via"] is not None else UNRECORDED
        entry["by_via"][via] = int(row["pairs"])
        if row["tail"]:
            entry["tail_by_via"][via] = int(row["tail"])
    for key, entry in result.items():
        entry["by_via"] = dict(sorted(entry["by_via"].items()))
        entry["tail_by_via"] = dict(sorted(entry["tail_by_via"].items()))
        entry["tail_from_s"] = tail_from.get(key)
    return result
