"""``pulsarcast bench large``: 1 MiB events along the tree under a bandwidth limit.

``nodes`` real nodes (UDP DHT, TCP transport, SQLite each) on loopback, all in this process
(one event loop: one core does every node's work), every node's uplink limited by the
transport's fault injector (a token bucket per sender, ``mbps``) and every link delayed by
``link_ms``, as in the GossipSub large-message paper (50 Mbit/s, 100 ms). Two topics, both
followed by every node: ``large`` carries ``events`` payloads of 1 MiB (random bytes), one
every ``interval`` seconds, and ``small`` a 200-byte event every 100 ms throughout.

The same workload runs four times, each on a fresh network:

* ``fragments`` — what this node does: the chunk tree travels the tree right behind the
  event, each fragment relayed as soon as it is verified (cut-through), IDONTWANT, groups of
  two served in turn, fragments paced at 90 % of the uplink;
* ``store_and_forward`` — the same, except that a relay sends nothing before it holds the
  whole payload: cut-through is the one difference (and the children's stall timeout,
  raised so that a relay waiting for a whole payload does not count as stalled);
* ``store_and_forward_plain`` — also no IDONTWANT and no staggering: the baseline of the
  first published figures, kept beside the fair one (staggering helps store-and-forward
  most, so against this one cut-through looks better than it is);
* ``dht_pull`` — the behaviour before: the event carries only the link, every subscriber
  pulls the chunks from the DHT when it reads the payload.

Latency is from the ``publish()`` call to the whole payload verified at a subscriber (the
subscription yields the event, then ``payload_of`` reads it, locally when fragments brought
it). ``bytes`` counts the transport's DATA bytes of every node during the large phase (the
DHT's UDP traffic is not counted and is not bandwidth-limited: the ``dht_pull`` baseline's
links are therefore faster than the others').

Figures (one JSON line): ``delivery_ratio``, ``latency_p50_ms`` / ``latency_p99_ms``,
``store_and_forward_latency_p50_ms``, ``latency_p50_ratio_vs_store_and_forward``,
``bytes_ratio_vs_store_and_forward``, the same three against ``store_and_forward_plain``,
``dht_pull_latency_p50_ms``, ``small_event_latency_p50_ms`` (while large events
flow) beside ``idle_small_event_latency_p50_ms`` (before they start), ``over_limit_refused``,
and per mode the details.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dag import CID
from pulsar.config import NodeConfig
from pulsar.net.faults import FaultInjector
from pulsar.node import Node, PayloadTooLarge
from pulsar.proto.core import CoreConfig
from pulsar.proto.fragments.config import FragmentConfig
from pulsar.runtime.subscription import Subscription
from pulsar.tools.sim.large import MODES, large_figures, mode_config

from .timing import percentile

LARGE = 1024 * 1024
SMALL = 200
SMALL_EVERY = 0.1
SETTLE = 60.0
"""Seconds after the last large publish within which every delivery must arrive."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _start(root: Path, n: int, fragments: FragmentConfig, faults: FaultInjector
                 ) -> list[Node]:
    core = CoreConfig(parent_retries=2, parent_retry_delay=0.1, fragments=fragments)
    nodes: list[Node] = []
    for i in range(n):
        seeds = tuple(x.address for x in nodes[-3:])
        config = NodeConfig(data_dir=root / f"n{i}", bootstrap=seeds, core=core, faults=faults)
        nodes.append(await Node.start(config))
    await asyncio.gather(*(x._routing.prove_known(5.0) for x in nodes))
    return nodes


async def _small_stream(
    publisher: Node, topic: CID, stop: asyncio.Event, started: dict[CID, float]
) -> None:
    i = 0
    while not stop.is_set():
        t0 = time.time()
        event = await publisher.publish(topic, b"s%06d" % i + bytes(SMALL - 7))
        started[event.cid] = t0
        i += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SMALL_EVERY)


async def _reader(node: Node, sub: Subscription, started: dict[CID, float],
                  done: dict[tuple[int, CID], float], index: int, read: bool) -> None:
    """Record when each event of ``sub`` is delivered here (with ``read``: once its payload
    is read and verified too)."""
    while True:
        event = await sub.get()
        if read:
            await node.payload_of(event)
        done[(index, event.cid)] = time.time()


