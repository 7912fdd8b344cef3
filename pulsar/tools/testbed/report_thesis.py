"""The Pulsarcast thesis's own Floodsub comparison, beside ours, metric by metric.

The thesis (J. Antunes, "Pulsarcast: Scalable and reliable pub-sub over P2P networks", MSc
thesis, Instituto Superior Técnico, Universidade de Lisboa; source and PDF in
github.com/JGAntunes/pulsarcast, ``thesis/``) summarises its six executions in Table 5.8
(§5.5.7, "Comparison and Discussion"). Only the figures that both it and our report have are
compared: subscription coverage and bytes sent. It measured no delivery latency and ran no
churn; its memory and CPU are whole-cluster peaks, which our per-node samples are not.
The figures below are copied from that table; nothing here is computed from them but ratios.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .report_headline import TIMES

__all__ = ["CITATION", "NETNS_DIFFERENCE", "SETUP_DIFFERENCES", "ThesisExecution", "THESIS",
           "thesis_rows"]

CITATION = ("J. Antunes, *Pulsarcast: Scalable and reliable pub-sub over P2P networks*, MSc "
            "thesis, IST, Universidade de Lisboa (github.com/JGAntunes/pulsarcast), "
            "Table 5.8, §5.5.7")


@dataclass(frozen=True)
class ThesisExecution:
    """One pair of the thesis's executions, as Table 5.8 gives them."""

    pulsarcast: str
    """Its row name for Pulsarcast."""
    floodsub: str
    pulsarcast_coverage: float
    """"Sub. Coverage" (of the events injected)."""
    pulsarcast_coverage_published: float
    """"Sub. Coverage for Published" (of the events effectively published)."""
    floodsub_coverage: float
    pulsarcast_mib: float
    """"Transmitted (MiB)": the peak of the whole cluster's network bytes sent."""
    floodsub_mib: float
    note: str = ""


THESIS: dict[str, ThesisExecution] = {
    "baseline": ThesisExecution("Pulsarcast", "Floodsub", 0.9999, 0.9999, 0.41,
                                2237.74, 6552.4),
    "latency": ThesisExecution("Pulsarcast w/ Lat.", "Floodsub w/ Lat.", 0.52, 0.86, 0.31,
                               3423.0, 6474.79),
    "order": ThesisExecution("Pulsarcast Order G.", "Floodsub", 0.37, 0.82, 0.41,
                             1050.4, 6552.4,
                             note="the thesis ran no Floodsub with order; its row is the "
                                  "plain Floodsub execution"),
}
"""Our scenario name → the thesis's executions it corresponds to (churn has none)."""

SETUP_DIFFERENCES = (
    "The thesis ran the JavaScript implementation inside js-ipfs: 100 IPFS nodes on "
    "Kubernetes over 5 VMs of 2 vCPUs, ~25,000 Reddit comments over 23 topics, latency "
    "500 ms ± 300 ms on every incoming TCP packet (Toxiproxy); its Floodsub nodes crashed "
    "under the load (down to 15 running, §5.5.3), its latency Pulsarcast run took 13 h, and "
    "its order execution had each topic's author publish for everyone else (request to "
    "publish), without loss. Its \"Transmitted\" is the cluster's peak network total, all of "
    "IPFS. Ours: this Python implementation, 100 processes on one 2-vCPU machine, 500 events "
    "at 4/s over 24 topics, 200 to 800 ms per pub-sub frame, order as single-publisher "
    "LAST_SEEN topics under 5 % frame loss; bytes are pub-sub frames and DHT datagrams sent. "
    "Its \"subscription coverage\" (§5.3: subscriptions fulfilled) has no per-pair "
    "definition, so both our delivery ratio and our subscription coverage stand beside it.")

NETNS_DIFFERENCE = (
    "These runs were in network namespaces (`testbed run --netns`): the kernel held every "
    "packet a node sent 200 to 800 ms (latency) or dropped 5 % of them (order), TCP "
    "resending what it lost, instead of the transport holding or dropping pub-sub frames; "
    "\"bytes sent\" is still what the nodes handed to their sockets, and \"bytes on the "
    "wire\" the kernel's interface counters.")
"""Said instead of the loopback setup's last sentence when every run was in namespaces."""


def _ours(run: dict[str, Any], protocol: str) -> str:
    metrics = run["protocols"][protocol]
    ratio, coverage = metrics["delivery_ratio"], metrics["subscription_coverage"]
    if ratio is None or coverage is None:
        return "—"
    return f"{ratio:.2%} · {coverage:.2%}".replace("%", " %")


def _share(value: float) -> str:
    return f"{value:.2%}".replace("%", " %")


def thesis_rows(runs: dict[str, Any]) -> list[list[str]]:
    """Rows of (scenario, metric, ours, the thesis's) for every run whose scenario the thesis
    also ran and that has both protocols, in the order of ``runs``."""
    rows = []
    for label, run in runs.items():
        thesis = THESIS.get(run["name"])
        comparison = run.get("comparison")
        if thesis is None or comparison is None:
            continue
        bytes_ratio = comparison["ratios"]["bytes_total"]
        where = f"`{label}`"
        rows += [
            [where, "Pulsarcast: delivery ratio · subscription coverage (thesis: sub. "
                    "coverage · of published)", _ours(run, "pulsarcast"),
             f"{_share(thesis.pulsarcast_coverage)} · "
             f"{_share(thesis.pulsarcast_coverage_published)} ({thesis.pulsarcast})"],
            [where, "Floodsub: delivery ratio · subscription coverage (thesis: sub. "
                    "coverage)", _ours(run, "floodsub"),
             f"{_share(thesis.floodsub_coverage)} ({thesis.floodsub}"
             + (f"; {thesis.note})" if thesis.note else ")")],
            [where, "Floodsub ÷ Pulsarcast bytes sent (higher = Pulsarcast cheaper)",
             "—" if bytes_ratio is None else f"{bytes_ratio:.2f}{TIMES}",
             f"{thesis.floodsub_mib / thesis.pulsarcast_mib:.2f}{TIMES} "
             f"({thesis.floodsub_mib:,.0f} / {thesis.pulsarcast_mib:,.0f} MiB)"],
        ]
    return rows
