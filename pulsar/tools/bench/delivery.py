"""``pulsarcast bench delivery``: eventual delivery, redundancy, backfill and replay.

Real nodes (UDP DHT, TCP transport, SQLite each) on loopback, all in this process. Five
phases, each on a network of its own:

1. **Loss and crashes** (``nodes`` nodes, ``events`` events of 256 bytes). Every transport
   drops ``drop_rate`` (10 %) of its outgoing DATA frames (:class:`FaultInjector`, seeded
   from ``seed``); when a third of the events are published, ``crash_fraction`` (30 %) of
   the nodes, chosen at random among the subscribers, are stopped. Figures:

   * ``eventual_delivery_ratio`` — of the (live subscriber, published event) pairs, the
     fraction delivered by the end (the end: every pair delivered, or ``settle_timeout``
     seconds after the last publish returned);
   * ``time_to_full_delivery_s`` — from the last ``publish()`` returning until every live
     subscriber has every event (``null`` if that did not happen within the timeout);
   * ``duplicate_deliveries`` — events a subscription yielded twice (must be 0);
   * ``unsettled_edges`` — tree edges (a subscriber without a parent, or a parent not
     listing it) still missing when publishing began, after up to ``tree_timeout`` s.

   This phase uses short timers, as the loss+crash test does (listed under ``timers`` in
   the output): DHT RPC timeout 1 s, transport keepalive 0.3 s / dead after 1 s, parent
   retries 2 x 0.1 s. With the defaults a crashed parent is noticed later and the time to
   full delivery is longer.

2. **Redundancy** (same size, default timers, no faults): ``rmr`` = copies received /
   (n - 1) - 1 per event, counting EVENT copies (duplicates included) and events taken by
   repair, as ``bench tree`` does (:func:`pulsar.tools.bench.worker.copies_received`).

3. **Backfill** (three nodes, default timers except a 1 s DHT RPC timeout): an author, a
   relay subscriber and a subscriber. The subscriber is stopped; the author publishes
   ``history`` events (window of 128 concurrent ``publish()`` calls); the subscriber is
   started again on the same data directory and subscribes again.
   ``backfill_events_per_s``: ``history`` divided by the time from the restart call
   (``Node.start``, included: ``backfill_node_start_s``) until its subscription has yielded
   all ``history`` events (WANT/BLOCKS from its neighbours, every block verified: CID,
   signature, rights); ``backfill_first_event_s`` is when the first of them arrived. The
   short DHT timeout only keeps the author's DHT stores from waiting out the stopped
   subscriber while the backlog is published.

4. **Replay.** ``replay_local_events_per_s``: ``node.history(topic)`` over the restarted
   subscriber's delivery log (``history`` + 1 events), against ``raw_sqlite_events_per_s``,
   one SQLite query joining the log with the blocks table (no decoding), the same rows, and
   ``raw_sqlite_decode_events_per_s``, the same query plus the decode ``history()`` does
   (``EventDescriptor.from_block`` without the signature check).
   ``replay_dht_cold_events_per_s``: with the author stopped, a fresh node that never
   followed the topic calls ``subscribe(topic, replay=True)``; events per second from that
   call until the subscription has yielded the whole history.
   ``replay_from_cid_events_per_s``: then the relay, the subscriber and that fresh node are
   stopped too — every publisher and subscriber is offline, only ``HOLDERS`` nodes that
   never subscribed hold the DHT records — and another fresh node calls
   ``node.replay(topic)`` (heads records, then a walk through the DHT); events per second
   of that call. ``replay_from_cid_vs_cold`` is its ratio to the cold replay above.

5. **Soundness** (``3 + 6`` nodes): publishers A (the author), B and C publish 10 events
   each in turn; B is stopped and revoked (a new version without it); B starts again
   knowing only the old version and tries 10 publishes (``revoked_publishes_refused``),
   then pushes a back-dated event signed under the old version straight to every reader;
   A is restarted and publishes 10; C is stopped; A publishes 10 more.
   ``unauthorised_deliveries``: events a reader delivered that were not allowed (must be
   0); ``order_violations``: events a reader delivered before their parent (must be 0);
   ``soundness_missing``: allowed events some reader lacks at the end.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dag import CID, EventDescriptor
from dht import DhtConfig
from pulsar.config import NodeConfig
from pulsar.net.config import TransportConfig
from pulsar.net.faults import FaultInjector
from pulsar.node import Node, PublishError
from pulsar.proto.codec import encode_message
from pulsar.proto.core import CoreConfig
from pulsar.proto.tree.messages import Event
from pulsar.runtime.subscription import Subscription

from .worker import copies_received

WINDOW = 64
"""Concurrent ``publish()`` calls in the redundancy and backfill phases."""
LOSSY_WINDOW = 8
"""Concurrent ``publish()`` calls in the loss+crash phase (a steadier stream, so the crash
really lands mid-stream)."""
SEEDS = 3
PAYLOAD_BYTES = 256
HOLDERS = 4
"""Nodes in the backfill network that never subscribe: they hold DHT records only."""

FAST_TRANSPORT = TransportConfig(
    idle_ping=0.3,
    dead_after=1.0,
    connect_timeout=1.0,
    handshake_timeout=2.0,
    reconnect_attempts=1,
    drain_timeout=0.5,
)
FAST_DHT = DhtConfig(rpc_timeout=1.0)
FAST_CORE = CoreConfig(parent_retries=2, parent_retry_delay=0.1, root_check_interval=0.5)
TIMERS = {
    "dht_rpc_timeout_s": 1.0,
    "transport_idle_ping_s": 0.3,
    "transport_dead_after_s": 1.0,
    "parent_retries": 2,
    "parent_retry_delay_s": 0.1,
    "root_check_interval_s": 0.5,
}


def _say(message: str) -> None:
    """Progress for the person running the benchmark; stdout carries only the JSON line."""
    print(message, file=sys.stderr, flush=True)


async def bench_delivery(
    nodes: int = 30,
    events: int = 300,
    history: int = 10_000,
    seed: int = 1,
    *,
    drop_rate: float = 0.10,
    crash_fraction: float = 0.30,
    settle_timeout: float = 60.0,
    backfill_timeout: float = 120.0,
    tree_timeout: float = 20.0,
) -> dict[str, Any]:
    """Run the four phases (see the module docstring) and return their figures.

    ``tree_timeout``: how long each phase waits for its tree to settle (every subscriber
    with a parent that lists it) before publishing anyway; ``unsettled_edges`` in the
    output says how many edges were still missing in the loss+crash phase."""
    if nodes < 4:
        raise ValueError("the delivery benchmark needs at least 4 nodes")
    if events < 3 or history < 1:
        raise ValueError("the delivery benchmark needs at least 3 events and 1 history event")
    figures: dict[str, Any] = {"bench": "delivery", "nodes": nodes, "events": events}
    with tempfile.TemporaryDirectory(prefix="pulsarcast-delivery-") as tmp:
        root = Path(tmp)
        _say(f"phase 1/5: {nodes} nodes, {drop_rate:.0%} loss, {crash_fraction:.0%} crashed")
        figures.update(
            await _lossy(
                root / "lossy",
                nodes,
                events,
                seed,
                drop_rate,
                crash_fraction,
                settle_timeout,
                tree_timeout,
            )
        )
        _say(f"phase 2/5: redundancy, {nodes} nodes, no faults")
        figures.update(await _redundancy(root / "rmr", nodes, events, tree_timeout))
        _say(f"phase 3/5: backfill of {history} events")
        figures.update(await _backfill_and_replay(root / "backfill", history, backfill_timeout))
        _say("phase 5/5: revocation, author restart, offline publishers")
        figures.update(await _soundness(root / "soundness", settle_timeout))
    figures["seed"] = seed
    figures["drop_rate"] = drop_rate
    figures["crash_fraction"] = crash_fraction
    figures["timers"] = {
        "loss_crash": TIMERS,
        "rmr": "defaults",
        "backfill_replay": {"dht_rpc_timeout_s": FAST_DHT.rpc_timeout, "others": "defaults"},
    }
    return figures


# ---------------------------------------------------------------------- helpers


class _Collector:
    """Consumes one subscription: which events it yielded, and how many twice."""

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.seen: set[CID] = set()
        self.order: list[EventDescriptor] = []
        self.duplicates = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for event in self.sub:
                if event.cid in self.seen:
                    self.duplicates += 1
                self.seen.add(event.cid)
                self.order.append(event)
        except asyncio.CancelledError:
            pass

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _start_network(
    root: Path, count: int, config: Callable[[int, tuple[tuple[str, int], ...]], NodeConfig]
) -> list[Node]:
    started: list[Node] = []
    try:
        for index in range(count):
            seeds = tuple(n.address for n in started[-SEEDS:])
            started.append(await Node.start(config(index, seeds)))
            if (index + 1) % 10 == 0:
                _say(f"  started {index + 1}/{count} nodes")
        await asyncio.gather(*(n._routing.prove_known(5.0) for n in started))
    except BaseException:
        await _stop_all(started)
        raise
    return started


async def _stop_all(nodes: list[Node]) -> None:
    await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)


async def crash(node: Node) -> None:
    """End ``node`` as a SIGKILL would, inside this process: nothing handed to its core any
    more, its tasks cancelled, its transport, DHT and store closed, with no goodbye and no
    flush of what was armed (benchmarks and tests that kill a node mid-run)."""
    node._driver.halt()
    for task in list(node._driver.tasks):
        task.cancel()
    await node.transport.close()
    await node.dht.stop()
    node.store.close()


async def _settle(nodes: list[Node], topic: CID, timeout: float = 20.0,
                  subscribers: list[Node] | None = None) -> int:
    """Wait until every subscriber (default: every node but the first, the author) has a
    parent that lists it as a child (proceed with a warning after ``timeout``: repair then
    covers the rest). Returns how many tree edges were still missing (0 when the tree
    settled)."""
    deadline = time.monotonic() + timeout
    by_peer = {n.peer_id: n for n in nodes}
    while True:
        missing = 0
        for node in nodes[1:] if subscribers is None else subscribers:
            view = node.tree(topic)
            if view is None or not view.parents:
                missing += 1
                continue
            for parent in view.parents:
                pview = by_peer[parent].tree(topic) if parent in by_peer else None
                if pview is None or node.peer_id not in pview.children:
                    missing += 1
        if missing == 0:
            return 0
        if time.monotonic() > deadline:
            _say(f"  warning: tree not settled ({missing} edges missing); publishing anyway")
            return missing
        await asyncio.sleep(0.05)


async def _publish(
    author: Node,
    topic: CID,
    count: int,
    window: int,
    on_published: Callable[[int], Any] | None = None,
) -> list[CID]:
    """Publish ``count`` 256-byte events with ``window`` concurrent ``publish()`` calls;
    ``on_published(n)`` (may be a coroutine function) runs after the n-th one returned."""
    payload = b"x" * PAYLOAD_BYTES
    slots = asyncio.Semaphore(window)
    published: list[CID] = []
    hooks: list[asyncio.Task[Any]] = []

    async def one(i: int) -> None:
        try:
            tag = str(i).encode()
            event = await author.publish(topic, payload[: -len(tag)] + tag)
            published.append(event.cid)
            if on_published is not None:
                result = on_published(len(published))
                if asyncio.iscoroutine(result):
                    hooks.append(asyncio.create_task(result))
        finally:
            slots.release()

    tasks: list[asyncio.Task[None]] = []
    try:
        for i in range(count):
            await slots.acquire()
            tasks.append(asyncio.create_task(one(i)))
            if i % 1000 == 999:
                _say(f"  publishing {i + 1}/{count}")
        await asyncio.gather(*tasks)
        await asyncio.gather(*hooks)
    finally:
        for task in tasks:
            task.cancel()
    return published


# ---------------------------------------------------------------------- phase 1


async def _lossy(
    root: Path,
    count: int,
    events: int,
    seed: int,
    drop_rate: float,
    crash_fraction: float,
    settle_timeout: float,
    tree_timeout: float,
) -> dict[str, Any]:
    injectors: list[FaultInjector] = []

    def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
        faults = FaultInjector(seed=seed * 100_003 + index, drop_rate=drop_rate)
        injectors.append(faults)
        return NodeConfig(
            data_dir=root / f"n{index}",
            bootstrap=seeds,
            core=FAST_CORE,
            dht=FAST_DHT,
            transport=FAST_TRANSPORT,
            faults=faults,
        )

    nodes = await _start_network(root, count, config)
    collectors: dict[int, _Collector] = {}
    try:
        author = nodes[0]
        topic = await author.create_topic("lossy")
        for i, node in enumerate(nodes[1:], start=1):
            collectors[i] = _Collector(await node.subscribe(topic.cid))
        unsettled = await _settle(nodes, topic.cid, tree_timeout)
        rng = random.Random(seed)
        doomed = sorted(rng.sample(range(1, count), round(crash_fraction * count)))
        crash_at = events // 3

        async def maybe_crash(published: int) -> None:
            if published == crash_at:
                _say(f"  {published}/{events} published: crashing nodes {doomed}")
                await asyncio.gather(*(nodes[i].stop() for i in doomed))

        published = await _publish(author, topic.cid, events, LOSSY_WINDOW, maybe_crash)
        last_publish = time.monotonic()
        expected = set(published)
        live = [i for i in collectors if i not in doomed]

        def delivered() -> int:
            return sum(len(collectors[i].seen & expected) for i in live)

        total = len(live) * len(expected)
        full_at: float | None = None
        deadline = last_publish + settle_timeout
        reported = last_publish
        while True:
            got = delivered()
            now = time.monotonic()
            if got == total:
                full_at = now
                break
            if now > deadline:
                _say(f"  warning: {total - got} deliveries still missing after {settle_timeout} s")
                break
            if now - reported > 2.0:
                _say(f"  waiting for delivery: {got}/{total}")
                reported = now
            await asyncio.sleep(0.02)
        got = delivered()
        drops = sum(f.stats.dropped_random for f in injectors)
        live_nodes = [nodes[i] for i in live]
        return {
            "live_subscribers": len(live),
            "crashed": len(doomed),
            "unsettled_edges": unsettled,
            "eventual_delivery_ratio": round(got / total, 6),
            "time_to_full_delivery_s": (
                None if full_at is None else round(full_at - last_publish, 3)
            ),
            "duplicate_deliveries": sum(collectors[i].duplicates for i in live),
            "frames_dropped": drops,
            "repairs_backfilled": sum(n.metrics.get("backfilled", 0) for n in live_nodes),
            "repairs_grafts": sum(n.metrics.get("grafts", 0) for n in live_nodes),
        }
    finally:
        for collector in collectors.values():
            await collector.close()
        await _stop_all(nodes)


# ---------------------------------------------------------------------- phase 2


async def _redundancy(root: Path, count: int, events: int, tree_timeout: float) -> dict[str, Any]:
    def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
        return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds)

    nodes = await _start_network(root, count, config)
    collectors: list[_Collector] = []
    try:
        author = nodes[0]
        topic = await author.create_topic("steady")
        for node in nodes[1:]:
            collectors.append(_Collector(await node.subscribe(topic.cid)))
        unsettled = await _settle(nodes, topic.cid, tree_timeout)
        subscribers = nodes[1:]
        before = [copies_received(n) for n in subscribers]
        published = await _publish(author, topic.cid, events, WINDOW)
        expected = set(published)
        total = len(expected) * len(subscribers)
        deadline = time.monotonic() + 60.0
        while sum(len(c.seen & expected) for c in collectors) < total:
            if time.monotonic() > deadline:
                raise RuntimeError("redundancy phase: not every event reached every subscriber")
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # late duplicates still count
        after = [copies_received(n) for n in subscribers]
        tree = sum(a["tree"] - b["tree"] for a, b in zip(after, before, strict=True))
        repair = sum(a["repair"] - b["repair"] for a, b in zip(after, before, strict=True))
        return {
            "rmr": round((tree + repair) / total - 1, 4),
            "rmr_repaired": repair,
            "rmr_unsettled_edges": unsettled,
        }
    finally:
        for collector in collectors:
            await collector.close()
        await _stop_all(nodes)


# ---------------------------------------------------------------------- phases 3 and 4


async def _take(
    sub: Subscription, count: int, timeout: float, first: list[float] | None = None
) -> int:
    """Read ``count`` distinct events from ``sub`` (within ``timeout``); return how many
    distinct events were read (``count`` unless it timed out). ``first``, if given, gets
    the monotonic time the first event arrived."""
    seen: set[CID] = set()
    try:
        async with asyncio.timeout(timeout):
            while len(seen) < count:
                seen.add((await sub.get()).cid)
                if first is not None and not first:
                    first.append(time.monotonic())
    except TimeoutError:
        pass
    return len(seen)


def _raw_sqlite_rate(
    path: str, topic: CID, repeat: int = 3, *, decode: bool = False
) -> tuple[float, int]:
    """Events/s reading the topic's log joined with the blocks table: the best of
    ``repeat`` reads; with ``decode`` each block is also decoded and checked as
    ``history()`` does (``EventDescriptor.from_block`` without the signature check)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    best = 0.0
    rows = 0
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            result = conn.execute(
                "SELECT l.event, b.data FROM delivery_log l JOIN blocks b ON b.cid = l.event "
                "WHERE l.topic = ? ORDER BY l.seq",
                (topic.raw,),
            ).fetchall()
            if decode:
                for raw, data in result:
                    EventDescriptor.from_block(
                        bytes(data), CID.parse(bytes(raw)), verify_signature=False
                    )
            elapsed = time.perf_counter() - start
            rows = len(result)
            best = max(best, rows / elapsed)
    finally:
        conn.close()
    return best, rows


