"""The report of a verify run: ``report.md`` with its plots, ``summary.json``, and one JSON
line (the last thing ``pulsarcast verify`` prints).

Everything here is computed from the history and the checker's result, plus the kernel's
interface counters for bytes on the wire (each node's data interface: every header,
handshake and retransmission included, the management network excluded).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checker import KINDS, CheckResult, excerpt
from .history import Op
from .scenario import Scenario

__all__ = ["RunResult", "summary_of", "write_report"]


@dataclass
class RunResult:
    """What a run produced: the checker's result, the faults made, each node's bytes on the
    wire, and (once written) the summary."""

    scenario: Scenario
    run_dir: Path
    result: CheckResult
    faults: list[dict[str, Any]]
    wire_bytes: dict[int, int]
    summary: dict[str, Any] = field(default_factory=dict)

MAX_LISTED = 20
"""Anomalies listed with their history excerpt per kind (all are counted)."""


def _round(value: float | None) -> float | None:
    if value is None:
        return None
    return value if math.isinf(value) else round(value, 3)


def summary_of(run: RunResult, history: Sequence[Op]) -> dict[str, Any]:
    """The run's figures as one JSON object (the line ``pulsarcast verify`` prints last).
    ``ok`` also needs every topic replayed whole from its CID at least once: a replay that
    never succeeded hides what it would have lost, so it fails the run too."""
    result = run.result
    total_wire = sum(run.wire_bytes.values())
    replays = [op for op in history if op.f == "replay" and op.type != "invoke"]
    topics = {op.topic for op in history if op.f == "create" and op.type == "ok"}
    replayed = {op.topic for op in replays if op.type == "ok"}
    return {
        "seed": run.scenario.seed,
        "nodes": run.scenario.nodes,
        "duration_s": run.scenario.duration,
        "faults": len(run.faults),
        "fault_kinds": sorted({f["kind"] for f in run.faults}),
        "anomalies": result.counts,
        "acknowledged": result.acknowledged,
        "delivered": result.delivered,
        "converge_p50_s": _round(result.converge_p50),
        "converge_p99_s": _round(result.converge_p99),
        "converge_max_s": _round(result.converge_max),
        "converge_uninterrupted_p99_s": _round(result.converge_uninterrupted_p99),
        "converge_final_s": _round(result.converge_final),
        "latency_p50_s": _round(_percentile(result.latencies, 50)),
        "latency_p99_s": _round(_percentile(result.latencies, 99)),
        "wire_bytes": total_wire,
        "wire_bytes_per_delivery": (
            round(total_wire / result.delivered, 1) if result.delivered else None
        ),
        "replays_ok": sum(op.type == "ok" for op in replays),
        "replays_failed": sum(op.type != "ok" for op in replays),
        "topics_not_replayed": len(topics - replayed),
        "ok": result.ok and not topics - replayed,
    }


def _percentile(values: Sequence[float], percent: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percent / 100 * len(ordered))) - 1]


def write_report(
    run: RunResult, history: list[Op], links_mechanisms: dict[str, str]
) -> dict[str, Any]:
    summary = summary_of(run, history)
    out = run.run_dir
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plots = _plots(run, history, out)
    lines = [
        f"# pulsarcast verify: seed {run.scenario.seed}",
        "",
        f"{run.scenario.nodes} nodes, each a `pulsarcast node` process in its own network "
        f"namespace; {run.scenario.duration:.0f} s of workload, {len(run.faults)} faults, "
        f"then convergence and a replay from each topic's CID by a fresh node after every "
        "publisher was killed. Checked from the client history alone "
        "(docs/verification.md).",
        "",
        "| anomaly | count |",
        "|---|---|",
        *[f"| {kind} | {summary['anomalies'][kind]} |" for kind in KINDS],
        "",
        "| figure | value |",
        "|---|---|",
        f"| acknowledged publishes | {summary['acknowledged']} |",
        f"| deliveries read by clients | {summary['delivered']} |",
        f"| convergence after a heal or restart, p50 / p99 / max (s) | "
        f"{summary['converge_p50_s']} / {summary['converge_p99_s']} / "
        f"{summary['converge_max_s']} |",
        f"| … p99 of those no later fault cut into / after the last heal (s) | "
        f"{summary['converge_uninterrupted_p99_s']} / {summary['converge_final_s']} |",
        f"| delivery latency as read by clients, p50 / p99 (s) | "
        f"{summary['latency_p50_s']} / {summary['latency_p99_s']} |",
        f"| bytes on the wire (kernel counters, all nodes) | {summary['wire_bytes']:,} |",
        f"| bytes on the wire per delivery | {summary['wire_bytes_per_delivery']} |",
        f"| replays from the CID: whole / failed attempts / topics never replayed | "
        f"{summary['replays_ok']} / {summary['replays_failed']} / "
        f"{summary['topics_not_replayed']} |",
        "",
        "## Faults",
        "",
        "| # | at (s) | length (s) | kind | nodes | made by | parameters |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in run.faults:
        params = {
            k: v
            for k, v in f.items()
            if k not in ("id", "kind", "nodes", "length", "at", "mechanism")
        }
        lines.append(
            f"| {f['id']} | {f['at']:.1f} | {f['length']:.1f} | {f['kind']} | "
            f"{f['nodes']} | {f.get('mechanism', '')} | {json.dumps(params)} |"
        )
    lines += ["", *[f"![{name}]({name})" for name in plots], ""]
    for kind in KINDS:
        found = run.result.anomalies[kind]
        if not found:
            continue
        lines += [f"## {kind}: {len(found)}", ""]
        for anomaly in found[:MAX_LISTED]:
            lines += [
                f"- topic `{anomaly.topic}` cid `{anomaly.cid}` node {anomaly.node}: "
                f"{anomaly.detail}",
                "",
                "```",
            ]
            lines += [op.to_json() for op in excerpt(history, anomaly, around=2)]
            lines += ["```", ""]
        if len(found) > MAX_LISTED:
            lines.append(f"... and {len(found) - MAX_LISTED} more")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    del links_mechanisms
    return summary


def _plots(run: RunResult, history: list[Op], out: Path) -> list[str]:
    """A timeline (faults as shaded bands, each delivery's latency over time per node)
    and convergence per heal. Skipped, with a note in the report, without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    published: dict[str, float] = {}
    invokes: dict[str, float] = {}
    for op in history:
        if op.f == "publish" and op.type == "invoke":
            invokes[op.process] = op.time
        elif op.f == "publish" and op.type == "ok":
            published[str(op.value["cid"])] = invokes.get(op.process, op.time)
    starts = {op.value.get("id"): op for op in history if op.f == "fault"}
    heals = {op.value.get("id"): op for op in history if op.f == "heal"}
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for fid, start in starts.items():
        end = heals.get(fid)
        ax.axvspan(start.time, end.time if end else history[-1].time, alpha=0.15, color="tab:red")
        ax.text(
            start.time,
            1.0,
            str(start.value.get("kind")),
            rotation=90,
            fontsize=6,
            va="top",
            transform=ax.get_xaxis_transform(),
        )
    nodes = sorted({op.node for op in history if op.f == "deliver" and op.node is not None})
    first_seen: set[tuple[int | None, str]] = set()
    for node in nodes:
        xs, ys = [], []
        for op in history:
            if op.f != "deliver" or op.node != node:
                continue
            cid = str(op.value["cid"])
            if cid not in published or (node, cid) in first_seen:
                continue
            first_seen.add((node, cid))
            xs.append(published[cid])
            ys.append(max(op.time - published[cid], 1e-3))
        ax.scatter(xs, ys, s=4, label=f"node {node}")
    ax.set_yscale("log")
    ax.set_xlabel("time of the publish (s since the run began)")
    ax.set_ylabel("latency until a client read it (s)")
    ax.set_title("Deliveries over time; faults shaded")
    ax.legend(fontsize=6, markerscale=2, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=110)
    plt.close(fig)
    names = ["timeline.png"]
    if run.result.converge:
        fig, ax = plt.subplots(figsize=(8, 3))
        values = [v if not math.isinf(v) else -1 for v in run.result.converge]
        ax.bar(
            range(len(values)), values, color=["tab:blue" if v >= 0 else "tab:red" for v in values]
        )
        ax.set_xlabel("heal, restart or resume (in order)")
        ax.set_ylabel("seconds until nothing was missing")
        ax.set_title("Convergence after each recovery (red: never)")
        fig.tight_layout()
        fig.savefig(out / "convergence.png", dpi=110)
        plt.close(fig)
        names.append("convergence.png")
    return names
