"""Misbehaving peers, played by a hand-rolled client: each is refused with a log line, the
connection is closed, and the transport keeps serving everyone else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dag import Identity, encode
from pulsar.net import HandshakeError, PeerUnreachable, TransportConfig
from pulsar.net.framing import Kind
from pulsar.net.handshake import STATIC_KEY_CONTEXT, Handshake, StaticKey
from pulsar.net.secure import encode_record

from .conftest import Endpoint, RawPeer

Make = Callable[..., Awaitable[Endpoint]]
Raw = Callable[..., Awaitable[RawPeer]]
HUNG_UP = (asyncio.IncompleteReadError, ConnectionResetError)


@pytest.fixture(autouse=True)
def _log_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pulsar.net")


async def still_serving(server: Endpoint, endpoints: Make) -> None:
    """A well-behaved peer still gets through."""
    client = await endpoints(listen=False)
    await client.transport.send(server.peer_id, server.address, b"still here")
    assert await server.wait_frames(client.peer_id, 1) == [b"still here"]


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records
        if r.name == "pulsar.net" and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


async def test_garbage_instead_of_a_handshake(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # "GE": an 18 KB record
    await raw.expect_closed()
    assert warnings_about(caplog, "oversized frame")
    assert server.transport.stats.handshake_failures == 1
    assert server.transport.stats.oversized_frames == 1
    await still_serving(server, endpoints)


async def test_garbage_record_instead_of_message_1(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_record(b"\xff\xfe not a key")
    await raw.expect_closed()
    assert warnings_about(caplog, "handshake message 1: handshake message too short")
    await still_serving(server, endpoints)


async def test_a_transport_v1_dialer_is_refused_plainly(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    """A node of the previous version opens with a plaintext HELLO behind a 4-byte length:
    its first two bytes read as an empty record, refused with a line that says why."""
    server = await endpoints()
    raw = await raw_peers(server.address)
    hello = encode({"v": 1, "peer": raw.peer_id.raw, "nonce": b"\x07" * 32,
                    "listen": ["127.0.0.1", 0]})
    await raw.send_raw(struct.pack(">I", len(hello)) + hello)
    await raw.expect_closed()
    assert warnings_about(caplog, "a transport v1 peer")
    assert server.transport.stats.handshake_failures == 1
    await still_serving(server, endpoints)


async def test_dialing_a_transport_v1_listener_fails_plainly(
    endpoints: Make, caplog: pytest.LogCaptureFixture
) -> None:
    """The other way round: a v1 listener speaks its HELLO at once; the dialer refuses it."""
    hello = encode({"v": 1, "peer": Identity.generate().peer_id.raw, "nonce": b"\x07" * 32,
                    "listen": ["127.0.0.1", 0]})

    async def old_node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack(">I", len(hello)) + hello)
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    server = await asyncio.start_server(old_node, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        client = await endpoints(listen=False, config=TransportConfig(reconnect_attempts=0))
        with pytest.raises(PeerUnreachable):
            await client.transport.send(Identity.generate().peer_id, ("127.0.0.1", port), b"x")
    assert warnings_about(caplog, "a transport v1 peer")


def _payload_with(raw: RawPeer, **change: Any) -> bytes:
    msg: dict[str, Any] = {
        "peer": raw.peer_id.raw, "sig": raw.key.signature, "listen": ["127.0.0.1", 0],
    }
    msg.update(change)
    return encode({k: v for k, v in msg.items() if v is not None})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"v": 1}, "unexpected ['v']"),
        ({"sig": None}, "missing ['sig']"),
        ({"sig": b"\x00" * 10}, "'sig' must be 64 bytes"),
        ({"peer": b"\x12\x20" + b"\x00" * 32}, "not a valid peer id"),
        ({"listen": ["127.0.0.1"]}, "'listen' must be"),
    ],
)
async def test_payload_with_a_wrong_field(
    endpoints: Make,
    raw_peers: Raw,
    caplog: pytest.LogCaptureFixture,
    change: dict[str, Any],
    reason: str,
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    with pytest.raises(HUNG_UP):  # hung up on instead of confirmed
        await raw.handshake(payload=_payload_with(raw, **change))
    assert warnings_about(caplog, reason), caplog.text
    assert server.transport.stats.handshake_failures == 1
    assert server.ups == []
    await still_serving(server, endpoints)


async def test_static_key_signed_by_another_identity(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    """A dialer claiming a peer id whose key did not sign its Noise static key (it holds
    the static key, not the identity) is refused."""
    server = await endpoints()
    raw = await raw_peers(server.address)
    impostor = Identity.generate()
    forged = impostor.sign(STATIC_KEY_CONTEXT + raw.key.public)
    with pytest.raises(HUNG_UP):
        await raw.handshake(payload=_payload_with(raw, sig=forged))
    assert warnings_about(caplog, "static key signature")
    assert warnings_about(caplog, "does not verify")
    assert raw.peer_id not in server.transport.connected()
    assert server.ups == []
    await still_serving(server, endpoints)


async def test_connection_to_self(endpoints: Make, caplog: pytest.LogCaptureFixture) -> None:
    """An address that turns out to be our own (say, from a stale DHT record) is refused."""
    a = await endpoints(config=TransportConfig(reconnect_attempts=0))
    someone = Identity.generate().peer_id
    with pytest.raises(PeerUnreachable):
        await a.transport.send(someone, a.address, b"x")
    assert warnings_about(caplog, "connection to self")
    assert a.transport.connected() == set()
    await still_serving(a, endpoints)


async def test_silent_client_times_out(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints(config=TransportConfig(handshake_timeout=0.1))
    raw = await raw_peers(server.address)
    await raw.expect_closed()
    assert warnings_about(caplog, "handshake timed out")
    assert server.transport.stats.handshake_failures == 1


async def test_oversized_frame_after_the_handshake(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints(config=TransportConfig(max_frame=1000))
    other = await endpoints()
    await server.transport.send(other.peer_id, other.address, b"before")
    raw = await raw_peers(server.address)
    await raw.handshake()
    await server.wait(lambda: raw.peer_id in server.transport.connected())
    await raw.send_kind(Kind.DATA, b"fits" * 250)  # 1000-byte payload: the limit, accepted
    await server.wait_frames(raw.peer_id, 1)
    await raw.send_plain(struct.pack(">I", 1002))  # payload 1001 + kind byte: over the limit
    await raw.expect_closed()
    assert warnings_about(caplog, "oversized frame")
    assert server.transport.stats.oversized_frames == 1
    await server.wait(lambda: server.downs == [raw.peer_id])
    # Other connections are untouched.
    assert other.peer_id in server.transport.connected()
    await server.transport.send(other.peer_id, None, b"after")
    assert await other.wait_frames(server.peer_id, 2) == [b"before", b"after"]
    await still_serving(server, endpoints)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty frame"),
        (b"\x09", "unknown frame kind 0x09"),
        (b"\x01extra", "PING frame of 6 bytes"),
        (b"\x04", "GOAWAY_ACK without our GOAWAY"),
    ],
)
async def test_bad_frames_after_the_handshake(
    endpoints: Make,
    raw_peers: Raw,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    reason: str,
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.handshake()
    await raw.send_frame(body)
    await raw.expect_closed()
    assert warnings_about(caplog, reason), caplog.text
    assert server.transport.stats.protocol_errors == 1
    await still_serving(server, endpoints)


async def test_data_after_goaway_is_a_protocol_error(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.handshake()
    await raw.send_kind(Kind.DATA, b"last")
    await raw.send_kind(Kind.GOAWAY, b"\x00")
    await raw.send_kind(Kind.DATA, b"too late")
    await raw.expect_closed()
    assert server.received[raw.peer_id] == [b"last"]
    assert warnings_about(caplog, "DATA after GOAWAY")


async def test_a_peer_cannot_claim_a_listen_host(endpoints: Make, raw_peers: Raw) -> None:
    """The recorded address is the observed IP with the advertised port."""
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.handshake(listen=("203.0.113.9", 4242))
    await server.wait(lambda: bool(server.ups))
    assert server.ups == [(raw.peer_id, ("127.0.0.1", 4242))]


async def _impostor_listener(key: StaticKey) -> asyncio.Server:
    """A listener that answers message 1 as ``key`` says, then waits."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hs = Handshake(key, ("127.0.0.1", 0), initiator=False)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, HandshakeError):
            (length,) = struct.unpack(">H", await reader.readexactly(2))
            reply = hs.receive(await reader.readexactly(length))
            assert reply is not None
            writer.write(encode_record(reply))
            await reader.read()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


@pytest.mark.parametrize("who", ["signed by another identity", "another peer"])
async def test_dialer_refuses_a_listener_that_is_not_the_expected_peer(
    endpoints: Make, caplog: pytest.LogCaptureFixture, who: str
) -> None:
    """We dial B. The listener either claims B's peer id with a static key that another
    identity signed (it has not got B's key), or is a genuine, different peer C."""
    b, c = Identity.generate(), Identity.generate()
    if who == "another peer":
        key = StaticKey.generate(c)
        reason = "but reached"
    else:
        private = X25519PrivateKey.generate()
        public = private.public_key().public_bytes_raw()
        key = StaticKey(b, private, public, c.sign(STATIC_KEY_CONTEXT + public))
        reason = "static key signature"
    server = await _impostor_listener(key)
    async with server:
        port = server.sockets[0].getsockname()[1]
        client = await endpoints(listen=False, config=TransportConfig(reconnect_attempts=0))
        with pytest.raises(PeerUnreachable):
            await client.transport.send(b.peer_id, ("127.0.0.1", port), b"for b only")
    assert warnings_about(caplog, reason), caplog.text
    assert client.transport.connected() == set()
    assert client.ups == []
