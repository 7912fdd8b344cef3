"""Verify scenarios: the network, the workload and the fault mix, as TOML.

Every key has a default, so a file names only what it changes; unknown keys are errors (a
typo must not silently run the default). From a scenario and its seed the fault schedule
is a pure function (:func:`pulsar.tools.verify.nemesis.schedule`): the same seed replays the
same faults at the same offsets.

    nodes = 5          # node processes, each in its own network namespace
    duration = 120.0   # seconds of workload while faults come and go
    rate = 4.0         # publishes per second, all publishers together
    large_every = 8    # one publish in this many on the large topic carries 40 KiB
    fault_gap = [2.0, 5.0]      # quiet seconds between two faults (uniform)
    fault_length = [3.0, 10.0]  # seconds a fault lasts (uniform)
    faults = ["partition-halves", "kill-restart", ...]  # the mix (default: every kind)
    every_kind = true  # the schedule holds each kind of the mix at least once
    settle = 60.0      # after the last heal, at most this long for every node to converge
    min_acks = 3       # the nodes' write quorum (3: every publisher is killed at the end)
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FAULT_KINDS", "Scenario", "ScenarioError", "load_scenario"]

FAULT_KINDS: tuple[str, ...] = (
    # made by the kernel on node-to-node traffic
    "loss",
    "delay",
    "reorder",
    "duplicate",
    "corrupt",
    "rate",
    "partition-halves",
    "partition-majority",
    "partition-bridge",
    "partition-ring",
    "partition-isolate",
    # made by the OS on node processes
    "kill-restart",
    "kill",
    "pause",
    "skew-ahead",
    "skew-behind",
    "disk-full",
)
"""Every fault ``pulsarcast verify`` can make (docs/verification.md says how each is made)."""


class ScenarioError(ValueError):
    """A scenario that cannot be run, with what is wrong."""


@dataclass(frozen=True, slots=True)
class Scenario:
    nodes: int = 5
    duration: float = 120.0
    seed: int = 1
    rate: float = 4.0
    large_every: int = 8
    large_bytes: int = 40 * 1024
    fault_gap: tuple[float, float] = (2.0, 5.0)
    fault_length: tuple[float, float] = (3.0, 10.0)
    faults: tuple[str, ...] = FAULT_KINDS
    every_kind: bool = True
    settle: float = 60.0
    disk_mib: int = 256
    """Size of each node's data directory (a tmpfs), so ``disk-full`` can fill it."""
    min_acks: int = 3
    """The nodes' write quorum. An acknowledged event is held by its publisher and at least
    ``min_acks`` others, so it survives the loss of any ``min_acks`` of them; the run
    kills all three publishers at the end, so it needs 3 (with 1, the quorum copy of a
    last event may sit on another publisher only)."""

    def __post_init__(self) -> None:
        if not 5 <= self.nodes <= 60:
            raise ScenarioError(f"nodes must be in 5..60 (roles need five), not {self.nodes}")
        if self.duration <= 0 or self.rate <= 0 or self.settle <= 0:
            raise ScenarioError("duration, rate and settle must be positive")
        unknown = [k for k in self.faults if k not in FAULT_KINDS]
        if unknown:
            raise ScenarioError(f"unknown fault kinds {unknown}; known: {list(FAULT_KINDS)}")
        for name in ("fault_gap", "fault_length"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ScenarioError(f"{name} must be [low, high] with 0 <= low <= high")
        if self.large_every < 1 or self.large_bytes < 1:
            raise ScenarioError("large_every and large_bytes must be >= 1")
        if self.disk_mib < 64:
            raise ScenarioError("disk_mib must be >= 64")
        if not 0 <= self.min_acks < self.nodes:
            raise ScenarioError(f"min_acks must be in 0..{self.nodes - 1}")

    def with_(self, **changes: Any) -> Scenario:
        """This scenario with command-line overrides (``--seed``, ``--nodes``, ...)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def load_scenario(path: Path | str | None) -> Scenario:
    """The scenario in ``path`` (TOML), or the defaults for None."""
    if path is None:
        return Scenario()
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"cannot read {path}: {exc}") from None
    known = {f.name for f in dataclasses.fields(Scenario)}
    unknown = set(raw) - known
    if unknown:
        raise ScenarioError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("fault_gap", "fault_length"):
            if not isinstance(value, list) or len(value) != 2:
                raise ScenarioError(f"{path}: {key} must be [low, high]")
            value = (float(value[0]), float(value[1]))
        elif key == "faults":
            value = tuple(str(v) for v in value)
        values[key] = value
    try:
        return Scenario(**values)
    except TypeError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
