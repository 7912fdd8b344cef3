"""``pulsarcast bench catchup`` at a small size: the node that was away gets every missed
event, in causal order, and the figures count what they say."""

from __future__ import annotations

import pytest

from pulsar.tools.bench.catchup import bench_catchup

pytestmark = pytest.mark.slow


async def test_a_node_back_catches_up_every_missed_event_in_order() -> None:
    figures = await bench_catchup(events=600, missed=0.25, timeout=60.0)
    assert figures["events"] == 600 and figures["missed_events"] == 150
    # The bench raises unless the log holds all 600 distinct events; none came before its
    # parent, and no gap was given up on.
    assert figures["delivered_before_parent"] == 0 and figures["gaps_reported"] == 0
    assert 0 < figures["first_event_s"] <= figures["catchup_s"]
    # It received at least the missed events' own blocks (every one came over the wire:
    # nothing of them was in its store), walking the chain back in WANT batches.
    assert figures["backfilled"] >= 150 and figures["found_locally"] == 0
    assert figures["wants_sent"] + figures["fetches"] >= 1
    assert figures["bytes_received"] >= figures["missed_bytes"] > 150 * 900
    assert figures["bytes_ratio"] == round(figures["bytes_received"] / figures["missed_bytes"],
                                           3)
    with pytest.raises(ValueError):
        await bench_catchup(events=10, missed=1.0)
