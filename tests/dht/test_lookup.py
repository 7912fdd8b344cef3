"""The lookup walk: a query that stalls stops holding the walk up (dht.lookup)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any

import pytest
from kademlia.node import Node

from dht import DhtConfig
from dht.lookup import NodeLookup
from dht.stats import DhtStats

from .conftest import Network

KEY = bytes(20)


def _node(distance: int) -> Node:
    """A node at XOR ``distance`` from KEY (all zeros), at a made-up address."""
    return Node(distance.to_bytes(20, "big"), "127.0.0.1", 1000 + distance)


@dataclasses.dataclass
class _Config:
    stall_after: float


class _FakeProtocol:
    """Just what a walk uses of the protocol: its config and stats, its own id, spawn."""

    def __init__(self, stall_after: float) -> None:
        self.config = _Config(stall_after)
        self.stats = DhtStats()
        self.source_node = _node(10**6)
        self.tasks: list[asyncio.Task[Any]] = []

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task


class _Peers:
    """Answers FIND_NODE-like queries after ``delay[node]`` seconds (never if absent from
    ``delay``), each naming ``names[node]``; records who was asked, in order."""

    def __init__(self, delay: dict[int, float], names: dict[int, list[int]]) -> None:
        self.delay = delay
        self.names = names
        self.asked: list[int] = []

    async def __call__(self, peer: Node, target: Node) -> tuple[bool, Any]:
        distance = int.from_bytes(peer.id, "big")
        self.asked.append(distance)
        if distance not in self.delay:
            await asyncio.Event().wait()  # silent: only a cancel or the test's end stops it
        await asyncio.sleep(self.delay[distance])
        return True, [(n.id, n.ip, n.port) for n in map(_node, self.names.get(distance, []))]


async def test_a_stalled_query_is_replaced_and_the_walk_ends_without_it() -> None:
    protocol = _FakeProtocol(stall_after=0.05)
    peers = _Peers(delay={2: 0.0, 3: 0.0}, names={2: [3]})  # 1 never answers
    walk = NodeLookup(protocol, KEY, ksize=2, alpha=1,  # type: ignore[arg-type]
                      seeds=[_node(1), _node(2)])
    loop = asyncio.get_running_loop()
    started = loop.time()
    found = await asyncio.wait_for(walk.run(peers), 5.0)
    assert [int.from_bytes(n.id, "big") for n in found] == [2, 3]
    assert peers.asked == [1, 2, 3]  # 1 first (closest); 2 in its place; 3 learned from 2
    assert walk.stalls == 1 and protocol.stats.lookup_stalls == 1
    assert loop.time() - started < 1.0
    # The silent query was left running (its timeout is what takes a dead contact out of
    # the routing table); the others finished.
    pending = [t for t in protocol.tasks if not t.done()]
    assert len(pending) == 1
    for task in pending:
        task.cancel()


async def test_a_stalled_node_that_answers_while_the_walk_runs_still_counts() -> None:
    protocol = _FakeProtocol(stall_after=0.05)
    # 1 answers after 0.15 s (stalled at 0.05); 2 is asked in its place and takes 0.3 s.
    peers = _Peers(delay={1: 0.15, 2: 0.3}, names={})
    walk = NodeLookup(protocol, KEY, ksize=2, alpha=1,  # type: ignore[arg-type]
                      seeds=[_node(1), _node(2)])
    found = await asyncio.wait_for(walk.run(peers), 5.0)
    # Both stalled with nothing answered yet, so the walk waited; 1's answer (0.15 s) made
    # the stall threshold 0.45 s, under which 2 was no longer stalled and was awaited.
    assert [int.from_bytes(n.id, "big") for n in found] == [1, 2]
    assert walk.stalls == 2
    assert not [t for t in protocol.tasks if not t.done()]


async def test_on_a_slow_network_nothing_is_skipped() -> None:
    # Every answer takes 0.1 s, twice stall_after: slow answers are no sign of a dead node.
    protocol = _FakeProtocol(stall_after=0.05)
    peers = _Peers(delay={1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1}, names={1: [3], 2: [4]})
    walk = NodeLookup(protocol, KEY, ksize=4, alpha=2,  # type: ignore[arg-type]
                      seeds=[_node(1), _node(2)])
    found = await asyncio.wait_for(walk.run(peers), 5.0)
    assert [int.from_bytes(n.id, "big") for n in found] == [1, 2, 3, 4]


async def test_with_stalls_off_the_walk_waits_for_every_query() -> None:
    protocol = _FakeProtocol(stall_after=0.0)
    peers = _Peers(delay={1: 0.2, 2: 0.0}, names={})
    walk = NodeLookup(protocol, KEY, ksize=2, alpha=1,  # type: ignore[arg-type]
                      seeds=[_node(1), _node(2)])
    found = await asyncio.wait_for(walk.run(peers), 5.0)
    assert [int.from_bytes(n.id, "big") for n in found] == [1, 2]
    assert peers.asked == [1, 2] and walk.stalls == 0


@pytest.mark.slow
async def test_bootstrap_through_peers_that_list_a_dead_node_takes_a_stall_not_a_timeout(
        network: Network) -> None:
    config = DhtConfig(rpc_timeout=3.0, stall_after=0.3, get_timeout=5.0,
                       maintenance_interval=3600)
    first, second, doomed = await network.grow(3, config=config)
    assert len(second.closest_known_peers(second.node_id)) == 2
    await network.stop(doomed)  # first and second still list it
    loop = asyncio.get_running_loop()
    started = loop.time()
    fresh = await network.add(bootstrap=[first.address, second.address], config=config)
    took = loop.time() - started
    assert took < config.rpc_timeout / 2, took  # the package's crawl waited rpc_timeout
    known = {c.node_id for c in fresh.closest_known_peers(fresh.node_id)}
    assert {first.node_id, second.node_id} <= known
