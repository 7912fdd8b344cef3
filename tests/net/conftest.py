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
from pulsar.net.handshake import Handshake, Payload, StaticKey
from pulsar.net.noise import CipherState
from pulsar.net.secure import encode_record

TIMEOUT = 5.0

FAST = TransportConfig(
    handshake_timeout=2.0,
    connect_timeout=2.0,
    reconnect_attempts=2,
    drain_timeout=1.0,
)


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
    """A hand-rolled dialer for wire-level tests: it can speak the protocol correctly (the
    Noise handshake, then sealed records), or not. ``sent_records`` keeps every record body
    sealed after the handshake, so tests can replay, reorder or tamper with real ciphertext.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, identity: Identity
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.identity = identity
        self.key = StaticKey.generate(identity)
        self.their: Payload | None = None
        self.send_cipher: CipherState | None = None
        self.recv_cipher: CipherState | None = None
        self.sent_records: list[bytes] = []
        self._plain = bytearray()

    @classmethod
    async def connect(cls, address: tuple[str, int], identity: Identity | None = None) -> RawPeer:
        reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer, identity or Identity.generate())

    @property
    def peer_id(self) -> PeerId:
        return self.identity.peer_id

    def new_handshake(
        self, listen: tuple[str, int] = ("127.0.0.1", 0), payload: bytes | None = None
    ) -> Handshake:
        """Our side of a handshake; ``payload`` replaces the correct one (to misbehave)."""
        hs = Handshake(self.key, listen, initiator=True)
        if payload is not None:
            hs._payload = payload
        return hs

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_record(self, body: bytes) -> None:
        """One record: a handshake message or a sealed one, with its 2-byte length."""
        await self.send_raw(encode_record(body))

    async def read_record(self, timeout: float = TIMEOUT) -> bytes:
        async with asyncio.timeout(timeout):
            (length,) = struct.unpack(">H", await self.reader.readexactly(2))
            return await self.reader.readexactly(length)

    async def send_message_1(self, hs: Handshake) -> bytes:
        """Write message 1 and return message 2."""
        first = hs.start()
        assert first is not None
        await self.send_record(first)
        return await self.read_record()

    async def handshake(
        self, listen: tuple[str, int] = ("127.0.0.1", 0), payload: bytes | None = None
    ) -> Payload:
        """A complete handshake, as any peer would do it (with ``payload``, a misbehaving
        one: then the server hangs up instead of confirming, and this raises)."""
        hs = self.new_handshake(listen, payload)
        third = hs.receive(await self.send_message_1(hs))
        assert third is not None
        await self.send_record(third)
        assert hs.receive(await self.read_record()) is None
        assert hs.done and hs.their is not None
        self.send_cipher, self.recv_cipher = hs.ciphers()
        self.their = hs.their
        return hs.their

    def seal(self, plaintext: bytes) -> bytes:
        """``plaintext`` (bytes of the frame stream) as one sealed record body, remembered
        in ``sent_records``."""
        assert self.send_cipher is not None, "handshake first"
        record = self.send_cipher.encrypt(plaintext)
        self.sent_records.append(record)
        return record

    async def send_plain(self, plaintext: bytes) -> None:
        """Bytes of the frame stream (whole frames or not), sealed into one record."""
        await self.send_record(self.seal(plaintext))

    async def send_frame(self, body: bytes) -> None:
        await self.send_plain(encode_frame(body))

    async def send_kind(self, kind: int, rest: bytes = b"") -> None:
        await self.send_frame(bytes([kind]) + rest)

    async def read_frame(self, timeout: float = TIMEOUT) -> bytes:
        """The next frame body, from records decrypted as they come."""
        assert self.recv_cipher is not None, "handshake first"
        async with asyncio.timeout(timeout):
            buf = self._plain
            while True:
                if len(buf) >= 4:
                    (length,) = struct.unpack_from(">I", buf)
                    if len(buf) >= 4 + length:
                        body = bytes(buf[4 : 4 + length])
                        del buf[: 4 + length]
                        return body
                buf += self.recv_cipher.decrypt(await self.read_record())

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
