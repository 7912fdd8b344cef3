"""Delivery metrics: what was expected, what arrived, how fast, how far, in what order.

Expected deliveries come from the manifest (subscribers of a topic) crossed with the
``publish`` records, so a node that never delivered an event still counts against the
protocol; deliveries nobody expected (relays, the publisher itself) count for nothing.

*Whether* an expected pair was delivered comes from the node's durable delivery log at the
end of the run (:mod:`pulsar.tools.testbed.delivery_logs`), which a SIGKILL does not cut short as
it cuts the last 0.25 s of a trace; only for a node without a readable log (or a run made
before logs were recorded) from its ``deliver`` records. *When* and *how far* come from the
traces: latency and hops are over the delivered pairs whose deliver record the traces hold
("traced" pairs); a delivered pair whose record was lost with a crashed node's trace tail
counts as delivered everywhere, but has no time. Definitions, exactly: docs/testbed.md,
"The QoS report".
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
    """Over traced delivered expected pairs only."""
    expected_latency_quantiles: list[float] | None = None
    """Over all expected pairs, ``NEVER`` for the undelivered ones: a protocol that misses
    a share s of its pairs has its top s of quantiles at ``NEVER``. Delivered pairs with no
    deliver record (no time) are left out."""
    reach_quantiles: dict[str, list[float]] | None = None
    """Per coverage level ("50", "90", "100"): the time each event with subscribers took to
    reach that share of them, ``NEVER`` for events that did not; events that did but whose
    time the traces lost are left out."""


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


def delivery_pairs(pubs: DataFrame, subscriptions: DataFrame, delivered: DataFrame,
                   logged: DataFrame, logged_nodes: DataFrame) -> DataFrame:
    """(part, event, topic, node, pub_t, delivered, latency, hop), one row per expected pair:
    every subscriber of the event's topic except its publisher.

    ``delivered``: the event is in the node's durable delivery log (``logged``: part, node,
    event), or, for a node with no log read (not in ``logged_nodes``: part, node), the node
    has a deliver record of it. ``latency`` (first deliver record minus publish time) and
    ``hop`` are those of the traces, null for pairs not delivered and for delivered pairs
    with no deliver record."""
    expected = (pubs.join(F.broadcast(subscriptions), on=[*KEY, "topic"])
                .filter(F.col("subscriber") != F.col("publisher"))
                .select(*KEY, "event", "topic", F.col("subscriber").alias("node"), "pub_t"))
    in_log = logged.withColumn("in_log", F.lit(True))
    has_log = logged_nodes.withColumn("has_log", F.lit(True))
    joined = (expected.join(delivered, on=[*KEY, "node", "event"], how="left")
              .join(in_log, on=[*KEY, "node", "event"], how="left")
              .join(F.broadcast(has_log), on=[*KEY, "node"], how="left"))
    done = F.when(F.col("has_log"), F.col("in_log").isNotNull()).otherwise(
        F.col("deliver_t").isNotNull())
    return joined.select(*KEY, "event", "topic", "node", "pub_t", done.alias("delivered"),
                         F.when(done, F.col("deliver_t") - F.col("pub_t")).alias("latency"),
                         F.when(done, F.col("hop")).alias("hop"))


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
        # null when every pair (event) in it was delivered without a time in the traces
        expected = _quantiles(total["expected_quantiles"]) if total else None
        reach = ({str(level): _quantiles(event[f"reach_quantiles_{level}"]) or [NEVER] * len(
                  CDF_GRID) for level in COVERAGE_LEVELS} if event else None)
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


def _quantiles(values: Any) -> list[float] | None:
    return None if values is None else list(values)


def _key(row: Any) -> int:
    return int(row["part"])


def _pair_totals(pairs: DataFrame) -> DataFrame:
    return pairs.groupBy(*KEY).agg(
        F.count("*").alias("expected"),
        F.count_if("delivered").alias("delivered"),
        F.count("latency").alias("traced"),
        F.percentile("latency", list(_PERCENTILES)).alias("percentiles"),
        F.percentile_approx("latency", list(CDF_GRID), _CDF_ACCURACY).alias("quantiles"),
        # undelivered pairs at NEVER; delivered ones without a time (null) are left out
        F.percentile_approx(F.when(~F.col("delivered"), F.lit(NEVER)).otherwise(
            F.col("latency")), list(CDF_GRID), _CDF_ACCURACY).alias("expected_quantiles"),
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
    """Per event: n expected subscribers, k that delivered it (durable logs), and the sorted
    latencies of the traced deliveries. An event reaches a level when k does; the time it
    took is the needed-th traced latency, unknown ("untimed") when the traces hold fewer
    (a delivery whose record a crash cut off)."""
    per_event = (pairs.groupBy(*KEY, "event")
                 .agg(F.count("*").alias("n"), F.count_if("delivered").alias("k"),
                      F.array_sort(F.collect_list("latency")).alias("latencies")))
    for level in COVERAGE_LEVELS:
        needed = _needed(level)
        per_event = (per_event
                     .withColumn(f"at_{level}", F.col("k") >= needed)
                     .withColumn(f"reach_{level}", F.when(
                         F.col(f"at_{level}") & (F.size("latencies") >= needed),
                         F.element_at("latencies", needed.cast("int")))))
    aggregates = [F.count("*").alias("events"),
                  F.count_if(F.col("k") == F.col("n")).alias("covered")]
    for level in COVERAGE_LEVELS:
        column, at = f"reach_{level}", F.col(f"at_{level}")
        aggregates += [F.percentile(column, 0.5).alias(f"median_{level}"),
                       F.count(column).alias(f"reached_{level}"),
                       F.count_if(at & F.col(column).isNull()).alias(f"untimed_{level}"),
                       F.percentile_approx(F.when(~at, F.lit(NEVER)).otherwise(F.col(column)),
                                           list(CDF_GRID),
                                           _CDF_ACCURACY).alias(f"reach_quantiles_{level}")]
    return per_event.groupBy(*KEY).agg(*aggregates)


def _subscription_totals(pairs: DataFrame) -> DataFrame:
    per_subscription = (pairs.groupBy(*KEY, "topic", "node")
                        .agg(F.count("*").alias("n"), F.count_if("delivered").alias("k")))
    return per_subscription.groupBy(*KEY).agg(
        F.count("*").alias("subscriptions"),
        F.count_if(F.col("k") == F.col("n")).alias("covered"))


def _ratio(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole else None


def _pair_metrics(row: Any) -> tuple[dict[str, Any], list[float] | None]:
    expected = int(row["expected"]) if row else 0
    delivered = int(row["delivered"]) if row else 0
    traced = int(row["traced"]) if row else 0
    percentiles = row["percentiles"] if row and traced else None
    quantiles = row["quantiles"] if row and traced else None
    metrics: dict[str, Any] = {
        "expected_pairs": expected,
        "delivered_pairs": delivered,
        "traced_pairs": traced,
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
        untimed = int(row[f"untimed_{level}"]) if row else 0
        expanding[str(level)] = {
            "median": row[f"median_{level}"] if row else None,
            "reached": reached,
            "untimed": untimed,
            "missing": events - reached - untimed,
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
