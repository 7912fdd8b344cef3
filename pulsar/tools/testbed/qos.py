"""The QoS computation: traces and durable delivery logs of testbed runs in, per (run,
protocol) figures out. Delivery and coverage come from the delivery logs, everything timed or
counted on the wire (latency, hops, routes, copies, order, bytes, CPU, memory) from the traces
(:mod:`pulsar.tools.testbed.qos_delivery`).

It holds the Spark part of the report together: one pass that parses and folds the traces
into a small in-memory table of facts, a few small cached intermediates (publishes, first
deliveries, expected pairs), then one small collect per family of metrics. What comes back
to the driver is per protocol or per node, never per record, so the driver's memory does not
grow with the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from .qos_delivery import (
    CDF_GRID,
    NEVER,
    delivery_figures,
    delivery_pairs,
    first_deliveries,
    order_violations,
    publishes,
)
from .qos_read import (
    durable_deliveries,
    expectations,
    fold_traces,
    ordered_topics,
    parts,
)
from .qos_routes import first_copies, route_counts
from .qos_traffic import (
    NodeUse,
    copy_counts,
    node_usage,
    record_counts,
    unpublished_events,
)
from .report_inputs import ProtocolRun, RunInput

__all__ = ["CDF_GRID", "NEVER", "NodeUse", "ProtocolQos", "compute_qos"]


@dataclass(frozen=True)
class ProtocolQos:
    """Figures of one protocol in one run: the JSON-ready metrics and the plot series."""

    run: str
    protocol: str
    metrics: dict[str, Any]
    latency_quantiles: list[float] | None
    """Latency of delivered expected pairs at the quantiles of ``CDF_GRID``; None if none."""
    nodes: list[NodeUse]
    expected_latency_quantiles: list[float] | None = None
    """Latency of all expected pairs at ``CDF_GRID``, ``NEVER`` (infinity) for undelivered
    ones; None if nothing was expected."""
    reach_quantiles: dict[str, list[float]] | None = None
    """Per coverage level, each event's time to reach it at ``CDF_GRID`` (``NEVER`` if not)."""


def compute_qos(spark: SparkSession, runs: Sequence[RunInput],
                say: Callable[[str], None] = lambda _: None) -> dict[tuple[str, str], ProtocolQos]:
    """Every metric of docs/testbed.md for every (run label, protocol) of ``runs``."""
    numbered = parts(runs)
    indices = range(len(numbered))
    files = sum(len(part.trace_files) for _, part in numbered)
    say(f"parsing and folding {files} trace files of {len(runs)} run(s)")
    facts = fold_traces(spark, runs)
    cached: list[DataFrame] = []
    try:
        counts = record_counts(facts)
        say(f"{sum(c['total'] for c in counts.values()):,} records; computing deliveries")
        pubs = publishes(facts).cache()
        delivered = first_deliveries(facts).cache()
        logged, logged_nodes = durable_deliveries(spark, runs)
        pairs = delivery_pairs(pubs, expectations(spark, runs), delivered, logged,
                               logged_nodes).cache()
        cached += [pubs, delivered, pairs]
        deliveries = delivery_figures(pubs, pairs, indices)
        say("routes of first copies")
        tail_from = {key: figures.metrics["latency_s"]["p99"]
                     for key, figures in deliveries.items()
                     if figures.metrics["latency_s"]["p99"] is not None}
        routes = route_counts(pairs, first_copies(facts), tail_from)
        say("delivery order")
        violations = order_violations(pubs, delivered, ordered_topics(spark, runs))
        say("payload copies and resource use")
        copies = copy_counts(facts, pubs)
        unpublished = unpublished_events(facts, delivered, pubs)
        usage = node_usage(facts)
    finally:
        for frame in reversed(cached):
            frame.unpersist()
    result = {}
    for key, (run, part) in enumerate(numbered):
        figures = deliveries[key]
        metrics = _manifest_metrics(part)
        metrics["delivery_source"] = _delivery_source(run, part)
        metrics.update(figures.metrics)
        metrics.update(_copy_metrics(copies.get(key), metrics["traced_pairs"]))
        metrics["first_copy"] = routes.get(key, {"by_via": {}, "tail_by_via": {},
                                                 "tail_from_s": None})
        metrics["order_violations"] = violations.get(key, 0)
        metrics["events_without_publish"] = unpublished.get(key, 0)
        metrics.update(_control_metrics(counts.get(key)))
        nodes = usage.get(key, [])
        metrics.update(_usage_metrics(nodes))
        metrics["bytes"]["wire_total"] = part.wire_tx_bytes
        metrics["records"] = counts.get(key, {"total": 0, "by_kind": {}, "unreadable_lines": 0})
        metrics["records"]["files"] = len(part.trace_files)
        result[(run.label, part.protocol)] = ProtocolQos(
            run=run.label, protocol=part.protocol, metrics=metrics,
            latency_quantiles=figures.latency_quantiles, nodes=nodes,
            expected_latency_quantiles=figures.expected_latency_quantiles,
            reach_quantiles=figures.reach_quantiles)
    return result


