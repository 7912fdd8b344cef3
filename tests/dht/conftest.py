"""Fixtures for the DHT tests: real nodes on loopback UDP, each with its own SQLite file."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import umsgpack
from kademlia.network import Server

from dag.identity import Identity
from dht import DhtConfig, DhtNode

FAST = DhtConfig(rpc_timeout=1.0, get_timeout=5.0, maintenance_interval=3600.0)
"""Short timeouts; no background maintenance pass after the first, so tests drive it."""


class Network:
    """Starts nodes that bootstrap off the first one, and stops them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[DhtNode] = []
        self.stock: list[Server] = []
        self._count = 0

    async def add(self, *, identity: Identity | None = None, name: str | None = None,
                  port: int = 0, bootstrap: list[tuple[str, int]] | None = None,
                  config: DhtConfig = FAST) -> DhtNode:
        self._count += 1
        name = name or f"node{self._count}"
        if bootstrap is None:
            bootstrap = [self.nodes[0].address] if self.nodes else []
        node = await DhtNode.start(identity or Identity.generate(), port=port,
                                   bootstrap=bootstrap, db_path=self.root / f"{name}.db",
                                   config=config)
        self.nodes.append(node)
        return node

    async def grow(self, count: int, *, config: DhtConfig = FAST) -> list[DhtNode]:
        return [await self.add(config=config) for _ in range(count)]

    async def add_stock(self, *, node_id: bytes | None = None,
                        bootstrap: list[tuple[str, int]] | None = None) -> Server:
        """An unmodified ``kademlia.network.Server`` on loopback."""
        server = Server(node_id=node_id)
        await server.listen(0, interface="127.0.0.1")
        self.stock.append(server)
        if bootstrap:
            await server.bootstrap(bootstrap)
        return server

    async def stop(self, node: DhtNode) -> None:
        await node.stop()
        self.nodes.remove(node)

    async def close(self) -> None:
        for node in self.nodes:
            await node.stop()
        for server in self.stock:
            server.stop()
        self.nodes.clear()
        self.stock.clear()
        await asyncio.sleep(0)  # let closed transports release their sockets


def stock_address(server: Server) -> tuple[str, int]:
    host, port = server.transport.get_extra_info("sockname")[:2]
    return host, port


@pytest.fixture
async def network(tmp_path: Path) -> AsyncIterator[Network]:
    net = Network(tmp_path)
    try:
        yield net
    finally:
        await net.close()


class RawPeer(asyncio.DatagramProtocol):
    """A hand-driven UDP socket that speaks (or abuses) the ``rpcudp`` datagram format.

    It answers PINGs (so a node can validate its address, see ``dht.address_check``) and
    acknowledges STOREs, unless ``answers_pings`` is False: then it behaves like a forged
    source address and answers nothing. ``requests`` counts what it was sent, by RPC."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.node_id = os.urandom(20)
        self.answers_pings = True
        self.pinged = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self.requests: dict[str, int] = {}
        self._answers: dict[bytes, asyncio.Future[object]] = {}

    @classmethod
    async def open(cls) -> RawPeer:
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_datagram_endpoint(cls, local_addr=("127.0.0.1", 0))
        return peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.bytes_received += len(data)
        if data[:1] == b"\x01" and (waiter := self._answers.pop(data[1:21], None)):
            if not waiter.done():
                waiter.set_result(umsgpack.unpackb(data[21:]))
        elif data[:1] == b"\x00":
            name, args = umsgpack.unpackb(data[21:])
            self.requests[name] = self.requests.get(name, 0) + 1
            answer: object = None
            if name == "ping":
                self.pinged += 1
                answer = self.node_id
            elif name == "store":
                answer = True
            elif name == "store_batch":
                answer = [True] * len(args[1])
            if self.answers_pings and answer is not None:
                self.send(b"\x01" + data[1:21] + umsgpack.packb(answer), addr)

    def send(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        self.bytes_sent += len(data)
        self.transport.sendto(data, addr)

    async def introduce(self, addr: tuple[str, int]) -> None:
        """PING the node at ``addr`` and answer its validation PING: from then on the node
        serves this peer's requests at once."""
        pinged = self.pinged
        await self.call(addr, "ping", self.node_id)
        for _ in range(200):
            if self.pinged > pinged:
                # Our answer is sent; a request that overtook it is held by the node until
                # it arrives, then served: nothing to wait for here.
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the node never validated our address")

    def request(self, addr: tuple[str, int], name: str, *args: object) -> asyncio.Future[object]:
        """Send ``name(*args)`` (no size or type checks) and return the answer's future."""
        msg_id = os.urandom(20)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._answers[msg_id] = future
        self.send(b"\x00" + msg_id + umsgpack.packb([name, list(args)]), addr)
        return future

    async def call(self, addr: tuple[str, int], name: str, *args: object,
                   timeout: float = 2.0) -> object:
        return await asyncio.wait_for(self.request(addr, name, *args), timeout)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


@pytest.fixture
async def raw_peer() -> AsyncIterator[RawPeer]:
    peer = await RawPeer.open()
    try:
        yield peer
    finally:
        peer.close()
        await asyncio.sleep(0)
