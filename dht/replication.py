"""Pipelined replication: many keys in flight, several blocks per datagram.

The package's ``Server.set`` stores one key at a time: a full node lookup (several rounds of
FIND_NODE), then k STOREs, then the next key. A publisher behind it is limited to one
lookup-plus-store round trip per block (~150/s on 10 local nodes). Here:

* :class:`Replicator` keeps ``put_concurrency`` keys in flight at once, each finding its k
  closest nodes (usually from the :class:`~dht.lookup.NeighbourhoodCache`) and storing to
  all of them in parallel, and reports how many acknowledged.
* :class:`StoreBatcher` queues stores per destination and sends them as STORE_BATCH
  datagrams of up to 8 KiB, with a few batches in flight per destination. A peer that does
  not answer STORE_BATCH (a stock ``kademlia`` node) is retried with plain STOREs and
  remembered, so mixed networks work.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final

from kademlia.node import Node

from dag.cid import CID

from .config import DhtConfig
from .keys import MAX_RPC_SIZE
from .lookup import NeighbourhoodCache, find_closest
from .protocol import PulsarProtocol, RpcResult
from .stats import DhtStats
from .wire import MalformedDatagram, parse_store_batch

__all__ = ["PutResult", "Replicated", "Replicator", "StoreBatcher"]

log = logging.getLogger(__name__)

_BATCH_BUDGET: Final = MAX_RPC_SIZE - 64
"""Bytes of ``[key, value]`` items per STORE_BATCH, leaving room for the RPC framing."""
_ITEM_OVERHEAD: Final = 32
"""msgpack framing of one ``[20-byte key, value]`` item (27 bytes), rounded up."""
_MAX_REMEMBERED: Final = 65536
PLACEMENT_SPARES: Final = 4
"""Nodes beyond the r closest a put keeps at hand, to store at in place of a target that
does not acknowledge (the placement walk does not ask every target first)."""
MAX_UNPLACED: Final = 100_000
"""Keys of a lone node's puts remembered for pushing when it joins; beyond this, such
records wait for their hourly republish."""


@dataclass(frozen=True, slots=True)
class PutResult:
    """What became of one block: ``acks`` of the ``targets`` closest nodes stored it."""

    cid: CID
    acks: int
    targets: int


@dataclass(frozen=True, slots=True)
class Replicated:
    """Replication of one key: acknowledgements, nodes tried, and whether this node is
    itself among the k closest to the key (so it should keep holding the record)."""

    acks: int
    targets: int
    we_are_close: bool


Report = Callable[[bool], None]
"""Told once whether one queued store was acknowledged."""


class _Tally:
    """The acknowledgements of one key's stores; resolves once every target has answered,
    and ``quorum`` (if any) as soon as that many acknowledged (or all answered). A target
    that does not acknowledge is replaced by the next of ``spares`` (through ``resend``),
    so a key placed by a walk that did not hear from every target still reaches its
    replication factor when one of them is gone.

    One of these per key, instead of a future per (key, node) pair and a ``gather`` over
    them, is what keeps the publisher's per-replica bookkeeping at a few attribute updates.
    """

    __slots__ = ("acks", "future", "needed", "quorum", "resend", "spares", "waiting")

    def __init__(self, future: asyncio.Future[int], waiting: int,
                 quorum: asyncio.Future[int] | None = None, needed: int = 0,
                 spares: Sequence[Node] = (),
                 resend: Callable[[Node, _Tally], None] | None = None) -> None:
        self.future = future
        self.waiting = waiting
        self.acks = 0
        self.quorum = quorum
        self.needed = needed
        self.spares = deque(spares)
        self.resend = resend

    def __call__(self, ok: bool) -> None:
        if not ok and self.spares and self.resend is not None:
            self.resend(self.spares.popleft(), self)  # still waiting for one answer
            return
        self.acks += ok
        self.waiting -= 1
        quorum = self.quorum
        if quorum is not None and not quorum.done() and (
            self.acks >= self.needed or self.waiting == 0
        ):
            quorum.set_result(self.acks)
        if self.waiting == 0 and not self.future.done():
            self.future.set_result(self.acks)


Item = tuple[bytes, bytes, Report]


class _Destination:
    """Stores waiting for one node, and how many of its batches are unanswered."""

    __slots__ = ("flush_scheduled", "in_flight", "node", "queue")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.queue: deque[Item] = deque()
        self.in_flight = 0
        self.flush_scheduled = False


class StoreBatcher:
    """Queues ``(node, key, value)`` stores and sends them as few, full datagrams.

    Per destination at most ``max_in_flight`` batches are unanswered; what is queued
    meanwhile waits and leaves in full STORE_BATCH datagrams as answers come back (the
    idea of Nagle's algorithm and of group commit). An idle destination gets a store at the
    end of the current event-loop turn, so a lone ``put`` is not delayed, while under load
    batches fill up by themselves.

    The hot path runs on callbacks, not tasks: a STORE_BATCH is sent at flush time and its
    answer settles the items it carried. Only the rare fallback (a peer not known to answer
    STORE_BATCH, e.g. a stock ``kademlia`` node) runs as a task of plain STOREs.

    Every store queued is settled exactly once, also when the node stops: once the
    protocol is closed, what is queued or queued later is reported unacknowledged at once
    (no flush is scheduled and no task spawned any more), so whoever waits for a put —
    a caller's task, or a background replica's tally — is never left pending.
    """

    def __init__(self, protocol: PulsarProtocol, cache: NeighbourhoodCache | None = None,
                 *, max_in_flight: int = 4) -> None:
        self._protocol = protocol
        self._cache = cache
        self._max_in_flight = max_in_flight
        self._destinations: dict[bytes, _Destination] = {}
        self._batch_ok: set[bytes] = set()
        self._no_batch: set[bytes] = set()

    def store(self, node: Node, key: bytes, value: bytes) -> asyncio.Future[bool]:
        """Queue one store; the future says whether ``node`` acknowledged it."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def report(ok: bool) -> None:
            if not future.done():
                future.set_result(ok)

        self._queue(node, (key, value, report))
        return future

    def store_all(self, nodes: list[Node], key: bytes, value: bytes,
                  spares: Sequence[Node] = ()) -> asyncio.Future[int]:
        """Queue a store of one record at each of ``nodes`` (a node that does not
        acknowledge is replaced by the next of ``spares``); the future gives how many
        acknowledged."""
        return self.store_quorum(nodes, key, value, len(nodes), spares)[1]

    def store_quorum(self, nodes: list[Node], key: bytes, value: bytes, needed: int,
                     spares: Sequence[Node] = ()
                     ) -> tuple[asyncio.Future[int], asyncio.Future[int]]:
        """Like :meth:`store_all`, with a second future that resolves as soon as
        ``needed`` nodes acknowledged (or all answered): ``(quorum, all)``."""
        loop = asyncio.get_running_loop()
        everyone: asyncio.Future[int] = loop.create_future()
        quorum: asyncio.Future[int] = loop.create_future()
        if not nodes:
            everyone.set_result(0)
            quorum.set_result(0)
            return quorum, everyone
        def resend(node: Node, tally: _Tally) -> None:
            self._queue(node, (key, value, tally))

        tally = _Tally(everyone, len(nodes), quorum, max(1, needed), spares, resend)
        for node in nodes:
            self._queue(node, (key, value, tally))
        return quorum, everyone

    def _queue(self, node: Node, item: Item) -> None:
        if self._protocol.closed:
            item[2](False)  # the node is stopping: nothing more goes out
            return
        dest = self._destinations.get(node.id)
        if dest is None:
            dest = self._destinations[node.id] = _Destination(node)
        dest.queue.append(item)
        self._schedule(dest)

    def _schedule(self, dest: _Destination) -> None:
        if self._protocol.closed:
            self._fail_queued(dest)
            return
        if not dest.flush_scheduled and dest.in_flight < self._max_in_flight:
            dest.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, dest)

    def _flush(self, dest: _Destination) -> None:
        dest.flush_scheduled = False
        if self._protocol.closed:
            self._fail_queued(dest)
            return
        queue = dest.queue
        while queue and dest.in_flight < self._max_in_flight:
            batch = [queue.popleft()]
            size = len(batch[0][1]) + _ITEM_OVERHEAD
            while queue and size + len(queue[0][1]) + _ITEM_OVERHEAD <= _BATCH_BUDGET:
                size += len(queue[0][1]) + _ITEM_OVERHEAD
                batch.append(queue.popleft())
            dest.in_flight += 1
            self._send(dest, batch)

    def _send(self, dest: _Destination, batch: list[Item]) -> None:
        protocol, node = self._protocol, dest.node
        known = node.id in self._batch_ok
        if node.id in self._no_batch or (len(batch) == 1 and not known):
            if protocol.spawn(self._send_singly(dest, batch)) is None:
                self._settle(dest, batch, None)  # the node is stopping
            return
        try:
            answer = protocol.store_batch((node.ip, node.port), protocol.source_node.id,
                                          [(key, value) for key, value, _ in batch])
        except Exception:  # pragma: no cover - e.g. the socket is gone
            log.exception("could not send STORE_BATCH to %s", node)
            self._settle(dest, batch, None)
            return
        answer.add_done_callback(partial(self._batch_answered, dest, batch))

    def _batch_answered(self, dest: _Destination, batch: list[Item],
                        answer: asyncio.Future[RpcResult]) -> None:
        protocol, node = self._protocol, dest.node
        ok, data = (False, None) if answer.cancelled() else answer.result()
        if ok:
            try:
                flags = parse_store_batch(data, len(batch))
            except MalformedDatagram:
                log.debug("garbled STORE_BATCH answer from %s", node)
                self._settle(dest, batch, None)
                return
            _remember(self._batch_ok, node.id)
            protocol.handle_call_response((True, data), node)
            self._settle(dest, batch, flags)
        elif node.id in self._batch_ok or protocol.closed:
            # It knew STORE_BATCH and went silent: count it gone, and do not make what is
            # queued for it wait for a timeout each.
            protocol.handle_call_response((False, None), node)
            queued = list(dest.queue)
            dest.queue.clear()
            self._settle(dest, batch + queued, None)
        elif protocol.spawn(self._send_singly(dest, batch)) is None:
            # silent: dead, or a stock node that ignores STORE_BATCH; plain STOREs would
            # tell, but the node is stopping
            self._settle(dest, batch, None)

    async def _send_singly(self, dest: _Destination, batch: list[Item]) -> None:
        protocol, node = self._protocol, dest.node
        try:
            results = await asyncio.gather(*(protocol.call_store(node, key, value)
                                              for key, value, _ in batch))
        except BaseException:
            self._settle(dest, batch, None)
            raise
        flags = [bool(ok and answer) for ok, answer in results]
        if len(batch) > 1 and any(ok for ok, _ in results):
            _remember(self._no_batch, node.id)  # answers STORE but not STORE_BATCH: stock
            log.info("%s does not speak STORE_BATCH; using plain STOREs", node)
        self._settle(dest, batch, flags)

    def _settle(self, dest: _Destination, batch: list[Item], flags: list[bool] | None
                ) -> None:
        dest.in_flight -= 1
        if flags is None:
            flags = [False] * len(batch)
        if not any(flags) and self._cache is not None:
            self._cache.forget_node(dest.node.id)
        for (_, _, report), flag in zip(batch, flags, strict=True):
            report(flag)
        if dest.queue:
            self._schedule(dest)
        elif dest.in_flight == 0 and self._destinations.get(dest.node.id) is dest:
            del self._destinations[dest.node.id]

    def _fail_queued(self, dest: _Destination) -> None:
        """Report everything queued for ``dest`` unacknowledged (the node is stopping)."""
        while dest.queue:
            _, _, report = dest.queue.popleft()
            report(False)  # may queue a spare elsewhere, which fails at once too
        if dest.in_flight == 0 and self._destinations.get(dest.node.id) is dest:
            del self._destinations[dest.node.id]

    def close(self) -> None:
        """The protocol is closed: settle every store still queued as unacknowledged.
        (Batches in flight were answered "no answer" by the protocol's close.)"""
        for dest in list(self._destinations.values()):
            self._fail_queued(dest)


