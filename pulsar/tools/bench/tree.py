"""``pulsarcast bench tree``: dissemination over a real loopback network.

``nodes`` real nodes (UDP DHT, TCP transport, SQLite each), one topic, every node
subscribed, the author publishing 256-byte events with a window of 64 concurrent
``publish()`` calls. Figures:

* ``deliveries_per_s`` — events x subscribers delivered per second, from the first publish
  call to the last delivery anywhere (sustained over ``events`` events);
* ``delivery_p50_ms`` / ``delivery_p99_ms`` — publish call start to delivery at each
  subscriber (wall clock, which all processes on one machine share);
* ``rmr`` — relative message redundancy, ``copies received / (n - 1) - 1`` per event,
  counting every copy any node took in: EVENT messages (duplicates included) and events
  taken by repair (backfill); ``repaired`` says how many copies came the second way (see
  :func:`pulsar.tools.bench.worker.copies_received`);
* ``ldh`` — last delivery hop: the largest hop count at which an event was delivered;
* ``tree_depth`` — the longest parent chain in the tree.

**Processes.** A node's per-event work (Ed25519 verification, SQLite writes, DHT RPC
packing) is CPU-bound Python, and one event loop uses one core: with every node in one
process the figure would be the figure of one core, however many the machine has. So the
subscribers are spread round-robin over ``processes`` worker processes (default: one per
CPU), each ``python -m pulsar.tools.bench.worker`` with its own event loop (see that module),
talking to the other nodes only through their sockets, as separate machines would. Each new
node bootstraps off the last three nodes started, whichever process they are in.

The author (node 0) runs in this process, on its own. Why: it does far more per event than a
subscriber — it signs, stores every event at the k=20 closest DHT nodes (a lookup and 20
STOREs) and sends it to each of its children, several ms of CPU per event, about as much as
ten subscribers. Placed in a worker beside its share of subscribers it made that worker the
bottleneck while the other idled (measured when this was written, 2 cores: 2,650
deliveries/s, one worker 89% busy, the other 70%); in a process of its own the operating
system shares the cores between all of them (3,900-4,300/s on the same machine and code).
It is also where a publisher usually is: in its own process, not sharing a loop with 24
other nodes. This process does nothing else while measuring but read a progress line from
each worker once a second.

``relay_events_per_s``: one relay node fed pre-signed event frames as fast as it takes them
(decode, CID and signature checks, rights, SQLite store, forwarding), with three real child
transports counting what arrives: events fully forwarded to all three per second. It runs
in this process after the workers have stopped, so it has the machine to itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dag import CID, EventDescriptor, Identity, TopicDescriptor
from pulsar.config import NodeConfig
from pulsar.net.transport import Transport
from pulsar.node import Node
from pulsar.proto.codec import encode_message
from pulsar.proto.tree.messages import Event, Join

from .control import WorkerProcess
from .timing import percentile
from .worker import copies_received, counters

TIMEOUT = 300.0
"""The whole network phase (start-up to statistics) must finish within this many seconds."""
WINDOW = 64
"""Concurrent ``publish()`` calls: DHT stores of successive events overlap, as in real use."""
SEEDS = 3
"""A new node bootstraps off this many of the nodes started before it."""
PAYLOAD_BYTES = 256


def _say(message: str) -> None:
    """Progress for the person running the benchmark; stdout carries only the JSON line."""
    print(message, file=sys.stderr, flush=True)


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux ``/proc/stat``), or
    None elsewhere. Compared with our own processes' CPU time it shows whether something
    else competed for the cores during the measurement."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user + nice + system (+ steal: cores the hypervisor gave to someone else); interrupt
    # time is left out, since our own loopback traffic is accounted there.
    busy = sum(fields[:3]) + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


class _Network:
    """The author (here) and the worker processes running the subscribers."""

    def __init__(self, workers: list[WorkerProcess], root: Path) -> None:
        self.workers = workers
        self.root = root
        self.author: Node | None = None
        self.addresses: list[list[Any]] = []  # node index -> [host, port]

    @classmethod
    async def spawn(cls, processes: int, root: Path) -> _Network:
        workers: list[WorkerProcess] = []
        try:
            for index in range(processes):
                label = f"bench worker {index}"
                workers.append(await WorkerProcess.spawn("pulsar.tools.bench.worker", label))
        except BaseException:
            await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
            raise
        return cls(workers, root)

    def worker_of(self, node: int) -> WorkerProcess:
        """Node 0 is the author (this process); subscribers go round-robin."""
        return self.workers[(node - 1) % len(self.workers)]

    async def all(self, command: str, **arguments: Any) -> list[dict[str, Any]]:
        return await asyncio.gather(*(w.call(command, **arguments) for w in self.workers))

    async def start(self, count: int) -> Node:
        """The author first, then one node per worker at a time, each bootstrapping off
        the last nodes started (in any process): as fast as the machine allows, and every
        node joins a network that already exists."""
        self.author = await Node.start(NodeConfig(data_dir=self.root / "n0"))
        self.addresses.append(list(self.author.address))
        index = 1
        while index < count:
            batch = range(index, min(count, index + len(self.workers)))
            seeds = self.addresses[-SEEDS:]
            replies = await asyncio.gather(
                *(
                    self.worker_of(i).call(
                        "start", index=i, data_dir=str(self.root / f"n{i}"), seeds=seeds
                    )
                    for i in batch
                )
            )
            self.addresses.extend(r["address"] for r in replies)
            if index // 10 != batch.stop // 10 or batch.stop == count:
                _say(f"starting nodes {batch.stop}/{count}")
            index = batch.stop
        return self.author

    async def close(self) -> None:
        """Stop every node and every process, whatever state the run ended in."""
        closing = [w.close() for w in self.workers]
        if self.author is not None:
            closing.append(self.author.stop())
        await asyncio.gather(*closing, return_exceptions=True)


async def bench_tree(
    nodes: int = 50, events: int = 500, processes: int | None = None
) -> dict[str, Any]:
    """Run the benchmark (see the module docstring) and return its figures.

    ``processes``: how many worker processes run the ``nodes - 1`` subscribers (default:
    one per CPU); the author runs in this process."""
    if nodes < 2:
        raise ValueError("the tree benchmark needs at least 2 nodes")
    if events < 1:
        raise ValueError("the tree benchmark needs at least 1 event")
    processes = (os.cpu_count() or 1) if processes is None else processes
    processes = max(1, min(processes, nodes - 1))
    progress = _Progress()
    with tempfile.TemporaryDirectory(prefix="pulsarcast-tree-") as tmp:
        network = await _Network.spawn(processes, Path(tmp))
        try:
            async with asyncio.timeout(TIMEOUT):
                figures = await _disseminate(network, nodes, events, progress)
        except TimeoutError:
            delivered = sum(w.progress.get("delivered", 0) for w in network.workers)
            raise TimeoutError(
                f"tree bench did not finish within {TIMEOUT:.0f} s: {progress.published}/"
                f"{events} published, {delivered}/{events * (nodes - 1)} delivered"
            ) from None
        finally:
            await network.close()
        figures["relay_events_per_s"] = round(await _relay(Path(tmp) / "relay"))
        return figures


class _Progress:
    """How far publishing got (for progress lines and the timeout message)."""

    def __init__(self) -> None:
        self.published = 0


async def _disseminate(
    network: _Network, nodes: int, events: int, progress: _Progress
) -> dict[str, Any]:
    author = await network.start(nodes)
    _say("proving contacts")
    await asyncio.gather(author._routing.prove_known(5.0), network.all("prove"))
    topic = await author.create_topic("bench")
    _say(f"subscribing {nodes - 1} nodes")
    await network.all("subscribe", topic=str(topic.cid))
    await _settle(network, topic.cid)
    baseline, counters_baseline = copies_received(author), counters(author)
    await network.all("arm", expect=events)

    expected = events * (nodes - 1)

    async def report() -> None:
        while True:
            await asyncio.sleep(1.0)
            delivered = sum(w.progress.get("delivered", 0) for w in network.workers)
            _say(f"publishing {progress.published}/{events}, delivered {delivered}/{expected}")

    reporter = asyncio.create_task(report())
    runs = [asyncio.create_task(w.call("run")) for w in network.workers]
    cpu, wall, busy = time.process_time(), time.monotonic(), _machine_busy_s()
    publishing = asyncio.create_task(_publish(author, topic.cid, events, progress))
    try:
        # The first failure (a worker gone, a publish refused) ends the run at once.
        done, _ = await asyncio.wait([publishing, *runs], return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            failure = task.exception()
            if failure is not None:
                raise failure
        published_at = publishing.result()
        results = [run.result() for run in runs]
    finally:
        reporter.cancel()
        for task in [publishing, *runs]:
            task.cancel()
        await asyncio.gather(publishing, *runs, return_exceptions=True)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    _say(f"published {events}/{events}, delivered {expected}/{expected}")
    # Which process, if any, was the bottleneck: CPU time close to wall time means it had a
    # core to itself and used all of it.
    _say(
        f"CPU while measuring: author {cpu:.1f} s of {wall:.1f} s, "
        + ", ".join(
            f"{w.label} {r['cpu_s']:.1f} s of {r['wall_s']:.1f} s"
            for w, r in zip(network.workers, results, strict=True)
        )
    )
    busy_after = _machine_busy_s()
    if busy is not None and busy_after is not None:
        others = (busy_after - busy) - cpu - sum(r["cpu_s"] for r in results)
        if others > 0.1 * wall * (os.cpu_count() or 1):
            _say(
                f"warning: other processes used {others:.1f} CPU s during the {wall:.1f} s "
                "measurement; the figures understate this machine"
            )
    await asyncio.sleep(0.5)  # late duplicates still count towards rmr
    stats = await network.all("stats")
    stats.append(
        {
            "deliveries": {},
            "received": {k: v - baseline[k] for k, v in copies_received(author).items()},
            "counters": {k: v - counters_baseline.get(k, 0) for k, v in counters(author).items()},
            "max_hop": author.core.counters().get("max_hop", 0),
            "nodes": [_row(author, topic.cid)],
        }
    )
    total: dict[str, int] = {}
    for s in stats:
        for name, value in s["counters"].items():
            total[name] = total.get(name, 0) + value
    _say("protocol counters, all nodes: " + json.dumps({k: v for k, v in total.items() if v}))
    published = {str(cid): t for cid, t in published_at.items()}
    return _figures(stats, published, nodes, events, len(network.workers))


async def _publish(author: Node, topic: CID, events: int, progress: _Progress) -> dict[CID, float]:
    """Publish ``events`` 256-byte events with a bounded window of concurrent ``publish()``
    calls (so DHT stores of successive events overlap, as for a busy publisher); return the
    wall-clock start of each call, by event CID."""
    payload = b"x" * PAYLOAD_BYTES
    slots = asyncio.Semaphore(WINDOW)
    started_at: dict[CID, float] = {}

    async def publish_one(i: int) -> None:
        try:
            started = time.time()
            tag = str(i).encode()
            event = await author.publish(topic, payload[: -len(tag)] + tag)
            started_at[event.cid] = started
            progress.published += 1
        finally:
            slots.release()

    tasks: list[asyncio.Task[None]] = []
    try:
        for i in range(events):
            await slots.acquire()
            tasks.append(asyncio.create_task(publish_one(i)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return started_at


def _row(node: Node, topic: CID) -> list[Any]:
    """``[peer, [parents], [children]]``, as the workers report their nodes."""
    view = node.tree(topic)
    parents = sorted(str(p) for p in view.parents) if view else []
    children = sorted(str(c) for c in view.children) if view else []
    return [str(node.peer_id), parents, children]


async def _settle(network: _Network, topic: CID, timeout: float = 20.0) -> None:
    """Wait until the tree is whole: every subscriber has a parent and every parent has
    accepted its JOIN (lists the subscriber as a child), so no event is published into a
    half-built tree. Proceeds with a warning after ``timeout`` (backfill then repairs)."""
    assert network.author is not None
    deadline = time.monotonic() + timeout
    while True:
        rows = [row for reply in await network.all("tree") for row in reply["nodes"]]
        rows.append(_row(network.author, topic))
        children = {peer: set(kids) for peer, _, kids in rows}
        orphans = sum(1 for _, parents, _ in rows if not parents) - 1  # the author has none
        unconfirmed = sum(
            1 for peer, parents, _ in rows for p in parents if peer not in children.get(p, ())
        )
        if orphans <= 0 and unconfirmed == 0:
            return
        if time.monotonic() > deadline:
            _say(
                f"warning: tree not settled ({orphans} without parent, {unconfirmed} joins "
                "unconfirmed); publishing anyway"
            )
            return
        await asyncio.sleep(0.1)


def _figures(
    stats: list[dict[str, Any]],
    published: dict[str, float],
    nodes: int,
    events: int,
    processes: int,
) -> dict[str, Any]:
    """The figures, from every process's raw observations (one wall clock for all)."""
    if len(published) != events:
        raise RuntimeError(f"{len(published)} of {events} events published")
    latencies: list[float] = []
    last = 0.0
    for s in stats:
        for cid, times in s["deliveries"].items():
            if cid not in published:
                raise RuntimeError(f"delivered {cid}, which the author did not publish")
            sent = published[cid]
            latencies.extend(t - sent for t in times)
            last = max(last, *times)
    expected = events * (nodes - 1)
    if len(latencies) != expected:
        raise RuntimeError(f"{len(latencies)} deliveries, expected {expected}")
    received = sum(s["received"]["tree"] + s["received"]["repair"] for s in stats)
    repaired = sum(s["received"]["repair"] for s in stats)
    parents = {peer: ps for s in stats for peer, ps, _ in s["nodes"]}
    return {
        "bench": "tree",
        "nodes": nodes,
        "processes": processes,
        "events": events,
        "deliveries": len(latencies),
        "deliveries_per_s": round(expected / (last - min(published.values()))),
        "delivery_p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "delivery_p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "rmr": round(received / expected - 1, 4),
        "repaired": repaired,
        "ldh": max(s["max_hop"] for s in stats),
        "tree_depth": _depth(parents),
    }


