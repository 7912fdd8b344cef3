"""The Markdown report: the JSON summary's figures as tables for a reader, plots linked.

It renders only what the summary holds (no Spark here), so the Markdown and the JSON can
never disagree. Row titles say the unit; docs/testbed.md has the exact definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .report_thesis import (
    CITATION,
    NETNS_DIFFERENCE,
    SETUP_DIFFERENCES,
    thesis_rows,
)

__all__ = ["render_markdown"]

_Row = tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str], str | None]
"""(title, getter, formatter, which way is better: "higher", "lower" or None for counts that
say what happened without being good or bad)."""


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


_UP, _DOWN = "higher", "lower"


def _reach(level: str, field: str) -> Callable[[dict[str, Any]], Any]:
    return lambda m: m["expanding_coverage_s"][level][field]


_METRICS: list[_Row] = [
    ("nodes", lambda m: m["nodes"], _int, None),
    ("events published", lambda m: m["events_published"], _int, None),
    ("expected pairs (node, event)", lambda m: m["expected_pairs"], _int, None),
    ("delivered expected pairs", lambda m: m["delivered_pairs"], _int, _UP),
    ("… of them with a deliver record (timed)", lambda m: m["traced_pairs"], _int, None),
    ("delivery ratio", lambda m: m["delivery_ratio"], _fraction, _UP),
    ("subscription coverage", lambda m: m["subscription_coverage"], _fraction, _UP),
    ("coverage of published events", lambda m: m["event_coverage"], _fraction, _UP),
    ("latency p50 (s)", lambda m: m["latency_s"]["p50"], _seconds, _DOWN),
    ("latency p90 (s)", lambda m: m["latency_s"]["p90"], _seconds, _DOWN),
    ("latency p99 (s)", lambda m: m["latency_s"]["p99"], _seconds, _DOWN),
    ("latency max (s)", lambda m: m["latency_s"]["max"], _seconds, _DOWN),
    ("median time to 50 % of subscribers (s)", _reach("50", "median"), _seconds, _DOWN),
    ("events never at 50 %", _reach("50", "missing"), _int, _DOWN),
    ("median time to 90 % of subscribers (s)", _reach("90", "median"), _seconds, _DOWN),
    ("events never at 90 %", _reach("90", "missing"), _int, _DOWN),
    ("median time to 100 % of subscribers (s)", _reach("100", "median"), _seconds, _DOWN),
    ("events never at 100 %", _reach("100", "missing"), _int, _DOWN),
    ("RMR", lambda m: m["rmr"], _fraction, _DOWN),
    ("payload copies", lambda m: m["copies"], _int, _DOWN),
    ("LDH (hops)", lambda m: m["ldh"], _int, _DOWN),
    ("mean hop", lambda m: m["mean_hop"], _float, _DOWN),
    ("duplicates", lambda m: m["duplicates"], _int, _DOWN),
    ("grafts", lambda m: m["grafts"], _int, None),
    ("prunes", lambda m: m["prunes"], _int, None),
    ("backfill WANTs", lambda m: m["backfills"], _int, None),
    ("order violations", lambda m: m["order_violations"], _int, _DOWN),
    ("events without a publish record", lambda m: m["events_without_publish"], _int, None),
    ("bytes sent, pub-sub, all nodes (MiB)", lambda m: m["bytes"]["pubsub_total"], _mib,
     _DOWN),
    ("bytes sent, DHT, all nodes (MiB)", lambda m: m["bytes"]["dht_total"], _mib, _DOWN),
    ("bytes sent, total, all nodes (MiB)", lambda m: m["bytes"]["total"], _mib, _DOWN),
    ("bytes on the wire, all nodes (MiB; kernel counters, --netns runs)",
     lambda m: m["bytes"].get("wire_total"), _mib, _DOWN),
    ("bytes sent per node, mean (MiB)", lambda m: m["bytes"]["per_node"]["total"]["mean"], _mib,
     _DOWN),
    ("bytes sent per node, max (MiB)", lambda m: m["bytes"]["per_node"]["total"]["max"], _mib,
     _DOWN),
    ("CPU per node, mean (s)", lambda m: m["cpu_s"]["mean"], _float, _DOWN),
    ("CPU per node, max (s)", lambda m: m["cpu_s"]["max"], _float, _DOWN),
    ("RSS per node, mean (MiB)", lambda m: m["rss_bytes"]["mean"], _mib, _DOWN),
    ("RSS per node, max (MiB)", lambda m: m["rss_bytes"]["max"], _mib, _DOWN),
]

_SOURCES = (
    "Delivery ratio, delivered pairs, both coverages and which events reached each coverage "
    "level are read from each node's durable delivery log at the end of the run "
    "(`<protocol>/delivery-logs.json`), which a crash does not cut short; latency, times to "
    "coverage, hops, routes, copies and RMR, order violations, control counts, bytes, CPU "
    "and memory from the traces, which lose a killed node's last 0.25 s.")


def _source(metrics: dict[str, Any]) -> str:
    return str(metrics.get("delivery_source", {}).get("source", "traces"))


def _source_line(protocols: dict[str, Any]) -> str:
    """Where each protocol's delivery figures of a run come from."""
    parts = []
    for protocol, metrics in protocols.items():
        source = metrics.get("delivery_source") or {}
        if source.get("source") == "durable_logs":
            text = f"{protocol}: durable delivery logs (`{source['file']}`)"
            fallback = source.get("nodes_from_traces") or []
            if fallback:
                text += (" and, for node(s) " + ", ".join(map(str, fallback))
                         + " whose log could not be read, their traces")
        else:
            text = f"{protocol}: traces (no durable delivery logs in this run)"
        parts.append(text)
    return "Delivery and coverage from " + "; ".join(parts) + "."


