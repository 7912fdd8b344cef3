"""The benchmark runs end to end (tiny, so the suite stays fast)."""

from __future__ import annotations

import pytest

from pulsar.tools.bench.dht import bench_dht

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("processes", [0, 1])
async def test_bench_reports_its_figures(processes: int) -> None:
    figures = await bench_dht(nodes=5, blocks=60, sequential_blocks=10, gets=20,
                              processes=processes)
    assert figures["replicas_mean"] == 4
    assert figures["put_per_s"] > 0 and figures["sequential_set_per_s"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["put_per_s"] / figures["sequential_set_per_s"], rel=0.02)
    assert 0 < figures["get_p50_ms"] <= figures["get_p99_ms"]