def _manifest_metrics(part: ProtocolRun) -> dict[str, Any]:
    return {
        "nodes": len(part.nodes),
        "topics": part.topics,
        "subscriptions": len(part.subscriptions),
        "faults": part.faults,
    }


def _delivery_source(run: RunInput, part: ProtocolRun) -> dict[str, Any]:
    """Where delivery and coverage come from: ``durable_logs`` (the file, relative to the run
    directory) or ``traces``; ``nodes_from_traces``: the nodes whose deliveries are taken
    from their traces because no log of theirs was read (all of them without a file)."""
    logs = part.delivery_logs
    if logs is None:
        return {"source": "traces", "file": None, "until": None,
                "nodes_from_traces": sorted(part.nodes)}
    try:
        file = str(logs.path.relative_to(run.path))
    except ValueError:
        file = str(logs.path)
    return {"source": "durable_logs", "file": file, "until": logs.until,
            "nodes_from_traces": sorted(set(part.nodes) - logs.nodes)}


def _copy_metrics(copies: dict[str, Any] | None, traced: int) -> dict[str, Any]:
    """RMR from the traces alone: copies over the delivered pairs the traces saw delivered
    (a crash cuts the two short together)."""
    total = copies["total"] if copies else 0
    return {
        "rmr": total / traced - 1 if traced else None,
        "copies": total,
        "copies_by_kind": dict(sorted(copies["by_kind"].items())) if copies else {},
        "copies_by_msg": dict(sorted(copies["by_msg"].items())) if copies else {},
    }


def _control_metrics(counts: dict[str, Any] | None) -> dict[str, int]:
    by_kind = counts["by_kind"] if counts else {}
    return {
        "duplicates": by_kind.get("duplicate", 0),
        "grafts": by_kind.get("graft", 0),
        "prunes": by_kind.get("prune", 0),
        "backfills": by_kind.get("backfill", 0),
    }


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {"mean": fmean(values) if values else None, "max": max(values) if values else None}


def _usage_metrics(nodes: list[NodeUse]) -> dict[str, Any]:
    cpu = [n.cpu_s for n in nodes]
    return {
        "bytes": {
            "nodes_sampled": len(nodes),
            "pubsub_total": sum(n.pubsub_bytes for n in nodes),
            "dht_total": sum(n.dht_bytes for n in nodes),
            "total": sum(n.total_bytes for n in nodes),
            "per_node": {
                "pubsub": _spread([n.pubsub_bytes for n in nodes]),
                "dht": _spread([n.dht_bytes for n in nodes]),
                "total": _spread([n.total_bytes for n in nodes]),
            },
        },
        "cpu_s": {**_spread(cpu), "total": sum(cpu)},
        "rss_bytes": _spread([n.rss_bytes for n in nodes]),
    }
