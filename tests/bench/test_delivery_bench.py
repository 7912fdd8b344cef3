"""The delivery benchmark runs end to end and its figures hang together.

Tiny on purpose (6 nodes, 60 events, a 300-event backlog) so the suite stays fast; the
point is that every figure is present and consistent, not its value.
"""

from __future__ import annotations

import pytest

from pulsar.bench.delivery import bench_delivery

pytestmark = pytest.mark.slow

FIELDS = (
    "nodes",
    "events",
    "eventual_delivery_ratio",
    "time_to_full_delivery_s",
    "rmr",
    "backfill_events_per_s",
    "replay_local_events_per_s",
    "raw_sqlite_events_per_s",
    "replay_local_vs_raw_sqlite",
    "replay_dht_cold_events_per_s",
    "replay_from_cid_events_per_s",
    "order_violations",
    "unauthorised_deliveries",
    "timers",
)


async def test_delivery_bench_figures_are_consistent() -> None:
    # A short wait for the tree: under loss an edge may stay unconfirmed (repair covers it).
    figures = await bench_delivery(nodes=6, events=60, history=300, seed=3, tree_timeout=3.0)

    for name in FIELDS:
        assert name in figures, name
    assert figures["bench"] == "delivery"
    assert figures["nodes"] == 6 and figures["events"] == 60
    assert figures["crashed"] == 2  # 30 % of 6
    assert figures["live_subscribers"] == 6 - 1 - 2
    assert 0.0 <= figures["eventual_delivery_ratio"] <= 1.0
    if figures["eventual_delivery_ratio"] == 1.0:
        assert figures["time_to_full_delivery_s"] >= 0
    else:
        assert figures["time_to_full_delivery_s"] is None
    assert figures["duplicate_deliveries"] == 0
    assert figures["unsettled_edges"] >= 0 and figures["rmr_unsettled_edges"] >= 0
    assert figures["frames_dropped"] > 0  # the faults really were on
    assert figures["rmr"] >= 0  # every copy counted: at least one per subscriber and event
    assert figures["history_events"] == 300
    assert figures["replay_local_events"] == 301  # the backlog plus the first event
    for name in (
        "backfill_events_per_s",
        "replay_local_events_per_s",
        "raw_sqlite_events_per_s",
        "raw_sqlite_decode_events_per_s",
        "replay_dht_cold_events_per_s",
    ):
        assert figures[name] > 0, name
    assert figures["backfilled_from_peers"] >= 1
    assert 0 < figures["backfill_node_start_s"] <= figures["backfill_s"]
    assert figures["backfill_node_start_s"] <= figures["backfill_first_event_s"]
    assert figures["backfill_first_event_s"] <= figures["backfill_s"]
    assert 0 < figures["replay_dht_cold_first_event_s"] <= figures["replay_dht_cold_s"]
    ratio = figures["replay_local_events_per_s"] / figures["raw_sqlite_events_per_s"]
    assert figures["replay_local_vs_raw_sqlite"] == pytest.approx(ratio, rel=0.01, abs=0.002)
    # The soundness phase: a revocation, an author restart, an offline publisher.
    assert figures["order_violations"] == 0
    assert figures["unauthorised_deliveries"] == 0
    assert figures["soundness_missing"] == 0
    assert figures["revoked_publishes_refused"] == "10/10"


async def test_delivery_bench_rejects_a_tiny_network() -> None:
    with pytest.raises(ValueError):
        await bench_delivery(nodes=3, events=10, history=10)
