"""The topics benchmark runs end to end at a tiny size and its figures hang together."""

from __future__ import annotations

import pytest

from pulsar.bench.topics import bench_topics

pytestmark = pytest.mark.slow


async def test_topics_bench_restarts_and_reattaches_every_tree() -> None:
    figures = await bench_topics(topics=20, idle=0.5)
    assert figures["topics"] == 20
    assert figures["restart_attached"] is True
    assert 0 < figures["restart_start_s"] <= figures["restart_s"]
    assert figures["create_first_s"] > 0 and figures["create_last_s"] > 0
    assert 0 <= figures["idle_cpu_share"] < 1
