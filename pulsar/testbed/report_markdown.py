"""The Markdown report: the JSON summary's figures as tables for a reader, plots linked.

It renders only what the summary holds (no Spark here), so the Markdown and the JSON can
never disagree. Row titles say the unit; docs/testbed.md has the exact definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["render_markdown"]

_Row = tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str]]


def _int(value: Any) -> str:
    return "—" if value is None else f"{int(value):,}"


def _fraction(value: Any) -> str:
    return "—" if value is None else f"{value:.4f}"


def _seconds(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}"


def _float(value: Any) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _mib(value: Any) -> str:
    return "—" if value is None else f"{value / 2**20:,.2f}"


def _reach(level: str, field: str) -> Callable[[dict[str, Any]], Any]:
    return lambda m: m["expanding_coverage_s"][level][field]


_METRICS: list[_Row] = [
    ("nodes", lambda m: m["nodes"], _int),
    ("events published", lambda m: m["events_published"], _int),
    ("expected pairs (node, event)", lambda m: m["expected_pairs"], _int),
    ("delivered expected pairs", lambda m: m["delivered_pairs"], _int),
    ("delivery ratio", lambda m: m["delivery_ratio"], _fraction),
    ("subscription coverage", lambda m: m["subscription_coverage"], _fraction),
    ("coverage of published events", lambda m: m["event_coverage"], _fraction),
    ("latency p50 (s)", lambda m: m["latency_s"]["p50"], _seconds),
    ("latency p90 (s)", lambda m: m["latency_s"]["p90"], _seconds),
    ("latency p99 (s)", lambda m: m["latency_s"]["p99"], _seconds),
    ("latency max (s)", lambda m: m["latency_s"]["max"], _seconds),
    ("median time to 50 % of subscribers (s)", _reach("50", "median"), _seconds),
    ("events never at 50 %", _reach("50", "missing"), _int),
    ("median time to 90 % of subscribers (s)", _reach("90", "median"), _seconds),
    ("events never at 90 %", _reach("90", "missing"), _int),
    ("median time to 100 % of subscribers (s)", _reach("100", "median"), _seconds),
    ("events never at 100 %", _reach("100", "missing"), _int),
    ("RMR", lambda m: m["rmr"], _fraction),
    ("payload copies", lambda m: m["copies"], _int),
    ("LDH (hops)", lambda m: m["ldh"], _int),
    ("mean hop", lambda m: m["mean_hop"], _float),
    ("duplicates", lambda m: m["duplicates"], _int),
    ("grafts", lambda m: m["grafts"], _int),
    ("prunes", lambda m: m["prunes"], _int),
    ("backfill WANTs", lambda m: m["backfills"], _int),
    ("order violations", lambda m: m["order_violations"], _int),
    ("events without a publish record", lambda m: m["events_without_publish"], _int),
    ("bytes sent, pub-sub, all nodes (MiB)", lambda m: m["bytes"]["pubsub_total"], _mib),
    ("bytes sent, DHT, all nodes (MiB)", lambda m: m["bytes"]["dht_total"], _mib),
    ("bytes sent, total, all nodes (MiB)", lambda m: m["bytes"]["total"], _mib),
    ("bytes sent per node, mean (MiB)", lambda m: m["bytes"]["per_node"]["total"]["mean"], _mib),
    ("bytes sent per node, max (MiB)", lambda m: m["bytes"]["per_node"]["total"]["max"], _mib),
    ("CPU per node, mean (s)", lambda m: m["cpu_s"]["mean"], _float),
    ("CPU per node, max (s)", lambda m: m["cpu_s"]["max"], _float),
    ("RSS per node, mean (MiB)", lambda m: m["rss_bytes"]["mean"], _mib),
    ("RSS per node, max (MiB)", lambda m: m["rss_bytes"]["max"], _mib),
]

_OVERVIEW = ("delivery ratio", "subscription coverage", "coverage of published events",
             "latency p50 (s)", "latency p99 (s)", "RMR", "bytes sent, total, all nodes (MiB)")

_PLOT_TITLES = {"latency-cdf": "Delivery latency CDF", "coverage": "Coverage over time",
                "bytes-per-node": "Bytes sent per node"}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _ratio(numerator: Any, denominator: Any) -> str:
    if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator:
        return f"{numerator / denominator:.3f}"
    return "—"


def render_markdown(summary: dict[str, Any]) -> str:
    """The whole report, from the JSON summary that report.py writes next to it."""
    lines = ["# QoS report", ""]
    lines.append(
        f"Generated {summary['generated_at']} by `pulsarcast report` in "
        f"{summary['wall_time_s']:.1f} s (Spark {summary['spark']['version']}, master "
        f"`{summary['spark']['master']}`): {summary['records']['total']:,} trace records read, "
        f"unreadable lines skipped: {summary['records']['unreadable_lines']:,}. Every figure is "
        "defined in docs/testbed.md, \"The QoS report\"; `summary.json` has them all.")
    runs: dict[str, Any] = summary["runs"]
    if len(runs) > 1:
        lines += ["", "## All runs", ""]
        rows = []
        for label, run in runs.items():
            for protocol, metrics in run["protocols"].items():
                rows.append([f"`{label}`", protocol] + [
                    fmt(get(metrics)) for title, get, fmt in _METRICS if title in _OVERVIEW])
        header = ["run", "protocol"] + [t for t, _, _ in _METRICS if t in _OVERVIEW]
        lines += _table(header, rows)
    for label, run in runs.items():
        lines += ["", *_run_section(label, run)]
    return "\n".join(lines) + "\n"


def _run_section(label: str, run: dict[str, Any]) -> list[str]:
    protocols: dict[str, Any] = run["protocols"]
    names = list(protocols)
    lines = [f"## Run `{label}`", "",
             f"Scenario `{run['name']}`, directory `{run['path']}`; "
             + ", ".join(f"{p}: {m['nodes']} nodes, {m['topics']} topics, "
                         f"{m['subscriptions']} subscriptions, {m['faults']} faults"
                         for p, m in protocols.items()) + ".", ""]
    comparison = run.get("comparison")
    header = ["metric", *names]
    if comparison:
        header.append(f"{comparison['numerator']} / {comparison['denominator']}")
    rows = []
    for title, get, fmt in _METRICS:
        values = [get(protocols[p]) for p in names]
        row = [title, *(fmt(v) for v in values)]
        if comparison:
            row.append(_ratio(get(protocols[comparison["numerator"]]),
                              get(protocols[comparison["denominator"]])))
        rows.append(row)
    lines += _table(header, rows)
    lines += ["", "Trace records:", ""]
    kinds = sorted({k for m in protocols.values() for k in m["records"]["by_kind"]})
    record_rows = [["files", *(_int(protocols[p]["records"]["files"]) for p in names)],
                   ["records", *(_int(protocols[p]["records"]["total"]) for p in names)],
                   ["unreadable lines",
                    *(_int(protocols[p]["records"]["unreadable_lines"]) for p in names)]]
    record_rows += [[f"`{kind}`", *(_int(protocols[p]["records"]["by_kind"].get(kind, 0))
                                    for p in names)] for kind in kinds]
    lines += _table(["", *names], record_rows)
    by_msg = sorted({k for m in protocols.values() for k in m["copies_by_msg"]})
    if by_msg:
        lines += ["", "Payload copies by message type:", ""]
        lines += _table(["msg", *names],
                        [[f"`{msg}`", *(_int(protocols[p]["copies_by_msg"].get(msg, 0))
                                        for p in names)] for msg in by_msg])
    for name, file_name in run["plots"].items():
        lines += ["", f"### {_PLOT_TITLES.get(name, name)}", "", f"![{name}]({file_name})"]
    return lines
