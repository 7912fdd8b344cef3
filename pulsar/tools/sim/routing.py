"""Kademlia routing tables for the simulator, built in O(n log n).

A node's Kademlia table holds, per bucket (per length of the id prefix it shares with the
node), up to ``k`` of the peers in that bucket. With every id in one sorted list, the peers
of one bucket are one contiguous slice of it (they share a prefix with us and differ in the
next bit), so a bucket is two bisections and a sample: no node ever compares itself with
every other one, which at 10,000 nodes would be 10^8 XORs and gigabytes of tables.

The same sorted list answers "the ``count`` live nodes closest to a key" (the DHT's
replica set) the same way: the smallest aligned subtree around the key that still holds
``count`` nodes contains them all, because XOR distance orders whole subtrees.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from dag import PeerId

__all__ = ["IdSpace", "KnownPeers"]

ID_BITS = 160  # sha1 Kademlia ids (PeerId.kademlia_id, dht.keys.dht_key)


def node_id(peer: PeerId) -> int:
    return int.from_bytes(peer.kademlia_id(), "big")


class IdSpace:
    """Every node's Kademlia id, sorted: bucket slices and closest-node queries."""

    def __init__(self, peers: Iterable[PeerId]) -> None:
        pairs = sorted((node_id(p), p) for p in peers)
        self.ids = [i for i, _ in pairs]
        self.peers = [p for _, p in pairs]
        self.id_of = {p: i for i, p in pairs}

    def _slice(self, lo: int, hi: int) -> tuple[int, int]:
        return bisect_left(self.ids, lo), bisect_left(self.ids, hi)

    def buckets(self, peer: PeerId) -> list[tuple[int, int]]:
        """The index ranges (into the sorted peers) of ``peer``'s non-empty buckets,
        farthest first."""
        me = self.id_of[peer]
        out: list[tuple[int, int]] = []
        for bit in range(ID_BITS, 0, -1):
            # Peers that share our top ID_BITS - bit bits and differ in the next one.
            half = 1 << (bit - 1)
            lo = ((me >> (bit - 1)) ^ 1) << (bit - 1)
            start, end = self._slice(lo, lo + half)
            if end > start:
                out.append((start, end))
            own_lo = (me >> (bit - 1)) << (bit - 1)
            own_start, own_end = self._slice(own_lo, own_lo + half)
            if own_end - own_start <= 1:  # we are alone in our half: no nearer bucket
                break
        return out

    def table(self, peer: PeerId, k: int, rng: random.Random) -> list[PeerId]:
        """A Kademlia table for ``peer``: up to ``k`` random peers of each bucket."""
        known: list[PeerId] = []
        for start, end in self.buckets(peer):
            count = end - start
            picks = range(start, end) if count <= k else rng.sample(range(start, end), k)
            known += [self.peers[i] for i in picks]
        return known

    def bucket_of(self, peer: PeerId, other: PeerId) -> tuple[int, int]:
        """The index range of the bucket of ``peer``'s table that ``other`` falls in."""
        me, them = self.id_of[peer], self.id_of[other]
        bit = (me ^ them).bit_length()
        lo = (them >> (bit - 1)) << (bit - 1)
        return self._slice(lo, lo + (1 << (bit - 1)))

    def closest(self, key: int, count: int, usable: Callable[[PeerId], bool]) -> list[PeerId]:
        """The ``count`` usable nodes closest to ``key`` by XOR, nearest first."""
        bit = 0
        while True:
            lo = (key >> bit) << bit
            start, end = self._slice(lo, lo + (1 << bit))
            found = [self.peers[i] for i in range(start, end) if usable(self.peers[i])]
            if len(found) >= count or bit >= ID_BITS:
                found.sort(key=lambda p: self.id_of[p] ^ key)
                return found[:count]
            # Widen by doubling the subtree until it holds enough usable nodes.
            bit = min(ID_BITS, bit + max(1, (count - len(found)).bit_length()))


class KnownPeers:
    """One node's routing table, as the core's ``Routing`` sees it."""

    def __init__(self, peers: Iterable[PeerId]) -> None:
        self.peers = list(peers)
        self._ids = {p: node_id(p) for p in self.peers}

    def closest_peers(self, key: bytes, count: int) -> Sequence[PeerId]:
        target = int.from_bytes(key, "big")
        return sorted(self.peers, key=lambda p: self._ids[p] ^ target)[:count]

    def __contains__(self, peer: PeerId) -> bool:
        return peer in self._ids

    def add(self, peer: PeerId) -> None:
        """A node (back) online is learned again, as a bucket refresh would."""
        if peer not in self._ids:
            self.peers.append(peer)
            self._ids[peer] = node_id(peer)

    def remove(self, peer: PeerId) -> None:
        if self._ids.pop(peer, None) is not None:
            self.peers.remove(peer)
