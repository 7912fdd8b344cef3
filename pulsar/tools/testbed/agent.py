"""One testbed node in a process of its own: ``python -m pulsar.tools.testbed.agent``.

One node per process, so that a crash is a real one (the runner SIGKILLs the process: no
flush, no goodbye, a trace file cut mid-line) and so that CPU and memory samples are the
node's own. Driven by the runner over :mod:`pulsar.tools.bench.control`'s line protocol.

Commands:

* ``start {index, data_dir, trace_path, protocol, seeds, port, life, network, host}`` —
  start the node on ``host`` (``port`` 0 the first time; the same port again on restart, so
  peers' routing tables stay right), with the scenario's link faults (all zero when the
  kernel makes them) and a tracer; replies ``address``, ``peer``.

With ``PULSARCAST_NETNS`` set to a network namespace's path (a testbed run in namespaces,
:mod:`pulsar.tools.testbed.kernel`), the process moves into it before it opens any socket.
* ``prove`` — prove the peer ids of the contacts the DHT knows.
* ``create {name, order}`` — create a topic (``order``: only this node may publish,
  LAST_SEEN); replies its ``cid``.
* ``subscribe {topics}`` — subscribe to these topic CIDs (the descriptors come from the DHT).
* ``count {topics}`` — which of ``topics`` this node is connected for: has a parent, is the
  root, or (Floodsub) knows a member to flood to.
* ``schedule {start_at, publishes, payload_bytes}`` — publish ``[[offset, topic], ...]`` at
  ``start_at + offset`` (wall clock); replies at once.
* ``partition {groups}`` / ``heal`` — cut the network into groups of peer ids, or end it.
* ``status`` — ``delivered`` (delivery-log entries of the workload topics: durable, so it
  counts across restarts), ``published``, ``publish_failed``, and ``published_by_topic``
  (acknowledged publishes of this life, per topic CID: what a crash cannot take back).
* ``finish`` — a last resource sample and flush of the trace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from dag import CID, PeerId
from pulsar.config import NodeConfig
from pulsar.net.faults import FaultInjector
from pulsar.node import Node, NotPersisted, PublishError
from pulsar.tools.bench.control import CommandWorker, run_worker
from pulsar.tools.netlab.netns import enter

from .trace import TraceWriter
from .tracer import NodeTracer

__all__ = ["main"]

log = logging.getLogger("pulsar.tools.testbed.agent")

CREATE_ATTEMPTS = 5
CREATE_RETRY_AFTER = 5.0
"""As the REST API's ``Retry-After`` on ``503 not-persisted``."""
SAMPLE_EVERY = 1.0
FLUSH_EVERY = 0.25
"""A crash (SIGKILL) loses at most this much of the trace, as it would lose a log's tail."""


