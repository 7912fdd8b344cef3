"""The simulator's scaling plot: RMR, LDH and bytes per delivered event against network
size, one line per protocol, from ``pulsarcast sim`` JSON lines.

``python -m pulsar.tools.sim.plot RESULTS.jsonl OUT.png [--scenario single]``. Drawn on a
matplotlib ``Figure`` with the Agg canvas (no display, no pyplot state), as the testbed
report's plots are.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["load_results", "write_scaling_plot"]

_STYLE = {"pulsarcast": "tab:blue", "floodsub": "tab:orange"}


def load_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_scaling_plot(results: Sequence[dict[str, Any]], out: Path, scenario: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 3.6))
    FigureCanvasAgg(figure)
    panels = (("rmr", "RMR (payload copies per delivery - 1)"),
              ("ldh", "LDH (largest delivery hop)"),
              ("bytes_per_delivery", "bytes sent per delivered event"))
    for index, (key, title) in enumerate(panels, start=1):
        axes = figure.add_subplot(1, 3, index)
        for protocol, colour in _STYLE.items():
            points = sorted((r["nodes"], r[key]) for r in results
                            if r["protocol"] == protocol and r["scenario"] == scenario
                            and r.get(key) is not None)
            if points:
                axes.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                          color=colour, label=protocol)
        axes.set_xscale("log")
        if key != "ldh":
            axes.set_yscale("log")
        axes.set_xlabel("nodes")
        axes.set_title(title, fontsize=9)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(f"pulsarcast sim, scenario {scenario}", fontsize=10)
    figure.tight_layout()
    figure.savefig(out, dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pulsar.tools.sim.plot")
    parser.add_argument("results", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--scenario", default="single")
    args = parser.parse_args(argv)
    write_scaling_plot(load_results(args.results), args.out, args.scenario)
    print(args.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
