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
from collections.abc import Callable
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
    spider = NodeSpiderCrawl(protocol, Node(key), seeds, ksize, alpha)
    found: list[Node] = await spider.find()
    nodes = _merge(key, [n for n in found if n.id != protocol.source_node.id], [], ksize)
    if cache is not None:
        cache.put(key, nodes)
    return nodes


def _merge(key: bytes, first: list[Node], second: list[Node], k: int) -> list[Node]:
    target = int.from_bytes(key, "big")
    unique = {n.id: n for n in second}
    unique.update((n.id, n) for n in first)
    return sorted(unique.values(), key=lambda n: n.long_id ^ target)[:k]


async def find_value(protocol: PulsarProtocol, cid: CID, key: bytes, *, ksize: int,
                     alpha: int, stats: DhtStats,
                     on_found: Callable[[Node, bytes], object] | None = None) -> bytes:
    """Walk towards ``key`` asking FIND_VALUE until some peer returns a block that hashes to
    ``cid``. Raises :class:`BlockNotFound` once the k closest live peers have all been asked.

    ``on_found(node, block)`` is told the closest peer that answered without the value, so
    the caller can cache the verified block there (Kademlia section 2.3).
    """
    me = protocol.source_node.id
    target = int.from_bytes(key, "big")
    known: dict[bytes, Node] = {n.id: n for n in protocol.closest_nodes(key, ksize)}
    asked: set[bytes] = set()
    dead: set[bytes] = set()
    in_flight: dict[asyncio.Future[Any], Node] = {}
    nearest_without: Node | None = None
    answered = bad = 0
    keynode = Node(key)

    def next_candidates() -> list[Node]:
        live = sorted((n for i, n in known.items() if i not in dead),
                      key=lambda n: n.long_id ^ target)[:ksize]
        return [n for n in live if n.id not in asked]

    try:
        while True:
            for node in next_candidates()[: max(0, alpha - len(in_flight))]:
                asked.add(node.id)
                in_flight[asyncio.ensure_future(protocol.call_find_value(node, keynode))] = node
            if not in_flight:
                raise BlockNotFound(cid, queried=answered, bad_values=bad)
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                node = in_flight.pop(future)
                ok, data = future.result()
                if not ok:
                    dead.add(node.id)
                    continue
                answered += 1
                if isinstance(data, dict):
                    value = data["value"]
                    if cid.verifies(value):
                        if on_found is not None and nearest_without is not None:
                            on_found(nearest_without, value)
                        return value  # type: ignore[no-any-return]
                    bad += 1
                    stats.bad_values_fetched += 1
                    dead.add(node.id)  # never ask a liar again in this lookup
                    log.warning("peer %s returned a value for %s that does not match it; "
                                "ignored", node, cid)
                    continue
                if nearest_without is None or (
                    node.long_id ^ target < nearest_without.long_id ^ target
                ):
                    nearest_without = node
                for node_id, host, port in data:
                    if node_id != me and node_id not in known:
                        known[node_id] = Node(node_id, host, port)
    finally:
        for future in in_flight:
            future.cancel()
