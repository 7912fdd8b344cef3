"""``pulsarcast bench catchup`` at a small size: each node that was away gets every missed
event, in causal order — one by walking, one by reconciliation — and the figures count
what they say."""

from __future__ import annotations

import pytest

from pulsar.tools.bench.catchup import bench_catchup

pytestmark = pytest.mark.slow


async def test_both_catch_ups_get_every_missed_event_in_order() -> None:
    figures = await bench_catchup(events=1_500, missed=0.4, timeout=60.0)
    assert figures["events"] == 1_500 and figures["missed_events"] == 600
    walk, recon = figures["walk"], figures["reconcile"]
    for mode in (walk, recon):
        # The bench raises unless the log holds all 1,500 distinct events; none came
        # before its parent, and no gap was given up on.
        assert mode["delivered_before_parent"] == 0 and mode["gaps_reported"] == 0
        assert 0 < mode["first_event_s"] <= mode["catchup_s"]
        # Every missed event came over the wire: nothing of them was in its store.
        assert mode["bytes_received"] >= figures["missed_bytes"] > 600 * 900
        assert mode["found_locally"] == 0
    # The walk: WANT after WANT, no reconciliation.
    assert walk["reconciliations"] == 0 and walk["backfilled"] == 600
    assert walk["wants_sent"] >= 2
    # Reconciliation: the first WANT's answer showed the gap was deep; the rest came by
    # ranges, fetched and delivered, none refused.
    assert recon["reconciliations"] == 1 and recon["wants_sent"] == 1
    assert recon["reconciled"] + recon["backfilled"] == 600
    assert recon["reconcile_missing"] == recon["reconcile_fetched"] == recon["reconciled"] > 0
    assert recon["reconcile_refused"] == recon["reconcile_bad_blocks"] == 0
    assert figures["speedup"] == round(walk["catchup_s"] / recon["catchup_s"], 2)
    assert figures["bytes_ratio"] == recon["bytes_ratio"] == round(
        recon["bytes_received"] / figures["missed_bytes"], 3)
    with pytest.raises(ValueError):
        await bench_catchup(events=10, missed=1.0)
    with pytest.raises(ValueError):
        await bench_catchup(events=10, order="sideways")
