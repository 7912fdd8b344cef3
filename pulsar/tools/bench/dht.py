"""``pulsarcast bench dht``: pipelined puts against the package's sequential ``Server.set``.

Starts an ``nodes``-node network on loopback (real UDP, real SQLite stores), then in the same
run measures

* ``put_per_s``: one node storing ``blocks`` blocks with :meth:`DhtNode.put_many`
  (pipelined, batched), each replicated to the k = 20 closest nodes, as the baseline
  stores it: the publisher runs with ``replicas`` = ``ksize`` (the node's default is 8),
  so pipelining is the one difference between the two;
* ``sequential_set_per_s``: the same node storing blocks with the package's own
  ``kademlia.network.Server.set`` in a loop (one lookup and k stores per block, awaited in
  turn) on the same network, and ``ratio`` = pipelined / sequential;
* ``get_p50_ms`` / ``get_p99_ms``: :meth:`DhtNode.get` latency for blocks the reading node
  does not hold (its own records are dropped first), so every get crosses the network.

The publishing and reading nodes run in this process; the others run in ``processes``
worker processes (default: one per CPU), as they would on separate machines, so the
receivers' work (verification, SQLite commits) is not charged to the publisher's core.
``processes=0`` runs every node in this process.

Where the nodes' SQLite files live matters: every replica is a durable write on the node
that receives it, so pass ``data_dir="/dev/shm"`` to measure the network path alone and the
default (the system temporary directory) to include the disk.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from kademlia.network import Server

from dag.cid import RAW, cid_of_raw
from dag.identity import Identity
from dht.config import DhtConfig
from dht.node import DhtNode
from pulsar.runtime.loop import run as run_loop

__all__ = ["bench_dht", "main"]


async def bench_dht(nodes: int = 20, blocks: int = 2000, *, block_size: int = 1024,
                    sequential_blocks: int = 300, gets: int = 500,
                    processes: int | None = None, data_dir: str | None = None
                    ) -> dict[str, Any]:
    """Run the benchmark and return its figures (see the module docstring)."""
    if nodes < 3:
        raise ValueError("the benchmark needs at least 3 nodes")
    processes = (os.cpu_count() or 1) if processes is None else processes
    remote = nodes - 2  # all but the publisher and the reader
    processes = min(processes, remote)
    with tempfile.TemporaryDirectory(prefix="pulsarcast-bench-", dir=data_dir) as tmp:
        same_replicas = DhtConfig(replicas=DhtConfig().ksize)  # as Server.set: all k
        publisher = await DhtNode.start(Identity.generate(), db_path=f"{tmp}/publisher.db",
                                        config=same_replicas)
        workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        local: list[DhtNode] = [publisher]
        try:
            seed = [publisher.address]
            in_main = remote if processes == 0 else 0
            for i in range(in_main):
                local.append(await DhtNode.start(Identity.generate(), db_path=f"{tmp}/n{i}.db",
                                                 bootstrap=seed))
            if processes:
                workers = await _start_workers(processes, remote, seed, tmp)
            reader = await DhtNode.start(Identity.generate(), db_path=f"{tmp}/reader.db",
                                         bootstrap=seed)
            local.append(reader)
            await _settle(publisher, nodes - 1)
            await publisher.put_many([os.urandom(block_size) for _ in range(50)], codec=RAW)

            payloads = [os.urandom(block_size) for _ in range(blocks)]
            started = time.perf_counter()
            results = await publisher.put_many(payloads, codec=RAW)
            put_s = time.perf_counter() - started

            sequential = [os.urandom(block_size) for _ in range(sequential_blocks)]
            started = time.perf_counter()
            for block in sequential:
                await Server.set(publisher.server, bytes(cid_of_raw(block)), block)
            set_s = time.perf_counter() - started

            reader.records.expire(time.time() + 1)  # hold nothing: every get is remote
            latencies = []
            for result in random.sample(results, min(gets, len(results))):
                started = time.perf_counter()
                await reader.get(result.cid)
                latencies.append((time.perf_counter() - started) * 1000)
        finally:
            for node in local:
                await node.stop()
            await _stop_workers(workers)
    put_per_s = blocks / put_s
    set_per_s = sequential_blocks / set_s
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "nodes": nodes,
        "processes": processes,
        "data_dir": data_dir or tempfile.gettempdir(),
        "blocks": blocks,
        "block_bytes": block_size,
        "replicas_mean": round(statistics.fmean(r.acks for r in results), 2),
        "put_per_s": round(put_per_s, 1),
        "sequential_set_per_s": round(set_per_s, 1),
        "ratio": round(put_per_s / set_per_s, 2),
        "get_p50_ms": round(statistics.median(latencies), 3),
        "get_p99_ms": round(cuts[98], 3),
    }


async def _settle(node: DhtNode, expected: int, timeout: float = 10.0) -> None:
    """Wait until ``node`` knows ``expected`` contacts (everyone has bootstrapped)."""
    deadline = time.monotonic() + timeout
    while len(node.closest_known_peers(node.node_id, expected)) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(node.closest_known_peers(node.node_id, expected))} "
                               f"of {expected} nodes joined")
        await asyncio.sleep(0.05)


async def _start_workers(processes: int, count: int, seed: list[tuple[str, int]], tmp: str
                         ) -> list[tuple[multiprocessing.process.BaseProcess, Connection]]:
    context = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    for w in range(processes):
        share = count // processes + (1 if w < count % processes else 0)
        parent, child = context.Pipe()
        process = context.Process(target=_worker_main, args=(child, share, seed, f"{tmp}/w{w}"),
                                  daemon=True)
        process.start()
        child.close()
        workers.append((process, parent))
    for _, conn in workers:
        ready = await loop.run_in_executor(None, conn.recv)
        if ready != "ready":
            raise RuntimeError(f"bench worker failed: {ready}")
    return workers


async def _stop_workers(workers: list[tuple[multiprocessing.process.BaseProcess, Connection]]
                        ) -> None:
    loop = asyncio.get_running_loop()
    for _, conn in workers:
        conn.send("stop")
    for process, conn in workers:
        await loop.run_in_executor(None, process.join, 30)
        conn.close()
        if process.is_alive():  # pragma: no cover - a hung worker
            process.kill()
            process.join()
        process.close()


def _worker_main(conn: Connection, count: int, seed: list[tuple[str, int]], tmp: str) -> None:
    run_loop(_worker(conn, count, seed, tmp))


async def _worker(conn: Connection, count: int, seed: list[tuple[str, int]], tmp: str) -> None:
    os.makedirs(tmp, exist_ok=True)
    nodes = []
    try:
        for i in range(count):
            nodes.append(await DhtNode.start(Identity.generate(), db_path=f"{tmp}/n{i}.db",
                                             bootstrap=seed, config=DhtConfig()))
        conn.send("ready")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    except Exception as exc:  # pragma: no cover - reported to the parent
        conn.send(repr(exc))
    finally:
        for node in nodes:
            await node.stop()
        conn.close()


def main() -> None:
    """Print the figures as one JSON line (what the CLI's ``bench dht`` runs)."""
    print(json.dumps(run_loop(bench_dht())))


if __name__ == "__main__":
    main()
