"""``pulsarcast bench consumers``: a consumer group sharing one topic's events across nodes.

Four real nodes in one process (UDP DHT, TCP transport, SQLite on disk, loopback). For
each group size k of 1, 2 and 4, a fresh topic gets ``events`` events (published and
logged at every node before the clock starts); then k members, one per node, each with a
durable consumer of group ``g``, handle the backlog. A member's handler handles one event
at a time: it fetches up to 16, and for each waits 10 ms (``handle_ms``: I/O, not CPU, so
the machine's two cores do not bound the group) and acknowledges it. The clock stops when
every event was acknowledged by some member.

* ``rate_k`` — events handled per second with k members; ``speedup_2`` and ``speedup_4``
  are ``rate_2`` and ``rate_4`` over ``rate_1``, from the same run;
* ``duplicates_steady`` — events handled by more than one member in the k = 2 and k = 4
  runs, where membership does not change once they start.

Then the kill: three members (nodes 0-2; node 3 publishes) handle another fresh backlog
with ``ack_wait`` 30 s; once a third is handled, and just after node 2's member fetched a
batch (it holds at least half of one, unacknowledged), node 2 crashes: its tasks
cancelled, its transport, DHT and store closed with no goodbye (what a SIGKILL leaves, in
one process).

* ``lost_after_kill`` — events nobody acknowledged when the survivors stop (the run waits
  up to 120 s for them);
* ``redelivered_after_kill`` — of the events node 2 held unacknowledged, those the
  survivors handled afterwards (all of them, when nothing is lost);
  ``unacked_at_kill`` how many it held;
* ``recover_s`` — from the crash until the survivors had handled the last of those
  (failure detection is 3 s of silence; the target is ``ack_wait`` + 5 s);
* ``duplicates_after_kill`` — events handled twice in the kill run (the event node 2 was
  handling when it died, if it had finished it but not acknowledged it, is one).

What it leaves out: the publishing and the spreading of the events (done before the clock
starts), and the time the members take to find each other (the same for every k).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dag import CID
from dht import DhtConfig
from pulsar.config import NodeConfig
from pulsar.node import Node

from .delivery import _settle, _start_network, _stop_all, crash

__all__ = ["bench_consumers"]

FETCH = 16
ACK_WAIT = 30.0
PUBLISH_WINDOW = 64


def _say(message: str) -> None:
    print(f"[bench consumers] {message}", file=sys.stderr, flush=True)


async def _fill(nodes: list[Node], name: str, events: int) -> CID:
    """A fresh topic of node 3's that every node follows, with ``events`` events logged
    everywhere."""
    author = nodes[3]
    topic = (await author.create_topic(name)).cid
    for node in nodes[:3]:
        await node.subscribe(topic)
    await _settle([author, *nodes[:3]], topic)
    numbers = iter(range(events))

    async def publisher() -> None:
        for number in numbers:
            await author.publish(topic, f"job {number}".encode())

    await asyncio.gather(*(publisher() for _ in range(PUBLISH_WINDOW)))
    deadline = time.monotonic() + 120
    while any(n.last_position(topic) < events for n in nodes):
        if time.monotonic() > deadline:
            raise TimeoutError("the backlog did not reach every node in 120 s")
        await asyncio.sleep(0.05)
    return topic


async def _join(members: list[Node], topic: CID, group: str) -> None:
    for i, node in enumerate(members):
        await node.consumers.add(topic, {"name": f"m{i}", "group": group,
                                         "ack_wait": ACK_WAIT})
    deadline = time.monotonic() + 60
    while True:
        ready = 0
        for i, node in enumerate(members):
            member = node._driver.groups.member(topic, f"m{i}")
            if member is not None and node._driver.groups.ready(member) \
                    and len(member.view.live()) == len(members):
                ready += 1
        if ready == len(members):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the group of {len(members)} did not form in 60 s")
        await asyncio.sleep(0.05)


class _Member:
    """One member's handler: one event at a time, ``handle_ms`` of waiting each."""

    def __init__(self, node: Node, topic: CID, name: str, handle_ms: float,
                 handled: Counter[CID], acked: set[CID]) -> None:
        self.node, self.topic, self.name = node, topic, name
        self.handle_s = handle_ms / 1000
        self.handled = handled
        self.acked = acked
        self.holding: set[CID] = set()
        """Handed out to it and not acknowledged yet."""
        self.mine: Counter[CID] = Counter()

    async def run(self, done: asyncio.Event) -> None:
        consumers = self.node.consumers
        while not done.is_set():
            messages = await consumers.fetch(self.topic, self.name, FETCH, 0.2)
            self.holding.update(m.event.cid for m in messages)
            for message in messages:
                await asyncio.sleep(self.handle_s)  # the handler's I/O
                cid = message.event.cid
                self.handled[cid] += 1
                self.mine[cid] += 1
                await consumers.ack(self.topic, self.name, [message.id])
                self.holding.discard(cid)
                self.acked.add(cid)


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        await asyncio.sleep(0.01)


