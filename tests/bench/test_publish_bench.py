"""The publish benchmark runs end to end and its figures hang together (tiny sizes)."""

from __future__ import annotations

import pytest

from pulsar.bench.publish import bench_publish

pytestmark = pytest.mark.slow


async def test_publish_bench_figures_are_consistent() -> None:
    figures = await bench_publish(nodes=4, events=20)
    assert figures["bench"] == "publish" and figures["nodes"] == 4
    for mode in ("quorum", "all_replicas"):
        assert figures[f"publish_p50_ms_{mode}"] > 0
        assert figures[f"deliveries_per_s_{mode}"] > 0
    ratio = figures["publish_p50_ms_quorum"] / figures["publish_p50_ms_all_replicas"]
    assert figures["publish_p50_quorum_vs_all"] == pytest.approx(ratio, rel=0.01, abs=0.002)
    assert set(figures["runs"]) == {"quorum_p50", "quorum_rate", "all_p50", "all_rate"}
