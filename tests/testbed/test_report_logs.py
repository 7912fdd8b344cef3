"""Delivery and coverage from the durable delivery logs, not from traces a crash cuts short.

One small run, four ways: node 3 is killed right after delivering a3, so its trace lost the
deliver record (its last line is cut mid-write), and its durable delivery log either holds a3
(``complete``), really lacks it (``missing``), could not be read (``unread``), or the run has
no delivery logs at all (``no-logs``, a run made before the runner wrote them). Every figure
is worked out by hand in the tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dag.cid import CID, cid_of
from dag.store import BlockStore
from pulsar.runtime.node_state import NodeState
from pulsar.tools.testbed.delivery_logs import (
    DELIVERY_LOGS,
    STORE_FILE,
    load_delivery_logs,
    read_node_log,
    write_delivery_logs,
)
from pulsar.tools.testbed.report import MARKDOWN, build_report, run_report

from .synthetic import write_run

T0 = 1_763_900_000.0
A = "bafyA"  # author 0, subscribers 1, 2, 3
PEER = "12D3KooWpeer"
EVENTS = ("a1", "a2", "a3")  # published by node 0 at t 0, 1, 2


def _section() -> dict[str, Any]:
    return {"started": T0, "publish_start": T0, "publish_end": T0 + 3, "ended": T0 + 20,
            "nodes": [{"index": i, "peer": f"{PEER}{i}"} for i in range(4)],
            "topics": [{"cid": A, "name": "a", "author": 0, "order": False,
                        "subscribers": [1, 2, 3]}],
            "faults": [{"t": T0 + 2.2, "kind": "crash", "nodes": [3]},
                       {"t": T0 + 5, "kind": "restart", "nodes": [3]}]}


def _got(t: float, event: str, hop: int = 1) -> list[dict[str, Any]]:
    return [{"t": T0 + t, "kind": "receive", "peer": PEER, "topic": A, "event": event,
             "hop": hop, "bytes": 100, "msg": "event"},
            {"t": T0 + t, "kind": "deliver", "topic": A, "event": event, "hop": hop}]


def _traces() -> dict[int, list[dict[str, Any]]]:
    """Latencies in the traces: a1 0.1 0.2 0.3; a2 0.1 0.2 0.3; a3 0.1 0.2 and, at node 3,
    none: it delivered a3 at about 2.15 s and was killed before the record was flushed."""
    publishes = [{"t": T0 + i, "kind": "publish", "topic": A, "event": e, "parent": None,
                  "bytes": 10} for i, e in enumerate(EVENTS)]
    return {
        0: publishes,
        1: [*_got(0.1, "a1"), *_got(1.1, "a2"), *_got(2.1, "a3")],
        2: [*_got(0.2, "a1", 2), *_got(1.2, "a2", 2), *_got(2.2, "a3", 2)],
        3: [*_got(0.3, "a1", 3), *_got(1.3, "a2", 3)],
    }


_CUT = {("pulsarcast", 3): '{"t":1763900002.15,"node":3,"kind":"rece'}


def _logs(node_3: dict[str, list[str]] | None) -> dict[int, dict[str, list[str]] | None]:
    every = {A: list(EVENTS)}
    return {0: {}, 1: every, 2: every, 3: node_3}


def _run(root: Path, label: str, logs: dict[int, dict[str, list[str]] | None] | None) -> Path:
    return write_run(root / label, {"pulsarcast": _section()}, {"pulsarcast": _traces()},
                     cut=_CUT, name="churn-ish",
                     logs=None if logs is None else {"pulsarcast": logs})


def _untimed_run(root: Path) -> Path:
    """One event, one subscriber, whose deliver record the crash took: delivered, untimed."""
    section = {**_section(), "topics": [{"cid": A, "name": "a", "author": 0, "order": False,
                                         "subscribers": [3]}]}
    traces = {0: _traces()[0][:1], 3: []}
    return write_run(root / "untimed", {"pulsarcast": section}, {"pulsarcast": traces},
                     cut=_CUT, logs={"pulsarcast": {0: {}, 3: {A: ["a1"]}}})


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("logs")
    runs = [_run(root, "complete", _logs({A: list(EVENTS)})),
            _run(root, "missing", _logs({A: ["a1", "a2"]})),
            _run(root, "unread", _logs(None)),
            _run(root, "no-logs", None), _untimed_run(root)]
    path = build_report(spark, runs, root / "out", progress=False)
    return path, json.loads(path.read_text())


def _pc(report: tuple[Path, dict[str, Any]], label: str) -> dict[str, Any]:
    return report[1]["runs"][label]["protocols"]["pulsarcast"]


def test_a_delivery_the_trace_lost_counts_when_the_durable_log_has_it(
        report: tuple[Path, dict[str, Any]]) -> None:
    pc = _pc(report, "complete")
    assert pc["records"]["unreadable_lines"] == 1  # the cut line
    assert (pc["expected_pairs"], pc["delivered_pairs"]) == (9, 9)
    assert pc["delivery_ratio"] == 1.0
    assert pc["subscription_coverage"] == 1.0 and pc["event_coverage"] == 1.0
    assert pc["delivery_source"] == {"source": "durable_logs",
                                     "file": f"pulsarcast/{DELIVERY_LOGS}",
                                     "until": T0 + 20, "nodes_from_traces": []}
    # latency and hops stay the traces': over the 8 pairs with a deliver record
    assert pc["traced_pairs"] == 8
    assert pc["latency_s"]["p50"] == pytest.approx(0.2, abs=1e-6)
    assert pc["latency_s"]["max"] == pytest.approx(0.3, abs=1e-6)
    assert pc["ldh"] == 3 and pc["mean_hop"] == pytest.approx(15 / 8)
    # 8 receive records: RMR stays trace over trace
    assert pc["rmr"] == pytest.approx(0.0)
    # every event reached 100 %; a3's time to it is unknown (its third delivery's record
    # is lost), and it is not counted as never getting there
    full = pc["expanding_coverage_s"]["100"]
    assert (full["reached"], full["untimed"], full["missing"]) == (2, 1, 0)
    assert full["median"] == pytest.approx(0.3, abs=1e-6)
    half = pc["expanding_coverage_s"]["50"]  # 2 of 3: 0.2 s for each event
    assert (half["reached"], half["untimed"], half["missing"]) == (3, 0, 0)


def test_an_entry_the_durable_log_lacks_is_a_loss(report: tuple[Path, dict[str, Any]]) -> None:
    pc = _pc(report, "missing")
    assert (pc["expected_pairs"], pc["delivered_pairs"], pc["traced_pairs"]) == (9, 8, 8)
    assert pc["delivery_ratio"] == pytest.approx(8 / 9)
    assert pc["delivery_ratio"] < 1.0
    assert pc["subscription_coverage"] == pytest.approx(2 / 3)  # (A, 3) misses a3
    assert pc["event_coverage"] == pytest.approx(2 / 3)  # a3 is not everywhere
    full = pc["expanding_coverage_s"]["100"]
    assert (full["reached"], full["untimed"], full["missing"]) == (2, 0, 1)


def test_a_node_without_a_readable_log_falls_back_to_its_trace(
        report: tuple[Path, dict[str, Any]]) -> None:
    pc = _pc(report, "unread")
    assert pc["delivery_source"]["source"] == "durable_logs"
    assert pc["delivery_source"]["nodes_from_traces"] == [3]
    assert pc["delivered_pairs"] == 8 and pc["delivery_ratio"] == pytest.approx(8 / 9)


def test_a_run_without_durable_logs_says_its_delivery_comes_from_traces(
        report: tuple[Path, dict[str, Any]]) -> None:
    pc = _pc(report, "no-logs")
    # what the report said before: the lost trace tail counts as a loss
    assert pc["delivery_ratio"] == pytest.approx(8 / 9)
    assert pc["delivery_source"] == {"source": "traces", "file": None, "until": None,
                                     "nodes_from_traces": [0, 1, 2, 3]}
    # and, but for the source of delivery, the same figures as the run with complete logs
    complete = _pc(report, "complete")
    for key in ("latency_s", "ldh", "mean_hop", "rmr", "copies", "traced_pairs", "bytes"):
        assert pc[key] == complete[key], key


def test_the_markdown_says_where_delivery_comes_from(
        report: tuple[Path, dict[str, Any]]) -> None:
    markdown = (report[0].parent / MARKDOWN).read_text()
    assert "read from each node's durable delivery log at the end of the run" in markdown
    assert ("Delivery and coverage from pulsarcast: durable delivery logs "
            f"(`pulsarcast/{DELIVERY_LOGS}`).") in markdown
    assert "their traces" in markdown  # the unread node of run `unread`
    assert "**Delivery from traces** for `no-logs` pulsarcast" in markdown
    assert "| delivery ratio | higher | 1.0000 | — |" in markdown
    assert "| … of them with a deliver record (timed) | — | 8 | — |" in markdown


def test_a_bad_delivery_log_file_is_refused_before_spark(tmp_path: Path) -> None:
    run = _run(tmp_path, "bad", _logs({A: list(EVENTS)}))
    (run / "pulsarcast" / DELIVERY_LOGS).write_text('{"format": 1, "until": 1, "nodes": []}')
    with pytest.raises(ValueError, match=re.escape("'nodes' is not an object")):
        run_report([run], None)
    (run / "pulsarcast" / DELIVERY_LOGS).write_text(
        '{"format": 1, "until": 1, "nodes": {"x": {}}}')
    with pytest.raises(ValueError, match="not a node index"):
        run_report([run], None)
    (run / "pulsarcast" / DELIVERY_LOGS).write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        run_report([run], None)


def test_logs_round_trip(tmp_path: Path) -> None:
    path = tmp_path / DELIVERY_LOGS
    write_delivery_logs(path, 5.0, {2: {A: ["e1", "e2"]}, 0: {}, 1: None})
    logs = load_delivery_logs(path)
    assert logs is not None
    assert logs.until == 5.0 and logs.nodes == {0, 2}
    assert logs.entries == ((2, "e1"), (2, "e2"))
    assert load_delivery_logs(tmp_path / "none.json") is None


def _event(i: int) -> CID:
    payload = i.to_bytes(8, "big")
    return cid_of(b"\x48" + payload)  # a DAG-CBOR byte string of 8 bytes


def test_a_nodes_log_is_read_from_its_store_up_to_the_end_of_the_run(tmp_path: Path) -> None:
    topic, other = _event(1000), _event(1001)
    with BlockStore(tmp_path / STORE_FILE) as store:
        state = NodeState(store)
        state.log_append(topic, [_event(1), _event(2)], 10.0)
        state.log_append(topic, [_event(3)], 30.0)  # after the run ended: left out
        state.log_append(other, [_event(4)], 10.0)  # not a workload topic
    got = read_node_log(tmp_path, [str(topic), str(_event(1002))], until=20.0)
    assert got == {str(topic): [str(_event(1)), str(_event(2))]}
    assert read_node_log(tmp_path / "never-started", [str(topic)], until=20.0) is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / STORE_FILE).write_bytes(b"not a database at all, no")
    assert read_node_log(tmp_path / "broken", [str(topic)], until=20.0) is None


def test_a_run_whose_every_delivery_lost_its_record(report: tuple[Path, dict[str, Any]]) -> None:
    pc = _pc(report, "untimed")
    assert (pc["expected_pairs"], pc["delivered_pairs"], pc["traced_pairs"]) == (1, 1, 0)
    assert pc["delivery_ratio"] == 1.0 and pc["event_coverage"] == 1.0
    assert pc["latency_s"]["p50"] is None and pc["rmr"] is None
    full = pc["expanding_coverage_s"]["100"]
    assert (full["reached"], full["untimed"], full["missing"]) == (0, 1, 0)
    assert report[1]["runs"]["untimed"]["plots"] == {}
