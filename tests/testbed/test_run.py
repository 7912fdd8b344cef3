"""The testbed end to end: the 10-node smoke scenario, both protocols, real processes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pulsar.tools.testbed.delivery_logs import DELIVERY_LOGS, load_delivery_logs
from pulsar.tools.testbed.manifest import load_manifest
from pulsar.tools.testbed.runner import run_scenario
from pulsar.tools.testbed.scenario import load_scenario
from pulsar.tools.testbed.workload import plan_workload

SMOKE = Path(__file__).resolve().parents[2] / "scenarios" / "smoke.toml"

pytestmark = pytest.mark.slow


def _records(path: Path) -> list[dict[str, object]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by the crash
            continue
    return out


async def test_smoke_scenario_runs_both_protocols_under_faults(tmp_path: Path) -> None:
    scenario = load_scenario(SMOKE)
    plan = plan_workload(scenario)
    run_dir = tmp_path / "run"
    await run_scenario(scenario, run_dir, progress=False)

    manifest = load_manifest(run_dir)
    assert set(manifest["protocols"]) == {"pulsarcast", "floodsub"}
    crashed = next(f.nodes for f in plan.faults if f.kind == "crash")
    for protocol, run in manifest["protocols"].items():
        assert [n["index"] for n in run["nodes"]] == list(range(10))
        assert [t["subscribers"] for t in run["topics"]] == [
            list(t.subscribers) for t in plan.topics]
        assert [f["kind"] for f in run["faults"]] == ["partition", "crash", "heal", "restart"]
        traces = {p.name: _records(p) for p in (run_dir / protocol).glob("node-*.jsonl")}
        assert len(traces) == 10
        kinds = Counter(r["kind"] for records in traces.values() for r in records)
        published = Counter(r["node"] for records in traces.values() for r in records
                            if r["kind"] == "publish")
        planned = Counter(p.node for p in plan.publishes)
        # Every node published its whole timetable, but the crashed one, which misses
        # what fell while it was down (and restarting).
        for node in range(10):
            if node in crashed:
                down = sum(1 for p in plan.publishes if p.node == node and 0.5 <= p.at < 1.5)
                assert published[node] <= planned[node] - down
            else:
                assert published[node] == planned[node], node
        assert kinds["deliver"] > 0 and kinds["receive"] > 0 and kinds["sample"] > 0
        # The crashed node came back as a second life, counters from zero.
        lives = {r["life"] for r in traces[f"node-{crashed[0]}.jsonl"] if r["kind"] == "sample"}
        assert lives == {0, 1}
        assert run["delivered_log_entries"] <= run["expected_log_entries"]
        # Every node's durable delivery log, the crashed one's included, is in the run
        # directory; it holds events at subscribers of their topic only.
        logs = load_delivery_logs(run_dir / protocol / DELIVERY_LOGS)
        assert logs is not None and logs.nodes == set(range(10))
        assert run["delivery_logs"] == {"file": f"{protocol}/{DELIVERY_LOGS}",
                                        "entries": len(logs.entries), "unreadable_nodes": []}
        assert logs.until == run["ended"]
        publishes = {r["event"]: r for records in traces.values() for r in records
                     if r["kind"] == "publish"}
        subscribers = {t["cid"]: set(t["subscribers"]) for t in run["topics"]}
        in_log = set(logs.entries)
        for node, event in in_log:
            # (an event the crashed node sent but was killed before acknowledging has no
            # publish record: a publish is traced when it is acknowledged)
            if event in publishes:
                assert node in subscribers[str(publishes[event]["topic"])]
        if protocol == "pulsarcast":
            # eventual delivery, in the durable logs: every event a node that was never
            # killed published is in the log of every other subscriber of its topic
            for event, record in publishes.items():
                if record["node"] in crashed:
                    continue
                for node in subscribers[str(record["topic"])] - {record["node"]}:
                    assert (node, event) in in_log, (node, event)

    pulsarcast = manifest["protocols"]["pulsarcast"]
    # Eventual delivery through 10% loss, a partition and a crash: every expected entry of
    # every subscriber's delivery log (the restarted node's included) is there. Publishes the
    # crashed node had not acknowledged when it was killed (it runs late under load) may or
    # may not have gone out: only those are uncertain.
    certain = pulsarcast["expected_log_entries"] - pulsarcast["uncertain_log_entries"]
    assert certain <= pulsarcast["delivered_log_entries"] <= pulsarcast["expected_log_entries"]
    # (The kill comes a little after the fault's 0.5 s; surely before the restart at 1.5 s.)
    due_before_restart = sum(len(plan.topics[p.topic].subscribers) for p in plan.publishes
                             if p.node in crashed and p.at < 1.5)
    assert pulsarcast["uncertain_log_entries"] <= due_before_restart
    grafts_or_wants = Counter(
        r["kind"] for p in (run_dir / "pulsarcast").glob("node-*.jsonl") for r in _records(p))
    assert grafts_or_wants["graft"] + grafts_or_wants["backfill"] > 0  # repair did work
    floodsub_kinds = Counter(
        r["kind"] for p in (run_dir / "floodsub").glob("node-*.jsonl") for r in _records(p))
    assert floodsub_kinds["graft"] == floodsub_kinds["backfill"] == 0  # no repair there
