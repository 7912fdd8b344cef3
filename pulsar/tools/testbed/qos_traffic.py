"""Traffic and resource metrics: record counts, payload copies (RMR), bytes, CPU, memory.

All of them read the folded traces of :func:`pulsar.tools.testbed.qos_read.fold_traces`.
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

__all__ = [
    "NodeUse",
    "copy_counts",
    "node_usage",
    "record_counts",
    "unpublished_events",
]

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


def record_counts(facts: DataFrame) -> dict[int, dict[str, Any]]:
    """Records by kind, and unreadable lines, per part."""
    rows = facts.groupBy(*KEY, "kind").agg(F.sum("records").alias("records")).collect()
    counts: dict[int, dict[str, Any]] = {}
    for row in rows:
        entry = counts.setdefault(int(row["part"]),
                                  {"total": 0, "by_kind": {}, "unreadable_lines": 0})
        if row["kind"] == UNREADABLE:
            entry["unreadable_lines"] = int(row["records"])
        else:
            entry["by_kind"][row["kind"]] = int(row["records"])
            entry["total"] += int(row["records"])
    for entry in counts.values():
        entry["by_kind"] = dict(sorted(entry["by_kind"].items()))
    return counts


def _copies(facts: DataFrame) -> DataFrame:
    """(part, event, kind, msg, records): copies of each event by record kind and msg."""
    return (facts.filter(F.col("kind").isin("receive", "duplicate"))
            .filter(F.col("event").isNotNull()))


def copy_counts(facts: DataFrame, pubs: DataFrame) -> dict[int, dict[str, Any]]:
    """Payload copies of published events, in total, by record kind and by ``msg``."""
    copies = (_copies(facts).join(pubs.select(*KEY, "event"), on=[*KEY, "event"],
                                  how="left_semi")
              .groupBy(*KEY, "kind", "msg").agg(F.sum("records").alias("copies")).collect())
    result: dict[int, dict[str, Any]] = {}
    for row in copies:
        entry = result.setdefault(int(row["part"]), {"total": 0, "by_kind": {}, "by_msg": {}})
        n = int(row["copies"])
        msg = row["msg"] if row["msg"] is not None else _NO_MSG
        entry["total"] += n
        entry["by_kind"][row["kind"]] = entry["by_kind"].get(row["kind"], 0) + n
        entry["by_msg"][msg] = entry["by_msg"].get(msg, 0) + n
    return result


def unpublished_events(facts: DataFrame, delivered: DataFrame,
                       pubs: DataFrame) -> dict[int, int]:
    """Events seen (received or delivered) without a publish record — e.g. the publisher
    crashed before flushing it. They are left out of every delivery metric; this says how
    many, so a hole in the traces is visible."""
    seen = (_copies(facts).select(*KEY, "event")
            .union(delivered.select(*KEY, "event")).distinct())
    rows = (seen.join(pubs.select(*KEY, "event"), on=[*KEY, "event"], how="left_anti")
            .groupBy(*KEY).agg(F.count("*").alias("events")).collect())
    return {int(row["part"]): int(row["events"]) for row in rows}


def node_usage(facts: DataFrame) -> dict[int, list[NodeUse]]:
    """Per node: bytes sent and CPU seconds summed over lives (the last sample of each life,
    as counters restart with the process), and the largest resident memory seen."""
    nodes = (facts.filter(F.col("kind") == "sample")
             .groupBy(*KEY, "node")
             .agg(F.sum(F.coalesce(F.col("last.sent_bytes"), F.lit(0))).alias("pubsub"),
                  F.sum(F.coalesce(F.col("last.dht_sent_bytes"), F.lit(0))).alias("dht"),
                  F.sum(F.coalesce(F.col("last.cpu_s"), F.lit(0.0))).alias("cpu_s"),
                  F.max("rss").alias("rss"))
             .collect())
    usage: dict[int, list[NodeUse]] = {}
    for row in nodes:
        usage.setdefault(int(row["part"]), []).append(NodeUse(
            node=int(row["node"]), pubsub_bytes=int(row["pubsub"]), dht_bytes=int(row["dht"]),
            cpu_s=float(row["cpu_s"]), rss_bytes=int(row["rss"] or 0)))
    for nodes_of in usage.values():
        nodes_of.sort(key=lambda use: use.node)
    return usage
