"""Scenario files: what network to build, what to publish, which faults to inject.

A scenario is a TOML file (``scenarios/*.toml``); every key has a default, so a file names
only what it changes. Unknown keys are errors (a typo must not silently run the default).
See ``docs/testbed.md`` for the format with an example. From a scenario and its seed the
workload — who subscribes to what, who publishes what when, which nodes crash — is a pure
function (:mod:`pulsar.tools.testbed.workload`), so both protocols get exactly the same one.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pulsar.config import PROTOCOLS

__all__ = ["Fault", "Network", "Scenario", "ScenarioError", "Settle", "Workload",
           "load_scenario"]

FAULT_KINDS = ("crash", "partition")


class ScenarioError(ValueError):
    """A scenario file that cannot be run, with what is wrong and where."""


@dataclass(frozen=True, slots=True)
class Workload:
    topics: int = 20
    """Topics, created by authors drawn at random."""
    popularity_skew: float = 1.0
    """Zipf exponent: topic i is subscribed by about ``max_subscribers / (i+1)**skew`` of
    the nodes, and published to in the same proportion."""
    max_subscribers: float = 0.6
    """Fraction of nodes subscribed to the most popular topic."""
    min_subscribers: int = 3
    """Every topic has at least this many subscribers (its author included)."""
    events: int = 3000
    """Events published in all, over all topics."""
    rate: float = 50.0
    """Events per second, whole network (evenly spaced)."""
    payload_bytes: int = 256
    order_topics: int = 1
    """Of the topics, this many (the least popular) have a single publisher, their author,
    and LAST_SEEN linking: the order-guarantee case."""

    @property
    def duration(self) -> float:
        return self.events / self.rate


@dataclass(frozen=True, slots=True)
class Network:
    latency: float = 0.0
    """Seconds every pub-sub frame is held (injected at the transport)."""
    jitter: float = 0.0
    """Extra hold, uniform in 0..jitter seconds per frame."""
    loss: float = 0.0
    """Probability a pub-sub frame is dropped."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault on the timeline, ``at`` seconds after publishing starts.

    ``crash``: ``fraction`` of the nodes (or the listed ``nodes``) are killed (SIGKILL) and,
    ``restart_after`` seconds later (if given), started again on the same data directory.
    ``partition``: ``fraction`` of the nodes (or ``nodes``) are cut off from the rest until
    ``heal_after`` seconds later (if given)."""

    at: float
    kind: str
    fraction: float = 0.0
    nodes: tuple[int, ...] = ()
    restart_after: float | None = None
    heal_after: float | None = None


@dataclass(frozen=True, slots=True)
class Settle:
    quiet: float = 10.0
    """After publishing ends, stop once no delivery happened for this long..."""
    max: float = 120.0
    """...or this long after publishing ended, whichever comes first (or when every
    expected delivery has happened)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    nodes: int = 100
    seed: int = 1
    description: str = ""
    protocols: tuple[str, ...] = PROTOCOLS
    workload: Workload = field(default_factory=Workload)
    network: Network = field(default_factory=Network)
    faults: tuple[Fault, ...] = ()
    settle: Settle = field(default_factory=Settle)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_scenario(path: Path) -> Scenario:
    """Read and check a scenario file; :class:`ScenarioError` says what is wrong."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_scenario(raw, default_name=Path(path).stem)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def parse_scenario(raw: dict[str, Any], *, default_name: str = "scenario") -> Scenario:
    raw = dict(raw)
    workload = _section(Workload, raw.pop("workload", {}), "workload")
    network = _section(Network, raw.pop("network", {}), "network")
    settle = _section(Settle, raw.pop("settle", {}), "settle")
    faults_raw = raw.pop("faults", [])
    if not isinstance(faults_raw, list):
        raise ScenarioError("'faults' must be an array of tables ([[faults]])")
    faults = tuple(_fault(f, i) for i, f in enumerate(faults_raw))
    raw.setdefault("name", default_name)
    if "protocols" in raw:
        protocols = raw["protocols"]
        if not isinstance(protocols, list) or not protocols or any(
            p not in PROTOCOLS for p in protocols
        ):
            raise ScenarioError(f"'protocols' must be a non-empty list of {list(PROTOCOLS)}")
        raw["protocols"] = tuple(protocols)
    scenario = _section(Scenario, raw, "scenario", workload=workload, network=network,
                        settle=settle, faults=faults)
    _check(scenario)
    return scenario


_T = TypeVar("_T")


def _section(cls: type[_T], raw: Any, where: str, **extra: Any) -> _T:
    if not isinstance(raw, dict):
        raise ScenarioError(f"[{where}] must be a table")
    names = {f.name for f in dataclasses.fields(cls)} - set(extra)  # type: ignore[arg-type]
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ScenarioError(f"[{where}]: unknown key(s) {', '.join(unknown)}; "
                            f"known: {', '.join(sorted(names))}")
    types = {f.name: f.type for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key, value in raw.items():
        expected = types[key]
        if "float" in expected and isinstance(value, int) and not isinstance(value, bool):
            raw[key] = float(value)
        elif expected == "int" and not (isinstance(value, int) and not isinstance(value, bool)):
            raise ScenarioError(f"[{where}] {key} must be an integer, not {value!r}")
        elif expected == "str" and not isinstance(value, str):
            raise ScenarioError(f"[{where}] {key} must be a string, not {value!r}")
    try:
        return cls(**raw, **extra)
    except TypeError as exc:
        raise ScenarioError(f"[{where}]: {exc}") from None


def _fault(raw: Any, index: int) -> Fault:
    where = f"faults[{index}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where} must be a table")
    raw = dict(raw)
    if "nodes" in raw:
        nodes = raw["nodes"]
        if not isinstance(nodes, list) or not all(isinstance(n, int) for n in nodes):
            raise ScenarioError(f"{where}.nodes must be a list of node indices")
        raw["nodes"] = tuple(nodes)
    fault: Fault = _section(Fault, raw, where)
    if fault.kind not in FAULT_KINDS:
        raise ScenarioError(f"{where}.kind must be one of {', '.join(FAULT_KINDS)}")
    if fault.kind == "crash" and fault.heal_after is not None:
        raise ScenarioError(f"{where}: a crash has restart_after, not heal_after")
    if fault.kind == "partition" and fault.restart_after is not None:
        raise ScenarioError(f"{where}: a partition has heal_after, not restart_after")
    if not fault.nodes and not 0.0 < fault.fraction < 1.0:
        raise ScenarioError(f"{where}: give nodes = [...] or a fraction in (0, 1)")
    return fault


def _check(s: Scenario) -> None:
    w, n = s.workload, s.network

    def positive(value: float, what: str) -> None:
        if not (math.isfinite(value) and value > 0):
            raise ScenarioError(f"{what} must be a positive number, not {value}")

    if not 2 <= s.nodes <= 1000:
        raise ScenarioError(f"nodes must be in 2..1000, not {s.nodes}")
    if not 1 <= w.topics <= 1000:
        raise ScenarioError(f"[workload] topics must be in 1..1000, not {w.topics}")
    if not 0 <= w.order_topics <= w.topics:
        raise ScenarioError("[workload] order_topics must be in 0..topics")
    if not 1 <= w.events <= 1_000_000:
        raise ScenarioError(f"[workload] events must be in 1..1000000, not {w.events}")
    positive(w.rate, "[workload] rate")
    if not 0.0 < w.max_subscribers <= 1.0:
        raise ScenarioError("[workload] max_subscribers must be in (0, 1]")
    if not 1 <= w.min_subscribers <= s.nodes:
        raise ScenarioError("[workload] min_subscribers must be in 1..nodes")
    if not 1 <= w.payload_bytes <= 4096:
        raise ScenarioError("[workload] payload_bytes must be in 1..4096 (inline payloads)")
    if not math.isfinite(w.popularity_skew) or w.popularity_skew < 0:
        raise ScenarioError("[workload] popularity_skew must be >= 0")
    for value, what in ((n.latency, "latency"), (n.jitter, "jitter")):
        if not (math.isfinite(value) and 0 <= value <= 10):
            raise ScenarioError(f"[network] {what} must be in 0..10 seconds")
    if not 0.0 <= n.loss < 1.0:
        raise ScenarioError("[network] loss must be in 0..1")
    positive(s.settle.quiet, "[settle] quiet")
    positive(s.settle.max, "[settle] max")
    for i, f in enumerate(s.faults):
        if any(not 0 <= node < s.nodes for node in f.nodes):
            raise ScenarioError(f"faults[{i}].nodes must be in 0..{s.nodes - 1}")
        if not math.isfinite(f.at) or f.at < 0:
            raise ScenarioError(f"faults[{i}].at must be >= 0 seconds")
