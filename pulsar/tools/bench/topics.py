"""``pulsarcast bench topics``: what a node pays for the topics it knows, not the events.

Real nodes (UDP DHT, TCP transport, SQLite each) on loopback, in this process: a seed, an
author that creates ``topics`` topics and a subscriber that subscribes to every one. Then:

* ``create_first_s`` / ``create_last_s``: create + subscribe time of the first and of the
  last tenth of the topics (``create_growth`` is their ratio: cost that grows with the
  number of topics already known shows up here);
* ``idle_cpu_share``: process CPU time / wall time over ``idle`` seconds in which nobody
  publishes (the whole process: three nodes and the event loop);
* ``idle_bytes_per_s``: every byte the three nodes sent in that window, per second: on the
  transport everything handed to the sockets (handshakes, record and frame headers, AEAD
  tags, keepalives: ``TransportStats.wire_bytes_sent``), and every DHT datagram (also
  given apart; ``idle_payload_bytes_per_s`` is the transport's frame payloads alone, what
  this figure counted before). TCP/UDP/IP headers are the kernel's and not counted;
* ``hourly_cycle_bytes``: the bytes of one hour's DHT upkeep, which a short window never
  contains (republishing every record, the bucket refresh and the audit run hourly): each
  node's maintenance is run with its clock an hour and a second ahead until nothing more
  is due, and everything sent meanwhile counted; ``idle_bytes_per_s_with_upkeep`` adds it
  spread over the hour;
* ``restart_s``: the subscriber stopped and started again, from the start call until every
  topic's tree has a parent that answered its JOIN again; ``restart_start_s`` is the time
  until ``Node.start`` returned (an API served by the node answers from then on) and
  ``restart_lag_ms`` the longest the event loop did not run a 10 ms ticker meanwhile.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dag import CID
from dht import DhtConfig
from pulsar.config import NodeConfig
from pulsar.node import Node
from pulsar.runtime.loop import LagMeter

from .delivery import _start_network, _stop_all

__all__ = ["bench_topics"]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _sent(nodes: list[Node]) -> tuple[int, int]:
    """(transport bytes on the sockets, DHT datagram bytes) sent by ``nodes`` so far."""
    return (sum(n.transport.stats.wire_bytes_sent for n in nodes),
            sum(n.dht.stats.bytes_sent for n in nodes))


def _payload_sent(nodes: list[Node]) -> int:
    return sum(n.transport.stats.bytes_sent for n in nodes)


async def _hourly_upkeep(nodes: list[Node]) -> tuple[int, float]:
    """Run one hour's DHT maintenance on every node now (its clock an interval and a
    second ahead, passes repeated while a backlog remains); returns the bytes sent
    meanwhile and the republish interval they are spread over."""
    interval = nodes[0].dht.config.republish_interval
    before = sum(_sent(nodes))
    ahead = time.time() + interval + 1.0
    for node in nodes:
        for _ in range(1000):  # each pass yields; a backlog means more is due at once
            report = await node.dht.maintain(ahead)
            if not report.backlog:
                break
    return sum(_sent(nodes)) - before, interval


async def _attached(node: Node, topics: list[CID], timeout: float) -> bool:
    """Poll until every tree of ``topics`` is attached. Only the trees not seen attached
    yet are looked at again, and a poll stops at the first that is not: building a view
    of all 20,000 trees every 50 ms was a sixth of the process's CPU during a restart,
    inflating the restart time and loop stall this measures."""
    deadline = time.monotonic() + timeout
    waiting = list(topics)
    while time.monotonic() < deadline:
        while waiting:
            view = node.tree(waiting[-1])
            if view is None or not view.attached:
                break
            waiting.pop()
        if not waiting:
            return True
        await asyncio.sleep(0.05)  # polling interval
    return False


async def bench_topics(topics: int = 1000, idle: float = 10.0) -> dict[str, Any]:
    if topics < 10 or idle <= 0:
        raise ValueError("the topics benchmark needs at least 10 topics and a positive idle time")
    with tempfile.TemporaryDirectory(prefix="pulsarcast-topics-") as tmp:
        root = Path(tmp)

        def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
            return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds,
                              dht=DhtConfig(rpc_timeout=1.0))

        _say("starting 3 nodes")
        network = await _start_network(root, 3, config)
        seed, author, subscriber = network
        figures: dict[str, Any] = {"bench": "topics", "topics": topics, "idle_s": idle}
        try:
            cids: list[CID] = []
            times: list[float] = []
            for index in range(topics):
                start = time.perf_counter()
                topic = await author.create_topic(f"bench/topics/{index}")
                await subscriber.subscribe(topic.cid)
                times.append(time.perf_counter() - start)
                cids.append(topic.cid)
                if (index + 1) % max(1, topics // 10) == 0:
                    _say(f"  {index + 1}/{topics} topics created and subscribed")
            tenth = max(1, topics // 10)
            first, last = sum(times[:tenth]), sum(times[-tenth:])
            figures.update(create_first_s=round(first, 3), create_last_s=round(last, 3),
                           create_growth=round(last / first, 3))
            if not await _attached(subscriber, cids, 60.0):
                _say("  warning: not every tree attached before the idle window")
            await asyncio.sleep(2.0)  # let the subscription burst's own traffic end
            _say(f"  idle for {idle:.0f} s")
            cpu0, wall0 = time.process_time(), time.perf_counter()
            pubsub0, dht0 = _sent(network)
            payload0 = _payload_sent(network)
            await asyncio.sleep(idle)  # the measured idle window
            cpu1, wall1 = time.process_time(), time.perf_counter()
            pubsub1, dht1 = _sent(network)
            payload1 = _payload_sent(network)
            wall = wall1 - wall0
            idle_bytes = (pubsub1 - pubsub0 + dht1 - dht0) / wall
            figures.update(
                idle_cpu_share=round((cpu1 - cpu0) / wall, 4),
                idle_bytes_per_s=round(idle_bytes),
                idle_pubsub_bytes_per_s=round((pubsub1 - pubsub0) / wall),
                idle_dht_bytes_per_s=round((dht1 - dht0) / wall),
                idle_payload_bytes_per_s=round((payload1 - payload0) / wall),
            )
            _say("  one hour's DHT upkeep")
            cycle, interval = await _hourly_upkeep(network)
            figures.update(hourly_cycle_bytes=cycle,
                           idle_bytes_per_s_with_upkeep=round(idle_bytes + cycle / interval))
            _say("  restarting the subscriber")
            await subscriber.stop()
            lag = LagMeter(0.01)  # a 10 ms ticker
            ticker = asyncio.create_task(lag.run())
            start = time.perf_counter()
            subscriber = await Node.start(config(2, (seed.address, author.address)))
            network[2] = subscriber
            started = time.perf_counter() - start
            attached = await _attached(subscriber, cids, 120.0)
            rejoined = time.perf_counter() - start
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            worst = lag.worst
            figures.update(restart_start_s=round(started, 3), restart_s=round(rejoined, 3),
                           restart_lag_ms=round(worst * 1000, 1), restart_attached=attached)
        finally:
            await _stop_all(network)
    return figures
