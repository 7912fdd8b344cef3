"""Network lookups: the k closest nodes to a key, and a value that provably belongs to a CID.

Both are one walk (:class:`_Walk`): the ``ksize`` closest live nodes known are asked,
``alpha`` at a time, and every answer may name closer ones. Unlike the package's crawls,
which ask ``alpha`` nodes per round and wait for the slowest of them, the walk keeps
``alpha`` queries in flight continuously, and a query unanswered after ``stall_after``
(:attr:`dht.config.DhtConfig.stall_after`) stops holding the walk up: it no longer counts
toward ``alpha``, the next closest node is asked in its place, and the walk may end without
it (its answer still counts if it comes while the walk runs). So a dead node that others
still list costs a lookup ``stall_after`` once, not ``rpc_timeout`` (5 s) per round: a
fresh node bootstrapping through peers that still listed a node stopped a moment before
took 5 s to start, and a placement lookup that met a dead node never asked FIND_NEAR
waited for two timeouts.

**Value lookup.** The package's ``ValueSpiderCrawl`` stops at the first round that returns
any value and hands back the *most common* one, so one lying peer in that round decides what
``get`` returns (and the package then stores the lie at another node). :func:`find_value`
checks every value against the CID as it arrives, ignores a bad one and the peer that sent
it, and keeps asking other holders until one returns a block that verifies or no closer
peer is left.

**Node lookup** (:func:`find_closest`, and a node's bootstrap): the ``ksize`` closest nodes
that answered. :class:`NeighbourhoodCache` lets one lookup serve the stores of many keys,
which is what makes pipelined puts cheap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from contextlib import aclosing
from typing import Any

from kademlia.node import Node

from dag.cid import CID

from .errors import BlockNotFound
from .keys import KEY_SIZE
from .protocol import PulsarProtocol
from .stats import DhtStats

__all__ = [
    "NeighbourhoodCache",
    "NodeLookup",
    "PlacementLookup",
    "ValueLookup",
    "crawl",
    "find_closest",
    "find_value",
]

log = logging.getLogger(__name__)

_BITS = KEY_SIZE * 8


class NeighbourhoodCache:
    """Remembers recent node lookups so keys in the same neighbourhood share one.

    A lookup for key K returns the k nodes closest to K; the k-th of them is at XOR distance
    ``d``. Every key sharing K's first ``p`` bits lies in a region of width ``2**(160-p)``
    around K; choosing ``p`` so that this width is at most ``d/2`` keeps the region well
    inside the ball the lookup already explored, so for another key K' in the region the
    closest k among (that lookup's nodes + our routing table) are, with rare exceptions at
    the ball's edge, the closest k in the network. In a network of N nodes that is about
    ``2N/k`` regions; a network smaller than k (the lookup found fewer than k nodes) is one
    region. A burst of puts therefore pays for a handful of lookups, not one per key.

    Entries expire after ``ttl`` seconds and are dropped as soon as one of their nodes fails
    to answer a store, so churn is picked up by a fresh lookup. Republishing (hourly) runs
    with the same cache; gets never use it (they always walk the network).
    """

    def __init__(self, ttl: float, ksize: int, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._ttl = ttl
        self._ksize = ksize
        self._clock = clock
        self._regions: dict[tuple[int, int], tuple[list[Node], float]] = {}
        self._prefix_lengths: set[int] = set()

    def get(self, key: bytes) -> list[Node] | None:
        if self._ttl <= 0:
            return None
        target = int.from_bytes(key, "big")
        now = self._clock()
        for p in sorted(self._prefix_lengths):
            entry = self._regions.get((p, target >> (_BITS - p)))
            if entry is not None:
                if entry[1] > now:
                    return entry[0]
                del self._regions[(p, target >> (_BITS - p))]
        return None

    def put(self, key: bytes, nodes: list[Node]) -> None:
        if self._ttl <= 0 or not nodes:
            return
        target = int.from_bytes(key, "big")
        if len(nodes) < self._ksize:
            p = 0  # fewer than k nodes in reach: every key's closest set is all of them
        else:
            kth = max(n.long_id ^ target for n in nodes)
            p = min(_BITS, max(0, _BITS + 2 - kth.bit_length()))
        self._prefix_lengths.add(p)
        self._regions[(p, target >> (_BITS - p))] = (list(nodes), self._clock() + self._ttl)

    def forget_node(self, node_id: bytes) -> None:
        """Drop every cached neighbourhood that includes ``node_id`` (it failed to answer)."""
        stale = [k for k, (nodes, _) in self._regions.items()
                 if any(n.id == node_id for n in nodes)]
        for k in stale:
            del self._regions[k]

    def clear(self) -> None:
        self._regions.clear()
        self._prefix_lengths.clear()


async def find_closest(protocol: PulsarProtocol, key: bytes, *, ksize: int, alpha: int,
                       stats: DhtStats, cache: NeighbourhoodCache | None = None,
                       spares: int | None = None) -> list[Node]:
    """The ``ksize`` nodes closest to ``key`` (never ourselves), nearest first, served from
    ``cache`` when a recent walk covered the key.

    With ``spares``, where to *store* the key: the walk is a :class:`PlacementLookup`
    (it ends once the nearest answered; the STOREs prove the rest alive), and up to
    ``spares`` next nodes follow the ``ksize``, to replace targets that do not
    acknowledge. Without, a :class:`NodeLookup`: every node returned answered."""
    wanted = ksize + (spares or 0)
    if cache is not None:
        cached = cache.get(key)
        if cached is not None:
            return _merge(key, cached, protocol.closest_nodes(key, wanted), wanted)
    seeds = protocol.closest_nodes(key, ksize)
    if not seeds:
        return []
    stats.lookups += 1

    def ask(peer: Node, target: Node) -> Awaitable[Any]:
        # FIND_NEAR: only the ``ksize`` closest the peer knows; the walk keeps no more.
        return protocol.call_find_near(peer, target, ksize)

    if spares is None:
        nodes = await NodeLookup(protocol, key, ksize=ksize, alpha=alpha, seeds=seeds).run(ask)
    else:
        nodes = await PlacementLookup(protocol, key, ksize=ksize, alpha=alpha, confirm=alpha,
                                      spares=spares, seeds=seeds).run(ask)
    if cache is not None:
        cache.put(key, nodes[:ksize])
    return nodes


async def crawl(protocol: PulsarProtocol, key: bytes, *, ksize: int, alpha: int,
                seeds: Iterable[Node]) -> list[Node]:
    """A FIND_NODE walk from ``seeds``: every answer names the peer's k closest contacts,
    which is what a routing table is filled from (a bootstrap, a bucket refresh)."""
    walk = NodeLookup(protocol, key, ksize=ksize, alpha=alpha, seeds=seeds)
    return await walk.run(protocol.call_find_node)


def _merge(key: bytes, first: list[Node], second: list[Node], k: int) -> list[Node]:
    target = int.from_bytes(key, "big")
    unique = {n.id: n for n in second}
    unique.update((n.id, n) for n in first)
    return sorted(unique.values(), key=lambda n: n.long_id ^ target)[:k]


Query = Callable[[Node, Node], Awaitable[Any]]
"""``(peer to ask, target) -> (ok, answer)``: one of the protocol's ``call_find_*``."""


class _Walk:
    """Asks the ``ksize`` closest live nodes known for ``key``, ``alpha`` at a time,
    learning closer nodes from the answers (see the module docstring for stalls).
    :meth:`answers` yields ``(node, answer)`` for every node that answered."""

    def __init__(self, protocol: PulsarProtocol, key: bytes, *, ksize: int, alpha: int,
                 seeds: Iterable[Node] | None = None) -> None:
        self._protocol = protocol
        self._key = key
        self._ksize = ksize
        self._alpha = alpha
        self._stall_after = protocol.config.stall_after
        self._target = int.from_bytes(key, "big")
        if seeds is None:
            seeds = protocol.closest_nodes(key, ksize)
        me = protocol.source_node.id
        self._known: dict[bytes, Node] = {n.id: n for n in seeds if n.id != me}
        self._asked: set[bytes] = set()
        self._dead: set[bytes] = set()
        self._stalled: set[bytes] = set()
        self._ever_stalled: set[bytes] = set()
        self._answered: set[bytes] = set()
        self.answered = 0

    def distrust(self, node: Node) -> None:
        self._dead.add(node.id)

    def _candidates(self) -> list[Node]:
        """The closest ``ksize`` known nodes, leaving out the dead and the stalled (so the
        next closest takes a stalled node's place), that were not asked yet."""
        out = self._dead | self._stalled
        live = sorted((n for i, n in self._known.items() if i not in out),
                      key=lambda n: n.long_id ^ self._target)[: self._ksize]
        return [n for n in live if n.id not in self._asked]

    def _enough(self) -> bool:
        """Whether the walk may end before every one of the closest ``ksize`` answered
        (never, for a full Kademlia walk)."""
        return False

    def learn(self, contacts: Iterable[tuple[bytes, str, int]]) -> None:
        me = self._protocol.source_node.id
        for node_id, host, port in contacts:
            if node_id != me and node_id not in self._known:
                self._known[node_id] = Node(node_id, host, port)

    async def answers(self, query: Query) -> AsyncGenerator[tuple[Node, Any], None]:
        """Use with ``contextlib.aclosing`` so queries still in flight are cancelled when
        the caller stops early.

        A query is stalled once it has waited ``stall_after``, or three times the slowest
        answer of this walk if that is longer (on a slow network every answer is slow, and
        that is no sign of a dead node). The walk never ends before some node answered."""
        keynode = Node(self._key)
        in_flight: dict[asyncio.Task[Any], tuple[Node, float]] = {}
        loop = asyncio.get_running_loop()
        slowest = 0.0
        try:
            while True:
                now = loop.time()
                if self.answered and self._enough():
                    return
                threshold = max(self._stall_after, 3 * slowest)
                self._stalled.clear()
                active = 0
                wake: float | None = None
                for node, started in in_flight.values():
                    if self._stall_after > 0 and now - started >= threshold:
                        self._stalled.add(node.id)
                        if node.id not in self._ever_stalled:
                            self._ever_stalled.add(node.id)
                            self._protocol.stats.lookup_stalls += 1
                        continue
                    active += 1
                    if self._stall_after > 0:
                        due = started + threshold - now
                        wake = due if wake is None else min(wake, due)
                for node in self._candidates()[: max(0, self._alpha - active)]:
                    self._asked.add(node.id)
                    task = self._protocol.spawn(_awaited(query, node, keynode))
                    if task is None:  # the protocol is closing
                        return
                    in_flight[task] = (node, now)
                    active += 1
                    if self._stall_after > 0:
                        wake = threshold if wake is None else min(wake, threshold)
                if active == 0 and (self.answered or not in_flight):
                    return  # nothing left to ask; only stalled queries, if any, are out
                done, _ = await asyncio.wait(in_flight, timeout=wake,
                                             return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    node, started = in_flight.pop(future)
                    # A query cancelled under us (the node is stopping) is no answer; its
                    # CancelledError is not ours to raise: this walk was not cancelled.
                    ok, data = (False, None) if future.cancelled() else future.result()
                    if not ok:
                        self._dead.add(node.id)
                        continue
                    slowest = max(slowest, loop.time() - started)
                    self.answered += 1
                    self._answered.add(node.id)
                    yield node, data
        finally:
            # A stalled query is left to finish: its silence (or late answer) is what
            # counts against a dead contact (a miss: ``contact_failures`` in a row take it
            # out of the routing table). The others are not needed.
            for future, (node, _started) in in_flight.items():
                if node.id not in self._stalled:
                    future.cancel()

    @property
    def stalls(self) -> int:
        """How many nodes' queries stalled during the walk."""
        return len(self._ever_stalled)


async def _awaited(query: Query, node: Node, target: Node) -> Any:
    # The query's coroutine is made inside the task: a task refused by a closing protocol
    # leaves no coroutine behind that was never awaited.
    return await query(node, target)


class NodeLookup(_Walk):
    """The ``ksize`` nodes closest to the key among those that answered."""

    async def run(self, query: Query) -> list[Node]:
        found: dict[bytes, Node] = {}
        async with aclosing(self.answers(query)) as answers:
            async for node, contacts in answers:
                found[node.id] = node
                self.learn(contacts)
        return sorted(found.values(), key=lambda n: n.long_id ^ self._target)[: self._ksize]


class PlacementLookup(_Walk):
    """Where to store a key: the ``ksize`` closest nodes known once the ``confirm``
    closest of them have answered, plus up to ``spares`` next ones.

    A node lookup ends only when every one of the ``ksize`` closest has answered, because
    its caller wants live nodes. A put does not need that proof: the STORE that follows
    is itself the round trip that shows a target is alive, and a target that does not
    acknowledge is replaced by the next spare (:class:`dht.replication.StoreBatcher`). So
    the walk stops as soon as the nodes nearest the key — the ones that know its
    neighbourhood best, and whose answers name the rest — have answered without naming
    anyone closer. In the 100-node testbed a put's walk asked ~7.5 nodes, most of them
    only to hear again the contacts it already had."""

    def __init__(self, protocol: PulsarProtocol, key: bytes, *, ksize: int, alpha: int,
                 confirm: int, spares: int, seeds: Iterable[Node] | None = None) -> None:
        super().__init__(protocol, key, ksize=ksize, alpha=alpha, seeds=seeds)
        self._confirm = max(1, confirm)
        self._spares = max(0, spares)

    def _live(self) -> list[Node]:
        """Known nodes nearest first, without the dead and without those whose query
        stalled and never answered (they are most likely gone)."""
        out = self._dead | (self._ever_stalled - self._answered)
        return sorted((n for i, n in self._known.items() if i not in out),
                      key=lambda n: n.long_id ^ self._target)

    def _enough(self) -> bool:
        head = self._live()[: self._confirm]
        return all(n.id in self._answered for n in head)

    async def run(self, query: Query) -> list[Node]:
        async with aclosing(self.answers(query)) as answers:
            async for _node, contacts in answers:
                self.learn(contacts)
        if not self.answered:
            return []
        return self._live()[: self._ksize + self._spares]


class ValueLookup(_Walk):
    """A FIND_VALUE walk toward ``key``, as Kademlia runs it, learning closer nodes from
    the answers without the value; :meth:`values` yields each answer that carries one. What
    a value is worth is the caller's to judge (a block must hash to its CID, a heads record
    must verify and be the newest); :meth:`distrust` keeps a liar from being asked again.
    With ``count``, each miss is answered with that many contacts (FIND_VALUE_NEAR), not
    the peer's k."""

    def __init__(self, protocol: PulsarProtocol, key: bytes, *, ksize: int, alpha: int,
                 count: int | None = None) -> None:
        super().__init__(protocol, key, ksize=ksize, alpha=alpha)
        self._count = count
        self.nearest_without: Node | None = None
        """The closest node that answered without the value (where to cache it)."""

    async def values(self) -> AsyncGenerator[tuple[Node, object], None]:
        """``(node, value)`` for each answer carrying a value, until every one of the
        ``ksize`` closest live nodes has been asked. Use with ``contextlib.aclosing``."""
        protocol, count, target = self._protocol, self._count, self._target

        def ask(peer: Node, keynode: Node) -> Awaitable[Any]:
            return protocol.call_find_value(peer, keynode, count)

        async with aclosing(self.answers(ask)) as answers:
            async for node, data in answers:
                if isinstance(data, dict):
                    yield node, data["value"]
                    continue
                nearest = self.nearest_without
                if nearest is None or node.long_id ^ target < nearest.long_id ^ target:
                    self.nearest_without = node
                self.learn(data)


async def find_value(protocol: PulsarProtocol, cid: CID, key: bytes, *, ksize: int,
                     alpha: int, stats: DhtStats, count: int | None = None,
                     on_found: Callable[[Node, bytes], object] | None = None) -> bytes:
    """Walk towards ``key`` asking FIND_VALUE until some peer returns a block that hashes to
    ``cid``. Raises :class:`BlockNotFound` once the k closest live peers have all been asked.

    ``on_found(node, block)`` is told the closest peer that answered without the value, so
    the caller can cache the verified block there (Kademlia section 2.3).
    """
    walk = ValueLookup(protocol, key, ksize=ksize, alpha=alpha, count=count)
    bad = 0
    async with aclosing(walk.values()) as answers:
        async for node, value in answers:
            if isinstance(value, bytes) and cid.verifies(value):
                if on_found is not None and walk.nearest_without is not None:
                    on_found(walk.nearest_without, value)
                return value
            bad += 1
            stats.bad_values_fetched += 1
            walk.distrust(node)  # never ask a liar again in this lookup
            log.warning("peer %s returned a value for %s that does not match it; ignored",
                        node, cid)
    raise BlockNotFound(cid, queried=walk.answered, bad_values=bad)
