"""The neighbourhood cache that lets one lookup serve the stores of many keys."""

from __future__ import annotations

import random

from kademlia.node import Node

from dht.lookup import NeighbourhoodCache


def nodes_near(key: int, count: int, spread_bits: int, rng: random.Random) -> list[Node]:
    return [Node((key ^ rng.getrandbits(spread_bits)).to_bytes(20, "big"))
            for _ in range(count)]


def test_a_network_smaller_than_k_is_one_neighbourhood() -> None:
    rng = random.Random(1)
    cache = NeighbourhoodCache(ttl=30, ksize=20, clock=lambda: 0.0)
    found = [Node(rng.randbytes(20)) for _ in range(19)]
    cache.put(rng.randbytes(20), found)
    assert cache.get(rng.randbytes(20)) == found


def test_only_keys_well_inside_the_explored_ball_share_a_lookup() -> None:
    rng = random.Random(2)
    cache = NeighbourhoodCache(ttl=30, ksize=20, clock=lambda: 0.0)
    key = rng.getrandbits(160)
    found = nodes_near(key, 20, 150, rng)  # the k-th closest is ~2**150 away
    cache.put(key.to_bytes(20, "big"), found)
    assert cache.get((key ^ (1 << 100)).to_bytes(20, "big")) == found
    assert cache.get((key ^ (1 << 155)).to_bytes(20, "big")) is None


def test_entries_expire_and_are_dropped_when_a_node_fails() -> None:
    now = [0.0]
    rng = random.Random(3)
    cache = NeighbourhoodCache(ttl=30, ksize=20, clock=lambda: now[0])
    found = [Node(rng.randbytes(20)) for _ in range(5)]
    key = rng.randbytes(20)
    cache.put(key, found)
    cache.forget_node(found[2].id)
    assert cache.get(key) is None
    cache.put(key, found)
    now[0] = 31.0
    assert cache.get(key) is None


def test_ttl_zero_disables_the_cache() -> None:
    cache = NeighbourhoodCache(ttl=0, ksize=20)
    cache.put(b"k" * 20, [Node(b"n" * 20)])
    assert cache.get(b"k" * 20) is None