async def _replay_local(node: Node, topic: CID, repeat: int = 3) -> tuple[float, int]:
    best = 0.0
    count = 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = 0
        async for _event in node.history(topic):
            count += 1
        best = max(best, count / (time.perf_counter() - start))
    return best, count


async def _backfill_and_replay(root: Path, history: int, timeout: float) -> dict[str, Any]:
    def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
        # DHT RPC timeout 1 s: the author's DHT stores would otherwise wait out the stopped
        # subscriber (5 s) whenever its quarantine lapses, and publishing the backlog alone
        # would take minutes. It does not touch the measured backfill (WANT/BLOCKS).
        return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds, dht=FAST_DHT)

    # Three that take part, and HOLDERS that only hold DHT records: once every publisher
    # and subscriber is stopped, they are all that is left of the topic.
    nodes = await _start_network(root, 3 + HOLDERS, config)
    author, relay, reader = nodes[:3]
    holders = nodes[3:]
    extra: list[Node] = []
    try:
        topic = await author.create_topic("backlog")
        relay_sub = await relay.subscribe(topic.cid)
        reader_sub = await reader.subscribe(topic.cid)
        await _settle(nodes[:3], topic.cid)  # the holders are in no tree
        # One event everybody has, so the reader resumes from a known head.
        await author.publish(topic.cid, b"first")
        for sub in (relay_sub, reader_sub):
            if await _take(sub, 1, 30.0) != 1:
                raise RuntimeError("backfill phase: the first event did not arrive")
        await reader.stop()
        _say(f"  subscriber stopped; publishing {history} events")
        start = time.monotonic()
        await _publish(author, topic.cid, history, 2 * WINDOW)
        publish_s = time.monotonic() - start
        if await _take(relay_sub, history, timeout) != history:
            raise RuntimeError("backfill phase: the relay did not get every event")
        _say(f"  published in {publish_s:.1f} s; restarting the subscriber")
        start = time.monotonic()
        reader = await Node.start(config(2, (author.address, relay.address)))
        nodes[2] = reader
        started_s = time.monotonic() - start
        reader_sub = await reader.subscribe(topic.cid)
        first: list[float] = []
        got = await _take(reader_sub, history, timeout, first)
        backfill_s = time.monotonic() - start
        if got != history:
            raise RuntimeError(f"backfill phase: {got}/{history} events after {timeout} s")
        _say(f"  backfilled {history} events in {backfill_s:.2f} s")
        figures: dict[str, Any] = {
            "history_events": history,
            "history_publish_events_per_s": round(history / publish_s),
            "backfill_s": round(backfill_s, 3),
            "backfill_node_start_s": round(started_s, 3),
            "backfill_first_event_s": round(first[0] - start, 3),
            "backfill_events_per_s": round(history / backfill_s),
            "backfilled_from_peers": reader.metrics.get("backfilled", 0),
        }

        _say("phase 4/5: replay")
        local_rate, replayed = await _replay_local(reader, topic.cid)
        raw_rate, rows = _raw_sqlite_rate(reader.store.path, topic.cid)
        decode_rate, _ = _raw_sqlite_rate(reader.store.path, topic.cid, decode=True)
        if replayed != history + 1 or rows != replayed:
            raise RuntimeError(f"replay: {replayed} events from history(), {rows} rows raw")
        figures.update(
            {
                "replay_local_events": replayed,
                "replay_local_events_per_s": round(local_rate),
                "raw_sqlite_events_per_s": round(raw_rate),
                "replay_local_vs_raw_sqlite": round(local_rate / raw_rate, 3),
                "raw_sqlite_decode_events_per_s": round(decode_rate),
                "replay_local_vs_raw_sqlite_decode": round(local_rate / decode_rate, 3),
            }
        )

        await author.stop()
        _say("  author stopped; a fresh node replays the whole topic")
        fresh = await Node.start(
            NodeConfig(data_dir=root / "fresh", bootstrap=(relay.address, reader.address))
        )
        extra.append(fresh)
        start = time.monotonic()
        cold_sub = await fresh.subscribe(topic.cid, replay=True)
        first = []
        got = await _take(cold_sub, history + 1, timeout, first)
        cold_s = time.monotonic() - start
        if got != history + 1:
            raise RuntimeError(f"cold replay: {got}/{history + 1} events after {timeout} s")
        _say(f"  cold replay of {got} events in {cold_s:.2f} s")
        figures.update(
            {
                "replay_dht_cold_s": round(cold_s, 3),
                "replay_dht_cold_first_event_s": round(first[0] - start, 3),
                "replay_dht_cold_events_per_s": round(got / cold_s),
            }
        )
        await _stop_all([relay, reader, fresh])
        _say(f"  every publisher and subscriber stopped; replay from the CID alone "
             f"through {len(holders)} DHT holders")
        alone = await Node.start(NodeConfig(
            data_dir=root / "from-cid", bootstrap=tuple(h.address for h in holders[:SEEDS]),
            dht=FAST_DHT))
        extra.append(alone)
        start = time.monotonic()
        replayed_from_cid = [e.cid async for e in alone.replay(topic.cid)]
        from_cid_s = time.monotonic() - start
        if len(replayed_from_cid) != history + 1:
            raise RuntimeError(
                f"replay from the CID: {len(replayed_from_cid)}/{history + 1} events")
        _say(f"  replayed {len(replayed_from_cid)} events from the CID in {from_cid_s:.2f} s")
        figures.update(
            {
                "replay_from_cid_s": round(from_cid_s, 3),
                "replay_from_cid_events_per_s": round(len(replayed_from_cid) / from_cid_s),
                "replay_from_cid_vs_cold": round(
                    (len(replayed_from_cid) / from_cid_s) / (got / cold_s), 3),
            }
        )
        return figures
    finally:
        await _stop_all(nodes + extra)


