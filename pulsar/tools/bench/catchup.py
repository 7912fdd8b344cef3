"""``pulsarcast bench catchup``: how a node that was away catches up with a topic.

Three real nodes in one process (UDP DHT, TCP transport, SQLite on disk, loopback): node 0
creates a topic, nodes 1 and 2 subscribe. Node 0 publishes ``events`` x (1 - ``missed``)
events (1 KiB of DAG-CBOR each: a 900-byte payload, signature and links), which both
subscribers deliver; node 2 stops; node 0 publishes the other ``events`` x ``missed``, which
node 1 delivers; then node 2 starts again on its data directory and catches up. The
catch-up is what it does today: it rejoins the tree, learns the heads from its parent's
JOINED and the heads records, and walks the missed chain back in WANT batches of up to 512
blocks (docs/protocol.md §5).

Figures, for node 2 from the moment ``Node.start`` is called:

* ``catchup_s`` — until its delivery log holds every event, checked to be in causal order
  (each event after its parent); ``first_event_s`` — until the first missed event is
  delivered; ``catchup_events_per_s`` — missed events ÷ ``catchup_s``;
* ``bytes_received`` — transport payload bytes it received (every frame: events, BLOCKS,
  HEADS, membership; not TCP/IP, Noise or frame headers) plus the DHT datagrams' bytes;
  ``missed_bytes`` — the missed events' own blocks; ``bytes_ratio`` the first over the
  second;
* ``cpu_s`` — the process's CPU time over the catch-up (all three nodes share the process;
  nodes 0 and 1 mostly answer), and the repair counters that explain the time
  (``wants_sent``, ``fetches``, ``backfilled``, ``found_locally``).

With ``link_ms`` (``--link-ms``) every frame a node sends waits that long first, so a
round trip takes twice it, as between distant machines. Filling the topic is not
measured. The figures a user would compare with a faster design are ``catchup_s`` and
``bytes_ratio``, at two or three sizes (``--events``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dag import CID
from dht import DhtConfig
from pulsar.config import NodeConfig
from pulsar.net.faults import FaultInjector
from pulsar.node import Node

from .delivery import _settle, _start_network, _stop_all

__all__ = ["bench_catchup"]

PAYLOAD = 900
WINDOW = 64
"""Publishes in flight while the topic is filled."""


def _say(message: str) -> None:
    print(f"[bench catchup] {message}", file=sys.stderr, flush=True)


async def _publish(node: Node, topic: CID, count: int, first: int) -> None:
    """``count`` events numbered from ``first``, ``WINDOW`` in flight."""
    numbers = iter(range(first, first + count))

    async def worker() -> None:
        for number in numbers:
            await node.publish(topic, number.to_bytes(8, "big") * (PAYLOAD // 8))
            if (number + 1) % 20_000 == 0:
                _say(f"  published {number + 1:,}")

    await asyncio.gather(*(worker() for _ in range(WINDOW)))


async def _until(node: Node, topic: CID, count: int, timeout: float) -> float:
    """Seconds until ``node``'s log of ``topic`` holds ``count`` events (polled)."""
    start = time.perf_counter()
    while node.last_position(topic) < count:
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{node.last_position(topic):,} of {count:,} events after "
                               f"{timeout:.0f} s")
        await asyncio.sleep(0.02)
    return time.perf_counter() - start


def _received(node: Node) -> int:
    return node.transport.stats.bytes_received + node.dht.stats.bytes_received


async def _log_in_causal_order(node: Node, topic: CID) -> tuple[list[CID], int]:
    """The log's CIDs in order, and how many events came before their parent (or with a
    parent the log does not hold)."""
    order: list[CID] = []
    position: dict[CID, int] = {}
    early = 0
    async for event in node.history(topic):
        if event.parent is not None and event.parent not in position:
            early += 1
        position[event.cid] = len(order)
        order.append(event.cid)
    return order, early


async def bench_catchup(events: int = 100_000, missed: float = 0.1, link_ms: float = 0.0,
                        timeout: float = 1800.0) -> dict[str, Any]:
    """Run the benchmark; figures as described in the module docstring. ``link_ms`` delays
    every frame every node sends by that much (the transport's fault injector; DHT
    datagrams are not delayed), so a round trip between nodes takes twice it."""
    if not 0 < missed < 1:
        raise ValueError("missed must be between 0 and 1")
    away = max(1, round(events * missed))
    before = events - away
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pulsarcast-bench-catchup-") as tmp:
        root = Path(tmp)
        configs: dict[int, NodeConfig] = {}

        def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
            faults = FaultInjector(seed=index, latency=link_ms / 1000) if link_ms else None
            configs[index] = NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds,
                                        dht=DhtConfig(rpc_timeout=1.0), faults=faults)
            return configs[index]

        nodes = await _start_network(root, 3, config)
        try:
            author, stays, leaves = nodes
            topic = (await author.create_topic("bench/catchup")).cid
            for node in (stays, leaves):
                await node.subscribe(topic)
            await _settle(nodes, topic)
            _say(f"filling {before:,} events that both subscribers deliver")
            await _publish(author, topic, before, 0)
            await _until(leaves, topic, before, timeout)
            await _until(stays, topic, before, timeout)
            await leaves.stop()
            _say(f"node 2 away; publishing the {away:,} events it misses")
            await _publish(author, topic, away, before)
            await _until(stays, topic, events, timeout)
            missed_bytes = 0
            async for event in stays.history(topic, since=before):
                missed_bytes += len(event.block)
            _say("node 2 back: catching up")
            cpu = time.process_time()
            start = time.perf_counter()
            back = await Node.start(NodeConfig(data_dir=configs[2].data_dir,
                                               bootstrap=(author.address,),
                                               dht=DhtConfig(rpc_timeout=1.0),
                                               faults=configs[2].faults))
            nodes[2] = back
            first_s = time.perf_counter() - start + await _until(back, topic, before + 1,
                                                                  timeout)
            await _until(back, topic, events, timeout)
            catchup_s = time.perf_counter() - start
            cpu_s = time.process_time() - cpu
            received = _received(back)
            order, early = await _log_in_causal_order(back, topic)
            if len(order) != events or len(set(order)) != events:
                raise RuntimeError(f"node 2's log holds {len(order):,} events "
                                   f"({len(set(order)):,} distinct), {events:,} published")
            metrics = back.metrics
            _say(f"caught up {away:,} events in {catchup_s:.2f} s (first after "
                 f"{first_s:.2f} s), {received / missed_bytes:.2f}x their bytes")
            return {
                "benchmark": "catchup",
                "events": events,
                "missed_events": away,
                "link_ms": link_ms,
                "catchup_s": round(catchup_s, 3),
                "first_event_s": round(first_s, 3),
                "catchup_events_per_s": round(away / catchup_s, 1),
                "bytes_received": received,
                "missed_bytes": missed_bytes,
                "bytes_ratio": round(received / missed_bytes, 3),
                "delivered_before_parent": early,
                "cpu_s": round(cpu_s, 2),
                **{name: metrics.get(name, 0) for name in (
                    "wants_sent", "fetches", "backfilled", "found_locally", "heads_unknown",
                    "gaps_reported", "duplicates")},
                "load_average_before": round(load_before, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
            }
        finally:
            await _stop_all(nodes)
