"""The lookup walk: a query that stalls stops holding the walk up (dht.lookup)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any

import pytest
from kademlia.node import Node

from dht import DhtConfig, dht_key
from dht.lookup import NodeLookup, PlacementLookup
from dht.stats import DhtStats
from tests.waiting import eventually

from .conftest import FAST, Network

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


def _distances(nodes: list[Node]) -> list[int]:
    return [int.from_bytes(n.id, "big") for n in nodes]


async def test_a_placement_walk_ends_once_the_nearest_answered() -> None:
    protocol = _FakeProtocol(stall_after=1.0)
    # We know 3..7; 3 and 4 name 1 and 2, who name nobody closer.
    peers = _Peers(delay={d: 0.0 for d in range(1, 8)},
                   names={3: [1, 2], 4: [1, 2], 1: [2, 3], 2: [1, 4]})
    seeds = [_node(d) for d in range(3, 8)]
    walk = PlacementLookup(protocol, KEY, ksize=5, alpha=2,  # type: ignore[arg-type]
                           confirm=2, spares=1, seeds=seeds)
    found = await asyncio.wait_for(walk.run(peers), 5.0)
    assert _distances(found) == [1, 2, 3, 4, 5, 6]  # 5 targets and a spare
    assert sorted(peers.asked) == [1, 2, 3, 4]  # 5, 6, 7 are left to the STOREs
    # A full node lookup asks every one of the five closest before it ends.
    full = _Peers(delay=peers.delay, names=peers.names)
    nodes = await NodeLookup(protocol, KEY, ksize=5, alpha=2,  # type: ignore[arg-type]
                             seeds=seeds).run(full)
    assert _distances(nodes) == [1, 2, 3, 4, 5] and sorted(full.asked) == [1, 2, 3, 4, 5]


async def test_a_placement_walk_leaves_out_a_node_that_never_answered() -> None:
    protocol = _FakeProtocol(stall_after=0.05)
    peers = _Peers(delay={2: 0.0, 3: 0.0}, names={2: [3], 3: [2]})  # 1 is silent
    walk = PlacementLookup(protocol, KEY, ksize=2, alpha=1,  # type: ignore[arg-type]
                           confirm=1, spares=0, seeds=[_node(1), _node(2), _node(3)])
    found = await asyncio.wait_for(walk.run(peers), 5.0)
    assert _distances(found) == [2, 3]
    assert peers.asked == [1, 2]  # 1 stalled, 2 answered and was then the nearest
    for task in protocol.tasks:
        task.cancel()


@pytest.mark.slow
async def test_a_target_that_is_gone_is_replaced_by_the_next_closest(
        network: Network) -> None:
    config = dataclasses.replace(FAST, replicas=3)
    nodes = await network.grow(8, config=config)
    writer, data = nodes[0], b"\x44gone"
    first = await writer.put_many([data])
    key = dht_key(first[0].cid)
    holders = [n for n in nodes[1:] if n.records.get(key) is not None]
    assert first[0].acks == 3 and len(holders) == 3
    await network.stop(holders[0])
    # The writer's neighbourhood cache still names the stopped node: its STORE goes
    # unanswered, and the next closest node is asked instead.
    again = await writer.put_many([data])
    assert again[0].acks == 3
    live = network.nodes[1:]
    await eventually(lambda: sum(n.records.get(key) is not None for n in live) == 3)
    assert writer.stats.lookups == 1  # the second put was placed from the cache


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
