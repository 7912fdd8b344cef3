"""The publish benchmark runs end to end and its figures hang together (tiny sizes)."""

from __future__ import annotations

import pytest

from pulsar.tools.bench.publish import bench_publish

pytestmark = pytest.mark.slow


async def test_publish_bench_figures_are_consistent() -> None:
    # One worker process: the default harness (subscribers out of this process), smallest.
    figures = await bench_publish(nodes=4, events=20, processes=1)
    assert figures["bench"] == "publish" and figures["nodes"] == 4
    assert figures["processes"] == 1
    for mode in ("quorum", "all_replicas"):
        assert figures[f"publish_p50_ms_{mode}"] > 0
        assert figures[f"deliveries_per_s_{mode}"] > 0
        assert figures[f"author_cpu_ms_per_publish_{mode}"] > 0
        assert figures[f"cpu_us_per_delivery_{mode}"] > 0
    ratio = figures["publish_p50_ms_quorum"] / figures["publish_p50_ms_all_replicas"]
    assert figures["publish_p50_quorum_vs_all"] == pytest.approx(ratio, rel=0.01, abs=0.002)
    assert set(figures["runs"]) == {
        f"{mode}_{name}" for mode in ("quorum", "all")
        for name in ("p50", "author_cpu", "busy", "rate", "cpu_per_delivery")
    }
    assert all(len(values) == 2 for values in figures["runs"].values())
    assert "against" not in figures


def test_a_revision_that_is_not_a_commit_is_refused_before_anything_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    from pulsar.tools.cli import main

    assert main(["bench", "publish", "--against", "no-such-revision-x9"]) == 2
    err = capsys.readouterr().err
    assert "--against no-such-revision-x9: not a commit" in err
