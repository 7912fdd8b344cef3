"""``pulsarcast bench tree``: dissemination over a real loopback network.

``nodes`` real nodes (UDP DHT, TCP transport, SQLite each) in this process, one topic,
every node subscribed, the author publishing 256-byte events as fast as the tree absorbs
them. Figures:

* ``deliveries_per_s`` — events x subscribers delivered per second, from the first publish
  to the last delivery (sustained over ``events`` events);
* ``delivery_p50_ms`` / ``delivery_p99_ms`` — publish call start to delivery at each
  subscriber (one clock: one process);
* ``rmr`` — relative message redundancy, ``copies received / (n - 1) - 1`` per event,
  counting every EVENT message any node received, duplicates included;
* ``ldh`` — last delivery hop: the largest hop count at which an event was delivered;
* ``tree_depth`` — the longest parent chain in the tree.

``relay_events_per_s``: one relay node fed pre-signed event frames as fast as it takes them
(decode, CID and signature checks, rights, SQLite store, forwarding), with three real child
transports counting what arrives: events fully forwarded to all three per second.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from dag import EventDescriptor, Identity, TopicDescriptor

from ..config import NodeConfig
from ..net.transport import Transport
from ..node import Node
from ..proto.messages import Event, Join, encode_message
from .timing import percentile


async def _network(root: Path, count: int) -> list[Node]:
    nodes: list[Node] = []
    for i in range(count):
        seeds = tuple(n.address for n in nodes[-3:])
        nodes.append(await Node.start(NodeConfig(data_dir=root / f"n{i}", bootstrap=seeds)))
    await asyncio.gather(*(n._routing.prove_known(5.0) for n in nodes))
    return nodes


def _depth(nodes: list[Node], topic: Any) -> int:
    parent_of = {}
    for node in nodes:
        view = node.tree(topic)
        if view is not None and view.parents:
            parent_of[node.peer_id] = next(iter(view.parents))
    deepest = 0
    for start in parent_of:
        depth, cursor = 0, start
        while cursor in parent_of and depth < len(nodes):
            cursor = parent_of[cursor]
            depth += 1
        deepest = max(deepest, depth)
    return deepest


async def bench_tree(nodes: int = 50, events: int = 500) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        network = await _network(Path(tmp), nodes)
        try:
            figures = await _disseminate(network, events)
            figures["relay_events_per_s"] = round(await _relay(Path(tmp) / "relay"))
            return figures
        finally:
            await asyncio.gather(*(n.stop() for n in network), return_exceptions=True)


async def _disseminate(network: list[Node], events: int) -> dict[str, Any]:
    author = network[0]
    topic = await author.create_topic("bench")
    subs = [await n.subscribe(topic.cid) for n in network[1:]]
    published_at: dict[Any, float] = {}
    arrivals: list[tuple[Any, float]] = []
    done = asyncio.Event()
    remaining = [len(subs) * events]
    last_delivery = [0.0]

    async def consume(sub: Any) -> None:
        for _ in range(events):
            event = await sub.get()
            now = time.perf_counter()
            arrivals.append((event.cid, now))
            last_delivery[0] = now
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    baseline = sum(n.core.metrics["events_received"] for n in network)
    consumers = [asyncio.create_task(consume(s)) for s in subs]
    start = time.perf_counter()
    in_flight: set[asyncio.Task[Any]] = set()
    payload = b"x" * 256
    window = asyncio.Semaphore(64)  # publishes in flight: DHT stores overlap, as in real use

    async def publish_one(i: int) -> None:
        async with window:
            t0 = time.perf_counter()
            event = await author.publish(topic.cid, payload + str(i).encode())
            published_at.setdefault(event.cid, t0)

    for i in range(events):
        await window.acquire()
        window.release()
        task = asyncio.create_task(publish_one(i))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await asyncio.wait_for(done.wait(), timeout=120)
    elapsed = last_delivery[0] - start
    latencies = [t - published_at[cid] for cid, t in arrivals]
    for task in consumers + list(in_flight):
        task.cancel()
    received = sum(n.core.metrics["events_received"] for n in network) - baseline
    hops = max(n.core.metrics.get("max_hop", 0) for n in network)
    return {
        "bench": "tree",
        "nodes": len(network),
        "events": events,
        "deliveries_per_s": round(len(subs) * events / elapsed),
        "delivery_p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "delivery_p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "rmr": round(received / (events * (len(network) - 1)) - 1, 4),
        "ldh": hops,
        "tree_depth": _depth(network, topic.cid),
    }


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
        relay._apply(relay.core.learn_topic(meta))
        relay._apply(relay.core.learn_topic(topic))
        await relay._subscribe_descriptor(topic, deliver=False)
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
            relay._on_frame(source, frame)
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