def _depth(parents: dict[str, list[str]]) -> int:
    """The longest parent chain, following each node's first parent (cycle-safe)."""
    parent_of = {peer: ps[0] for peer, ps in parents.items() if ps}
    deepest = 0
    for start in parent_of:
        depth, cursor = 0, start
        while cursor in parent_of and depth <= len(parents):
            cursor = parent_of[cursor]
            depth += 1
        deepest = max(deepest, depth)
    return deepest


async def _relay(root: Path, events: int = 3000) -> float:
    """Feed one relay node frames directly; three child transports count arrivals."""
    author = Identity.generate()
    meta = TopicDescriptor.create(author, "relay/meta")
    topic = TopicDescriptor.create(author, "relay", meta=meta.cid)
    blocks = []
    parent = None
    for i in range(events):
        event = EventDescriptor.create(author, topic.cid, b"%256d" % i, parent=parent)
        blocks.append(event.block)
        parent = event.cid
    relay = await Node.start(NodeConfig(data_dir=root))
    counts = [0, 0, 0]
    finished = asyncio.Event()
    children: list[Transport] = []
    try:
        relay.store.put_many([(meta.cid, meta.block)], pinned=True)
        await relay._topics.join(topic, deliver=False)
        for index in range(3):

            def on_frame(peer: Any, frame: bytes, index: int = index) -> None:
                counts[index] += 1
                if min(counts) >= events:
                    finished.set()

            child = Transport(Identity.generate(), on_frame=on_frame)
            await child.listen("127.0.0.1", 0)
            children.append(child)
            await child.send(
                relay.peer_id, relay.address, encode_message(Join(topic.cid, topic.block))
            )
        await _wait(lambda: len(relay.tree(topic.cid).children) == 3)  # type: ignore[union-attr]
        source = author.peer_id
        frames = [encode_message(Event(topic.cid, b, 1)) for b in blocks]
        start = time.perf_counter()
        for i, frame in enumerate(frames):
            relay._driver.on_frame(source, frame)
            if i % 200 == 199:
                await asyncio.sleep(0)  # let the transport write, as a socket reader would
        await asyncio.wait_for(finished.wait(), timeout=120)
        return events / (time.perf_counter() - start)
    finally:
        for child in children:
            await child.close()
        await relay.stop()


async def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("relay bench set-up timed out")
        await asyncio.sleep(0.01)
