"""``pulsarcast bench publish``: what the write quorum does to publishing.

Real nodes (UDP DHT, TCP transport, SQLite each) on loopback, in this process. One
network of ``nodes`` nodes; the author publishes, the others subscribe. Two measurements,
each run twice on the same network — with the write quorum (the publish returns once
``min_acks`` = 1 DHT node stored the event, the other replicas are written behind it) and
with every replica awaited (``wait_all_replicas``, what publishing did before) — in
alternating order so machine noise falls on both:

* ``publish_p50_ms``: ``events`` sequential ``publish()`` calls of 256 bytes, the median
  time from the call to its return;
* ``deliveries_per_s``: ``events`` publishes with 64 in flight, unpaced; (subscribers x
  events) / the time from the first call until every subscriber has yielded every event.

Ratios: ``publish_p50_quorum_vs_all`` (target ≤ 0.25) and ``deliveries_quorum_vs_all``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dht import DhtConfig

from ..config import NodeConfig
from ..node import Node
from .delivery import _publish, _settle, _start_network, _stop_all, _take

__all__ = ["bench_publish"]

PAYLOAD = b"p" * 256


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def bench_publish(nodes: int = 20, events: int = 200) -> dict[str, Any]:
    if nodes < 3 or events < 10:
        raise ValueError("the publish benchmark needs at least 3 nodes and 10 events")
    with tempfile.TemporaryDirectory(prefix="pulsarcast-publish-") as tmp:
        root = Path(tmp)

        def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
            return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds,
                              dht=DhtConfig(rpc_timeout=1.0))

        _say(f"starting {nodes} nodes")
        network = await _start_network(root, nodes, config)
        author = network[0]
        try:
            topic = await author.create_topic("bench/publish")
            subs = [await n.subscribe(topic.cid) for n in network[1:]]
            await _settle(network, topic.cid)
            figures: dict[str, list[float]] = {}
            for mode in ("quorum", "all", "all", "quorum"):
                _set_wait_all(author, mode == "all")
                latency = await _sequential(author, topic.cid, events)
                rate = await _unpaced(author, topic.cid, events, subs)
                figures.setdefault(f"{mode}_p50", []).append(latency)
                figures.setdefault(f"{mode}_rate", []).append(rate)
                _say(f"  {mode}: publish p50 {latency * 1000:.2f} ms, {rate:,.0f} deliveries/s")
        finally:
            await _stop_all(network)
    q50, a50 = min(figures["quorum_p50"]), min(figures["all_p50"])
    qrate, arate = max(figures["quorum_rate"]), max(figures["all_rate"])
    return {
        "bench": "publish",
        "nodes": nodes,
        "events": events,
        "publish_p50_ms_quorum": round(q50 * 1000, 3),
        "publish_p50_ms_all_replicas": round(a50 * 1000, 3),
        "publish_p50_quorum_vs_all": round(q50 / a50, 3),
        "deliveries_per_s_quorum": round(qrate),
        "deliveries_per_s_all_replicas": round(arate),
        "deliveries_quorum_vs_all": round(qrate / arate, 3),
        "runs": {k: [round(v, 5) for v in vs] for k, vs in figures.items()},
    }


def _set_wait_all(node: Node, wait_all: bool) -> None:
    """Switch how a running node publishes (the setting is read at each publish)."""
    node.config = dataclasses.replace(node.config, wait_all_replicas=wait_all)


async def _sequential(author: Node, topic: Any, events: int) -> float:
    times = []
    for _ in range(events):
        start = time.perf_counter()
        await author.publish(topic, PAYLOAD)
        times.append(time.perf_counter() - start)
    await asyncio.sleep(0)
    return statistics.median(times)


async def _unpaced(author: Node, topic: Any, events: int, subs: list[Any]) -> float:
    # Drain what the sequential run delivered, so each subscription starts empty.
    for sub in subs:
        await _take(sub, events, 30.0)
    start = time.perf_counter()
    await _publish(author, topic, events, 64)
    got = await asyncio.gather(*(_take(sub, events, 60.0) for sub in subs))
    elapsed = time.perf_counter() - start
    if any(g != events for g in got):
        raise RuntimeError(f"unpaced run: {min(got)}/{events} events at some subscriber")
    return len(subs) * events / elapsed
