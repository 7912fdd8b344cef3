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
    "NEVER",
    "DeliveryFigures",
    "delivery_figures",
    "delivery_pairs",
    "first_deliveries",
    "order_violations",
    "publishes",
]

COVERAGE_LEVELS = (50, 90, 100)
"""Expanding coverage: percent of an event's expected subscribers reached."""

CDF_GRID = tuple([i / 100 for i in range(95)] + [i / 1000 for i in range(950, 1001)])
"""Quantiles of latency fetched for the plots, every 1 % and every 0.1 % in the last 5 %
where the tail stretches out: a CDF drawn from them looks like one drawn from every delivery,
at a fixed, small size."""

_PERCENTILES = (0.5, 0.9, 0.99)
"""Reported exactly (Spark's ``percentile``: linear interpolation between closest ranks)."""

_CDF_ACCURACY = 10_000
"""The plotted quantiles come from ``percentile_approx`` (rank error at most n / 10,000):
exact ``percentile`` costs time in proportion to the number of quantiles asked (20 s for a
1,001-point grid on a 100-node run, against about 1 s for this)."""


NEVER = float("inf")
"""The latency given to an expected pair that was never delivered, and the time to a
coverage level given to an event that never reached it: so that quantiles taken over *all*
expected pairs (or events) put the losses at the far end instead of leaving them out."""


@dataclass(frozen=True)
class DeliveryFigures:
    """Per part: JSON-ready metrics and the plot series, quantiles at ``CDF_GRID``."""

    metrics: dict[str, Any]
    latency_quantiles: list[float] | None
    """Over delivered expected pairs only."""
    expected_latency_quantiles: list[float] | None = None
    """Over all expected pairs, ``NEVER`` for the undelivered ones: a protocol that misses
    a share s of its pairs has its top s of quantiles at ``NEVER``."""
    reach_quantiles: dict[str, list[float]] | None = None
    """Per coverage level ("50", "90", "100"): the time each event with subscribers took to
    reach that share of them, ``NEVER`` for events that did not."""


def publishes(facts: DataFrame) -> DataFrame:
    """(part, event, topic, parent, publisher, pub_t): one row per published event.

    An event with publish records at several nodes (it should not happen) keeps the first."""
    return (facts.filter(F.col("kind") == "publish").filter(F.col("event").isNotNull())
            .groupBy(*KEY, "event")
            .agg(F.min("t").alias("pub_t"),
                 F.min_by("topic", "t").alias("topic"),
                 F.min_by("parent", "t").alias("parent"),
                 F.min_by("node", "t").alias("publisher")))


def first_deliveries(facts: DataFrame) -> DataFrame:
    """(part, node, event, deliver_t, hop): each node's first delivery of an event (the fold
    made repeated deliver records of a pair one row, with the first one's time and hop)."""
    return (facts.filter(F.col("kind") == "deliver").filter(F.col("event").isNotNull())
            .select(*KEY, "node", "event", F.col("t").alias("deliver_t"), "hop"))


def delivery_pairs(pubs: DataFrame, subscriptions: DataFrame, delivered: DataFrame) -> DataFrame:
    """(part, event, topic, node, pub_t, latency, hop), one row per expected pair:
    every subscriber of the event's topic except its publisher. ``latency`` (first delivery
    minus publish time) and ``hop`` are null for pairs never delivered."""
    expected = (pubs.join(F.broadcast(subscriptions), on=[*KEY, "topic"])
                .filter(F.col("subscriber") != F.col("publisher"))
                .select(*KEY, "event", "topic", F.col("subscriber").alias("node"), "pub_t"))
    return (expected.join(delivered, on=[*KEY, "node", "event"], how="left")
            .select(*KEY, "event", "topic", "node", "pub_t",
                    (F.col("deliver_t") - F.col("pub_t")).alias("latency"), "hop"))