async def _share(nodes: list[Node], k: int, events: int, handle_ms: float
                 ) -> tuple[float, int]:
    """Events per second for a group of ``k``, and events handled twice."""
    topic = await _fill(nodes, f"bench/consumers/{k}", events)
    members = nodes[:k]
    await _join(members, topic, f"g{k}")
    handled: Counter[CID] = Counter()
    acked: set[CID] = set()
    done = asyncio.Event()
    handlers = [_Member(n, topic, f"m{i}", handle_ms, handled, acked)
                for i, n in enumerate(members)]
    start = time.perf_counter()
    tasks = [asyncio.create_task(h.run(done)) for h in handlers]
    await _until(lambda: len(acked) >= events, 600, f"{events} events with {k} member(s)")
    elapsed = time.perf_counter() - start
    done.set()
    await asyncio.gather(*tasks)
    twice = sum(1 for count in handled.values() if count > 1)
    shares = ", ".join(str(len(h.mine)) for h in handlers)
    _say(f"{k} member(s): {events / elapsed:.1f} events/s ({elapsed:.2f} s; shares {shares}; "
         f"{twice} handled twice)")
    return events / elapsed, twice


async def _kill(nodes: list[Node], events: int, handle_ms: float) -> dict[str, Any]:
    topic = await _fill(nodes, "bench/consumers/kill", events)
    members = nodes[:3]
    await _join(members, topic, "gkill")
    handled: Counter[CID] = Counter()
    acked: set[CID] = set()
    done = asyncio.Event()
    handlers = [_Member(n, topic, f"m{i}", handle_ms, handled, acked)
                for i, n in enumerate(members)]
    tasks = [asyncio.create_task(h.run(done)) for h in handlers]
    await _until(lambda: len(acked) >= events // 3, 600, "a third of the events")
    victim = handlers[2]
    # Just after a fetch, so it dies holding most of a batch it has not acknowledged.
    await _until(lambda: len(victim.holding) >= FETCH // 2, 60, "a fetched batch")
    tasks[2].cancel()
    await asyncio.gather(tasks[2], return_exceptions=True)
    unacked = set(victim.holding)
    await crash(victim.node)
    killed = time.perf_counter()
    _say(f"node 2 crashed holding {len(unacked)} unacknowledged event(s)")
    recovered: float | None = None
    deadline = killed + 120
    while time.perf_counter() < deadline:
        if recovered is None and all(c in handlers[0].mine or c in handlers[1].mine
                                     for c in unacked):
            recovered = time.perf_counter() - killed
        if len(acked) >= events and recovered is not None:
            break
        await asyncio.sleep(0.01)
    done.set()
    await asyncio.gather(*tasks[:2])
    survivors = handlers[0].mine + handlers[1].mine
    lost = events - len(acked)
    redelivered = sum(1 for c in unacked if c in survivors)
    twice = sum(1 for count in handled.values() if count > 1)
    taken = 0
    for i, node in enumerate(nodes[:2]):
        group = node.consumers.describe(topic, f"m{i}", node.consumers.clock()).group
        taken += 0 if group is None else group.taken_over
    _say(f"kill: lost {lost}, redelivered {redelivered} of {len(unacked)}, recovered in "
         f"{recovered if recovered is None else round(recovered, 2)} s, {twice} handled "
         f"twice, {taken} taken over")
    return {"unacked_at_kill": len(unacked), "lost_after_kill": lost,
            "redelivered_after_kill": redelivered,
            "recover_s": None if recovered is None else round(recovered, 3),
            "duplicates_after_kill": twice, "taken_over_after_kill": taken}


async def bench_consumers(events: int = 3000, handle_ms: float = 10.0) -> dict[str, Any]:
    """Run the benchmark; figures as described in the module docstring."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pulsarcast-bench-consumers-") as tmp:
        root = Path(tmp)

        def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
            return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds,
                              dht=DhtConfig(rpc_timeout=1.0))

        nodes = await _start_network(root, 4, config)
        try:
            cpu = time.process_time()
            rates: dict[int, float] = {}
            duplicates = 0
            for k in (1, 2, 4):
                rates[k], twice = await _share(nodes, k, events, handle_ms)
                if k > 1:
                    duplicates += twice
            shared_cpu = time.process_time() - cpu
            kill = await _kill(nodes, events, handle_ms)
            figures: dict[str, Any] = {
                "benchmark": "consumers", "events": events, "handle_ms": handle_ms,
                **{f"rate_{k}": round(r, 1) for k, r in rates.items()},
                "ideal_rate_1": round(1000 / handle_ms, 1),
                "cpu_s_sharing": round(shared_cpu, 2),
                **kill,
                "ack_wait": ACK_WAIT,
                "load_average_before": round(load_before, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
                "speedup_2": round(rates[2] / rates[1], 2),
                "speedup_4": round(rates[4] / rates[1], 2),
                "duplicates_steady": duplicates,
            }
            # The keys the issue names come last, in its order.
            for key in ("lost_after_kill", "redelivered_after_kill", "recover_s"):
                figures[key] = figures.pop(key)
            return figures
        finally:
            await _stop_all([n for n in nodes if not n.stopped])
