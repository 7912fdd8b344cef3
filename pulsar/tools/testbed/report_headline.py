"""The one-line headline of a run: delivery of both protocols, what it cost, how fast, and
what the slow tail is made of — computed from the run's summary, never written by hand.

A cause for the tail is named only when the traces show it: when most of the slowest 1 %
of Pulsarcast's delivered pairs got their first copy by repair (WANT/BLOCKS or a DHT
fetch; see :mod:`pulsar.tools.testbed.qos_routes`). Otherwise the headline states the tail's
routes and stops.
"""

from __future__ import annotations

from typing import Any

from .trace import REPAIR_MSGS

__all__ = ["BASELINE", "SUBJECT", "TIMES", "headline_facts", "headline_sentence"]

TIMES = "\N{MULTIPLICATION SIGN}"

SUBJECT = "pulsarcast"
BASELINE = "floodsub"
_TAIL_CAUSE = 0.5
"""Share of the tail that must have come by repair before the headline says "from repairs"."""
_NAMES = {"pulsarcast": "Pulsarcast", "floodsub": "Floodsub"}


def headline_facts(run: dict[str, Any]) -> dict[str, Any] | None:
    """The figures the headline states, from one run of summary.json (per protocol →
    metrics); None when the run lacks Pulsarcast."""
    protocols: dict[str, Any] = run["protocols"]
    if SUBJECT not in protocols:
        return None
    subject = protocols[SUBJECT]
    baseline = protocols.get(BASELINE)
    facts: dict[str, Any] = {
        "delivery_ratio": {p: m["delivery_ratio"] for p, m in protocols.items()},
        "latency_s": {p: {"p50": m["latency_s"]["p50"], "p99": m["latency_s"]["p99"]}
                      for p, m in protocols.items()},
        "tail": _tail(subject),
    }
    if baseline is not None:
        facts["bytes_vs_baseline"] = {
            part: _ratio(subject["bytes"][key], baseline["bytes"][key])
            for part, key in (("total", "total"), ("pubsub", "pubsub_total"),
                              ("dht", "dht_total"))}
    return facts


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _tail(metrics: dict[str, Any]) -> dict[str, Any]:
    """The slowest 1 % of delivered pairs (latency ≥ p99) by the route of their first copy."""
    by_via: dict[str, int] = metrics.get("first_copy", {}).get("tail_by_via", {})
    pairs = sum(by_via.values())
    repaired = sum(n for via, n in by_via.items() if via in REPAIR_MSGS)
    share = repaired / pairs if pairs else None
    return {"pairs": pairs, "by_repair": repaired, "repair_share": share,
            "from_repair": share is not None and share >= _TAIL_CAUSE}


def _percent(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2%}".replace("%", " %")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}{TIMES}"


def headline_sentence(label: str, facts: dict[str, Any]) -> str:
    """One Markdown line: "**baseline**: Pulsarcast delivered 100.00 % vs Floodsub's …"."""
    delivery = facts["delivery_ratio"]
    latency = facts["latency_s"]
    others = [p for p in delivery if p != SUBJECT]
    text = f"**{label}**: Pulsarcast delivered {_percent(delivery[SUBJECT])} of expected pairs"
    if others:
        text += " vs " + ", ".join(f"{_NAMES.get(p, p)}'s {_percent(delivery[p])}"
                                   for p in others)
    cost = facts.get("bytes_vs_baseline")
    if cost:
        text += (f"; cost: {_times(cost['total'])} {_NAMES[BASELINE]}'s bytes sent "
                 f"(pub-sub {_times(cost['pubsub'])}, DHT {_times(cost['dht'])})")
    mine = latency[SUBJECT]
    text += (f"; latency of delivered pairs p50 {_duration(mine['p50'])}, "
             f"p99 {_duration(mine['p99'])}")
    if others:
        text += " (" + ", ".join(f"{_NAMES.get(p, p)} {_duration(latency[p]['p50'])} / "
                                 f"{_duration(latency[p]['p99'])}" for p in others) + ")"
    return text + _tail_clause(facts["tail"]) + "."


def _tail_clause(tail: dict[str, Any]) -> str:
    pairs, repaired = tail["pairs"], tail["by_repair"]
    if not pairs:
        return ""
    if tail["from_repair"]:
        return (f" — the p99 is from repairs: {repaired} of the {pairs} slowest pairs "
                f"({_percent(tail['repair_share'])}) got their first copy by WANT/BLOCKS "
                "or a DHT fetch")
    if repaired == 0:
        return f" — all {pairs} slowest pairs came by the tree, none by repair"
    return (f" — {repaired} of the {pairs} slowest pairs came by repair, the rest by the "
            "tree")
