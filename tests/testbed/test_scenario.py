"""Scenario files and the workload drawn from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulsar.tools.testbed.scenario import ScenarioError, load_scenario, parse_scenario
from pulsar.tools.testbed.workload import plan_workload

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_the_scenarios_in_the_repo_load(path: Path) -> None:
    scenario = load_scenario(path)
    plan = plan_workload(scenario)
    assert scenario.name == path.stem
    assert len(plan.publishes) == scenario.workload.events
    assert all(len(t.subscribers) >= scenario.workload.min_subscribers for t in plan.topics)


def test_default_scenarios_mirror_the_thesis() -> None:
    base, latency, churn, order = (load_scenario(SCENARIOS / f"{n}.toml")
                                   for n in ("baseline", "latency", "churn", "order"))
    for s in (base, latency, churn, order):
        assert s.nodes == 100 and s.workload.topics >= 20 and s.workload.events >= 500
        assert s.protocols == ("pulsarcast", "floodsub")
    # 500 ms +- 300 ms: 200 ms fixed plus 0..600 ms uniform.
    assert latency.network.latency + latency.network.jitter / 2 == pytest.approx(0.5)
    crashed = sum(len(f.nodes) for f in plan_workload(churn).faults if f.kind == "crash")
    assert 0.1 * churn.nodes <= crashed / 2 <= 0.3 * churn.nodes  # per wave
    assert all(t.order for t in plan_workload(order).topics)


def test_popularity_is_skewed_and_the_workload_reproducible() -> None:
    scenario = parse_scenario({"nodes": 100, "workload": {"topics": 10, "events": 500}})
    plan = plan_workload(scenario)
    sizes = [len(t.subscribers) for t in plan.topics]
    assert sizes[0] == 60 and sizes[0] > sizes[4] > sizes[9]
    assert plan == plan_workload(scenario)
    per_topic = [sum(1 for p in plan.publishes if p.topic == t) for t in range(10)]
    assert per_topic[0] > per_topic[9]
    for p in plan.publishes:
        assert p.node in plan.topics[p.topic].subscribers


def test_order_topics_have_their_author_as_only_publisher() -> None:
    plan = plan_workload(parse_scenario({"nodes": 20, "workload": {
        "topics": 4, "order_topics": 2, "events": 200}}))
    for p in plan.publishes:
        topic = plan.topics[p.topic]
        if topic.order:
            assert p.node == topic.author


def test_crash_with_restart_is_two_steps_on_the_same_nodes() -> None:
    plan = plan_workload(parse_scenario({"nodes": 50, "faults": [
        {"at": 5, "kind": "crash", "fraction": 0.2, "restart_after": 10},
        {"at": 1, "kind": "partition", "nodes": [1, 2], "heal_after": 2}]}))
    kinds = [(f.kind, f.at) for f in plan.faults]
    assert kinds == [("partition", 1.0), ("heal", 3.0), ("crash", 5.0), ("restart", 15.0)]
    assert plan.faults[2].nodes == plan.faults[3].nodes and len(plan.faults[2].nodes) == 10


@pytest.mark.parametrize(("raw", "message"), [
    ({"nodez": 3}, "unknown key"),
    ({"workload": {"events": "many"}}, "must be an integer"),
    ({"workload": {"rate": 0}}, "rate must be a positive"),
    ({"network": {"loss": 1.5}}, "loss must be in"),
    ({"faults": [{"at": 1, "kind": "meteor", "fraction": 0.1}]}, "kind must be one of"),
    ({"faults": [{"at": 1, "kind": "crash"}]}, "fraction in"),
    ({"faults": [{"at": 1, "kind": "crash", "nodes": [500]}]}, "must be in 0..99"),
    ({"faults": [{"at": 1, "kind": "crash", "nodes": [1], "heal_after": 3}]}, "restart_after"),
    ({"protocols": ["gossipsub"]}, "protocols"),
])
def test_bad_scenarios_say_what_is_wrong(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(raw)


def test_a_broken_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("nodes = [")
    with pytest.raises(ScenarioError, match=r"broken\.toml: not valid TOML"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="no such scenario"):
        load_scenario(tmp_path / "missing.toml")

