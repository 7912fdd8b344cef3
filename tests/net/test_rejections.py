"""Misbehaving peers, played by a hand-rolled client: each is refused with a log line, the
connection is closed, and the transport keeps serving everyone else."""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dag import Identity, encode
from pulsar.net import PeerUnreachable, TransportConfig
from pulsar.net.framing import Kind
from pulsar.net.handshake import Hello

from .conftest import Endpoint, RawPeer

Make = Callable[..., Awaitable[Endpoint]]
Raw = Callable[..., Awaitable[RawPeer]]


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


async def test_garbage_instead_of_hello(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # "GET " is a 1.2 GB length
    await raw.expect_closed()
    assert warnings_about(caplog, "oversized frame")
    assert server.transport.stats.handshake_failures == 1
    assert server.transport.stats.oversized_frames == 1
    await still_serving(server, endpoints)


async def test_garbage_frame_instead_of_hello(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_frame(b"\xff\xfe not cbor at all")
    await raw.expect_closed()
    assert warnings_about(caplog, "not canonical DAG-CBOR")
    await still_serving(server, endpoints)


async def test_garbage_before_a_valid_hello(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_raw(b"\x00\x00\x00\x02hi" + struct.pack(">I", 0) + raw.hello())
    await raw.expect_closed()
    assert warnings_about(caplog, "handshake rejected")
    assert server.transport.connected() == set()


def _hello_with(raw: RawPeer, **change: Any) -> bytes:
    msg: dict[str, Any] = {
        "v": 1, "peer": raw.peer_id.raw, "nonce": raw.nonce, "listen": ["127.0.0.1", 0],
    }
    msg.update(change)
    return encode({k: v for k, v in msg.items() if v is not None})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"v": 2}, "version 2"),
        ({"extra": "field"}, "unexpected ['extra']"),
        ({"nonce": None}, "missing ['nonce']"),
        ({"nonce": b"short"}, "'nonce' must be 32 bytes"),
        ({"peer": b"\x12\x20" + b"\x00" * 32}, "not a valid peer id"),
        ({"listen": ["127.0.0.1"]}, "'listen' must be"),
    ],
)
async def test_hello_with_a_wrong_field(
    endpoints: Make,
    raw_peers: Raw,
    caplog: pytest.LogCaptureFixture,
    change: dict[str, Any],
    reason: str,
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_frame(_hello_with(raw, **change))
    await raw.read_hello()  # the server speaks first-and-at-once, then hangs up on us
    await raw.expect_closed()
    assert warnings_about(caplog, reason), caplog.text
    assert server.transport.stats.handshake_failures == 1
    await still_serving(server, endpoints)


async def test_bad_auth_signature(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_frame(raw.hello())
    their = await raw.read_hello()
    # Signed by the wrong key (a peer claiming an id it does not hold).
    impostor = Identity.generate()
    forged = encode({"sig": impostor.sign(b"pulsarcast/handshake/v1" + their.nonce + raw.nonce
                                         + their.peer.raw)})
    await raw.send_frame(forged)
    await raw.expect_closed()
    assert warnings_about(caplog, "does not verify")
    assert raw.peer_id not in server.transport.connected()
    assert server.ups == []
    await still_serving(server, endpoints)


async def test_auth_with_a_malformed_signature(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    server = await endpoints()
    raw = await raw_peers(server.address)
    await raw.send_frame(raw.hello())
    await raw.read_hello()
    await raw.send_frame(encode({"sig": b"\x00" * 10}))
    await raw.expect_closed()
    assert warnings_about(caplog, "'sig' must be 64 bytes")


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
    await raw.send_raw(struct.pack(">I", 1002))  # payload 1001 + kind byte: over the limit
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
    hello = Hello(raw.peer_id, raw.nonce, ("203.0.113.9", 4242)).encode()
    raw.hello = lambda: hello  # type: ignore[method-assign]
    await raw.handshake()
    await server.wait(lambda: bool(server.ups))
    assert server.ups == [(raw.peer_id, ("127.0.0.1", 4242))]
