"""Real nodes on loopback: UDP DHT, TCP transport, SQLite, all in one event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dag import EventDescriptor
from dht import DhtConfig
from pulsar import Node, NodeConfig
from pulsar.net.config import TransportConfig
from pulsar.net.faults import FaultInjector
from pulsar.proto.core import CoreConfig
from pulsar.runtime.subscription import Subscription
from tests.waiting import eventually

__all__ = ["Network", "PartitionableNetwork", "collect", "eventually"]

FAST_TRANSPORT = TransportConfig(
    idle_ping=0.3,
    dead_after=1.0,
    connect_timeout=1.0,
    handshake_timeout=2.0,
    reconnect_attempts=1,
    drain_timeout=0.5,
)
FAST_DHT = DhtConfig(rpc_timeout=1.0)  # loopback answers in well under a millisecond
FAST_CORE = CoreConfig(parent_retries=2, parent_retry_delay=0.1, root_check_interval=0.5)


async def collect(sub: Subscription, count: int, timeout: float = 20.0) -> list[EventDescriptor]:
    """The next ``count`` events of ``sub``, failing after ``timeout`` seconds."""
    events = []
    async with asyncio.timeout(timeout):
        while len(events) < count:
            events.append(await sub.get())
    return events


class Network:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[Node] = []
        self.drop_rate = 0.0
        self.checkpoint_every = 1000  # NodeConfig's default
        self.checkpoint_interval = 600.0

    def config(self, index: int, bootstrap: tuple[tuple[str, int], ...]) -> NodeConfig:
        faults = FaultInjector(seed=index, drop_rate=self.drop_rate) if self.drop_rate else None
        return NodeConfig(
            data_dir=self.root / f"n{index}",
            bootstrap=bootstrap,
            core=FAST_CORE,
            dht=FAST_DHT,
            transport=FAST_TRANSPORT,
            faults=faults,
            checkpoint_every=self.checkpoint_every,
            checkpoint_interval=self.checkpoint_interval,
        )

    async def start(self, count: int) -> list[Node]:
        started = []
        for _ in range(count):
            index = len(self.nodes)
            seeds = tuple(n.address for n in self.nodes[-3:])
            node = await Node.start(self.config(index, seeds))
            self.nodes.append(node)
            started.append(node)
        # Everyone proves the contacts it learned while others joined after it.
        await asyncio.gather(*(n._routing.prove_known(5.0) for n in self.nodes))
        return started

    async def restart(self, node: Node) -> Node:
        index = self.nodes.index(node)
        await node.stop()
        seeds = tuple(n.address for n in self.nodes if n is not node and not n.stopped)[:3]
        fresh = await Node.start(self.config(index, seeds))
        self.nodes[index] = fresh
        return fresh

    async def close(self) -> None:
        await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)


class PartitionableNetwork(Network):
    """Every node's transport asks one fault injector, which a test partitions and heals."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.faults = FaultInjector(seed=1)

    def config(self, index: int, bootstrap: tuple[tuple[str, int], ...]) -> NodeConfig:
        return dataclasses.replace(super().config(index, bootstrap), faults=self.faults)


@pytest.fixture
async def network(tmp_path: Path) -> AsyncIterator[Network]:
    net = Network(tmp_path)
    try:
        yield net
    finally:
        await net.close()
