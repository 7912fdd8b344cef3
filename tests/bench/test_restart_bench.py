"""``pulsarcast bench restart`` on a small scale: a ``pulsarcast node`` process that follows
a few topics is restarted with each garbage-collector mode and rejoins every tree."""

from __future__ import annotations

from pulsar.tools.bench.restart import bench_restart
from pulsar.tools.cli import main


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    assert main(["bench", "restart", "--topics", "-1"]) == 2


async def test_each_restart_rejoins_every_tree_and_says_how_long() -> None:
    figures = await bench_restart(topics=6, restarts=2)
    assert figures["trees"] == 12
    assert [r["gc"] for r in figures["runs"]] == ["default", "freeze"]
    for run in figures["runs"]:
        assert run["trees_attached"] == 12 and run["attached_s"] is not None
        assert 0 < run["api_s"] <= run["attached_s"]
        assert run["lag_ms"] >= 0  # the node reports its loop's lag
