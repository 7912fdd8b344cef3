"""The fault schedule: which fault, on which nodes, when and for how long.

A pure function of the scenario and its seed, so a failing run replays exactly. Faults
come one at a time (a fault starts only after the previous one healed and a quiet gap
passed): each anomaly the checker finds can then be laid next to the one fault that was
active, and convergence is measured from each heal.

Which nodes a fault hits follows the workload's roles (:mod:`pulsar.tools.verify.workload`):
node 0, 1 and 2 author the three topics. A ``kill`` without restart never takes an author
(it is restarted only at the end, and the run's promise is about live subscribers), and
``disk-full`` fills a publisher's disk so the refusal is visible to a client.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from .scenario import Scenario

__all__ = ["PlannedFault", "partition_groups", "schedule"]


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One fault: starts ``at`` seconds into the workload, heals ``length`` later."""

    id: int
    kind: str
    at: float
    length: float
    nodes: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def heal_at(self) -> float:
        return self.at + self.length

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "nodes": list(self.nodes),
            "length": self.length,
            **self.params,
        }


def schedule(scenario: Scenario) -> list[PlannedFault]:
    """The faults of one run, in time order, all healed before ``scenario.duration``."""
    rng = random.Random(f"verify-nemesis-{scenario.seed}")
    kinds = list(scenario.faults)
    todo: list[str] = []
    if scenario.every_kind:
        todo = kinds[:]
        rng.shuffle(todo)
    faults: list[PlannedFault] = []
    t = rng.uniform(*scenario.fault_gap)
    while True:
        kind = todo.pop() if todo else rng.choice(kinds)
        length = rng.uniform(*scenario.fault_length)
        if t + length > scenario.duration:
            break
        nodes, params = _targets(kind, scenario.nodes, rng)
        faults.append(PlannedFault(len(faults), kind, round(t, 3), round(length, 3), nodes, params))
        t += length + rng.uniform(*scenario.fault_gap)
    return faults


def _targets(kind: str, n: int, rng: random.Random) -> tuple[tuple[int, ...], dict[str, Any]]:
    everyone = tuple(range(n))
    match kind:
        case "loss":
            return everyone, {"percent": rng.choice([3, 10, 30])}
        case "delay":
            return everyone, {
                "delay_ms": rng.choice([20, 50, 100]),
                "jitter_ms": rng.choice([10, 40]),
            }
        case "reorder":
            return everyone, {"delay_ms": 30, "jitter_ms": 30, "reorder_pct": 50}
        case "duplicate":
            return everyone, {"duplicate_pct": rng.choice([5, 20])}
        case "corrupt":
            return everyone, {"corrupt_pct": rng.choice([1, 5])}
        case "rate":
            return tuple(sorted(rng.sample(everyone, max(1, n // 3)))), {
                "kbit": rng.choice([256, 1024])
            }
        case k if k.startswith("partition-"):
            return everyone, {"groups": partition_groups(k, n, rng)}
        case "kill":  # not an author: it stays down until the end of the workload
            return (rng.randrange(3, n),), {}
        case "kill-restart" | "pause":
            return (rng.randrange(n),), {}
        case "skew-ahead":
            return (rng.randrange(n),), {"offset_s": rng.choice([120, 600])}
        case "skew-behind":
            return (rng.randrange(n),), {"offset_s": -rng.choice([120, 600])}
        case "disk-full":
            return (rng.choice([0, 1, 2]),), {}
    raise ValueError(f"unknown fault kind {kind!r}")


def partition_groups(kind: str, n: int, rng: random.Random) -> list[list[int]]:
    """Who can still talk to whom, as groups (a node may be in two: a bridge). Nodes in
    no common group are cut apart."""
    order = list(range(n))
    rng.shuffle(order)
    match kind:
        case "partition-halves":
            return [sorted(order[: n // 2]), sorted(order[n // 2 :])]
        case "partition-majority":
            cut = n // 2 + 1
            return [sorted(order[:cut]), sorted(order[cut:])]
        case "partition-bridge":
            # Two sides that both reach one bridge node, but not each other.
            bridge, rest = order[0], order[1:]
            half = len(rest) // 2
            return [sorted([bridge, *rest[:half]]), sorted([bridge, *rest[half:]])]
        case "partition-ring":
            # Each node reaches only its two ring neighbours.
            return [sorted([order[i], order[(i + 1) % n]]) for i in range(n)]
        case "partition-isolate":
            return [[order[0]], sorted(order[1:])]
    raise ValueError(f"unknown partition {kind!r}")
