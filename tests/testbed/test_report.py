"""The QoS report job on small synthetic runs whose answers are worked out by hand below.

The main run (``known``) has six nodes and two topics for Pulsarcast, and a one-event Floodsub
half whose only job is to make the comparison ratios known. Every expected figure is derived
in a comment from the records, not read back from the job.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pulsar.tools.cli import main as cli_main
from pulsar.tools.testbed.report import MARKDOWN, build_report, default_out_dir, run_report
from pulsar.tools.testbed.report_headline import TIMES
from pulsar.tools.testbed.report_inputs import load_runs

from .synthetic import write_run

T0 = 1_763_900_000.0
A, B = "bafyA", "bafyB"  # topic A: subscribers 1-4, not ordered; B: subscribers 0, 2, 5, ordered
G = "bafyG"  # Floodsub's ordered topic
PEER = "12D3KooWpeer"


def _section(topics: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    return {"started": T0, "publish_start": T0, "publish_end": T0 + 10, "ended": T0 + 20,
            "nodes": [{"index": i, "peer": f"{PEER}{i}"} for i in range(nodes)],
            "topics": topics, "faults": []}


def _publish(t: float, topic: str, event: str, parent: str | None = None) -> dict[str, Any]:
    return {"t": T0 + t, "kind": "publish", "topic": topic, "event": event, "parent": parent,
            "bytes": 10}


def _got(t: float, topic: str, event: str, hop: int, msg: str = "event") -> list[dict[str, Any]]:
    """A first copy taken in and delivered at once."""
    return [{"t": T0 + t, "kind": "receive", "peer": PEER, "topic": topic, "event": event,
             "hop": hop, "bytes": 100, "msg": msg},
            {"t": T0 + t, "kind": "deliver", "topic": topic, "event": event, "hop": hop}]


def _sample(t: float, sent: int, dht: int, cpu: float, rss: int, life: int) -> dict[str, Any]:
    return {"t": T0 + t, "kind": "sample", "cpu_s": cpu, "rss": rss, "sent_bytes": sent,
            "recv_bytes": 0, "dht_sent_bytes": dht, "dht_recv_bytes": 0, "life": life}


def _known_pulsarcast() -> dict[int, list[dict[str, Any]]]:
    """Publishes: a1 (t 0), a2 (t 1) by node 0 on A; a3 (t 2, parent a2) by node 1 on A;
    b1 (t 3), b2 (t 4, parent b1) by node 0 on B. Latency of each delivery = its t minus the
    publish t; the hop is the third argument of ``_got``."""
    dup = {"kind": "duplicate", "peer": PEER, "bytes": 100, "msg": "event"}
    return {
        0: [_publish(0, A, "a1"), {"t": T0, "kind": "deliver", "topic": A, "event": "a1",
                                   "hop": 0},
            _publish(1, A, "a2"),
            _publish(3, B, "b1"), {"t": T0 + 3, "kind": "deliver", "topic": B, "event": "b1",
                                   "hop": 0},
            _publish(4, B, "b2", parent="b1"),
            {"t": T0 + 0.5, "kind": "send", "peer": PEER, "topic": A, "event": "a1", "hop": 1,
             "bytes": 100, "msg": "event"},
            {"t": T0 + 0.6, "kind": "prune", "peer": PEER, "topic": A, "bytes": 20},
            _sample(0, 100, 10, 0.5, 1000, 0), _sample(1, 300, 30, 1.0, 3000, 0)],
        1: [*_got(0.10, A, "a1", 1), *_got(1.15, A, "a2", 1), _publish(2, A, "a3", "a2"),
            # an event nobody published (its publisher lost the record): not counted
            *_got(5, A, "x9", 1),
            {"t": T0 + 6, "kind": "graft", "peer": PEER, "topic": A, "event": "a2", "bytes": 30},
            _sample(5, 500, 0, 2.0, 4000, 0)],
        2: [*_got(0.20, A, "a1", 1), {**dup, "t": T0 + 0.21, "topic": A, "event": "a1", "hop": 2},
            *_got(1.25, A, "a2", 2), *_got(2.05, A, "a3", 1),
            *_got(3.12, B, "b1", 1), *_got(4.08, B, "b2", 1),
            {"t": T0 + 7, "kind": "graft", "peer": PEER, "topic": B, "event": "b2", "bytes": 30}],
        3: [*_got(0.30, A, "a1", 2), *_got(1.35, A, "a2", 2), *_got(2.50, A, "a3", 2),
            {**dup, "t": T0 + 2.6, "topic": A, "event": "a3", "hop": 3},
            # delivered again (after a restart): the pair counts once, with its first time
            {"t": T0 + 2.9, "kind": "deliver", "topic": A, "event": "a3", "hop": 5},
            _sample(0, 50, 5, 0.2, 2000, 0), _sample(1, 80, 8, 0.4, 2500, 0),
            _sample(3, 20, 2, 0.1, 1500, 1), _sample(4, 70, 7, 0.3, 1800, 1)],
        # node 4 misses a2 and gets a3 by backfill; A is not ordered, so no order violation
        4: [*_got(0.40, A, "a1", 3), *_got(3.00, A, "a3", 4, msg="blocks"),
            {"t": T0 + 2.8, "kind": "backfill", "peer": PEER, "topic": A, "event": "a3",
             "bytes": 40}],
        # node 5 is no subscriber of A: its copy counts, its delivery does not; it misses b1
        # and delivers b2 from the DHT: an order violation on B
        5: [*_got(0.05, A, "a1", 7), *_got(4.60, B, "b2", 2, msg="dht")],
    }


def _known_floodsub() -> dict[int, list[dict[str, Any]]]:
    """f1 on topic F by node 0, delivered by 1 and 2; g1 then g2 (parent g1) on the ordered
    topic G by node 0, delivered by node 1 in the wrong order. Node 0 sent twice the bytes
    of all Pulsarcast nodes together (995 * 2 = 1990)."""
    return {
        0: [_publish(0, "bafyF", "f1"), _sample(9, 1900, 90, 3.0, 9000, 0),
            _publish(1, G, "g1"), _publish(2, G, "g2", parent="g1"),
            # its own g2, no deliver record of g1: it published g1, so in order
            {"t": T0 + 2, "kind": "deliver", "topic": G, "event": "g2", "hop": 0}],
        1: [*_got(0.01, "bafyF", "f1", 1), *_got(2.01, G, "g2", 1), *_got(2.02, G, "g1", 1)],
        2: [*_got(0.03, "bafyF", "f1", 1),
            {"t": T0 + 0.04, "kind": "duplicate", "peer": PEER, "topic": "bafyF", "event": "f1",
             "hop": 2, "bytes": 100, "msg": "event"}],
    }


def _known_run(root: Path) -> Path:
    topics = [{"cid": A, "name": "a", "author": 0, "order": False, "subscribers": [1, 2, 3, 4]},
              {"cid": B, "name": "b", "author": 0, "order": True, "subscribers": [0, 2, 5]}]
    flood = [{"cid": "bafyF", "name": "f", "author": 0, "order": False, "subscribers": [1, 2]},
             {"cid": G, "name": "g", "author": 0, "order": True, "subscribers": [1]}]
    return write_run(
        root / "known",
        {"pulsarcast": _section(topics, 6), "floodsub": _section(flood, 3)},
        {"pulsarcast": _known_pulsarcast(), "floodsub": _known_floodsub()},
        # node 3 was killed in the middle of writing a record
        cut={("pulsarcast", 3): '{"t":1763900005.5,"node":3,"kind":"deliv'},
        name="known-answers")


def _silent_run(root: Path) -> Path:
    """One event expected at nodes 1 and 2 and delivered nowhere; node 1's file is empty.
    The directory has the same name as the known run's, so the labels must differ."""
    topics = [{"cid": A, "name": "a", "author": 0, "order": False, "subscribers": [1, 2]}]
    return write_run(root / "known", {"pulsarcast": _section(topics, 3)},
                     {"pulsarcast": {0: [_publish(0, A, "a1")], 1: []}})


