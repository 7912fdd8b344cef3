"""Network lookups: the k closest nodes to a key, and a value that provably belongs to a CID.

**Value lookup.** The package's ``ValueSpiderCrawl`` stops at the first round that returns
any value and hands back the *most common* one, so one lying peer in that round decides what
``get`` returns (and the package then stores the lie at another node). :func:`find_value`
checks every value against the CID as it arrives, ignores a bad one and the peer that sent
it, and keeps asking other holders until one returns a block that verifies or no closer
peer is left. It also keeps ``alpha`` queries in flight continuously instead of waiting for
the slowest peer of each round, so one dead peer costs one timeout, not one per round.

**Node lookup** is the package's ``NodeSpiderCrawl``; :class:`NeighbourhoodCache` lets one
lookup serve the stores of many keys, which is what makes pipelined puts cheap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from kademlia.crawling import NodeSpiderCrawl
from kademlia.node import Node

from dag.cid import CID

from .errors import BlockNotFound
from .keys import KEY_SIZE
from .protocol import PulsarProtocol
from .stats import DhtStats

__all__ = ["NeighbourhoodCache", "find_closest", "find_value"]

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
                       stats: DhtStats, cache: NeighbourhoodCache | None = None
                       ) -> list[Node]:
    """The ``ksize`` nodes closest to ``key`` (never ourselves), nearest first."""
    if cache is not None:
        cached = cache.get(key)
        if cached is not None:
            return _merge(key, cached, protocol.closest_nodes(key, ksize), ksize)
    seeds = protocol.closest_nodes(key, ksize)
    if not seeds:
        return []
    stats.lookups += 1
    spider = _NearCrawl(protocol, Node(key), seeds, ksize, alpha)
    found: list[Node] = await spider.find()
    nodes = _merge(key, [n for n in found if n.id != protocol.source_node.id], [], ksize)
    if cache is not None:
        cache.put(key, nodes)
    return nodes


class _NearCrawl(NodeSpiderCrawl):  # type: ignore[misc]
    """The package's node crawl, asking each peer for only the ``ksize`` closest it knows
    (FIND_NEAR where the peer is ours): the crawl keeps no more than that anyway."""

    async def find(self) -> list[Node]:
        protocol: PulsarProtocol = self.protocol
        ksize: int = self.ksize

        async def ask(peer: Node, node: Node) -> Any:
            return await protocol.call_find_near(peer, node, ksize)

        found: list[Node] = await self._find(ask)
        return found


def _merge(key: bytes, first: list[Node], second: list[Node], k: int) -> list[Node]:
    target = int.from_bytes(key, "big")
    unique = {n.id: n for n in second}
    unique.update((n.id, n) for n in first)
    return sorted(unique.values(), key=lambda n: n.long_id ^ target)[:k]


class ValueLookup:
    """A FIND_VALUE walk toward ``key``, as Kademlia runs it: the ``ksize`` closest live
    nodes are asked, ``alpha`` at a time, learning closer nodes from the answers without
    the value; :meth:`values` yields each answer that carries one. What a value is worth
    is the caller's to judge (a block must hash to its CID, a heads record must verify and
    be the newest); :meth:`distrust` keeps a liar from being asked again. With ``count``,
    each miss is answered with that many contacts (FIND_VALUE_NEAR), not the peer's k."""

    def __init__(self, protocol: PulsarProtocol, key: bytes, *, ksize: int, alpha: int,
                 count: int | None = None) -> None:
        self._protocol = protocol
        self._key = key
        self._ksize = ksize
        self._count = count
        self._alpha = alpha
        self._target = int.from_bytes(key, "big")
        self._known: dict[bytes, Node] = {n.id: n for n in protocol.closest_nodes(key, ksize)}
        self._asked: set[bytes] = set()
        self._dead: set[bytes] = set()
        self.answered = 0
        self.nearest_without: Node | None = None
        """The closest node that answered without the value (where to cache it)."""

    def distrust(self, node: Node) -> None:
        self._dead.add(node.id)

    def _candidates(self) -> list[Node]:
        live = sorted((n for i, n in self._known.items() if i not in self._dead),
                      key=lambda n: n.long_id ^ self._target)[: self._ksize]
        return [n for n in live if n.id not in self._asked]

    async def values(self) -> AsyncGenerator[tuple[Node, object], None]:
        """``(node, value)`` for each answer carrying a value, until every one of the
        ``ksize`` closest live nodes has been asked. Use with ``contextlib.aclosing`` so
        queries still in flight are cancelled when the caller stops early."""
        me = self._protocol.source_node.id
        keynode = Node(self._key)
        in_flight: dict[asyncio.Future[Any], Node] = {}
        try:
            while True:
                for node in self._candidates()[: max(0, self._alpha - len(in_flight))]:
                    self._asked.add(node.id)
                    query = self._protocol.call_find_value(node, keynode, self._count)
                    in_flight[asyncio.ensure_future(query)] = node
                if not in_flight:
                    return
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    node = in_flight.pop(future)
                    ok, data = future.result()
                    if not ok:
                        self._dead.add(node.id)
                        continue
                    self.answered += 1
                    if isinstance(data, dict):
                        yield node, data["value"]
                        continue
                    nearest = self.nearest_without
                    target = self._target
                    if nearest is None or node.long_id ^ target < nearest.long_id ^ target:
                        self.nearest_without = node
                    for node_id, host, port in data:
                        if node_id != me and node_id not in self._known:
                            self._known[node_id] = Node(node_id, host, port)
        finally:
            for future in in_flight:
                future.cancel()


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
