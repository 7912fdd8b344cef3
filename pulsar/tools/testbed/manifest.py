"""``RUN_DIR/run.json``: what a testbed run did, for the report job.

The traces say what each node saw; the manifest says what was asked of the network — who
subscribed to what, when publishing started and stopped, which faults were injected when —
so the report can tell a missing delivery from one that was never expected; each protocol's
``delivery-logs.json`` says what every node's durable delivery log held at the end. Shape::

    {
      "format": 1,
      "name": "baseline-100",              # the scenario's name
      "scenario": {...},                   # the scenario as run (pulsar.tools.testbed.scenario)
      "protocols": {
        "pulsarcast": {
          "started": 1763900000.0,         # nodes starting
          "publish_start": ..., "publish_end": ...,
          "ended": ...,                    # after the settle phase, before stopping nodes
          "nodes": [{"index": 0, "peer": "12D3KooW..."}, ...],
          "topics": [{"cid": "bafyrei...", "name": "topic-0", "author": 0,
                      "order": false, "subscribers": [1, 5, 9]}, ...],
          "faults": [{"t": ..., "kind": "crash", "nodes": [3, 7]},
                     {"t": ..., "kind": "restart", "nodes": [3, 7]},
                     {"t": ..., "kind": "partition", "groups": [[0, 1], [2, 3]]},
                     {"t": ..., "kind": "heal"}],
          "expected_log_entries": ..., "uncertain_log_entries": ...,
          "delivered_log_entries": ...,    # the runner's progress count (see docs/testbed.md)
          "delivery_logs": {"file": "pulsarcast/delivery-logs.json", "entries": ...,
                            "unreadable_nodes": []}   # pulsar.tools.testbed.delivery_logs
        },
        "floodsub": {...}                  # same shape, same workload and faults
      }
    }

Subscribers are the nodes expected to deliver a topic's events: the publisher of an event is
not expected to deliver its own (it has it), whether or not it subscribed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "MANIFEST", "load_manifest", "write_manifest"]

FORMAT = 1
MANIFEST = "run.json"


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Write atomically: a run interrupted while writing leaves the old manifest or none."""
    path = run_dir / MANIFEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, **manifest}, indent=1))
    tmp.replace(path)


def load_manifest(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / MANIFEST
    try:
        manifest: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{run_dir}: not a testbed run directory (no {MANIFEST})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown manifest format {manifest.get('format')!r}")
    if not isinstance(manifest.get("protocols"), dict):
        raise ValueError(f"{path}: no 'protocols' section")
    checked: dict[str, Any] = manifest
    return checked
