"""Encrypted records: what is on the wire, and what a relay or a raw peer can and cannot do.

Records are sealed pieces of the frame stream (``pulsar.net.secure``); the Noise primitives
themselves are pinned by ``test_noise_vectors.py``. Here: sealing and opening at the record
size boundaries, two real transports seen through a recording relay, and a hand-rolled peer
(``RawPeer``) that tampers with, replays, reorders or forges records after a correct
handshake. Each must end the connection with a log line and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from pulsar.net import BadRecord, FaultInjector, TransportConfig
from pulsar.net.framing import Kind, encode_data
from pulsar.net.noise import CipherState, HandshakeState
from pulsar.net.secure import MAX_RECORD, MAX_RECORD_PLAINTEXT, RecordDecoder, seal

from .conftest import FAST, Endpoint, RawPeer, seq, seqs

Make = Callable[..., Awaitable[Endpoint]]
Raw = Callable[..., Awaitable[RawPeer]]


def _pair() -> tuple[CipherState, CipherState]:
    """The initiator's send cipher and the responder's receive cipher of a fresh session."""
    init = HandshakeState(initiator=True, static=X25519PrivateKey.generate())
    resp = HandshakeState(initiator=False, static=X25519PrivateKey.generate())
    resp.read_message(init.write_message())
    init.read_message(resp.write_message())
    resp.read_message(init.write_message())
    return init.split()[0], resp.split()[1]


# --- sealing and opening, no sockets ------------------------------------------------------


@pytest.mark.parametrize(
    "size", [0, 1, MAX_RECORD_PLAINTEXT, MAX_RECORD_PLAINTEXT + 1, 3 * MAX_RECORD_PLAINTEXT + 7]
)
def test_seal_splits_at_the_noise_limit_and_open_joins(size: int) -> None:
    send, recv = _pair()
    data = os.urandom(size)
    wire = seal(send, data)
    records = max(1, -(-size // MAX_RECORD_PLAINTEXT))
    assert len(wire) == size + records * (2 + 16)
    assert send.n == records
    lengths, pos = [], 0
    while pos < len(wire):
        (length,) = struct.unpack_from(">H", wire, pos)
        lengths.append(length)
        pos += 2 + length
    assert all(length <= MAX_RECORD for length in lengths) and len(lengths) == records
    assert b"".join(RecordDecoder().open(wire, recv)) == data


def test_open_keeps_a_record_that_spans_reads() -> None:
    send, recv = _pair()
    data = os.urandom(2 * MAX_RECORD_PLAINTEXT + 100)
    wire = seal(send, data)
    decoder = RecordDecoder()
    out = bytearray()
    for i in range(0, len(wire), 4093):  # cuts inside prefixes and bodies alike
        out += b"".join(decoder.open(wire[i : i + 4093], recv))
    assert out == data and decoder.buffered == 0


def test_open_takes_over_records_buffered_during_the_handshake() -> None:
    """The handshake reads records one by one; whole records it left behind (sent right
    after the last handshake message, in the same read) are opened first, in order."""
    send, recv = _pair()
    decoder = RecordDecoder(max_record=1024)
    wire = bytes(seal(send, b"one") + seal(send, b"two") + seal(send, b"three"))
    decoder.feed(wire[:-3])
    assert decoder.open(wire[-3:], recv) == [b"one", b"two", b"three"]
    assert decoder.buffered == 0


def test_open_stops_at_a_replayed_or_tampered_record() -> None:
    send, recv = _pair()
    first = seal(send, b"one")
    decoder = RecordDecoder()
    assert decoder.open(first, recv) == [b"one"]
    assert decoder.open(first, recv) == []  # replayed: nonce 0 again
    assert decoder.error is not None and "does not authenticate" in str(decoder.error)
    with pytest.raises(BadRecord):
        decoder.open(seal(send, b"two"), recv)  # nothing more once one failed
    send, recv = _pair()
    genuine = seal(send, b"three")
    tampered = bytearray(seal(send, b"four"))
    tampered[3] ^= 0x01
    decoder = RecordDecoder()
    assert decoder.open(bytes(genuine + tampered + seal(send, b"five")), recv) == [b"three"]
    assert isinstance(decoder.error, BadRecord)


# --- two transports through a relay -----------------------------------------------------


class Relay:
    """A TCP relay between a dialer and a listener that records both directions and may
    rewrite the dialer's records (``rewrite(index, body) -> list of bodies``; records count
    from 0: message 1, message 3, then transport records)."""

    def __init__(
        self,
        target: tuple[str, int],
        rewrite: Callable[[int, bytes], list[bytes]] | None = None,
    ) -> None:
        self.target = target
        self.rewrite = rewrite
        self.upstream = bytearray()  # dialer -> listener, as sent by the dialer
        self.downstream = bytearray()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] = ("", 0)

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = ("127.0.0.1", self._server.sockets[0].getsockname()[1])
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        for coro in (self._up(reader, up_writer), self._down(up_reader, writer)):
            task = asyncio.get_running_loop().create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = 0
        try:
            while True:
                head = await reader.readexactly(2)
                body = await reader.readexactly(struct.unpack(">H", head)[0])
                self.upstream += head + body
                out = [body] if self.rewrite is None else self.rewrite(index, body)
                writer.write(b"".join(struct.pack(">H", len(b)) + b for b in out))
                await writer.drain()
                index += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                self.downstream += data
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@pytest.fixture
async def relays() -> AsyncIterator[Callable[..., Awaitable[Relay]]]:
    made: list[Relay] = []

    async def make(
        target: tuple[str, int], rewrite: Callable[[int, bytes], list[bytes]] | None = None
    ) -> Relay:
        relay = Relay(target, rewrite)
        made.append(relay)
        await relay.start()
        return relay

    yield make
    for relay in made:
        await relay.close()


SECRET = b"attack at dawn; bring the 16 KiB of cake " * 8


@pytest.mark.parametrize("encrypt", [True, False])
async def test_frames_on_the_wire_are_not_the_plaintext(
    endpoints: Make, relays: Callable[..., Awaitable[Relay]], encrypt: bool
) -> None:
    config = TransportConfig(encrypt=encrypt, reconnect_attempts=0)
    server = await endpoints(config=config)
    client = await endpoints(config=config, listen=False)
    assert server.address is not None
    relay = await relays(server.address)
    await client.transport.send(server.peer_id, relay.address, SECRET)
    await server.transport.send(client.peer_id, None, SECRET[::-1])
    assert await server.wait_frames(client.peer_id, 1) == [SECRET]
    assert await client.wait_frames(server.peer_id, 1) == [SECRET[::-1]]
    # Neither direction shows a payload, nor even the DATA frame around it, unless the
    # frames were sent in the clear on purpose (which shows the relay saw the traffic).
    for wire, payload in ((relay.upstream, SECRET), (relay.downstream, SECRET[::-1])):
        assert (encode_data(payload) in wire) is not encrypt
        assert (payload[:16] in wire) is not encrypt


async def test_a_relay_cannot_replay_a_record(
    endpoints: Make,
    relays: Callable[..., Awaitable[Relay]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The relay passes the handshake through untouched, then sends the dialer's first
    transport record twice: the copy does not authenticate, the connection ends, and the
    frame was delivered once."""
    caplog.set_level(logging.INFO, logger="pulsar.net")
    server = await endpoints()
    client = await endpoints(listen=False, config=TransportConfig(reconnect_attempts=0))
    assert server.address is not None
    relay = await relays(server.address, lambda i, body: [body, body] if i == 2 else [body])
    await client.transport.send(server.peer_id, relay.address, b"once")
    await server.wait(lambda: server.transport.stats.bad_records == 1)
    await server.wait(lambda: server.downs == [client.peer_id])
    assert server.received[client.peer_id] == [b"once"]
    assert "bad record" in caplog.text


