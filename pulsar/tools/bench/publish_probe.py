"""One network of real nodes in one process: sequential publish latency and unpaced
deliveries. Part of ``pulsarcast bench publish``.

Why a module of its own, run as a script: the issue's baseline is *the code before the
write quorum*, measured by the same harness in the same run. ``bench publish --against
REV`` unpacks that revision and runs this file with ``PYTHONPATH`` pointing at it, so the
file may import only what that code already had: ``Node`` (start, create_topic, subscribe,
publish, stop), ``NodeConfig``, ``DhtConfig`` and the helpers of ``pulsar.tools.bench.delivery``
and of ``pulsar.tools.bench.tree`` (its worker processes), all present with these signatures since
2026-11-23. Run as a script (``--nodes N --events E --processes P --mode quorum|all ...``)
it prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dht import DhtConfig
from pulsar.config import NodeConfig
from pulsar.node import Node
from pulsar.runtime.loop import run as run_loop

from . import tree
from .delivery import _publish, _settle, _start_network, _stop_all, _take

__all__ = ["probe", "sequential_p50", "set_wait_all", "unpaced_rate"]

PAYLOAD = b"p" * 256
WINDOW = 64
"""Concurrent ``publish()`` calls in the unpaced run."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def sequential_p50(author: Node, topic: Any, events: int) -> tuple[float, float, float]:
    """``events`` back-to-back ``publish()`` calls: the median seconds per call, this
    process's CPU seconds per call, and how busy the whole machine was meanwhile (busy
    CPU time / (wall time x cores), Linux only, else -1): near 1, every core was working
    and a publish waited for CPU, whatever it waited for on the wire."""
    times = []
    cpu, wall, busy = time.process_time(), time.monotonic(), tree._machine_busy_s()
    for _ in range(events):
        start = time.perf_counter()
        await author.publish(topic, PAYLOAD)
        times.append(time.perf_counter() - start)
    cpu, wall, busy_after = time.process_time() - cpu, time.monotonic() - wall, \
        tree._machine_busy_s()
    share = -1.0
    if busy is not None and busy_after is not None:
        share = (busy_after - busy) / (wall * (os.cpu_count() or 1))
    return statistics.median(times), cpu / events, share


def _record(figures: dict[str, list[float]], mode: str,
            sequential: tuple[float, float, float], rate: float, per_delivery: float) -> None:
    """Keep one round's figures. ``per_delivery``: CPU seconds of every process of the
    network (author and workers) per delivery in the unpaced run: ``cores / per_delivery``
    is the most deliveries per second this machine could give that code."""
    latency, cpu, busy = sequential
    for name, value in (("p50", latency), ("author_cpu", cpu), ("busy", busy), ("rate", rate),
                        ("cpu_per_delivery", per_delivery)):
        figures.setdefault(f"{mode}_{name}", []).append(value)
    _say(f"  {mode}: publish p50 {latency * 1000:.2f} ms (author CPU {cpu * 1000:.2f} ms a "
         f"publish, machine {busy:.0%} busy); {rate:,.0f} deliveries/s unpaced, "
         f"{per_delivery * 1e6:.0f} us of CPU a delivery")


async def unpaced_rate(author: Node, topic: Any, events: int, subs: list[Any]
                       ) -> tuple[float, float]:
    """Deliveries per second: ``events`` publishes ``WINDOW`` at a time, until every
    subscription in ``subs`` yielded all of them; and the CPU seconds per delivery (every
    node is in this process)."""
    start, cpu = time.perf_counter(), time.process_time()
    await _publish(author, topic, events, WINDOW)
    got = await asyncio.gather(*(_take(sub, events, 60.0) for sub in subs))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if any(g != events for g in got):
        raise RuntimeError(f"unpaced run: {min(got)}/{events} events at some subscriber")
    return len(subs) * events / elapsed, cpu / (len(subs) * events)


def set_wait_all(node: Node, wait_all: bool) -> None:
    """Switch how a running node publishes (read at each publish; code from before the
    write quorum has no such setting and always waits for every replica)."""
    if any(f.name == "wait_all_replicas" for f in dataclasses.fields(node.config)):
        node.config = dataclasses.replace(node.config, wait_all_replicas=wait_all)
    elif not wait_all:
        raise ValueError("this code has no write quorum: it always waits for every replica")


async def probe(nodes: int, events: int, modes: list[str], processes: int = 0
                ) -> dict[str, list[float]]:
    """One network of ``nodes`` nodes, one topic, every node but the author subscribed;
    for each mode (``quorum`` / ``all``) in turn, a sequential run then an unpaced run on
    that network. The subscribers run in ``processes`` worker processes (0: here).
    Returns ``{mode_p50: [...], mode_rate: [...]}``."""
    if processes > 0:
        return await _in_workers(nodes, events, modes, processes)
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pulsarcast-publish-") as tmp:
        root = Path(tmp)

        def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
            return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds,
                              dht=DhtConfig(rpc_timeout=1.0))

        import pulsar

        _say(f"starting {nodes} nodes in one process, code from {Path(pulsar.__file__).parent}")
        network = await _start_network(root, nodes, config)
        author = network[0]
        try:
            topic = await author.create_topic("bench/publish")
            subs = [await n.subscribe(topic.cid) for n in network[1:]]
            await _settle(network, topic.cid)
            for mode in modes:
                set_wait_all(author, mode == "all")
                sequential = await sequential_p50(author, topic.cid, events)
                # Drain what the sequential run delivered, so each subscription starts empty.
                for sub in subs:
                    await _take(sub, events, 30.0)
                _record(figures, mode, sequential,
                        *await unpaced_rate(author, topic.cid, events, subs))
        finally:
            await _stop_all(network)
    return figures


async def _in_workers(nodes: int, events: int, modes: list[str], processes: int
                      ) -> dict[str, list[float]]:
    """The author here, the subscribers round-robin over ``processes`` workers (the
    harness of ``bench tree``)."""
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pulsarcast-publish-") as tmp:
        import pulsar

        _say(f"{nodes} nodes, subscribers in {processes} worker processes, "
             f"code from {Path(pulsar.__file__).parent}")
        network = await tree._Network.spawn(processes, Path(tmp))
        try:
            author = await network.start(nodes)
            await asyncio.gather(author._routing.prove_known(5.0), network.all("prove"))
            topic = await author.create_topic("bench/publish")
            await network.all("subscribe", topic=str(topic.cid))
            await tree._settle(network, topic.cid)
            for mode in modes:
                set_wait_all(author, mode == "all")
                await network.all("arm", expect=events)
                sequential = await sequential_p50(author, topic.cid, events)
                await network.all("run")  # all delivered: the unpaced run starts clean
                await network.all("arm", expect=events)
                running = [asyncio.create_task(w.call("run")) for w in network.workers]
                start, cpu = time.perf_counter(), time.process_time()
                await _publish(author, topic.cid, events, WINDOW)
                replies = await asyncio.gather(*running)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
                cpu += sum(reply["cpu_s"] for reply in replies)
                _record(figures, mode, sequential, (nodes - 1) * events / elapsed,
                        cpu / ((nodes - 1) * events))
        finally:
            await network.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--mode", action="append", choices=["quorum", "all"], required=True)
    args = parser.parse_args()
    figures = probe(args.nodes, args.events, args.mode, args.processes)
    print(json.dumps(run_loop(figures)), flush=True)


if __name__ == "__main__":
    main()