_OVERVIEW = ("delivery ratio", "subscription coverage", "coverage of published events",
             "latency p50 (s)", "latency p99 (s)", "RMR", "bytes sent, total, all nodes (MiB)")

_PLOT_TITLES = {
    "latency-cdf": "Latency over all expected pairs (undelivered = never)",
    "coverage": "Coverage of published events over time",
    "bytes-per-node": "Bytes sent per node, pub-sub and DHT",
}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _ratio(numerator: Any, denominator: Any) -> str:
    if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator:
        return f"{numerator / denominator:.3f}"
    return "—"


def _favours(better: str | None, values: dict[str, Any]) -> str:
    """Which protocol the row's figures favour, given which way is better; "—" for rows that
    are neither good nor bad, or lack a value."""
    if better is None or any(not isinstance(v, int | float) for v in values.values()):
        return "—"
    best = (max if better == _UP else min)(values.values())
    winners = [p for p, v in values.items() if v == best]
    return "even" if len(winners) == len(values) else ", ".join(winners)


def render_markdown(summary: dict[str, Any]) -> str:
    """The whole report, from the JSON summary that report.py writes next to it."""
    lines = ["# QoS report", ""]
    runs: dict[str, Any] = summary["runs"]
    headlines = [run["headline"]["text"] for run in runs.values() if "headline" in run]
    if headlines:
        lines += [f"- {text}" for text in headlines] + [""]
    lines.append(
        f"Generated {summary['generated_at']} by `pulsarcast report` in "
        f"{summary['wall_time_s']:.1f} s (Spark {summary['spark']['version']}, master "
        f"`{summary['spark']['master']}`): {summary['records']['total']:,} trace records read, "
        f"unreadable lines skipped: {summary['records']['unreadable_lines']:,}. Every figure is "
        "defined in docs/testbed.md, \"The QoS report\"; `summary.json` has them all. "
        + _SOURCES + " Latency percentiles are over delivered pairs with a deliver record; "
        "the latency plots count the undelivered ones as never arriving.")
    fallback = [f"`{label}` {protocol}" for label, run in runs.items()
                for protocol, metrics in run["protocols"].items()
                if _source(metrics) != "durable_logs"]
    if fallback:
        lines += ["", "**Delivery from traces** for " + ", ".join(fallback) + ": those runs "
                  "have no durable delivery logs (`<protocol>/delivery-logs.json`), so a node "
                  "killed in a crash counts as not having delivered what its lost trace tail "
                  "held: their delivery and coverage can be too low."]
    lines += _thesis_section(runs)
    if len(runs) > 1:
        lines += ["", "## All runs", ""]
        rows = []
        for label, run in runs.items():
            for protocol, metrics in run["protocols"].items():
                rows.append([f"`{label}`", protocol] + [
                    fmt(get(metrics)) for title, get, fmt, _ in _METRICS if title in _OVERVIEW])
        header = ["run", "protocol"] + [t for t, _, _, _ in _METRICS if t in _OVERVIEW]
        lines += _table(header, rows)
    for label, run in runs.items():
        lines += ["", *_run_section(label, run)]
    return "\n".join(lines) + "\n"


