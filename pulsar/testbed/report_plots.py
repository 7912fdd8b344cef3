"""PNG plots of one run: latency CDF, coverage over time, bytes per node; one line per protocol.

Figures are drawn on matplotlib ``Figure`` objects with the Agg canvas rather than through
pyplot, so the report neither needs a display nor changes the process-wide backend or keeps
figures alive after saving.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .qos import CDF_GRID, ProtocolQos

__all__ = ["PLOTS", "write_plots"]

PLOTS = ("latency-cdf", "coverage", "bytes-per-node")
"""Plot names; the file of plot ``name`` of run ``label`` is ``<label>-<name>.png``."""

_STYLE = {"pulsarcast": "tab:blue", "floodsub": "tab:orange"}


def write_plots(out_dir: Path, label: str, protocols: Sequence[ProtocolQos]) -> dict[str, str]:
    """Draw the plots that have data; return {plot name: file name relative to out_dir}."""
    written = {}
    drawers = {"latency-cdf": _latency_cdf, "coverage": _coverage, "bytes-per-node": _bytes}
    for name in PLOTS:
        figure = drawers[name](label, protocols)
        if figure is None:
            continue
        file_name = f"{label}-{name}.png"
        FigureCanvasAgg(figure)
        figure.savefig(out_dir / file_name, dpi=100)
        written[name] = file_name
    return written


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(7, 4.2), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    return figure, axes


def _latency_cdf(label: str, protocols: Sequence[ProtocolQos]) -> Figure | None:
    drawn = [p for p in protocols if p.latency_quantiles]
    if not drawn:
        return None
    figure, axes = _figure(f"{label}: delivery latency CDF", "latency (s)",
                           "fraction of delivered expected pairs")
    for p in drawn:
        assert p.latency_quantiles is not None
        axes.plot(p.latency_quantiles, CDF_GRID, label=p.protocol, color=_STYLE.get(p.protocol))
    axes.set_ylim(0, 1.02)
    axes.legend()
    return figure


def _coverage(label: str, protocols: Sequence[ProtocolQos]) -> Figure | None:
    """Fraction of *all* expected pairs delivered by t: the latency CDF scaled down by the
    delivery ratio, so a protocol that loses events levels off below 1."""
    drawn = [p for p in protocols if p.latency_quantiles and p.metrics["expected_pairs"]]
    if not drawn:
        return None
    figure, axes = _figure(f"{label}: coverage over time", "seconds since publish",
                           "fraction of expected pairs delivered")
    end = max(max(p.latency_quantiles or [0.0]) for p in drawn)
    for p in drawn:
        assert p.latency_quantiles is not None
        scale = p.metrics["delivered_pairs"] / p.metrics["expected_pairs"]
        xs = [*p.latency_quantiles, end]
        ys = [q * scale for q in CDF_GRID] + [scale]
        axes.step(xs, ys, where="post", label=p.protocol, color=_STYLE.get(p.protocol))
    axes.set_ylim(0, 1.02)
    axes.legend()
    return figure


def _bytes(label: str, protocols: Sequence[ProtocolQos]) -> Figure | None:
    drawn = [p for p in protocols if p.nodes]
    if not drawn:
        return None
    figure, axes = _figure(f"{label}: bytes sent per node (pub-sub + DHT)",
                           "nodes, sorted by bytes sent", "MiB sent")
    for p in drawn:
        totals = sorted((n.total_bytes / 2**20 for n in p.nodes), reverse=True)
        axes.plot(range(1, len(totals) + 1), totals, marker=".", label=p.protocol,
                  color=_STYLE.get(p.protocol))
    axes.set_ylim(bottom=0)
    axes.legend()
    return figure
