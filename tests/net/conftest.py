"""Helpers for the transport tests: recording endpoints, a raw wire-level peer, waits.

Nothing here sleeps for a fixed time to synchronise: waits are on events set by the
transport's callbacks, or polls of a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from dag import Identity, PeerId
from pulsar.net import FaultInjector, Transport, TransportConfig
from pulsar.net.framing import Kind, encode_frame
from pulsar.net.handshake import Hello, encode_auth, parse_auth, signed_message

TIMEOUT = 5.0

FAST = TransportConfig(
    handshake_timeout=2.0,
    connect_timeout=2.0,
    reconnect_attempts=2,
    drain_timeout=1.0,
)


async def eventually(
    condition: Callable[[], bool], timeout: float = TIMEOUT, what: str = "condition"
) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


class Endpoint:
    """A transport that records what it receives and which peers came and went."""

    def __init__(
        self,
        identity: Identity | None = None,
        config: TransportConfig | None = None,
        faults: FaultInjector | None = None,
    ) -> None:
        self.identity = identity or Identity.generate()
        self.received: dict[PeerId, list[bytes]] = defaultdict(list)
        self.ups: list[tuple[PeerId, tuple[str, int]]] = []
        self.downs: list[PeerId] = []
        self._changed = asyncio.Event()
        self.address: tuple[str, int] | None = None
        self.transport = Transport(
            self.identity,
            config or FAST,
            on_frame=self._on_frame,
            on_peer_up=self._on_up,
            on_peer_down=self._on_down,
            faults=faults,
        )

    @property
    def peer_id(self) -> PeerId:
        return self.identity.peer_id

    async def listen(self, port: int = 0) -> tuple[str, int]:
        self.address = await self.transport.listen("127.0.0.1", port)
        return self.address

    def _on_frame(self, peer: PeerId, payload: bytes) -> None:
        self.received[peer].append(payload)
        self._changed.set()

    def _on_up(self, peer: PeerId, address: tuple[str, int]) -> None:
        self.ups.append((peer, address))
        self._changed.set()

    def _on_down(self, peer: PeerId) -> None:
        self.downs.append(peer)
        self._changed.set()

    async def wait(self, condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        """Wait until ``condition`` holds, re-checking whenever a callback fires."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def wait_frames(self, peer: PeerId, count: int, timeout: float = TIMEOUT) -> list[bytes]:
        await self.wait(lambda: len(self.received[peer]) >= count, timeout)
        return self.received[peer]


@pytest.fixture
async def endpoints() -> AsyncIterator[Callable[..., Awaitable[Endpoint]]]:
    """Factory of listening (or not) endpoints, all closed at the end of the test."""
    made: list[Endpoint] = []

    async def make(*, listen: bool = True, port: int = 0, **kwargs: Any) -> Endpoint:
        endpoint = Endpoint(**kwargs)
        made.append(endpoint)
        if listen:
            await endpoint.listen(port)
        return endpoint

    yield make
    for endpoint in made:
        await endpoint.transport.close()


# --- a raw peer, speaking the wire protocol by hand --------------------------------------------


class RawPeer:
    """A hand-rolled client for wire-level tests: it can speak the protocol correctly, or not."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, identity: Identity
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.identity = identity
        self.nonce = b"\x07" * 32
        self.their: Hello | None = None

    @classmethod
    async def connect(cls, address: tuple[str, int], identity: Identity | None = None) -> RawPeer:
        reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer, identity or Identity.generate())

    @property
    def peer_id(self) -> PeerId:
        return self.identity.peer_id

    def hello(self) -> bytes:
        return Hello(self.peer_id, self.nonce, ("127.0.0.1", 0)).encode()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_frame(self, body: bytes) -> None:
        await self.send_raw(encode_frame(body))

    async def send_kind(self, kind: int, rest: bytes = b"") -> None:
        await self.send_frame(bytes([kind]) + rest)

    async def read_frame(self, timeout: float = TIMEOUT) -> bytes:
        async with asyncio.timeout(timeout):
            (length,) = struct.unpack(">I", await self.reader.readexactly(4))
            return await self.reader.readexactly(length)

    async def read_hello(self) -> Hello:
        self.their = Hello.parse(await self.read_frame())
        return self.their

    async def handshake(self) -> Hello:
        """A correct handshake, as any peer would do it."""
        await self.send_frame(self.hello())
        their = await self.read_hello()
        await self.send_frame(encode_auth(self.identity, their, self.nonce))
        sig = parse_auth(await self.read_frame())
        assert their.peer.verify(sig, signed_message(self.nonce, their.nonce, self.peer_id))
        return their

    async def read_data(self, timeout: float = TIMEOUT) -> bytes:
        """The next DATA payload, answering PINGs on the way."""
        while True:
            body = await self.read_frame(timeout)
            if body[0] == Kind.DATA:
                return body[1:]
            if body[0] == Kind.PING:
                await self.send_kind(Kind.PONG)

    async def expect_closed(self, timeout: float = TIMEOUT) -> None:
        """Read (and ignore) until the other side closes the connection."""
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionResetError):
                while await self.reader.read(65536):
                    pass

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


@pytest.fixture
async def raw_peers() -> AsyncIterator[Callable[..., Awaitable[RawPeer]]]:
    made: list[RawPeer] = []

    async def connect(address: tuple[str, int], identity: Identity | None = None) -> RawPeer:
        peer = await RawPeer.connect(address, identity)
        made.append(peer)
        return peer

    yield connect
    for peer in made:
        await peer.close()


def seq(i: int) -> bytes:
    """A recognisable payload: DAG-CBOR would be the protocol's business; a counter is ours."""
    return i.to_bytes(4, "big")


def seqs(payloads: list[bytes]) -> list[int]:
    return [int.from_bytes(p[:4], "big") for p in payloads]
