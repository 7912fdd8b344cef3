"""Delivery metrics: what was expected, what arrived, how fast, how far, in what order.

Expected deliveries come from the manifest (subscribers of a topic) crossed with the
``publish`` records, so a node that never delivered an event still counts against the
protocol; deliveries nobody expected (relays, the publisher itself) count for nothing.
Definitions, exactly: docs/testbed.md, "The QoS report".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .qos_read import KEY

__all__ = [
    "COVERAGE_LEVELS",
    "CDF_GRID",
    "DeliveryFigures",
    "delivery_figures",
    "delivery_pairs",
    "first_deliveries",
    "order_violations",
    "publishes",
]

COVERAGE_LEVELS = (50, 90, 100)
"""Expanding coverage: percent of an event's expected subscribers reached."""

CDF_GRID = tuple(i / 1000 for i in range(1001))
"""Quantiles of latency fetched for the plots: enough points that a CDF drawn from them is
indistinguishable from one drawn from every delivery, at a fixed, small size."""

_PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class DeliveryFigures:
    """Per (run, protocol): JSON-ready metrics and the latency quantiles at ``CDF_GRID``."""

    metrics: dict[str, Any]
    latency_quantiles: list[float] | None


def publishes(records: DataFrame) -> DataFrame:
    """(run, protocol, event, topic, parent, publisher, pub_t): one row per published event.

    An event with several publish records (it should not happen) keeps its first."""
    return (records.filter(F.col("kind") == "publish").filter(F.col("event").isNotNull())
            .groupBy(*KEY, "event")
            .agg(F.min("t").alias("pub_t"),
                 F.min_by("topic", "t").alias("topic"),
                 F.min_by("parent", "t").alias("parent"),
                 F.min_by("node", "t").alias("publisher")))


def first_deliveries(records: DataFrame) -> DataFrame:
    """(run, protocol, node, event, deliver_t, hop): each node's first delivery of an event;
    repeated deliver records of the same pair count once."""
    return (records.filter(F.col("kind") == "deliver").filter(F.col("event").isNotNull())
            .groupBy(*KEY, "node", "event")
            .agg(F.min("t").alias("deliver_t"), F.min_by("hop", "t").alias("hop")))


def delivery_pairs(pubs: DataFrame, subscriptions: DataFrame, delivered: DataFrame) -> DataFrame:
    """(run, protocol, event, topic, node, pub_t, latency, hop), one row per expected pair:
    every subscriber of the event's topic except its publisher. ``latency`` (first delivery
    minus publish time) and ``hop`` are null for pairs never delivered."""
    expected = (pubs.join(F.broadcast(subscriptions), on=[*KEY, "topic"])
                .filter(F.col("subscriber") != F.col("publisher"))
                .select(*KEY, "event", "topic", F.col("subscriber").alias("node"), "pub_t"))
    return (expected.join(delivered, on=[*KEY, "node", "event"], how="left")
            .select(*KEY, "event", "topic", "node", "pub_t",
                    (F.col("deliver_t") - F.col("pub_t")).alias("latency"), "hop"))


def delivery_figures(pubs: DataFrame, pairs: DataFrame,
                     keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], DeliveryFigures]:
    """Delivery ratio, both coverages, latency percentiles, expanding coverage and hops, for
    each (run, protocol) of ``keys`` (those with nothing published get zeros and nulls)."""
    published = {_key(row): row["events"] for row in
                 pubs.groupBy(*KEY).agg(F.count("*").alias("events")).collect()}
    totals = {_key(row): row for row in _pair_totals(pairs).collect()}
    events = {_key(row): row for row in _event_totals(pairs).collect()}
    subs = {_key(row): row for row in _subscription_totals(pairs).collect()}
    figures = {}
    for key in keys:
        total, event, sub = totals.get(key), events.get(key), subs.get(key)
        metrics, quantiles = _pair_metrics(total)
        metrics["events_published"] = published.get(key, 0)
        metrics.update(_event_metrics(event))
        metrics.update(_subscription_metrics(sub))
        figures[key] = DeliveryFigures(metrics, quantiles)
    return figures


def order_violations(pubs: DataFrame, delivered: DataFrame, ordered: DataFrame) -> dict[
        tuple[str, str], int]:
    """Deliveries, on ordered topics, of an event whose parent was published but that node
    had not delivered (or published) the parent at or before that moment."""
    child = (delivered.join(pubs.select(*KEY, "event", "topic", "parent"), on=[*KEY, "event"])
             .join(F.broadcast(ordered), on=[*KEY, "topic"])
             .filter(F.col("parent").isNotNull()))
    parent = pubs.select(*KEY, F.col("event").alias("parent"),
                         F.col("publisher").alias("parent_publisher"),
                         F.col("pub_t").alias("parent_pub_t"))
    parent_delivered = delivered.select(*KEY, "node", F.col("event").alias("parent"),
                                        F.col("deliver_t").alias("parent_deliver_t"))
    checked = (child.join(parent, on=[*KEY, "parent"])
               .join(parent_delivered, on=[*KEY, "node", "parent"], how="left"))
    had_parent = (
        F.coalesce(F.col("parent_deliver_t") <= F.col("deliver_t"), F.lit(False))
        | ((F.col("parent_publisher") == F.col("node"))
           & (F.col("parent_pub_t") <= F.col("deliver_t")))
    )
    rows = checked.groupBy(*KEY).agg(F.count_if(~had_parent).alias("violations")).collect()
    return {_key(row): int(row["violations"]) for row in rows}