async def _run_mode(mode: str, n: int, events: int, interval: float, mbps: float,
                    link_ms: float, seed: int) -> dict[str, Any]:
    bandwidth = mbps * 1e6 / 8
    faults = FaultInjector(seed=seed, latency=link_ms / 1000, bandwidth=bandwidth)
    with tempfile.TemporaryDirectory(prefix="bench-large-") as tmp:
        nodes = await _start(Path(tmp), n, mode_config(mode, bandwidth * 0.9), faults)
        tasks: list[asyncio.Task[Any]] = []
        try:
            author = nodes[0]
            large = await author.create_topic("large")
            small = await author.create_topic("small")
            started: dict[CID, float] = {}
            large_done: dict[tuple[int, CID], float] = {}
            small_done: dict[tuple[int, CID], float] = {}
            for i, node in enumerate(nodes[1:], start=1):
                big_sub = await node.subscribe(large.cid)
                small_sub = await node.subscribe(small.cid)
                tasks.append(asyncio.create_task(
                    _reader(node, big_sub, started, large_done, i, True)))
                tasks.append(asyncio.create_task(
                    _reader(node, small_sub, started, small_done, i, False)))
            await asyncio.sleep(2.0)  # let the trees form (a warm-up, not synchronisation)
            # Idle: small events alone.
            stop = asyncio.Event()
            stream = asyncio.create_task(_small_stream(nodes[2], small.cid, stop, started))
            await asyncio.sleep(3.0)
            stop.set()
            await stream
            idle_cids = set(started)
            # Loaded: large events one every `interval`, the small stream throughout.
            for node in nodes:
                node.transport.stats.bytes_sent = 0
            stop = asyncio.Event()
            stream = asyncio.create_task(_small_stream(nodes[2], small.cid, stop, started))
            large_cids: list[CID] = []
            payloads = [random.Random(k).randbytes(LARGE) for k in range(events)]
            t_phase = time.time()
            for k in range(events):
                t0 = time.time()
                event = await nodes[1].publish(large.cid, payloads[k])
                started[event.cid] = t0
                large_cids.append(event.cid)
                _say(f"[large {mode}] published {k + 1}/{events}")
                await asyncio.sleep(max(0.0, t0 + interval - time.time()))
            expected = {(i, c) for i in range(2, n) for c in large_cids}
            deadline = time.time() + SETTLE
            while time.time() < deadline and not expected <= large_done.keys():
                await asyncio.sleep(0.2)
            stop.set()
            await stream
            phase_s = time.time() - t_phase
            sent = sum(x.transport.stats.bytes_sent for x in nodes)
            lat = [large_done[k] - started[k[1]] for k in expected if k in large_done]
            busy_small = [t - started[c] for (i, c), t in small_done.items()
                          if c not in idle_cids and c in started and i != 2]
            idle_small = [t - started[c] for (i, c), t in small_done.items()
                          if c in idle_cids and i != 2]
            refused = False
            if mode == "fragments":
                try:
                    limit = nodes[1].config.core.fragments.max_event_size
                    await nodes[1].publish(large.cid, bytes(limit + 1))
                except PayloadTooLarge:
                    refused = True
            counters: dict[str, int] = {}
            for x in nodes:
                for key, value in x.metrics.items():
                    if key.startswith(("fragment", "large_", "idontwant", "fwant")):
                        counters[key] = counters.get(key, 0) + value
            return {
                "delivery_ratio": round(len(lat) / len(expected), 4) if expected else 0.0,
                "latency_p50_ms": round(percentile(lat, 50) * 1000, 1) if lat else None,
                "latency_p99_ms": round(percentile(lat, 99) * 1000, 1) if lat else None,
                "small_p50_ms": round(percentile(busy_small, 50) * 1000, 1)
                if busy_small else None,
                "idle_small_p50_ms": round(percentile(idle_small, 50) * 1000, 1)
                if idle_small else None,
                "bytes": sent,
                "phase_s": round(phase_s, 1),
                "over_limit_refused": refused,
                "counters": counters,
            }
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(x.stop() for x in nodes), return_exceptions=True)


async def bench_large(nodes: int = 30, events: int = 5, interval: float = 4.0,
                      mbps: float = 50.0, link_ms: float = 100.0,
                      modes: tuple[str, ...] = MODES, seed: int = 1,
                      ) -> dict[str, Any]:
    load = os.getloadavg()[0]
    cpu0 = time.process_time()
    results: dict[str, dict[str, Any]] = {}
    for mode in modes:
        _say(f"[large] {mode}: {nodes} nodes, {events} x 1 MiB, {mbps} Mbit/s, {link_ms} ms")
        results[mode] = await _run_mode(mode, nodes, events, interval, mbps, link_ms, seed)
        _say(f"[large] {mode}: {results[mode]}")
    figures = large_figures(results, nodes, events, mbps, link_ms)
    modes_run = figures.pop("modes")
    return {
        "seed": seed,
        **figures,
        "over_limit_refused": results.get("fragments", {}).get("over_limit_refused"),
        "load_avg_1m_at_start": round(load, 2),
        "cpu_s": round(time.process_time() - cpu0, 1),
        "modes": modes_run,
    }


__all__ = ["bench_large"]