class _Agent(CommandWorker):
    commands = frozenset({"start", "prove", "create", "subscribe", "count", "schedule",
                          "partition", "heal", "status", "finish"})

    def __init__(self, channel: IO[str]) -> None:
        super().__init__(channel)
        self.node: Node | None = None
        self.tracer: NodeTracer | None = None
        self.faults: FaultInjector | None = None
        self.topics: list[CID] = []
        self.published = 0
        self.published_by_topic: Counter[str] = Counter()
        self.publish_failed = 0
        self.tasks: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @property
    def _node(self) -> Node:
        if self.node is None:
            raise RuntimeError("no node started")
        return self.node

    # ------------------------------------------------------------------ commands

    async def start(self, index: int, data_dir: str, trace_path: str, protocol: str,
                    seeds: list[list[Any]], port: int, life: int,
                    network: dict[str, float], seed: int,
                    host: str = "127.0.0.1") -> dict[str, Any]:
        self.faults = FaultInjector(seed * 1000 + index * 10 + life, drop_rate=network["loss"],
                                    latency=network["latency"], jitter=network["jitter"])
        self.tracer = NodeTracer(TraceWriter(Path(trace_path), index), life)
        config = NodeConfig(
            data_dir=Path(data_dir),
            host=host,
            port=port,
            bootstrap=tuple((str(h), int(p)) for h, p in seeds),
            protocol=protocol,
            faults=self.faults,
            tracer=self.tracer,
        )
        self.node = await Node.start(config)
        self._spawn(self._sampler())
        return {"address": list(self.node.address), "peer": str(self.node.peer_id)}

    async def prove(self) -> dict[str, Any]:
        proven = await self._node._routing.prove_known(5.0)
        return {"proven": proven}

    async def create(self, name: str, order: bool) -> dict[str, Any]:
        """Create the topic, trying again as a client told ``503 not-persisted`` would
        (the node may not have found its DHT contacts yet: a loaded host, a lossy link)."""
        node = self._node
        allowed = [node.peer_id] if order else None
        for attempt in range(CREATE_ATTEMPTS):
            try:
                topic = await node.create_topic(name, allowed_publishers=allowed)
            except NotPersisted as exc:
                if attempt + 1 == CREATE_ATTEMPTS:
                    raise
                log.warning("creating %s: %s; again in %.0f s", name, exc, CREATE_RETRY_AFTER)
                await asyncio.sleep(CREATE_RETRY_AFTER)  # the Retry-After a client is given
            else:
                return {"cid": str(topic.cid), "attempts": attempt + 1}
        raise AssertionError("unreachable")

    async def subscribe(self, topics: list[str]) -> dict[str, Any]:
        cids = [CID.parse(t) for t in topics]
        await asyncio.gather(*(self._node.subscribe(c) for c in cids))
        return {}

    def count(self, topics: list[str]) -> dict[str, Any]:
        self.topics = [CID.parse(t) for t in topics]
        ready = 0
        for cid in self.topics:
            view = self._node.tree(cid)
            if view is not None and (view.parents or view.is_root or view.children):
                ready += 1
        return {"ready": ready}

    def schedule(self, start_at: float, publishes: list[list[Any]],
                 payload_bytes: int) -> dict[str, Any]:
        self._spawn(self._publish_all(start_at, publishes, payload_bytes))
        return {}

    def partition(self, groups: list[list[str]]) -> dict[str, Any]:
        assert self.faults is not None
        self.faults.partition([[PeerId.parse(p) for p in group] for group in groups])
        return {}

    def heal(self) -> dict[str, Any]:
        assert self.faults is not None
        self.faults.heal()
        return {}

    def status(self) -> dict[str, Any]:
        node = self._node
        subscribed = set(node.subscribed())
        delivered = sum(node.last_position(t) for t in self.topics if t in subscribed)
        return {"delivered": delivered, "published": self.published,
                "publish_failed": self.publish_failed,
                "published_by_topic": dict(self.published_by_topic)}

    def finish(self) -> dict[str, Any]:
        self._sample()
        if self.tracer is not None:
            self.tracer.writer.flush()
        return {}

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.node is not None:
            await self.node.stop()
        if self.tracer is not None:
            self._sample()
            self.tracer.writer.close()
        self.node = self.tracer = None  # stop() runs again when stdin closes

    # ------------------------------------------------------------------ work

    async def _publish_all(self, start_at: float, publishes: list[list[Any]],
                           payload_bytes: int) -> None:
        node = self._node
        filler = os.urandom(payload_bytes)
        for number, (offset, topic) in enumerate(publishes):
            delay = start_at + offset - time.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the workload's timetable, not synchronisation
            payload = number.to_bytes(4, "big") + filler[4:]
            self._spawn(self._publish_one(node, CID.parse(topic), payload))

    async def _publish_one(self, node: Node, topic: CID, payload: bytes) -> None:
        try:
            await node.publish(topic, payload)
            self.published += 1
            self.published_by_topic[str(topic)] += 1
        except (PublishError, LookupError, OSError) as exc:
            self.publish_failed += 1
            log.warning("publish on %s failed: %s", topic, exc)

    def _sample(self) -> None:
        node, tracer = self.node, self.tracer
        if node is None or tracer is None:
            return
        transport = node.transport.stats
        dht = node.dht.stats
        overlay: dict[str, list[float | bool | None]] = {}
        rtts = node.core.rtt_snapshot()
        for peer, near in node.core.overlay().items():
            measured = rtts.get(peer)
            srtt = None if measured is None else round(measured[0] * 1000, 1)
            overlay[str(peer)] = [srtt, near]
        trees = {str(view.topic): [sorted(map(str, view.parents)),
                                   sorted(map(str, view.children))]
                 for view in node.trees()}
        tracer.sample(transport.bytes_sent, transport.bytes_received, dht.bytes_sent,
                      dht.bytes_received, dht.sent_by_rpc, overlay,
                      {**node.metrics, **dht.as_dict()}, trees)

    async def _sampler(self) -> None:
        ticks_per_sample = round(SAMPLE_EVERY / FLUSH_EVERY)
        tick = 0
        while True:
            await asyncio.sleep(FLUSH_EVERY)  # a sampling period, not synchronisation
            tick += 1
            if tick % ticks_per_sample == 0:
                self._sample()
            if self.tracer is not None:
                self.tracer.writer.flush()


def main() -> None:
    namespace = os.environ.get("PULSARCAST_NETNS")
    if namespace:
        enter(namespace)  # before any socket or thread
    logging.basicConfig(level=os.environ.get("PULSARCAST_TESTBED_LOG", "ERROR"))
    run_worker(_Agent)


if __name__ == "__main__":
    main()
