"""``pulsarcast sim`` at 200 nodes: every scenario delivers everything, within iroh-gossip's
thresholds, with the invariants holding. The large runs are benchmarks (docs/simulator.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pulsar.tools.cli import main
from pulsar.tools.sim.scenarios import SimOptions, run_sim

NODES = 200


def _run(**kw: Any) -> dict[str, Any]:
    result = run_sim(SimOptions(nodes=NODES, events=kw.pop("events", 20), **kw))
    assert result["published"] > 0
    return result


def _sound(result: dict[str, Any]) -> None:
    assert result["missed"] == 0, result
    assert result["delivered"] == result["expected"] > 0
    assert result["duplicates"] == 0
    # A gap that times out releases what waited behind it (reported as GapReported):
    # those are the only order violations allowed.
    assert result["order_violations_unreported"] == 0
    assert result["invariants"] == {"tree_cycles": 0, "asymmetric_tree_edges": 0,
                                    "unattached_members": 0}


@pytest.mark.parametrize(("scenario", "events", "max_rmr", "max_ldh"), [
    ("single", 20, 0.2, 15),
    ("random", 20, 1.0, 18),
    ("all", 1, 3.0, 30),
])
def test_iroh_gossip_scenarios_meet_its_thresholds(
    scenario: str, events: int, max_rmr: float, max_ldh: int,
) -> None:
    result = _run(scenario=scenario, events=events)
    _sound(result)
    assert result["rmr"] < max_rmr and result["ldh"] < max_ldh, result
    expected_events = NODES if scenario == "all" else events
    assert result["published"] == expected_events


@pytest.mark.parametrize("scenario", ["churn", "partition", "offline-author", "late-subscriber"])
def test_our_scenarios_lose_nothing_under_ten_percent_loss(scenario: str) -> None:
    result = _run(scenario=scenario, loss=0.1)
    _sound(result)
    assert result["rmr"] < 1.0, result


def test_churn_without_restarts_still_reaches_every_live_subscriber() -> None:
    result = _run(scenario="churn", loss=0.1, restart=False)
    _sound(result)
    assert result["faults"]["crashed_for_good"] == int(NODES * 0.3)


def test_floodsub_runs_the_same_scenario_for_comparison() -> None:
    pulsar = _run(scenario="single", events=5)
    flood = _run(scenario="single", events=5, protocol="floodsub")
    assert flood["missed"] == 0 and flood["invariants"] == {}
    # Floodsub sends every event to every subscribed peer it knows.
    assert flood["rmr"] > 20 * max(pulsar["rmr"], 0.01)
    assert flood["bytes"]["total"] > 5 * pulsar["bytes"]["total"]


def test_a_lossy_floodsub_misses_what_pulsarcast_repairs() -> None:
    flood = _run(scenario="churn", events=10, protocol="floodsub")
    assert flood["missed"] > 0  # crashed nodes come back without what they missed


def test_the_command_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--nodes", "30", "--events", "3", "--latency-ms", "5-20",
                 "--seed", "4", "-q"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    result = json.loads(out[0])
    for key in ("nodes", "scenario", "protocol", "seed", "expected", "delivered", "missed",
                "duplicates", "rmr", "ldh", "latency_ms", "bytes", "order_violations",
                "wall_s", "peak_rss_mb"):
        assert key in result
    assert result["nodes"] == 30 and result["seed"] == 4 and result["missed"] == 0
    assert result["latency_range_ms"] == [5.0, 20.0]
    assert set(result["latency_ms"]) == {"p50", "p90", "p99", "max"}
    assert result["bytes"]["total"] == sum(v for k, v in result["bytes"].items() if k != "total")


def test_the_same_seed_gives_the_same_run() -> None:
    one = run_sim(SimOptions(nodes=40, events=5, seed=9, loss=0.1))
    two = run_sim(SimOptions(nodes=40, events=5, seed=9, loss=0.1))
    for key in ("expected", "delivered", "rmr", "ldh", "latency_ms", "bytes", "messages"):
        assert one[key] == two[key], key


@pytest.mark.parametrize("argv", [
    ["--nodes", "1"],
    ["--scenario", "nope"],
    ["--latency-ms", "50-10"],
    ["--loss", "1.5"],
    ["--topics", "0"],
])
def test_bad_options_are_refused_with_exit_status_2(
    argv: list[str], capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc_info:
        code = main(["sim", "-q", *argv])
        raise SystemExit(code)
    assert exc_info.value.code == 2
    assert "pulsarcast sim" in capsys.readouterr().err


def test_a_run_does_not_depend_on_the_hash_seed() -> None:
    """Sets of peer ids iterate in hash order, which changes with each process: the
    simulator must not let that order decide anything, or "--seed" would not reproduce."""
    import os
    import subprocess
    import sys

    def once(hash_seed: str) -> dict[str, Any]:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-m", "pulsar", "sim", "--nodes", "40", "--events", "5",
             "--scenario", "churn", "--loss", "0.1", "-q"],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        ).stdout
        result: dict[str, Any] = json.loads(out)
        for volatile in ("wall_s", "peak_rss_mb"):
            del result[volatile]
        return result

    assert once("1") == once("2")