def _thesis_section(runs: dict[str, Any]) -> list[str]:
    rows = thesis_rows(runs)
    if not rows:
        return []
    netns = all(run.get("network") == "netns" for run in runs.values())
    setup = SETUP_DIFFERENCES + (" " + NETNS_DIFFERENCE if netns else "")
    return ["", "## Against the thesis", "",
            f"Our runs beside the thesis's own Floodsub comparison ({CITATION}), for the "
            "figures both have. The thesis measured no delivery latency and ran no churn. "
            + setup, "",
            *_table(["run", "figure", "ours", "thesis"], rows)]


def _run_section(label: str, run: dict[str, Any]) -> list[str]:
    protocols: dict[str, Any] = run["protocols"]
    names = list(protocols)
    lines = [f"## Run `{label}`", ""]
    if "headline" in run:
        lines += [run["headline"]["text"], ""]
    lines += [f"Scenario `{run['name']}`, directory `{run['path']}`; "
              + ", ".join(f"{p}: {m['nodes']} nodes, {m['topics']} topics, "
                          f"{m['subscriptions']} subscriptions, {m['faults']} faults"
                          for p, m in protocols.items()) + ". " + _source_line(protocols), ""]
    comparison = run.get("comparison")
    header = ["metric", "better", *names]
    if comparison:
        header.append(f"{comparison['numerator']} ÷ {comparison['denominator']}")
    header.append("favours")
    rows = []
    for title, get, fmt, better in _METRICS:
        values = {p: get(protocols[p]) for p in names}
        row = [title, better or "—", *(fmt(v) for v in values.values())]
        if comparison:
            row.append(_ratio(values[comparison["numerator"]],
                              values[comparison["denominator"]]))
        row.append(_favours(better, values) if len(names) > 1 else "—")
        rows.append(row)
    lines += _table(header, rows)
    lines += _routes(protocols)
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


def _routes(protocols: dict[str, Any]) -> list[str]:
    """How delivered pairs got their first copy, all of them and the slowest 1 %."""
    names = list(protocols)
    routes = sorted({via for m in protocols.values() for part in ("by_via", "tail_by_via")
                     for via in m["first_copy"][part]})
    if not routes:
        return []
    lines = ["", "First copy of each delivered pair, by route (`msg` of the node's first "
             "`receive`: \"event\" = tree or flood, grafts included; \"blocks\" = WANT/BLOCKS "
             "backfill; \"dht\" = DHT fetch), all delivered pairs and the slowest 1 % "
             "(latency ≥ p99):", ""]
    header = ["route", *(f"{p}, all" for p in names), *(f"{p}, ≥ p99" for p in names)]
    rows = [[f"`{via}`",
             *(_int(protocols[p]["first_copy"]["by_via"].get(via, 0)) for p in names),
             *(_int(protocols[p]["first_copy"]["tail_by_via"].get(via, 0)) for p in names)]
            for via in routes]
    return lines + _table(header, rows)