def _remember(bounded: set[bytes], node_id: bytes) -> None:
    if len(bounded) >= _MAX_REMEMBERED:
        bounded.clear()
    bounded.add(node_id)


class Replicator:
    """Stores records at the k closest nodes of their keys, many keys at once."""

    def __init__(self, protocol: PulsarProtocol, config: DhtConfig, stats: DhtStats,
                 cache: NeighbourhoodCache) -> None:
        self._protocol = protocol
        self._config = config
        self._stats = stats
        self._cache = cache
        self.batcher = StoreBatcher(protocol, cache)
        self.unplaced: dict[bytes, None] = {}
        """Keys put while no other node was reachable, oldest first (bounded)."""

    async def replicate(self, key: bytes, value: bytes, quorum: int | None = None
                        ) -> Replicated:
        """Store at the ``replication`` closest nodes, found by a lookup that converges on
        exactly that many live nodes: a Kademlia crawl ends by querying every one of the
        closest ``ksize`` it has seen, so converging on k = 20 to store at 8 queried ~2.5x
        the nodes, and FIND_NODE answers were the largest share of the DHT's bytes (12 of
        23 MiB in the 100-node baseline). With ``quorum``, return as soon as that many
        acknowledged (Kafka's ``acks``): the other stores go on in the background, counted
        in ``stats.background_acks`` / ``background_stores``."""
        if self._protocol.closed:  # the node is stopping: the record stays local
            return Replicated(0, 0, True)
        targets, spares = await self.placement(key)
        self._note_placement(key, bool(targets))
        if quorum is None:
            acks = await self.batcher.store_all(targets, key, value, spares)
            return Replicated(acks, len(targets), self._we_are_close(key, targets))
        early, everyone = self.batcher.store_quorum(targets, key, value, quorum, spares)
        acks = await early
        if not everyone.done():
            self._stats.background_stores += 1
            everyone.add_done_callback(self._count_background(acks))
        return Replicated(acks, len(targets), self._we_are_close(key, targets))

    async def placement(self, key: bytes) -> tuple[list[Node], list[Node]]:
        """Where ``key`` is stored: its ``replication`` closest live nodes (never this
        one), and up to ``PLACEMENT_SPARES`` next ones to stand in for a target that does
        not acknowledge. Served by the neighbourhood cache when a recent walk covered
        the key."""
        config = self._config
        found = await find_closest(self._protocol, key, ksize=config.replication,
                                   alpha=config.alpha, spares=PLACEMENT_SPARES,
                                   stats=self._stats, cache=self._cache)
        return found[: config.replication], found[config.replication:]

    def _note_placement(self, key: bytes, placed: bool) -> None:
        """Remember keys put while no other node was known (a lone node's puts): they are
        the records a node must push when it joins a network (``Maintainer.joined``)."""
        if placed:
            self.unplaced.pop(key, None)
        elif len(self.unplaced) < MAX_UNPLACED:
            self.unplaced[key] = None

    def close(self) -> None:
        """Settle the stores still queued (see :meth:`StoreBatcher.close`)."""
        self.batcher.close()

    def _count_background(self, early: int) -> Callable[[asyncio.Future[int]], None]:
        def done(everyone: asyncio.Future[int]) -> None:
            if not everyone.cancelled():
                self._stats.background_acks += everyone.result() - early
        return done

    async def replicate_many(self, items: Sequence[tuple[bytes, bytes]],
                             quorum: int | None = None) -> list[Replicated]:
        """Replicate every item with at most ``put_concurrency`` keys in flight; results
        in input order."""
        results: list[Replicated | None] = [None] * len(items)
        position = iter(range(len(items)))

        async def worker() -> None:
            for i in position:
                results[i] = await self.replicate(*items[i], quorum=quorum)

        workers = min(self._config.put_concurrency, len(items))
        await asyncio.gather(*(worker() for _ in range(workers)))
        return [r for r in results if r is not None]

    def _we_are_close(self, key: bytes, targets: list[Node]) -> bool:
        if len(targets) < self._config.replication:
            return True
        target = int.from_bytes(key, "big")
        return bool(self._protocol.source_node.long_id ^ target
                    < max(n.long_id ^ target for n in targets))
