"""PNG plots of one run: latency over expected pairs, event coverage over time, bytes per node.

Figures are drawn on matplotlib ``Figure`` objects with the Agg canvas rather than through
pyplot, so the report neither needs a display nor changes the process-wide backend or keeps
figures alive after saving.

Both time plots count losses instead of hiding them: their y axes are shares of everything
that was expected, so a protocol that missed some of it levels off below 1. Their time axes
are logarithmic, because one run spans milliseconds on the tree and tens of seconds through
repair, and a linear axis squeezes one of the two into a vertical line.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import isfinite, log10
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .qos import CDF_GRID, ProtocolQos

__all__ = ["PLOTS", "cdf_points", "write_plots"]

PLOTS = ("latency-cdf", "coverage", "bytes-per-node")
"""Plot names; the file of plot ``name`` of run ``label`` is ``<label>-<name>.png``."""

_STYLE = {"pulsarcast": "tab:blue", "floodsub": "tab:orange"}
_LEVELS = {"100": "-", "50": ":"}
"""Coverage levels drawn on the coverage plot, and their line styles."""
_FEW_DECADES = 3
"""Up to this many decades on a time axis, ticks at 1, 2 and 5 of each; beyond, 1 only."""
_DHT_ALPHA = 0.45
_MIB = 2**20


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


def cdf_points(quantiles: Sequence[float]) -> tuple[list[float], list[float]]:
    """(x, y) of a CDF drawn from values at the quantiles of ``CDF_GRID``, for values that may
    be infinite (never): only finite, positive values are points (a log axis has no 0), so
    the curve stops at the share that happened; the caller extends it flat from there."""
    xs, ys = [], []
    for value, share in zip(quantiles, CDF_GRID, strict=True):
        if isfinite(value) and value > 0:
            xs.append(value)
            ys.append(share)
    return xs, ys


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(7.5, 5), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, which="both", alpha=0.25)
    return figure, axes


def _step_to(axes: Axes, xs: list[float], ys: list[float], share: float, end: float,
             **style: object) -> None:
    """A CDF as steps, carried on flat at ``share`` (the part that happened) to ``end``."""
    axes.step([*xs, end], [*ys, share], where="post", **style)  # type: ignore[arg-type]


def _time_axis(figure: Figure, axes: Axes, lo: float, hi: float) -> None:
    """Log time axis labelled in plain seconds (1, 2, 5 per decade when it spans few), and
    the legend under the plot, where it cannot hide a curve."""
    axes.set_xscale("log")
    axes.set_xlim(lo, hi)
    axes.set_ylim(0, 1.02)
    subs = (1.0, 2.0, 5.0) if log10(hi / lo) <= _FEW_DECADES else (1.0,)
    axes.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_formatter(NullFormatter())
    figure.legend(loc="outside lower center", ncols=2, fontsize="small")


def _bounds(series: list[list[float]]) -> tuple[float, float]:
    finite = [v for s in series for v in s if isfinite(v) and v > 0]
    return (min(finite) / 1.5, max(finite) * 1.5) if finite else (1e-3, 1.0)


def _latency_cdf(label: str, protocols: Sequence[ProtocolQos]) -> Figure | None:
    drawn = [p for p in protocols if p.expected_latency_quantiles and p.latency_quantiles]
    if not drawn:
        return None
    figure, axes = _figure(f"{label}: latency over all expected (subscriber, event) pairs",
                           "seconds since publish (log scale)",
                           "share of expected pairs delivered")
    lo, hi = _bounds([p.expected_latency_quantiles or [] for p in drawn])
    for p in drawn:
        assert p.expected_latency_quantiles is not None
        xs, ys = cdf_points(p.expected_latency_quantiles)
        ratio = p.metrics["delivery_ratio"] or 0.0
        _step_to(axes, xs, ys, ratio, hi, color=_STYLE.get(p.protocol),
                 label=f"{p.protocol}: {ratio:.2%} delivered, rest never")
    _time_axis(figure, axes, lo, hi)
    return figure


def _coverage(label: str, protocols: Sequence[ProtocolQos]) -> Figure | None:
    """Share of published events (with subscribers) that had reached 100 % (and 50 %) of
    their expected subscribers t seconds after publish."""
    drawn = [p for p in protocols if p.reach_quantiles and p.metrics["events_with_subscribers"]
             and any(cdf_points(p.reach_quantiles[level])[0] for level in _LEVELS)]
    if not drawn:  # nothing reached any level: an empty panel would say nothing
        return None
    figure, axes = _figure(f"{label}: coverage of published events over time",
                           "seconds since publish (log scale)",
                           "share of events at that many subscribers")
    lo, hi = _bounds([q for p in drawn for q in (p.reach_quantiles or {}).values()])
    events_of = "events_with_subscribers"
    for p in drawn:
        assert p.reach_quantiles is not None
        reach = p.metrics["expanding_coverage_s"]
        for level, line in _LEVELS.items():
            xs, ys = cdf_points(p.reach_quantiles[level])
            # events at the level by the durable logs, those whose time is unknown included
            share = ((reach[level]["reached"] + reach[level].get("untimed", 0))
                     / p.metrics[events_of])
            _step_to(axes, xs, ys, share, hi, color=_STYLE.get(p.protocol), linestyle=line,
                     label=f"{p.protocol}, {level} % of subscribers ({share:.1%} of events)")
    _time_axis(figure, axes, lo, hi)
    return figure


def _bytes(label: str, protocols: Sequence[ProtocolQos]) -> Figure | None:
    """One panel per protocol, nodes sorted by total bytes sent, each bar split into
    pub-sub (solid) and DHT (light) bytes; the panels share their y axis."""
    drawn = [p for p in protocols if p.nodes]
    if not drawn:
        return None
    figure = Figure(figsize=(4.2 * len(drawn) + 1, 4.5), layout="constrained")
    panels = figure.subplots(1, len(drawn), sharey=True, squeeze=False)[0]
    figure.suptitle(f"{label}: bytes sent per node, pub-sub + DHT")
    for axes, p in zip(panels, drawn, strict=True):
        nodes = sorted(p.nodes, key=lambda n: n.total_bytes, reverse=True)
        ranks = range(1, len(nodes) + 1)
        pubsub = [n.pubsub_bytes / _MIB for n in nodes]
        dht = [n.dht_bytes / _MIB for n in nodes]
        color = _STYLE.get(p.protocol)
        total = p.metrics["bytes"]
        axes.bar(ranks, pubsub, width=1.0, color=color,
                 label=f"pub-sub: {total['pubsub_total'] / _MIB:,.1f} MiB in all")
        axes.bar(ranks, dht, width=1.0, bottom=pubsub, color=color, alpha=_DHT_ALPHA,
                 label=f"DHT: {total['dht_total'] / _MIB:,.1f} MiB in all")
        axes.set_title(p.protocol)
        axes.set_xlabel("nodes, sorted by bytes sent")
        axes.set_xlim(0.5, len(nodes) + 0.5)
        axes.grid(True, axis="y", alpha=0.25)
        axes.legend(loc="upper right")
    panels[0].set_ylabel("MiB sent")
    return figure