async def test_a_relay_cannot_inject_a_record(
    endpoints: Make, relays: Callable[..., Awaitable[Relay]]
) -> None:
    """A record the relay makes up (it has no key) in front of the dialer's first one."""
    forged = os.urandom(len(encode_data(b"forged")) + 16)
    server = await endpoints()
    client = await endpoints(listen=False, config=TransportConfig(reconnect_attempts=0))
    assert server.address is not None
    relay = await relays(server.address, lambda i, body: [forged, body] if i == 2 else [body])
    await client.transport.send(server.peer_id, relay.address, b"genuine")
    await server.wait(lambda: server.transport.stats.bad_records == 1)
    assert server.received[client.peer_id] == []


# --- a raw peer that misbehaves after a correct handshake ----------------------------------


async def _connected(server: Endpoint, raw_peers: Raw) -> RawPeer:
    assert server.address is not None
    raw = await raw_peers(server.address)
    await raw.handshake()
    await server.wait(lambda: raw.peer_id in server.transport.connected())
    return raw


async def _refused(server: Endpoint, raw: RawPeer, caplog: pytest.LogCaptureFixture) -> None:
    await raw.expect_closed()
    await server.wait(lambda: server.downs == [raw.peer_id])
    assert server.transport.stats.bad_records == 1
    assert [r for r in caplog.records if "bad record" in r.getMessage()
            and r.levelno == logging.WARNING]


