"""``pulsarcast bench publish``: what the write quorum does to publishing.

Real nodes (UDP DHT, TCP transport, SQLite each) on loopback; the author publishes 256-byte
events and the other ``nodes - 1`` subscribe. Two measurements, each made with the write
quorum (the publish returns once ``min_acks`` = 1 DHT node stored the event, the other
replicas are written behind it) and with every replica awaited (``wait_all_replicas``, what
publishing did before), in the order quorum/all/all/quorum on the same network so machine
noise falls on both:

* ``publish_p50_ms``: ``events`` sequential ``publish()`` calls, the median time from the
  call to its return;
* ``deliveries_per_s``: ``events`` publishes with 64 in flight, unpaced; (subscribers x
  events) / the time from the first call until every subscriber has yielded every event.

**Processes.** A quorum can only return before the slowest replica when the replicas work
in parallel with each other, as separate machines do. With every node in one event loop the
20 nodes' work for an event (19 STOREs and 19 deliveries, each verified and committed) runs
one piece after another on one core, and the first acknowledgement is read only after it
all: the ratio is ~1 whatever the protocol does. So by default the subscribers run in
worker processes (``processes``, one per CPU, as ``bench tree`` does; the author in this
process); ``processes=0`` puts every node in this process (:mod:`.publish_probe`).

**Against an older revision** (``against``): the issue's baseline is the code before the
write quorum, measured by the same harness in the same run. The revision is unpacked with
``git archive``, and :mod:`.publish_probe` runs on it and on this code in subprocesses, each
a fresh network with the subscribers in the same number of workers, alternated
old/new/new/old: ``deliveries_per_s_against`` / ``_now`` and ``deliveries_vs_against``
(target ≥ 3). The old code has no quorum, so it waits for every replica; this code runs
its default quorum.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from .publish_probe import probe

__all__ = ["bench_publish"]

ORDER = ("quorum", "all", "all", "quorum")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def bench_publish(nodes: int = 20, events: int = 200, processes: int | None = None,
                        against: str | None = None) -> dict[str, Any]:
    if nodes < 3 or events < 10:
        raise ValueError("the publish benchmark needs at least 3 nodes and 10 events")
    processes = (os.cpu_count() or 1) if processes is None else processes
    processes = max(0, min(processes, nodes - 1))
    if against is not None:
        _check_revision(against)  # before minutes of measuring, not after
    runs = await probe(nodes, events, list(ORDER), processes)
    q50, a50 = min(runs["quorum_p50"]), min(runs["all_p50"])
    qrate, arate = max(runs["quorum_rate"]), max(runs["all_rate"])
    figures: dict[str, Any] = {
        "bench": "publish",
        "nodes": nodes,
        "events": events,
        "processes": processes,
        "publish_p50_ms_quorum": round(q50 * 1000, 3),
        "publish_p50_ms_all_replicas": round(a50 * 1000, 3),
        "publish_p50_quorum_vs_all": round(q50 / a50, 3),
        "deliveries_per_s_quorum": round(qrate),
        "deliveries_per_s_all_replicas": round(arate),
        "deliveries_quorum_vs_all": round(qrate / arate, 3),
        "author_cpu_ms_per_publish_quorum": round(min(runs["quorum_author_cpu"]) * 1000, 3),
        "author_cpu_ms_per_publish_all_replicas": round(min(runs["all_author_cpu"]) * 1000, 3),
        "machine_busy_share_sequential": round(max(runs["quorum_busy"] + runs["all_busy"]), 3),
        "cpu_us_per_delivery_quorum": round(min(runs["quorum_cpu_per_delivery"]) * 1e6, 1),
        "cpu_us_per_delivery_all_replicas": round(min(runs["all_cpu_per_delivery"]) * 1e6, 1),
        "runs": {k: [round(v, 5) for v in vs] for k, vs in runs.items()},
    }
    if against is not None:
        figures.update(await _against(against, nodes, events, processes))
    return figures


def _check_revision(revision: str) -> None:
    """Raise ValueError, in words, unless ``revision`` names a commit of this checkout."""
    here = Path(__file__).resolve().parents[3]
    try:
        subprocess.run(["git", "-C", str(here), "rev-parse", "--verify", "--quiet",
                        f"{revision}^{{commit}}"], check=True, capture_output=True)
    except FileNotFoundError:
        raise ValueError("--against needs git, and git is not installed") from None
    except subprocess.CalledProcessError:
        raise ValueError(f"--against {revision}: not a commit of the git checkout at "
                         f"{here}") from None


async def _against(revision: str, nodes: int, events: int, processes: int
                   ) -> dict[str, Any]:
    """Deliveries per second of ``revision`` (every replica awaited: it has no quorum) and
    of this code (default quorum), each in a fresh network of its own with the same
    harness (subscribers in ``processes`` workers), alternated old/new/new/old."""
    here = Path(__file__).resolve().parents[3]
    with tempfile.TemporaryDirectory(prefix="pulsarcast-against-") as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        _say(f"unpacking {revision}")
        archive = subprocess.run(["git", "-C", str(here), "archive", revision],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        rates: dict[str, list[float]] = {"against": [], "now": []}
        p50s: dict[str, list[float]] = {"against": [], "now": []}
        per_delivery: dict[str, list[float]] = {"against": [], "now": []}
        for which in ("against", "now", "now", "against"):
            tree, mode = (old, "all") if which == "against" else (here, "quorum")
            _say(f"{which}: {revision if which == 'against' else 'this code'}")
            result = await _run_probe(tree, nodes, events, mode, processes)
            rates[which].append(result[f"{mode}_rate"][0])
            per_delivery[which].append(result[f"{mode}_cpu_per_delivery"][0])
            p50s[which].append(result[f"{mode}_p50"][0])
    then, now = max(rates["against"]), max(rates["now"])
    return {
        "against": revision,
        "deliveries_per_s_against": round(then),
        "deliveries_per_s_now": round(now),
        "deliveries_vs_against": round(now / then, 3),
        "publish_p50_ms_against": round(min(p50s["against"]) * 1000, 3),
        "publish_p50_ms_now": round(min(p50s["now"]) * 1000, 3),
        "cpu_us_per_delivery_against": round(min(per_delivery["against"]) * 1e6, 1),
        "cpu_us_per_delivery_now": round(min(per_delivery["now"]) * 1e6, 1),
        "against_runs": {k: [round(v) for v in vs] for k, vs in rates.items()},
    }


async def _run_probe(tree: Path, nodes: int, events: int, mode: str, processes: int
                     ) -> dict[str, list[float]]:
    """:mod:`.publish_probe` as a script, with ``tree``'s packages first on the path."""
    # run_path rather than ``python FILE``: the script's own directory must not come first
    # on the path (its siblings would shadow top-level modules).
    script = str(Path(__file__).with_name("publish_probe.py"))
    argv = [script, "--nodes", str(nodes), "--events", str(events), "--mode", mode,
            "--processes", str(processes)]
    launcher = (f"import runpy, sys; sys.argv = {argv!r}; "
                f"runpy.run_path({script!r}, run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", launcher, env=env, cwd=str(tree), stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"publish probe on {tree} failed (exit {process.returncode})")
    result: dict[str, list[float]] = json.loads(out.decode().strip().splitlines()[-1])
    return result
