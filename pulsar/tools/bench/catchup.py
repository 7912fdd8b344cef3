"""``pulsarcast bench catchup``: how a node that was away catches up with a topic, by
walking the DAG back (backfill) and by range reconciliation, in the same run.

Four real nodes (UDP DHT, TCP transport, SQLite on disk, loopback): node 0 creates a
topic, nodes 1, 2 and 3 subscribe. Node 0 publishes ``events`` x (1 - ``missed``) events
(1 KiB of DAG-CBOR each: a 900-byte payload, signature and links), which every subscriber
delivers; nodes 2 and 3 stop; node 0 publishes the other ``events`` x ``missed``, which node
1 delivers. Then, one after the other (the other still away), each starts again on its
data directory, **in a process of its own** (as it would run: its work and its
neighbours' answers on different cores; nodes 0 and 1 share this process), and catches
up:

* **walk** (the baseline, ``NodeConfig.reconcile=False``): it rejoins the tree, learns the
  heads from its parent's JOINED, and walks the missed chain back in WANT batches of up to
  512 blocks, one round trip each (docs/protocol.md §5);
* **reconcile** (the default): the same, until the first WANT answer shows the gap is deep
  (``reconcile_after`` blocks); then RECON rounds with that neighbour find every missing
  event and RWANTs fetch them in its delivery order, four requests in flight
  (docs/protocol.md §12).

The two differ in that setting alone. ``--order reconcile-first`` swaps which comes back
first (the second finds its neighbours' caches warm).

Figures, for each, from the moment ``Node.start`` returns (the DHT bootstrapped and the
subscription resumed: the catch-up begins then; ``start_s``, the time ``Node.start`` took,
is printed apart — about 1 s here, a bootstrap RPC to the other away node timing out):

* ``catchup_s`` — until its delivery log holds every event, checked to be in causal order
  (each event after its parent); ``first_event_s`` — until the first missed event is
  delivered;
* ``bytes_received`` — transport payload bytes it received (every frame: events, BLOCKS,
  RECON, RBLOCKS, HEADS, membership; not TCP/IP, Noise or frame headers) plus the DHT
  datagrams' bytes; ``missed_bytes`` — the missed events' own blocks; ``bytes_ratio`` the
  first over the second;
* ``cpu_s`` — the away node's process's CPU time over the catch-up (every thread), and the
  counters that explain the time.

``speedup`` is the walk's ``catchup_s`` over reconciliation's. With ``link_ms``
(``--link-ms``) every frame a node sends waits that long first, so a round trip takes
twice it, as between distant machines. Filling the topic is not measured.
"""


from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from dag import CID
from dht import DhtConfig
from pulsar.config import NodeConfig
from pulsar.net.faults import FaultInjector
from pulsar.node import Node
from pulsar.runtime.loop import run as run_loop

from .delivery import _settle, _start_network, _stop_all

__all__ = ["bench_catchup"]

PAYLOAD = 900
WINDOW = 64
"""Publishes in flight while the topic is filled."""
COUNTERS = ("wants_sent", "fetches", "backfilled", "found_locally", "heads_unknown",
            "gaps_reported", "duplicates", "reconciliations", "reconciled",
            "reconcile_rounds", "reconcile_missing", "reconcile_fetched", "reconcile_refused",
            "reconcile_bad_blocks", "reconcile_timeouts")
"""The repair and reconciliation counters that explain a catch-up's time."""


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


async def _back(config: NodeConfig, topic: CID, events: int, before: int,
                timeout: float) -> dict[str, Any]:
    """Start an away node again, time its catch-up, check its log, stop it."""
    begin = time.perf_counter()
    node = await Node.start(config)
    try:
        start_s = time.perf_counter() - begin
        if node.last_position(topic) != before:
            raise RuntimeError("the node caught up before Node.start returned: not measured")
        cpu = time.process_time()
        start = time.perf_counter()
        first_s = await _until(node, topic, before + 1, timeout)
        await _until(node, topic, events, timeout)
        catchup_s = time.perf_counter() - start
        cpu_s = time.process_time() - cpu
        received = _received(node)
        order, early = await _log_in_causal_order(node, topic)
        if len(order) != events or len(set(order)) != events:
            raise RuntimeError(f"the log holds {len(order):,} events ({len(set(order)):,} "
                               f"distinct), {events:,} published")
        metrics = node.metrics
    finally:
        await node.stop()
    return {
        "catchup_s": round(catchup_s, 3),
        "start_s": round(start_s, 3),
        "first_event_s": round(first_s, 3),
        "catchup_events_per_s": round((events - before) / catchup_s, 1),
        "bytes_received": received,
        "delivered_before_parent": early,
        "cpu_s": round(cpu_s, 2),
        **{name: metrics.get(name, 0) for name in COUNTERS},
    }