def delivery_figures(pubs: DataFrame, pairs: DataFrame,
                     keys: Iterable[int]) -> dict[int, DeliveryFigures]:
    """Delivery ratio, both coverages, latency percentiles, expanding coverage and hops, for
    each part in ``keys`` (those with nothing published get zeros and nulls)."""
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
        expected = list(total["expected_quantiles"]) if total else None
        reach = ({str(level): list(event[f"reach_quantiles_{level}"])
                  for level in COVERAGE_LEVELS} if event else None)
        figures[key] = DeliveryFigures(metrics, quantiles, expected, reach)
    return figures


def order_violations(pubs: DataFrame, delivered: DataFrame,
                     ordered: DataFrame) -> dict[int, int]:
    """Deliveries, on ordered topics, of an event whose parent was published but that node
    had not delivered (or published) the parent at or before that moment.

    The few events of ordered topics that have a published parent are picked first, so the
    joins with the deliveries are broadcast joins against a small table."""
    parent = pubs.select(*KEY, F.col("event").alias("parent"),
                         F.col("publisher").alias("parent_publisher"),
                         F.col("pub_t").alias("parent_pub_t"))
    children = (pubs.join(F.broadcast(ordered), on=[*KEY, "topic"])
                .filter(F.col("parent").isNotNull())
                .select(*KEY, "event", "parent")
                .join(parent, on=[*KEY, "parent"]))
    child = delivered.join(F.broadcast(children), on=[*KEY, "event"])
    parent_delivered = (
        delivered.join(F.broadcast(children.select(*KEY, F.col("parent").alias("event"))),
                       on=[*KEY, "event"], how="left_semi")
        .select(*KEY, "node", F.col("event").alias("parent"),
                F.col("deliver_t").alias("parent_deliver_t")))
    checked = child.join(parent_delivered, on=[*KEY, "node", "parent"], how="left")
    had_parent = (
        F.coalesce(F.col("parent_deliver_t") <= F.col("deliver_t"), F.lit(False))
        | ((F.col("parent_publisher") == F.col("node"))
           & (F.col("parent_pub_t") <= F.col("deliver_t")))
    )
    rows = checked.groupBy(*KEY).agg(F.count_if(~had_parent).alias("violations")).collect()
    return {_key(row): int(row["violations"]) for row in rows}


def _key(row: Any) -> int:
    return int(row["part"])


def _pair_totals(pairs: DataFrame) -> DataFrame:
    return pairs.groupBy(*KEY).agg(
        F.count("*").alias("expected"),
        F.count("latency").alias("delivered"),
        F.percentile("latency", list(_PERCENTILES)).alias("percentiles"),
        F.percentile_approx("latency", list(CDF_GRID), _CDF_ACCURACY).alias("quantiles"),
        F.percentile_approx(F.coalesce("latency", F.lit(NEVER)), list(CDF_GRID),
                            _CDF_ACCURACY).alias("expected_quantiles"),
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
                       F.count(column).alias(f"reached_{level}"),
                       F.percentile_approx(F.coalesce(column, F.lit(NEVER)), list(CDF_GRID),
                                           _CDF_ACCURACY).alias(f"reach_quantiles_{level}")]
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
    percentiles = row["percentiles"] if row and delivered else None
    quantiles = row["quantiles"] if row and delivered else None
    metrics: dict[str, Any] = {
        "expected_pairs": expected,
        "delivered_pairs": delivered,
        "delivery_ratio": _ratio(delivered, expected),
        "latency_s": {
            "p50": percentiles[0] if percentiles else None,
            "p90": percentiles[1] if percentiles else None,
            "p99": percentiles[2] if percentiles else None,
            "max": row["latency_max"] if row else None,
            "mean": row["latency_mean"] if row else None,
        },
        "ldh": int(row["ldh"]) if row and row["ldh"] is not None else None,
        "mean_hop": row["mean_hop"] if row else None,
    }
    return metrics, (list(quantiles) if quantiles else None)


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