def _key(row: Any) -> tuple[str, str]:
    return str(row["run"]), str(row["protocol"])


def _pair_totals(pairs: DataFrame) -> DataFrame:
    points = [*_PERCENTILES, *CDF_GRID]
    return pairs.groupBy(*KEY).agg(
        F.count("*").alias("expected"),
        F.count("latency").alias("delivered"),
        F.percentile("latency", points).alias("quantiles"),
        F.max("latency").alias("latency_max"),
        F.mean("latency").alias("latency_mean"),
        F.max("hop").alias("ldh"),
        F.mean("hop").alias("mean_hop"),
    )


def _needed(level: int) -> Column:
    """Deliveries that make ``level`` percent of an event's n expected subscribers:
    ceil(n * level / 100), in integers so that 90 % of 10 is 9 and not 9.000000000000002."""
    return F.expr(f"(n * {level} + 99) div 100")


def _event_totals(pairs: DataFrame) -> DataFrame:
    per_event = (pairs.groupBy(*KEY, "event")
                 .agg(F.count("*").alias("n"), F.count("latency").alias("k"),
                      F.array_sort(F.collect_list("latency")).alias("latencies")))
    for level in COVERAGE_LEVELS:
        needed = _needed(level)
        per_event = per_event.withColumn(
            f"reach_{level}",
            F.when(F.col("k") >= needed, F.element_at("latencies", needed.cast("int"))))
    aggregates = [F.count("*").alias("events"),
                  F.count_if(F.col("k") == F.col("n")).alias("covered")]
    for level in COVERAGE_LEVELS:
        column = f"reach_{level}"
        aggregates += [F.percentile(column, 0.5).alias(f"median_{level}"),
                       F.count(column).alias(f"reached_{level}")]
    return per_event.groupBy(*KEY).agg(*aggregates)


def _subscription_totals(pairs: DataFrame) -> DataFrame:
    per_subscription = (pairs.groupBy(*KEY, "topic", "node")
                        .agg(F.count("*").alias("n"), F.count("latency").alias("k")))
    return per_subscription.groupBy(*KEY).agg(
        F.count("*").alias("subscriptions"),
        F.count_if(F.col("k") == F.col("n")).alias("covered"))


def _ratio(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole else None


def _pair_metrics(row: Any) -> tuple[dict[str, Any], list[float] | None]:
    expected = int(row["expected"]) if row else 0
    delivered = int(row["delivered"]) if row else 0
    quantiles = row["quantiles"] if row and delivered else None
    p = len(_PERCENTILES)
    metrics: dict[str, Any] = {
        "expected_pairs": expected,
        "delivered_pairs": delivered,
        "delivery_ratio": _ratio(delivered, expected),
        "latency_s": {
            "p50": quantiles[0] if quantiles else None,
            "p90": quantiles[1] if quantiles else None,
            "p99": quantiles[2] if quantiles else None,
            "max": row["latency_max"] if row else None,
            "mean": row["latency_mean"] if row else None,
        },
        "ldh": int(row["ldh"]) if row and row["ldh"] is not None else None,
        "mean_hop": row["mean_hop"] if row else None,
    }
    return metrics, (list(quantiles[p:]) if quantiles else None)


def _event_metrics(row: Any) -> dict[str, Any]:
    events = int(row["events"]) if row else 0
    covered = int(row["covered"]) if row else 0
    expanding = {}
    for level in COVERAGE_LEVELS:
        reached = int(row[f"reached_{level}"]) if row else 0
        expanding[str(level)] = {
            "median": row[f"median_{level}"] if row else None,
            "reached": reached,
            "missing": events - reached,
        }
    return {
        "events_with_subscribers": events,
        "events_covered": covered,
        "event_coverage": _ratio(covered, events),
        "expanding_coverage_s": expanding,
    }


def _subscription_metrics(row: Any) -> dict[str, Any]:
    subscriptions = int(row["subscriptions"]) if row else 0
    covered = int(row["covered"]) if row else 0
    return {
        "subscriptions_with_events": subscriptions,
        "subscriptions_covered": covered,
        "subscription_coverage": _ratio(covered, subscriptions),
    }