@pytest.fixture(scope="module")
def known(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One report over both runs: Spark's fixed cost per query dominates on data this small,
    so every test reads this one summary."""
    root = tmp_path_factory.mktemp("report")
    runs = [_known_run(root / "a"), _silent_run(root / "b")]
    summary_path = build_report(spark, runs, root / "out", progress=False)
    return summary_path, json.loads(summary_path.read_text())


@pytest.fixture
def pc(known: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    return known[1]["runs"]["known"]["protocols"]["pulsarcast"]


def test_summary_names_the_runs(known: tuple[Path, dict[str, Any]]) -> None:
    path, summary = known
    assert path == path.parent / "summary.json" and path.parent.name == "out"
    assert list(summary["runs"]) == ["known", "known-2"]
    assert summary["runs"]["known"]["name"] == "known-answers"
    assert summary["runs"]["known"]["path"].endswith("a/known")


def test_default_output_directory(tmp_path: Path) -> None:
    assert default_out_dir([tmp_path / "run"]) == tmp_path / "run" / "report"
    assert default_out_dir([tmp_path / "a", tmp_path / "b"]) == Path("report")


def test_delivery_ratio_and_both_coverages(pc: dict[str, Any]) -> None:
    # expected pairs: a1 → 1,2,3,4; a2 → 1,2,3,4; a3 → 2,3,4 (1 published it);
    # b1, b2 → 2,5 (0 published them): 4 + 4 + 3 + 2 + 2 = 15
    assert pc["events_published"] == 5
    assert pc["expected_pairs"] == 15
    # missing: (4, a2) and (5, b1); node 5's a1 and the publisher's own are not expected
    assert pc["delivered_pairs"] == 13
    assert pc["delivery_ratio"] == pytest.approx(13 / 15)
    # subscriptions with expected events: (A,1) (A,2) (A,3) (A,4) (B,2) (B,5) — (B,0) has
    # none, node 0 published every B event; (A,4) misses a2, (B,5) misses b1
    assert pc["subscriptions"] == 7
    assert pc["subscriptions_with_events"] == 6
    assert pc["subscriptions_covered"] == 4
    assert pc["subscription_coverage"] == pytest.approx(4 / 6)
    # events delivered to every expected subscriber: a1, a3, b2 of 5
    assert pc["events_covered"] == 3
    assert pc["event_coverage"] == pytest.approx(3 / 5)


def test_latency_percentiles_are_exact(pc: dict[str, Any]) -> None:
    latencies = sorted([0.10, 0.20, 0.30, 0.40,  # a1 at 1, 2, 3, 4
                        0.15, 0.25, 0.35,        # a2 at 1, 2, 3
                        0.05, 0.50, 1.00,        # a3 at 2, 3 (first delivery), 4
                        0.12,                    # b1 at 2
                        0.08, 0.60])             # b2 at 2, 5
    # linear interpolation between closest ranks: the value at rank p * (n - 1), n = 13
    assert latencies[6] == 0.25                  # p50: rank 6
    p90 = 0.50 + 0.8 * (0.60 - 0.50)             # rank 10.8 between 0.50 and 0.60
    p99 = 0.60 + 0.88 * (1.00 - 0.60)            # rank 11.88 between 0.60 and 1.00
    got = pc["latency_s"]
    assert got["p50"] == pytest.approx(0.25, abs=1e-6)
    assert got["p90"] == pytest.approx(p90, abs=1e-6)
    assert got["p99"] == pytest.approx(p99, abs=1e-6)
    assert got["max"] == pytest.approx(1.00, abs=1e-6)
    assert got["mean"] == pytest.approx(sum(latencies) / 13, abs=1e-6)


def test_expanding_coverage(pc: dict[str, Any]) -> None:
    # time for ceil(level% * n) of an event's n expected subscribers to have it:
    #   a1 (n 4): 50 % → 2nd = 0.2, 90 % and 100 % → 4th = 0.4
    #   a2 (n 4, 3 delivered): 50 % → 0.25; never 90 % (needs 4)
    #   a3 (n 3): 50 % → 2nd = 0.5; 90 % → 3rd = 1.0
    #   b1 (n 2, 1 delivered): 50 % → 0.12; never 90 %
    #   b2 (n 2): 50 % → 0.08; 90 % → 0.6
    reach = pc["expanding_coverage_s"]
    assert reach["50"]["median"] == pytest.approx(0.2, abs=1e-6)   # of .08 .12 .2 .25 .5
    assert (reach["50"]["reached"], reach["50"]["missing"]) == (5, 0)
    assert reach["90"]["median"] == pytest.approx(0.6, abs=1e-6)   # of .4 .6 1.0
    assert (reach["90"]["reached"], reach["90"]["missing"]) == (3, 2)
    assert reach["100"]["median"] == pytest.approx(0.6, abs=1e-6)
    assert reach["100"]["missing"] == 2


def test_rmr_counts_every_copy(pc: dict[str, Any]) -> None:
    # copies of published events: 13 first copies at expected pairs + node 5's a1 + the
    # duplicates at 2 (a1) and 3 (a3) = 16; x9 was never published and is left out
    assert pc["copies"] == 16
    assert pc["rmr"] == pytest.approx(16 / 13 - 1)
    assert pc["copies_by_kind"] == {"duplicate": 2, "receive": 14}
    assert pc["copies_by_msg"] == {"blocks": 1, "dht": 1, "event": 14}
    assert pc["events_without_publish"] == 1


def test_hops(pc: dict[str, Any]) -> None:
    # first delivery hops of expected pairs: a1 1 1 2 3, a2 1 2 2, a3 1 2 4, b1 1, b2 1 2;
    # node 5's a1 at hop 7 and node 3's repeated a3 at hop 5 do not count
    assert pc["ldh"] == 4
    assert pc["mean_hop"] == pytest.approx(23 / 13)


def test_order_violations_only_on_ordered_topics(pc: dict[str, Any]) -> None:
    # node 5 delivered b2 without b1; node 4's a3 without a2 is on unordered A
    assert pc["order_violations"] == 1


def test_control_counts(pc: dict[str, Any]) -> None:
    assert (pc["duplicates"], pc["grafts"], pc["prunes"], pc["backfills"]) == (2, 2, 1, 1)


def test_bytes_cpu_and_memory_sum_the_lives(pc: dict[str, Any]) -> None:
    # last sample of each life: node 0 (300, 30, 1.0 s); node 1 (500, 0, 2.0 s);
    # node 3 life 0 (80, 8, 0.4 s) + life 1 (70, 7, 0.3 s) = (150, 15, 0.7 s)
    volume = pc["bytes"]
    assert volume["nodes_sampled"] == 3
    assert (volume["pubsub_total"], volume["dht_total"], volume["total"]) == (950, 45, 995)
    assert volume["per_node"]["total"] == {"mean": pytest.approx(995 / 3), "max": 500}
    assert volume["per_node"]["pubsub"]["max"] == 500
    assert volume["per_node"]["dht"] == {"mean": pytest.approx(15), "max": 30}
    assert pc["cpu_s"] == {"mean": pytest.approx(3.7 / 3), "max": pytest.approx(2.0),
                           "total": pytest.approx(3.7)}
    assert pc["rss_bytes"] == {"mean": pytest.approx(9500 / 3), "max": 4000}


def test_cut_line_of_a_crashed_node_is_skipped(pc: dict[str, Any],
                                               known: tuple[Path, dict[str, Any]]) -> None:
    records = pc["records"]
    assert records["unreadable_lines"] == 1
    assert records["files"] == 6
    # deliver at nodes 0-5: 2 + 3 + 5 + 4 + 2 + 2; receive: 0 + 3 + 5 + 3 + 2 + 2
    assert records["by_kind"] == {"backfill": 1, "deliver": 18, "duplicate": 2, "graft": 2,
                                  "prune": 1, "publish": 5, "receive": 15, "sample": 7,
                                  "send": 1}
    assert records["total"] == 52
    assert known[1]["records"]["unreadable_lines"] == 1


def test_comparison_of_the_two_protocols(known: tuple[Path, dict[str, Any]]) -> None:
    run = known[1]["runs"]["known"]
    flood = run["protocols"]["floodsub"]
    # expected: f1 at 1 and 2, g1 and g2 at 1; copies: 4 receives and 1 duplicate
    assert (flood["expected_pairs"], flood["delivery_ratio"]) == (4, 1.0)
    assert flood["rmr"] == pytest.approx(5 / 4 - 1)
    ratios = run["comparison"]["ratios"]
    assert run["comparison"]["numerator"] == "floodsub"
    assert ratios["bytes_total"] == pytest.approx(1990 / 995)
    assert ratios["copies"] == pytest.approx(5 / 16)


def test_order_violation_when_the_parent_comes_later(known: tuple[Path, dict[str, Any]]) -> None:
    # node 1 delivered g2 before g1; node 0 delivered g2 having published g1 itself
    assert known[1]["runs"]["known"]["protocols"]["floodsub"]["order_violations"] == 1


def test_markdown_links_existing_plots(known: tuple[Path, dict[str, Any]]) -> None:
    path, summary = known
    markdown = (path.parent / MARKDOWN).read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert sorted(links) == sorted(summary["runs"]["known"]["plots"].values())
    assert len(links) == 3
    for link in links:
        assert (path.parent / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the ratio column says which way it divides, the next ones which way is better
    assert "| delivery ratio | higher | 0.8667 | 1.0000 | 1.154 | floodsub |" in markdown
    assert "| RMR | lower | 0.2308 | 0.2500 | 1.083 | pulsarcast |" in markdown
    assert "| floodsub ÷ pulsarcast | favours |" in markdown
    # the headline opens the report; no thesis table for a scenario the thesis did not run
    assert markdown.splitlines()[2] == "- " + summary["runs"]["known"]["headline"]["text"]
    assert "## Against the thesis" not in markdown
    assert summary["wall_time_s"] > 0


def test_a_run_with_nothing_delivered(known: tuple[Path, dict[str, Any]]) -> None:
    path, summary = known
    lost = summary["runs"]["known-2"]["protocols"]["pulsarcast"]
    assert (lost["expected_pairs"], lost["delivered_pairs"]) == (2, 0)
    assert lost["delivery_ratio"] == 0.0 and lost["event_coverage"] == 0.0
    assert lost["latency_s"]["p50"] is None and lost["rmr"] is None
    assert lost["bytes"]["total"] == 0 and lost["ldh"] is None
    assert lost["records"]["files"] == 2 and lost["records"]["total"] == 1
    assert summary["runs"]["known-2"]["plots"] == {}
    assert "comparison" not in summary["runs"]["known-2"]
    markdown = (path.parent / MARKDOWN).read_text()
    assert "## All runs" in markdown and "## Run `known-2`" in markdown


def _manifest_only(root: Path, section: dict[str, Any]) -> Path:
    return write_run(root, {"pulsarcast": section}, {})


@pytest.mark.parametrize("case, message", [
    ("missing", "not a directory"),
    ("empty", "not a testbed run directory"),
    ("no traces", "no traces for protocol 'pulsarcast'"),
    ("bad topics", "'subscribers' list"),
])
def test_bad_input_is_a_value_error_before_spark(tmp_path: Path, case: str, message: str) -> None:
    run = tmp_path / "run"
    if case == "empty":
        run.mkdir()
    elif case == "no traces":
        _manifest_only(run, _section([], 2))
    elif case == "bad topics":
        write_run(run, {"pulsarcast": _section([{"cid": A, "subscribers": "all"}], 2)},
                  {"pulsarcast": {0: []}})
    with pytest.raises(ValueError, match=re.escape(message)):
        run_report([run], None)


def test_output_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {"pulsarcast": _section([], 1)}, {"pulsarcast": {0: []}})
    (tmp_path / "taken").write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        run_report([run], tmp_path / "taken")
    with pytest.raises(ValueError, match="no run directory"):
        run_report([], None)
    with pytest.raises(ValueError, match="given twice"):
        load_runs([run, tmp_path / "run" / ".." / "run"])


def test_cli_reports_bad_input_with_exit_status_2(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["report", str(tmp_path / "nothing")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_route_of_each_first_copy(pc: dict[str, Any]) -> None:
    # first copies of the 13 delivered pairs: (4, a3) by BLOCKS, (5, b2) from the DHT, the
    # other 11 by EVENT. p99 = 0.952 s (above): only (4, a3) at 1.00 s is in the tail
    assert pc["first_copy"]["by_via"] == {"blocks": 1, "dht": 1, "event": 11}
    assert pc["first_copy"]["tail_by_via"] == {"blocks": 1}
    assert pc["first_copy"]["tail_from_s"] == pytest.approx(0.60 + 0.88 * 0.40, abs=1e-6)


def test_headline_is_computed_from_the_run(known: tuple[Path, dict[str, Any]]) -> None:
    headline = known[1]["runs"]["known"]["headline"]
    assert headline["delivery_ratio"] == {"pulsarcast": pytest.approx(13 / 15),
                                          "floodsub": 1.0}
    # bytes: Pulsarcast 950 + 45 = 995, Floodsub's node 0 1,900 + 90 = 1,990
    assert headline["bytes_vs_baseline"] == {"total": pytest.approx(0.5),
                                             "pubsub": pytest.approx(0.5),
                                             "dht": pytest.approx(0.5)}
    assert headline["tail"] == {"pairs": 1, "by_repair": 1, "repair_share": 1.0,
                                "from_repair": True}
    text = headline["text"].replace(TIMES, "x")
    assert text.startswith("**known**: Pulsarcast delivered 86.67 % of expected pairs vs "
                           "Floodsub's 100.00 %; cost: 0.50x Floodsub's bytes sent")
    assert "p50 250 ms, p99 952 ms" in text
    assert "the p99 is from repairs: 1 of the 1 slowest pairs (100.00 %)" in text
    assert "headline" not in known[1]["runs"]["known-2"] or \
        known[1]["runs"]["known-2"]["headline"]["tail"]["pairs"] == 0


@pytest.fixture(scope="module")
def series(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    """The plot series of the known run, which the summary does not hold."""
    from pulsar.tools.testbed.qos import compute_qos

    root = tmp_path_factory.mktemp("series")
    return compute_qos(spark, load_runs([_known_run(root)]))


def test_a_missing_delivery_counts_as_never(series: dict[tuple[str, str], Any]) -> None:
    from pulsar.tools.testbed.qos import CDF_GRID, NEVER
    from pulsar.tools.testbed.report_plots import cdf_points

    pc = series[("known", "pulsarcast")]
    # 15 expected pairs, 2 never delivered: the top 2/15 of the quantiles are NEVER, and
    # the curve drawn from them stops at 13/15 instead of reaching 1
    expected = dict(zip(CDF_GRID, pc.expected_latency_quantiles, strict=True))
    assert all(value < NEVER for q, value in expected.items() if q <= 0.86)
    assert all(value == NEVER for q, value in expected.items() if q >= 0.87)
    assert max(v for v in expected.values() if v < NEVER) == pytest.approx(1.0)
    xs, ys = cdf_points(pc.expected_latency_quantiles)
    assert max(ys) <= 13 / 15 and max(xs) == pytest.approx(1.0)
    # the delivered-only series reaches 1 with the same slowest delivery
    assert pc.latency_quantiles[-1] == pytest.approx(1.0)
    # events at 100 % of their subscribers: a1 0.4 s, b2 0.6 s, a3 1.0 s; a2 and b1 never.
    # Quantile q is the value at rank ceil(q * 5) of the 5 events
    reach = dict(zip(CDF_GRID, pc.reach_quantiles["100"], strict=True))
    assert (reach[0.2], reach[0.4], reach[0.6]) == pytest.approx((0.4, 0.6, 1.0))
    assert all(value == NEVER for q, value in reach.items() if q >= 0.61)