def _back_in_process(args: tuple[str, tuple[str, int], bool, bytes, int, int, float, int,
                                 float], conn: Connection) -> None:
    """A child process: the away node, alone in its process as it would be deployed, so
    its catch-up and its neighbours' answers run on different cores."""
    data_dir, seed, reconcile, topic, events, before, link_ms, index, timeout = args
    faults = FaultInjector(seed=index, latency=link_ms / 1000) if link_ms else None
    config = NodeConfig(data_dir=Path(data_dir), bootstrap=(seed,),
                        dht=DhtConfig(rpc_timeout=1.0), faults=faults, reconcile=reconcile)
    try:
        conn.send(run_loop(_back(config, CID(topic), events, before, timeout)))
    except BaseException as exc:
        conn.send(RuntimeError(f"the away node failed: {exc!r}"))
        raise


async def _back_elsewhere(args: tuple[str, tuple[str, int], bool, bytes, int, int, float,
                                      int, float]) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    process = context.Process(target=_back_in_process, args=(args, theirs))
    process.start()
    try:
        answer = await asyncio.to_thread(mine.recv)
    finally:
        await asyncio.to_thread(process.join)
    if isinstance(answer, BaseException):
        raise answer
    figures: dict[str, Any] = answer
    return figures


async def bench_catchup(events: int = 100_000, missed: float = 0.1, link_ms: float = 0.0,
                        timeout: float = 1800.0, order: str = "walk-first") -> dict[str, Any]:
    """Run the benchmark; figures as described in the module docstring. ``link_ms`` delays
    every frame every node sends by that much (the transport's fault injector; DHT
    datagrams are not delayed), so a round trip between nodes takes twice it."""
    if not 0 < missed < 1:
        raise ValueError("missed must be between 0 and 1")
    if order not in ("walk-first", "reconcile-first"):
        raise ValueError("order must be walk-first or reconcile-first")
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

        nodes = await _start_network(root, 4, config)
        try:
            author, stays = nodes[0], nodes[1]
            topic = (await author.create_topic("bench/catchup")).cid
            for node in nodes[1:]:
                await node.subscribe(topic)
            await _settle(nodes, topic)
            _say(f"filling {before:,} events that every subscriber delivers")
            await _publish(author, topic, before, 0)
            for node in nodes[1:]:
                await _until(node, topic, before, timeout)
            await nodes[2].stop()
            await nodes[3].stop()
            _say(f"nodes 2 and 3 away; publishing the {away:,} events they miss")
            await _publish(author, topic, away, before)
            await _until(stays, topic, events, timeout)
            missed_bytes = 0
            async for event in stays.history(topic, since=before):
                missed_bytes += len(event.block)
            figures: dict[str, dict[str, Any]] = {}
            modes = [("walk", 2, False), ("reconcile", 3, True)]
            if order == "reconcile-first":
                modes.reverse()
            for name, index, reconcile in modes:
                _say(f"node {index} back ({name}, in its own process): catching up")
                figures[name] = await _back_elsewhere(
                    (str(configs[index].data_dir), author.address, reconcile, topic.raw,
                     events, before, link_ms, index, timeout))
                figures[name]["bytes_ratio"] = round(
                    figures[name]["bytes_received"] / missed_bytes, 3)
                _say(f"  {name}: {away:,} events in {figures[name]['catchup_s']:.2f} s, "
                     f"{figures[name]['bytes_ratio']:.3f}x their bytes")
            walk, recon = figures["walk"], figures["reconcile"]
            return {
                "benchmark": "catchup",
                "events": events,
                "missed_events": away,
                "missed_bytes": missed_bytes,
                "link_ms": link_ms,
                "order": order,
                "walk": walk,
                "reconcile": recon,
                "speedup": round(walk["catchup_s"] / recon["catchup_s"], 2),
                "bytes_ratio": recon["bytes_ratio"],
                "load_average_before": round(load_before, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
            }
        finally:
            await _stop_all(nodes)
