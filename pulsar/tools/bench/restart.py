"""``pulsarcast bench restart``: a node that follows many topics restarts, in its own process.

``bench topics`` restarts a subscriber in the process that also runs the author and a
seed, so a garbage collection there walks three nodes' objects and the author's side of
every JOIN shares its event loop. This one measures what an operator runs: the
subscriber is a ``pulsarcast node`` process of its own (its REST API on loopback), the
seed and the author share this process.

The author creates ``topics`` topics; the subscriber subscribes to each over REST (each
also follows its meta topic: ``2 * topics`` trees). Then it is stopped (SIGTERM) and
started again, ``restarts`` times, alternating ``--gc default`` (Python's collector as it
is) and ``--gc freeze`` (held back while the node rejoins its trees, then frozen: see
:mod:`pulsar.tools.runner`), so both are measured on the same data on one machine state.
For each restart, from the process's launch:

* ``api_s``: until the node printed its details (its API answers from then on);
* ``attached_s``: until every tree has a parent that answered its JOIN again
  (``trees_attached == trees`` and nothing left to resume, polled on
  ``/v1/node/metrics`` every 0.25 s);
* ``lag_ms``: the node's own ``loop_lag_max_ms`` :data:`SETTLE_S` seconds after that (so
  what the end of the resume causes, a collection or the freeze, is in it): the longest
  its event loop ran nothing that was due (a 100 ms ticker inside the node, from when
  ``Node.start`` set up its background tasks: the resume is all after that).

One JSON line on stdout; progress on stderr. The targets (issue): every tree re-attached
within 10 s and no stall over 200 ms at 10,000 topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from dht import DhtConfig
from pulsar.config import NodeConfig

from .delivery import _start_network, _stop_all

__all__ = ["bench_restart"]

POLL_S = 0.25
SETTLE_S = 2.0
TOKEN = "bench-restart-token-0123456789abcdef"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _Child:
    """A ``pulsarcast node`` process and its API."""

    def __init__(self, process: asyncio.subprocess.Process, url: str, started: float) -> None:
        self.process = process
        self.url = url
        self.started = started

    @classmethod
    async def launch(cls, data_dir: Path, seeds: list[tuple[str, int]], gc: str) -> _Child:
        started = time.perf_counter()
        argv = [sys.executable, "-m", "pulsar.tools.cli", "node", "--data-dir", str(data_dir),
                "--port", "0", "--api-port", "0", "--token", TOKEN, "--json", "--gc", gc]
        for host, port in seeds:
            argv += ["--bootstrap", f"{host}:{port}"]
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, env={**os.environ})
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 120)
        if not line:
            raise RuntimeError("the node exited before it printed its details")
        return cls(process, json.loads(line)["url"], started)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def _metrics(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with http.get(f"{url}/v1/node/metrics") as response:
        response.raise_for_status()
        return dict((await response.json())["node"])


async def _rejoined(http: aiohttp.ClientSession, child: _Child, trees: int,
                    timeout: float) -> tuple[float | None, dict[str, int]]:
    """Seconds from launch until every tree is attached again (None on timeout)."""
    deadline = time.perf_counter() + timeout
    while True:
        now = await _metrics(http, child.url)
        if (now.get("trees", 0) >= trees and now.get("trees_attached", 0) >= trees
                and not now.get("topics_to_resume", 0)):
            return time.perf_counter() - child.started, now
        if time.perf_counter() > deadline:
            return None, now
        await asyncio.sleep(POLL_S)  # polling interval of the measurement


async def bench_restart(topics: int = 10_000, restarts: int = 4) -> dict[str, Any]:
    if topics < 1 or restarts < 1:
        raise ValueError("the restart benchmark needs at least one topic and one restart")
    with tempfile.TemporaryDirectory(prefix="pulsarcast-restart-") as tmp:
        root = Path(tmp)

        def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
            return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds,
                              dht=DhtConfig(rpc_timeout=1.0))

        _say("starting the seed and the author in this process")
        network = await _start_network(root, 2, config)
        seed, author = network
        seeds = [seed.address, author.address]
        child: _Child | None = None
        runs: list[dict[str, Any]] = []
        auth = {"Authorization": f"Bearer {TOKEN}"}
        try:
            async with aiohttp.ClientSession() as http:
                child = await _Child.launch(root / "subscriber", seeds, "default")
                cids: list[str] = []
                for index in range(topics):
                    topic = await author.create_topic(f"bench/restart/{index}")
                    cids.append(str(topic.cid))
                    async with http.put(f"{child.url}/v1/subscriptions/{topic.cid}",
                                        headers=auth) as response:
                        response.raise_for_status()
                    if (index + 1) % max(1, topics // 10) == 0:
                        _say(f"  {index + 1}/{topics} topics created and subscribed")
                trees = 2 * topics
                first, _ = await _rejoined(http, child, trees, 300.0)
                _say(f"  every tree attached ({first:.2f} s after the first launch)"
                     if first is not None else "  warning: not every tree attached")
                for run in range(restarts):
                    gc = ("default", "freeze")[run % 2]
                    await child.stop()
                    child = await _Child.launch(root / "subscriber", seeds, gc)
                    api = time.perf_counter() - child.started
                    attached, seen = await _rejoined(http, child, trees, 300.0)
                    await asyncio.sleep(SETTLE_S)  # the measured window's tail, not a wait
                    seen = await _metrics(http, child.url)
                    lag = int(seen.get("loop_lag_max_ms", -1))
                    runs.append({"gc": gc, "api_s": round(api, 3),
                                 "attached_s": None if attached is None else round(attached, 3),
                                 "lag_ms": lag, "trees_attached": seen.get("trees_attached")})
                    done = "never" if attached is None else f"{attached:.2f} s"
                    _say(f"  restart {run + 1} (--gc {gc}): API after {api:.2f} s, every tree "
                         f"attached after {done}, longest loop stall {lag} ms")
        finally:
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    await child.stop()
            await _stop_all(network)

    def best_of(mode: str, key: str) -> list[Any]:
        return [r[key] for r in runs if r["gc"] == mode]

    return {"bench": "restart", "topics": topics, "trees": 2 * topics, "runs": runs,
            **{f"attached_s_{m}": best_of(m, "attached_s") for m in ("default", "freeze")},
            **{f"lag_ms_{m}": best_of(m, "lag_ms") for m in ("default", "freeze")}}
