"""Traffic and resource metrics: record counts, payload copies (RMR), bytes, CPU, memory.

Copies are counted at every node, relays included, because a relay that takes in a copy it
does not deliver still paid for it; bytes come from the nodes' own transport counters, which
cover every message type (control traffic, repair, DHT) and not only event payloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .qos_read import KEY, UNREADABLE

__all__ = ["NodeUse", "copy_counts", "node_usage", "record_counts", "unpublished_events"]

_NO_MSG = "none"


@dataclass(frozen=True)
class NodeUse:
    """One node's resource use over all its lives."""

    node: int
    pubsub_bytes: int
    dht_bytes: int
    cpu_s: float
    rss_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.pubsub_bytes + self.dht_bytes


def record_counts(traces: DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    """Records by kind, and unreadable lines, per (run, protocol).

    Run first: it is the action that parses every file and fills the trace cache."""
    rows = traces.groupBy(*KEY, "kind").agg(F.count("*").alias("records")).collect()
    counts: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        entry = counts.setdefault((row["run"], row["protocol"]),
                                  {"total": 0, "by_kind": {}, "unreadable_lines": 0})
        if row["kind"] == UNREADABLE:
            entry["unreadable_lines"] = int(row["records"])
        else:
            entry["by_kind"][row["kind"]] = int(row["records"])
            entry["total"] += int(row["records"])
    for entry in counts.values():
        entry["by_kind"] = dict(sorted(entry["by_kind"].items()))
    return counts


def copy_counts(records: DataFrame, pubs: DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    """Payload copies (``receive`` + ``duplicate`` records of published events), in total, by
    record kind and by ``msg``."""
    copies = (records.filter(F.col("kind").isin("receive", "duplicate"))
              .join(pubs.select(*KEY, "event"), on=[*KEY, "event"], how="left_semi")
              .groupBy(*KEY, "kind", "msg").agg(F.count("*").alias("copies")).collect())
    result: dict[tuple[str, str], dict[str, Any]] = {}
    for row in copies:
        entry = result.setdefault((row["run"], row["protocol"]),
                                  {"total": 0, "by_kind": {}, "by_msg": {}})
        n = int(row["copies"])
        msg = row["msg"] if row["msg"] is not None else _NO_MSG
        entry["total"] += n
        entry["by_kind"][row["kind"]] = entry["by_kind"].get(row["kind"], 0) + n
        entry["by_msg"][msg] = entry["by_msg"].get(msg, 0) + n
    return result


def unpublished_events(records: DataFrame, pubs: DataFrame) -> dict[tuple[str, str], int]:
    """Events seen (received or delivered) without a publish record — e.g. the publisher
    crashed before flushing it. They are left out of every delivery metric; this says how
    many, so a hole in the traces is visible."""
    seen = (records.filter(F.col("kind").isin("receive", "duplicate", "deliver"))
            .filter(F.col("event").isNotNull()).select(*KEY, "event").distinct())
    rows = (seen.join(pubs.select(*KEY, "event"), on=[*KEY, "event"], how="left_anti")
            .groupBy(*KEY).agg(F.count("*").alias("events")).collect())
    return {(row["run"], row["protocol"]): int(row["events"]) for row in rows}


def node_usage(records: DataFrame) -> dict[tuple[str, str], list[NodeUse]]:
    """Per node: bytes sent and CPU seconds summed over lives (the last sample of each life,
    as counters restart with the process), and the largest resident memory seen."""
    last = F.max_by(F.struct("sent_bytes", "dht_sent_bytes", "cpu_s"), "t")
    lives = (records.filter(F.col("kind") == "sample")
             .withColumn("life", F.coalesce(F.col("life"), F.lit(0)))
             .groupBy(*KEY, "node", "life")
             .agg(last.alias("last"), F.max("rss").alias("rss")))
    nodes = (lives.groupBy(*KEY, "node")
             .agg(F.sum(F.coalesce(F.col("last.sent_bytes"), F.lit(0))).alias("pubsub"),
                  F.sum(F.coalesce(F.col("last.dht_sent_bytes"), F.lit(0))).alias("dht"),
                  F.sum(F.coalesce(F.col("last.cpu_s"), F.lit(0.0))).alias("cpu_s"),
                  F.max("rss").alias("rss"))
             .collect())
    usage: dict[tuple[str, str], list[NodeUse]] = {}
    for row in nodes:
        usage.setdefault((row["run"], row["protocol"]), []).append(NodeUse(
            node=int(row["node"]), pubsub_bytes=int(row["pubsub"]), dht_bytes=int(row["dht"]),
            cpu_s=float(row["cpu_s"]), rss_bytes=int(row["rss"] or 0)))
    for nodes_of in usage.values():
        nodes_of.sort(key=lambda use: use.node)
    return usage
