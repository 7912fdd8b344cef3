"""``RUN_DIR/<protocol>/delivery-logs.json``: what every node's durable delivery log held at
the end of a run — the source of the report's delivery and coverage figures.

A node the testbed kills (SIGKILL) loses the tail of its trace — records are flushed every
0.25 s — but not the deliveries its SQLite delivery log had committed: what the application
was handed and will still be handed after a restart. So delivery, once reached, is read from
the logs, not from ``deliver`` records; the traces stay the source of *when* and *how* (latency,
hops, routes, copies, bytes). The runner writes this file after the nodes of a protocol are
stopped, reading each node's store from its data directory (a node that was down at the end
included). Shape::

    {
      "format": 1,
      "until": 1763900075.0,               # the end of the run (the settle phase over):
                                           # entries logged later are left out
      "nodes": {
        "0": {"bafyrei<topic>": ["bafyrei<event>", ...], ...},  # workload topics with entries
        "7": null                          # the log could not be read
      }
    }

A node with no entries has ``{}``; a node missing from ``nodes`` or ``null`` has no usable
record, and the report falls back to that node's traces for it (and says so).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dag import CID
from dag.store import BlockStore
from pulsar.runtime.node_state import NodeState

__all__ = ["DELIVERY_LOGS", "FORMAT", "DeliveryLogs", "load_delivery_logs", "read_node_log",
           "write_delivery_logs"]

log = logging.getLogger("pulsar.tools.testbed.delivery_logs")

FORMAT = 1
DELIVERY_LOGS = "delivery-logs.json"
STORE_FILE = "node.sqlite3"
"""The node's database in its data directory (``pulsar.node.Node.start``)."""


def read_node_log(data_dir: Path, topics: Iterable[str],
                  until: float) -> dict[str, list[str]] | None:
    """The events in the delivery log of each of ``topics`` in the node store under
    ``data_dir``, oldest first, logged at or before ``until``; topics without entries are
    left out. None when there is no store or it cannot be read. The node must be stopped (or
    killed): the store is opened as the node would open it, which recovers a killed node's
    write-ahead log exactly as its restart would have."""
    path = Path(data_dir) / STORE_FILE
    if not path.is_file():
        return None
    try:
        with BlockStore(path, cache_size=0) as store:
            state = NodeState(store)
            entries = {}
            for topic in topics:
                events = [str(event) for _, event, at in state.log_range(CID.parse(topic))
                          if at <= until]
                if events:
                    entries[topic] = events
            return entries
    except Exception as exc:  # a damaged or half-created file: say so, count it as unread
        log.warning("cannot read the delivery log in %s: %s", path, exc)
        return None


def write_delivery_logs(path: Path, until: float,
                        nodes: Mapping[int, Mapping[str, list[str]] | None]) -> None:
    """Write atomically, like the manifest."""
    tmp = path.with_suffix(".tmp")
    body = {"format": FORMAT, "until": until,
            "nodes": {str(node): None if entries is None else dict(entries)
                      for node, entries in sorted(nodes.items())}}
    tmp.write_text(json.dumps(body, separators=(",", ":")))
    tmp.replace(path)


@dataclass(frozen=True)
class DeliveryLogs:
    """One protocol's delivery logs as the report uses them."""

    path: Path
    until: float
    nodes: frozenset[int]
    """The nodes whose log was read (possibly empty); the others have no usable record."""
    entries: tuple[tuple[int, str], ...]
    """(node, event CID) of every entry, each pair once."""


def load_delivery_logs(path: Path) -> DeliveryLogs | None:
    """The file at ``path``, checked; None if there is none (a run made before the runner
    wrote it). ValueError says what is wrong with a file that is there."""
    try:
        body = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown delivery-log format "
                         f"{body.get('format') if isinstance(body, dict) else body!r}")
    until, nodes = body.get("until"), body.get("nodes")
    if not isinstance(until, int | float) or isinstance(until, bool):
        raise ValueError(f"{path}: 'until' is not a time")
    if not isinstance(nodes, dict):
        raise ValueError(f"{path}: 'nodes' is not an object")
    read: set[int] = set()
    pairs: dict[tuple[int, str], None] = {}
    for key, topics in nodes.items():
        node = _node_index(path, key)
        if topics is None:
            continue
        if not isinstance(topics, dict) or not all(
                isinstance(topic, str) and isinstance(events, list)
                and all(isinstance(event, str) for event in events)
                for topic, events in topics.items()):
            raise ValueError(f"{path}: node {key} is not null or an object of topic CID → "
                             f"list of event CIDs")
        read.add(node)
        for events in topics.values():
            for event in events:
                pairs[(node, event)] = None
    return DeliveryLogs(path=Path(path), until=float(until), nodes=frozenset(read),
                        entries=tuple(pairs))


def _node_index(path: Path, key: Any) -> int:
    try:
        node = int(key)
    except ValueError:
        raise ValueError(f"{path}: node key {key!r} is not a node index") from None
    if node < 0 or str(node) != key:
        raise ValueError(f"{path}: node key {key!r} is not a node index")
    return node