async def test_a_tampered_byte_closes_the_connection(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await _connected(server, raw_peers)
    await raw.send_frame(encode_data(b"fine")[4:])
    record = bytearray(raw.seal(encode_data(b"altered")))
    record[1] ^= 0x20  # one bit of the ciphertext
    await raw.send_record(bytes(record))
    await _refused(server, raw, caplog)
    assert server.received[raw.peer_id] == [b"fine"]


async def test_a_replayed_record_closes_the_connection(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await _connected(server, raw_peers)
    await raw.send_kind(Kind.DATA, b"pay me once")
    await server.wait_frames(raw.peer_id, 1)
    await raw.send_record(raw.sent_records[-1])
    await _refused(server, raw, caplog)
    assert server.received[raw.peer_id] == [b"pay me once"]


async def test_records_out_of_order_close_the_connection(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await _connected(server, raw_peers)
    first, second = raw.seal(encode_data(b"1")), raw.seal(encode_data(b"2"))
    await raw.send_record(second)
    await _refused(server, raw, caplog)
    assert first and server.received[raw.peer_id] == []


async def test_a_frame_split_across_records_is_reassembled(
    endpoints: Make, raw_peers: Raw
) -> None:
    """Record boundaries mean nothing to frames: here one frame in three records, then two
    frames in one record."""
    server = await endpoints()
    raw = await _connected(server, raw_peers)
    stream = encode_data(b"a" * 5000) + encode_data(b"b") + encode_data(b"c")
    for piece in (stream[:3], stream[3:4000], stream[4000:]):
        await raw.send_plain(piece)
    assert await server.wait_frames(raw.peer_id, 3) == [b"a" * 5000, b"b", b"c"]


# --- large frames ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes",
    [
        [MAX_RECORD_PLAINTEXT - 5, MAX_RECORD_PLAINTEXT - 4, MAX_RECORD, 200_000, 1 << 20],
        [10, 70_000, 10, 300_000, 10],
    ],
)
async def test_frames_larger_than_a_noise_message_round_trip(
    endpoints: Make, sizes: list[int]
) -> None:
    a, b = await endpoints(), await endpoints()
    payloads = [os.urandom(size) for size in sizes]
    for payload in payloads:
        await a.transport.send(b.peer_id, b.address, payload)
        await b.transport.send(a.peer_id, a.address, payload[::-1])
    assert await b.wait_frames(a.peer_id, len(sizes)) == payloads
    assert await a.wait_frames(b.peer_id, len(sizes)) == [p[::-1] for p in payloads]


async def test_encrypted_frames_through_a_delay_line_that_reorders(endpoints: Make) -> None:
    """The fault injector reorders frames before they are sealed: records still leave in
    nonce order, so every frame arrives (in the injected order) and nothing fails."""
    faults = FaultInjector(seed=3, jitter=0.02, reorder=True)
    a = await endpoints(faults=faults, config=FAST)
    b = await endpoints()
    big = os.urandom(100_000)
    for i in range(40):
        await a.transport.send(b.peer_id, b.address, seq(i) + (big if i % 10 == 0 else b""))
    got = await b.wait_frames(a.peer_id, 40)
    assert sorted(seqs(got)) == list(range(40))
    assert seqs(got) != list(range(40))  # the injector did reorder
    assert b.transport.stats.bad_records == 0
    assert a.transport.stats.bad_records == 0
