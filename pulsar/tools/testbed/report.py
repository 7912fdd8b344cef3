"""``pulsarcast report RUN_DIR...``: the QoS report of testbed runs, computed with PySpark.

Writes, into the output directory, ``summary.json`` (every figure, per run → per protocol →
metric, each run's headline, plus the job's wall time and record counts), ``report.md``
(headlines, the thesis's figures beside ours, tables) and PNG plots linked from it. The
definitions are in docs/testbed.md, "The QoS report". Input is checked before Spark starts,
so a wrong path fails in a moment with a ValueError that says why.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .report_headline import headline_facts, headline_sentence
from .report_inputs import RunInput, load_runs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .qos import ProtocolQos

__all__ = ["MARKDOWN", "SUMMARY", "build_report", "default_out_dir", "run_report"]

SUMMARY = "summary.json"
MARKDOWN = "report.md"
_FORMAT = 1
_COMPARED = ("floodsub", "pulsarcast")
"""(numerator, denominator) of the comparison ratios when a run has both protocols."""


def run_report(run_dirs: list[Path], out_dir: Path | None, master: str = "local[*]") -> Path:
    """Report on ``run_dirs`` with a Spark session on ``master``; return the summary's path.

    The session is created here and stopped at the end, unless one is already active in this
    process (it is then used and left running)."""
    started = time.perf_counter()
    runs = load_runs(run_dirs)
    out = _prepare_out_dir(runs, out_dir)
    _say(f"starting Spark ({master})")
    spark, owned = _session(master)
    try:
        return _report(spark, runs, out, started)
    finally:
        if owned:
            spark.stop()


def build_report(spark: SparkSession, run_dirs: Sequence[Path], out_dir: Path | None = None,
                 progress: bool = True) -> Path:
    """The report with a session the caller owns (tests, notebooks); same outputs."""
    started = time.perf_counter()
    runs = load_runs(run_dirs)
    return _report(spark, runs, _prepare_out_dir(runs, out_dir), started, progress)


def default_out_dir(run_dirs: Sequence[Path]) -> Path:
    """RUN_DIR/report for one run, ./report for several."""
    return Path(run_dirs[0]) / "report" if len(run_dirs) == 1 else Path("report")


def _say(message: str, progress: bool = True) -> None:
    if progress:
        print(f"report: {message}", file=sys.stderr, flush=True)


def _prepare_out_dir(runs: Sequence[RunInput], out_dir: Path | None) -> Path:
    out = out_dir if out_dir is not None else default_out_dir([run.path for run in runs])
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: output path exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{out}: cannot create the output directory ({exc})") from None
    return out


def _session(master: str) -> tuple[SparkSession, bool]:
    """(session, whether we created it). Local masters get a shuffle width to match the
    machine instead of Spark's 200, which would make every tiny stage schedule 200 tasks."""
    # Python workers, should a step ever need them (none does now), run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = (SparkSession.builder.master(master).appName("pulsarcast-report")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "2g")
               .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith("local"):
        builder = builder.config("spark.sql.shuffle.partitions",
                                 str(max(4, 2 * (os.cpu_count() or 1))))
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # py4j and JVM errors share no base class worth naming
        raise ValueError(f"cannot start Spark with master {master!r}: {exc}") from exc
    session.sparkContext.setLogLevel("ERROR")
    return session, True


def _report(spark: SparkSession, runs: Sequence[RunInput], out: Path, started: float,
            progress: bool = True) -> Path:
    from .qos import compute_qos
    from .report_markdown import render_markdown
    from .report_plots import write_plots

    def say(message: str) -> None:
        _say(f"[{time.perf_counter() - started:5.1f} s] {message}", progress)

    figures = compute_qos(spark, runs, say=say)
    say(f"writing the report to {out}")
    summary_runs = {}
    for run in runs:
        parts = [figures[(run.label, part.protocol)] for part in run.protocols]
        summary_runs[run.label] = _run_summary(run, parts, write_plots(out, run.label, parts))
    everything = [p.metrics["records"] for p in figures.values()]
    summary: dict[str, Any] = {
        "format": _FORMAT,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_time_s": round(time.perf_counter() - started, 3),
        "spark": {"master": spark.sparkContext.master, "version": spark.version},
        "records": {"total": sum(r["total"] for r in everything),
                    "unreadable_lines": sum(r["unreadable_lines"] for r in everything),
                    "files": sum(r["files"] for r in everything)},
        "runs": summary_runs,
    }
    path = out / SUMMARY
    path.write_text(json.dumps(summary, indent=1) + "\n")
    (out / MARKDOWN).write_text(render_markdown(summary))
    _say(f"done in {summary['wall_time_s']:.1f} s: {path}", progress)
    return path


def _run_summary(run: RunInput, parts: Sequence[ProtocolQos],
                 plots: dict[str, str]) -> dict[str, Any]:
    protocols = {p.protocol: p.metrics for p in parts}
    summary: dict[str, Any] = {"path": str(run.path), "name": run.name,
                               "network": run.network, "protocols": protocols,
                               "plots": plots}
    numerator, denominator = _COMPARED
    if numerator in protocols and denominator in protocols:
        summary["comparison"] = _comparison(protocols[numerator], protocols[denominator])
    facts = headline_facts(summary)
    if facts is not None:
        summary["headline"] = {**facts, "text": headline_sentence(run.label, facts)}
    return summary


def _comparison(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, Any]:
    """Ratios of the totals that say what one protocol costs against the other."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {
        "numerator": _COMPARED[0],
        "denominator": _COMPARED[1],
        "ratios": {
            "bytes_total": ratio(numerator["bytes"]["total"], denominator["bytes"]["total"]),
            "bytes_pubsub": ratio(numerator["bytes"]["pubsub_total"],
                                  denominator["bytes"]["pubsub_total"]),
            "bytes_dht": ratio(numerator["bytes"]["dht_total"], denominator["bytes"]["dht_total"]),
            "bytes_wire": ratio(numerator["bytes"].get("wire_total"),
                                denominator["bytes"].get("wire_total")),
            "copies": ratio(numerator["copies"], denominator["copies"]),
            "cpu_s_total": ratio(numerator["cpu_s"]["total"], denominator["cpu_s"]["total"]),
            "latency_p50": ratio(numerator["latency_s"]["p50"], denominator["latency_s"]["p50"]),
            "latency_p99": ratio(numerator["latency_s"]["p99"], denominator["latency_s"]["p99"]),
        },
    }
