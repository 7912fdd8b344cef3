"""Run directories as input of the QoS report: checked and reduced to what the Spark job needs.

Everything here is plain Python and runs before a Spark session exists, so a wrong path or a
broken manifest is reported in a second instead of after the JVM has started. The manifest
says what was *expected* (who subscribed to what, which topics are ordered); the durable
delivery logs (``<protocol>/delivery-logs.json``) say what was delivered, and are read and
checked here; the traces say when and how, and only their file names are looked at here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .delivery_logs import DELIVERY_LOGS, DeliveryLogs, load_delivery_logs
from .manifest import load_manifest

__all__ = ["KNOWN_PROTOCOLS", "ProtocolRun", "RunInput", "load_runs", "trace_files"]

KNOWN_PROTOCOLS = ("pulsarcast", "floodsub")
"""Report order: Pulsarcast first, the baseline second, anything else after, by name."""

_TRACE_GLOB = "node-*.jsonl"


@dataclass(frozen=True)
class ProtocolRun:
    """One protocol's half of a run: its trace files and the expectations of its manifest."""

    protocol: str
    trace_dir: Path
    trace_files: tuple[Path, ...]
    nodes: tuple[int, ...]
    subscriptions: tuple[tuple[str, int], ...]
    """(topic CID, subscriber node index), each pair once."""
    ordered_topics: frozenset[str]
    topics: int
    faults: int
    delivery_logs: DeliveryLogs | None = None
    """The nodes' durable delivery logs at the end of the run; None for a run directory
    without them (made before the runner recorded them): delivery then comes from traces."""
    wire_tx_bytes: int | None = None
    """Bytes every node sent on its link, from the kernel's interface counters: runs in
    network namespaces (``testbed run --netns``) only."""


@dataclass(frozen=True)
class RunInput:
    """A run directory as the report sees it; ``label`` names it in tables, files and JSON."""

    label: str
    path: Path
    name: str
    protocols: tuple[ProtocolRun, ...]
    network: str = "loopback"
    """"netns" for a run in network namespaces (faults made by the kernel)."""


def load_runs(run_dirs: Sequence[Path]) -> list[RunInput]:
    """Check every run directory and read its manifest; ValueError says what is wrong."""
    if not run_dirs:
        raise ValueError("no run directory given")
    seen: set[Path] = set()
    runs: list[RunInput] = []
    labels: set[str] = set()
    for given in run_dirs:
        path = Path(given).resolve()
        if not path.is_dir():
            raise ValueError(f"{given}: not a directory")
        if path in seen:
            raise ValueError(f"{given}: run directory given twice")
        seen.add(path)
        manifest = load_manifest(path)
        label = _unique_label(path.name, labels)
        labels.add(label)
        runs.append(RunInput(label=label, path=path, name=str(manifest.get("name") or path.name),
                             network=str(manifest.get("network") or "loopback"),
                             protocols=_protocols(path, manifest)))
    return runs


def trace_files(run: RunInput) -> int:
    """How many node trace files the run has, over all its protocols."""
    return sum(len(p.trace_files) for p in run.protocols)


def _unique_label(name: str, taken: set[str]) -> str:
    """Labels become file names and Markdown link targets, so keep them to a safe alphabet."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"
    label, n = base, 2
    while label in taken:
        label, n = f"{base}-{n}", n + 1
    return label


def _order_key(protocol: str) -> tuple[int, str]:
    if protocol in KNOWN_PROTOCOLS:
        return KNOWN_PROTOCOLS.index(protocol), ""
    return len(KNOWN_PROTOCOLS), protocol


def _protocols(run_dir: Path, manifest: dict[str, Any]) -> tuple[ProtocolRun, ...]:
    where = run_dir / "run.json"
    sections: dict[str, Any] = manifest["protocols"]
    if not sections:
        raise ValueError(f"{where}: 'protocols' is empty")
    protocols = []
    for protocol in sorted(sections, key=_order_key):
        section = sections[protocol]
        if not isinstance(section, dict):
            raise ValueError(f"{where}: protocols.{protocol} is not an object")
        trace_dir = run_dir / protocol
        files = tuple(sorted(trace_dir.glob(_TRACE_GLOB))) if trace_dir.is_dir() else ()
        if not files:
            raise ValueError(f"{run_dir}: no traces for protocol {protocol!r} "
                             f"(expected {trace_dir}/{_TRACE_GLOB})")
        subscriptions, ordered, topics = _topics(where, protocol, section.get("topics"))
        protocols.append(ProtocolRun(
            protocol=protocol, trace_dir=trace_dir, trace_files=files,
            nodes=_nodes(where, protocol, section.get("nodes")),
            subscriptions=subscriptions, ordered_topics=ordered, topics=topics,
            faults=len(section.get("faults") or ()),
            delivery_logs=load_delivery_logs(trace_dir / DELIVERY_LOGS),
            wire_tx_bytes=_wire(where, protocol, section.get("wire")),
        ))
    return tuple(protocols)


def _wire(where: Path, protocol: str, wire: Any) -> int | None:
    if wire is None:
        return None
    sent = wire.get("tx_bytes") if isinstance(wire, dict) else None
    if not isinstance(sent, int) or isinstance(sent, bool) or sent < 0:
        raise ValueError(f"{where}: protocols.{protocol}.wire has no byte count 'tx_bytes'")
    return sent


def _nodes(where: Path, protocol: str, nodes: Any) -> tuple[int, ...]:
    if not isinstance(nodes, list):
        raise ValueError(f"{where}: protocols.{protocol}.nodes is not a list")
    indices = []
    for node in nodes:
        index = node.get("index") if isinstance(node, dict) else None
        if not isinstance(index, int) or isinstance(index, bool):
            raise ValueError(f"{where}: protocols.{protocol}.nodes has an entry without an "
                             f"integer 'index': {node!r}")
        indices.append(index)
    return tuple(indices)


def _topics(where: Path, protocol: str,
            topics: Any) -> tuple[tuple[tuple[str, int], ...], frozenset[str], int]:
    if not isinstance(topics, list):
        raise ValueError(f"{where}: protocols.{protocol}.topics is not a list")
    pairs: dict[tuple[str, int], None] = {}
    ordered: set[str] = set()
    for topic in topics:
        cid = topic.get("cid") if isinstance(topic, dict) else None
        subscribers = topic.get("subscribers") if isinstance(topic, dict) else None
        if not isinstance(cid, str) or not isinstance(subscribers, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in subscribers):
            raise ValueError(f"{where}: protocols.{protocol}.topics has an entry without a "
                             f"'cid' string and a 'subscribers' list of node indices: {topic!r}")
        if topic.get("order") is True:
            ordered.add(cid)
        for subscriber in subscribers:
            pairs[(cid, subscriber)] = None
    return tuple(pairs), frozenset(ordered), len(topics)