# ---------------------------------------------------------------------- phase 5


def order_violations(delivered: list[EventDescriptor]) -> int:
    """Events delivered before their parent, or whose parent (an event of the history)
    never came: each breaks the causal order a subscriber was promised."""
    position = {e.cid: i for i, e in enumerate(delivered)}
    return sum(
        1
        for i, e in enumerate(delivered)
        if e.parent is not None and position.get(e.parent, len(delivered)) > i
    )


async def _soundness(root: Path, timeout: float, readers: int = 6,
                     rounds: int = 10) -> dict[str, Any]:
    """Publishers A (author), B and C; B is revoked while stopped, comes back knowing the
    old version and tries to publish (through the API, and by pushing back-dated frames
    signed under the old version straight to every reader); A restarts; C goes offline.
    ``unauthorised_deliveries``: events a reader delivered that nobody was allowed to
    publish; ``order_violations``: events a reader delivered before their parent."""

    def config(index: int, seeds: tuple[tuple[str, int], ...]) -> NodeConfig:
        return NodeConfig(data_dir=root / f"n{index}", bootstrap=seeds, dht=FAST_DHT)

    nodes = await _start_network(root, 3 + readers, config)
    author, bob, carol = nodes[:3]
    collectors: list[_Collector] = []
    try:
        topic = await author.create_topic(
            "soundness", allowed_publishers=[bob.peer_id, carol.peer_id])
        for reader in nodes[3:]:
            collectors.append(_Collector(await reader.subscribe(topic.cid)))
        # The other publishers do not subscribe: only the readers have tree edges to wait for.
        await _settle(nodes, topic.cid, subscribers=nodes[3:])
        allowed: list[CID] = []
        for i in range(rounds):
            for publisher in (author, bob, carol):
                allowed.append((await publisher.publish(topic.cid, b"before %d" % i)).cid)
        await bob.stop()
        await author.update_topic(topic.cid, allowed_publishers=[carol.peer_id])
        bob = nodes[1] = await Node.start(config(1, (author.address, carol.address)))
        refused = 0
        for i in range(rounds):
            try:
                await bob.publish(topic.cid, b"revoked %d" % i)
            except PublishError:
                refused += 1
        forged = EventDescriptor.create(bob.identity, topic.cid, b"back-dated", now=1.0)
        frame = encode_message(Event(topic.cid, forged.block, 1))
        for reader in nodes[3:]:
            await bob.transport.send(reader.peer_id, reader.address, frame)
        await author.stop()
        author = nodes[0] = await Node.start(config(0, (carol.address, nodes[3].address)))
        for i in range(rounds):
            allowed.append((await author.publish(topic.cid, b"restarted %d" % i)).cid)
        await carol.stop()
        for i in range(rounds):
            allowed.append((await author.publish(topic.cid, b"carol away %d" % i)).cid)
        expected = set(allowed)
        deadline = time.monotonic() + timeout
        while any(not expected <= c.seen for c in collectors) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        missing = sum(len(expected - c.seen) for c in collectors)
        return {
            "soundness_events": len(allowed),
            "soundness_missing": missing,
            "order_violations": sum(order_violations(c.order) for c in collectors),
            "unauthorised_deliveries": sum(len(c.seen - expected) for c in collectors),
            "revoked_publishes_refused": f"{refused}/{rounds}",
            "soundness_duplicates": sum(c.duplicates for c in collectors),
        }
    finally:
        for collector in collectors:
            await collector.close()
        await _stop_all(nodes)
