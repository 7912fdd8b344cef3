"""One process of the multi-process tree benchmark: ``python -m pulsar.tools.bench.worker``.

Why a separate process: a node's per-event work (Ed25519 verification, SQLite writes, DHT
RPC packing) is CPU-bound Python, and one event loop runs on one core. To measure what the
whole machine delivers, ``pulsar.tools.bench.tree`` spreads the subscribers over several of these
workers, each running its own event loop with its share of real :class:`pulsar.Node` s —
as separate machines would.

The worker is driven by its parent over the line protocol of :mod:`pulsar.tools.bench.control`;
while a ``run`` is in progress it also sends ``{"progress": {...}}`` lines about once a
second.

Commands:

* ``start {index, data_dir, seeds}`` — start one node bootstrapped off ``seeds``;
  replies with its ``address`` and ``peer``.
* ``prove`` — every node proves the peer ids of the contacts it knows.
* ``subscribe {topic}`` — every node here subscribes to the topic (by CID: the descriptor
  comes from the DHT, as for any subscriber).
* ``tree`` — ``nodes``: ``[peer, [parents], [children]]`` for each node here.
* ``arm {expect}`` — start counting: a consumer on every subscription, metric baselines.
* ``run`` — reply once every subscription here has ``expect`` events, with the CPU time the
  process used meanwhile.
* ``stats`` — delivery times by event CID, payload copies received (see
  :func:`copies_received`), max hop, tree edges.
* ``stop`` — stop every node; the process then exits.

Set ``PULSARCAST_BENCH_PROFILE=<dir>`` to have each worker write a cProfile of its ``run``
phase (the measured part) to ``<dir>/worker-<pid>.prof``.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import time
from pathlib import Path
from typing import IO, Any

from dag import CID
from pulsar.config import NodeConfig
from pulsar.node import Node
from pulsar.runtime.subscription import Subscription

from .control import CommandWorker, run_worker

__all__ = ["main"]


def copies_received(node: Node) -> dict[str, int]:
    """Event payload copies ``node`` has taken in, by way: ``tree`` (EVENT messages,
    duplicates included) and ``repair`` (events the backfill layer took from a BLOCKS answer,
    a DHT fetch, or the node's own store where a DHT STORE had put them). Counting only
    EVENT messages would make an event that reached a node by repair look like no copy at
    all (redundancy below zero). DHT replication itself (k STOREs per event, for
    persistence) is not dissemination and is not counted."""
    counted = node.core.counters()
    return {
        "tree": counted["events_received"],
        "repair": counted.get("backfilled", 0) + counted.get("found_locally", 0),
    }


def counters(node: Node) -> dict[str, int]:
    """The node's protocol counters (core, backfill, Plumtree), for diagnosis: they say
    *why* a run was slow or redundant (gaps opened, WANTs sent, grafts...)."""
    out: dict[str, int] = {}
    for prefix, owner in (
        ("", node.core),
        ("backfill.", getattr(node.core, "backfill", None)),
        ("lazy.", getattr(node.core, "lazy", None)),
    ):
        metrics = getattr(owner, "metrics", None) or {}
        for name, value in metrics.items():
            if isinstance(value, int) and name != "max_hop":
                out[prefix + name] = value
    return out


class _Worker(CommandWorker):
    """The nodes of this process and what the benchmark measures about them."""

    commands = frozenset({"start", "prove", "subscribe", "tree", "arm", "run", "stats"})

    def __init__(self, channel: IO[str]) -> None:
        super().__init__(channel)
        self.nodes: dict[int, Node] = {}
        self.topic: CID | None = None
        self.subs: list[Subscription] = []
        self.consumers: list[asyncio.Task[None]] = []
        # (event CID, wall-clock time) per delivery; CIDs are turned into strings only when
        # reporting, so the measured path does no extra encoding.
        self.arrivals: list[tuple[CID, float]] = []
        self.baseline: dict[str, int] = {"tree": 0, "repair": 0}
        self.counters_baseline: dict[str, int] = {}

    # ------------------------------------------------------------------ commands

    async def start(self, index: int, data_dir: str, seeds: list[list[Any]]) -> dict[str, Any]:
        bootstrap = tuple((str(h), int(p)) for h, p in seeds)
        node = await Node.start(NodeConfig(data_dir=Path(data_dir), bootstrap=bootstrap))
        self.nodes[index] = node
        return {"address": list(node.address), "peer": str(node.peer_id)}

    async def prove(self) -> dict[str, Any]:
        await asyncio.gather(*(n._routing.prove_known(5.0) for n in self.nodes.values()))
        return {}

    async def subscribe(self, topic: str) -> dict[str, Any]:
        self.topic = CID.parse(topic)
        nodes = self.nodes.values()
        self.subs = list(await asyncio.gather(*(n.subscribe(self.topic) for n in nodes)))
        return {}

    def tree(self) -> dict[str, Any]:
        assert self.topic is not None
        rows = []
        for node in self.nodes.values():
            view = node.tree(self.topic)
            parents = sorted(str(p) for p in view.parents) if view else []
            children = sorted(str(c) for c in view.children) if view else []
            rows.append([str(node.peer_id), parents, children])
        return {"nodes": rows}

    def arm(self, expect: int) -> dict[str, Any]:
        self.baseline = self._received()
        self.counters_baseline = self._counters()
        self.consumers = [asyncio.create_task(self._consume(s, expect)) for s in self.subs]
        return {}

    async def run(self) -> dict[str, Any]:
        profile_dir = os.environ.get("PULSARCAST_BENCH_PROFILE")
        profiler = cProfile.Profile() if profile_dir else None
        if profiler is not None:
            profiler.enable()
        ticker = asyncio.create_task(self._report_progress())
        cpu, wall = time.process_time(), time.monotonic()
        try:
            await asyncio.gather(*self.consumers)
        finally:
            ticker.cancel()
            if profiler is not None and profile_dir is not None:
                profiler.disable()
                Path(profile_dir).mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(f"{profile_dir}/worker-{os.getpid()}.prof")
        self._progress()
        return {
            "delivered": len(self.arrivals),
            "cpu_s": time.process_time() - cpu,
            "wall_s": time.monotonic() - wall,
        }

    def stats(self) -> dict[str, Any]:
        deliveries: dict[str, list[float]] = {}
        for cid, at in self.arrivals:
            deliveries.setdefault(str(cid), []).append(at)
        hops = (n.core.counters().get("max_hop", 0) for n in self.nodes.values())
        return {
            "deliveries": deliveries,
            "received": {k: v - self.baseline[k] for k, v in self._received().items()},
            "counters": {
                k: v - self.counters_baseline.get(k, 0) for k, v in self._counters().items()
            },
            "max_hop": max(hops, default=0),
            **self.tree(),
        }

    async def stop(self) -> None:
        for task in self.consumers:
            task.cancel()
        await asyncio.gather(*self.consumers, return_exceptions=True)
        await asyncio.gather(*(n.stop() for n in self.nodes.values()), return_exceptions=True)
        self.nodes.clear()

    # ------------------------------------------------------------------ measuring

    def _counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for node in self.nodes.values():
            for name, value in counters(node).items():
                total[name] = total.get(name, 0) + value
        return total

    def _received(self) -> dict[str, int]:
        total = {"tree": 0, "repair": 0}
        for node in self.nodes.values():
            for way, count in copies_received(node).items():
                total[way] += count
        return total

    async def _consume(self, sub: Subscription, expect: int) -> None:
        for _ in range(expect):
            event = await sub.get()
            self.arrivals.append((event.cid, time.time()))

    def _progress(self) -> None:
        self.send({"progress": {"delivered": len(self.arrivals)}})

    async def _report_progress(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._progress()


def main() -> None:
    """Run one worker until told to stop or until stdin closes."""
    run_worker(_Worker)


if __name__ == "__main__":
    main()
