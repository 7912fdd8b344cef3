"""Transports over real TCP on 127.0.0.1: delivery, ordering, duplicates, reconnect,
back-pressure, close."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings
from collections.abc import Awaitable, Callable

import pytest

from dag import Identity
from pulsar.net import PeerUnreachable, TransportClosed, TransportConfig
from tests.waiting import eventually

from .conftest import FAST, Endpoint, RawPeer, seq, seqs

Make = Callable[..., Awaitable[Endpoint]]
Raw = Callable[..., Awaitable[RawPeer]]


async def test_ten_thousand_frames_arrive_in_order(endpoints: Make) -> None:
    a = await endpoints()
    b = await endpoints()
    assert b.address is not None
    await a.transport.send(b.peer_id, b.address, seq(0))
    for i in range(1, 10_000):
        await a.transport.send(b.peer_id, None, seq(i))
    got = await b.wait_frames(a.peer_id, 10_000)
    assert seqs(got) == list(range(10_000))
    assert a.transport.stats.frames_sent == 10_000
    assert b.transport.stats.frames_received == 10_000
    assert b.transport.stats.bytes_received == 40_000


async def test_peer_up_reports_the_verified_listen_address(endpoints: Make) -> None:
    a = await endpoints()
    b = await endpoints()
    assert a.address is not None and b.address is not None
    await a.transport.send(b.peer_id, b.address, b"hi")
    await b.wait_frames(a.peer_id, 1)
    # b learns where a listens (observed IP, advertised port), though a dialed from another
    # port; a learns b's address from its own dial.
    assert b.ups == [(a.peer_id, a.address)]
    assert a.ups == [(b.peer_id, b.address)]
    assert b.transport.address_of(a.peer_id) == a.address
    assert a.transport.connected() == {b.peer_id}
    assert b.transport.connected() == {a.peer_id}
    # The frame flows back over the same connection, no address needed.
    await b.transport.send(a.peer_id, None, b"back")
    assert await a.wait_frames(b.peer_id, 1) == [b"back"]
    assert len(a.transport.connections()) == len(b.transport.connections()) == 1


async def test_ten_peers_all_to_all(endpoints: Make) -> None:
    peers = [await endpoints() for _ in range(10)]
    per_pair = 100

    async def pump(src: Endpoint) -> None:
        for i in range(per_pair):
            for dst in peers:
                if dst is not src:
                    await src.transport.send(dst.peer_id, dst.address, seq(i))

    await asyncio.gather(*(pump(p) for p in peers))
    for dst in peers:
        for src in peers:
            if src is not dst:
                got = await dst.wait_frames(src.peer_id, per_pair)
                assert seqs(got) == list(range(per_pair)), (src.peer_id, dst.peer_id)
    for p in peers:
        await eventually(lambda p=p: len(p.transport.connections()) == 9, what="9 connections")
        assert p.transport.connected() == {q.peer_id for q in peers if q is not p}


@pytest.mark.parametrize("lower_first", [True, False])
async def test_simultaneous_dial_keeps_one_connection_and_loses_nothing(
    endpoints: Make, lower_first: bool
) -> None:
    ids = sorted((Identity.generate() for _ in range(2)), key=lambda i: i.peer_id.raw)
    if not lower_first:
        ids.reverse()
    a = await endpoints(identity=ids[0])
    b = await endpoints(identity=ids[1])
    n = 3000

    async def pump(src: Endpoint, dst: Endpoint) -> None:
        for i in range(n):
            await src.transport.send(dst.peer_id, dst.address, seq(i))

    await asyncio.gather(pump(a, b), pump(b, a))
    assert seqs(await a.wait_frames(b.peer_id, n)) == list(range(n))
    assert seqs(await b.wait_frames(a.peer_id, n)) == list(range(n))

    def settled() -> bool:
        return len(a.transport.connections()) == len(b.transport.connections()) == 1

    await eventually(settled, what="one connection per side")
    (ca,) = a.transport.connections()
    (cb,) = b.transport.connections()
    assert ca.local == cb.remote and ca.remote == cb.local  # the same TCP connection
    assert ca.outbound != cb.outbound
    lower = a if a.peer_id.raw < b.peer_id.raw else b
    kept_by = a if ca.outbound else b
    assert kept_by is lower  # the one dialed by the lower peer id
    # Both dialed, both saw two connections and retired the same one.
    assert a.transport.stats.duplicate_connections == 1
    assert b.transport.stats.duplicate_connections == 1
    assert a.ups == [(b.peer_id, b.address)] and a.downs == []
    await asyncio.sleep(0)
    assert len(a.received[b.peer_id]) == n  # and no frame twice


@pytest.mark.parametrize("a_is_lower", [True, False])
async def test_stale_connection_is_replaced_when_the_peer_comes_back(
    endpoints: Make, caplog: pytest.LogCaptureFixture, a_is_lower: bool
) -> None:
    """B restarts (same identity, new process) while A's connection to the old process
    still looks alive. When A is the lower id, the tie-break alone would keep that stale
    connection (A dialed it); the ORPHAN flag tells A to drop it instead of waiting for the
    keepalive."""
    caplog.set_level(logging.INFO, logger="pulsar.net")
    ids = sorted((Identity.generate() for _ in range(2)), key=lambda i: i.peer_id.raw)
    if not a_is_lower:
        ids.reverse()
    a = await endpoints(identity=ids[0])
    old_b = await endpoints(identity=ids[1])
    new_b = await endpoints(identity=ids[1], listen=False)
    assert a.address is not None
    await a.transport.send(old_b.peer_id, old_b.address, b"hello old")  # A dials
    await old_b.wait_frames(a.peer_id, 1)
    await old_b.transport.send(a.peer_id, None, b"old")
    await a.wait_frames(old_b.peer_id, 1)

    await new_b.transport.send(a.peer_id, a.address, b"new-1")
    await a.wait_frames(new_b.peer_id, 2)
    await old_b.wait(lambda: old_b.downs == [a.peer_id])  # the stale one is gone
    await new_b.transport.send(a.peer_id, a.address, b"new-2")
    assert await a.wait_frames(new_b.peer_id, 3) == [b"old", b"new-1", b"new-2"]
    await eventually(lambda: len(a.transport.connections()) == 1, what="one connection")
    if a_is_lower:
        assert "is stale" in caplog.text


async def test_reconnect_after_the_remote_restarts_on_the_same_port(endpoints: Make) -> None:
    config = TransportConfig(reconnect_attempts=6, handshake_timeout=2, connect_timeout=2)
    a = await endpoints(config=config)
    b = await endpoints()
    address = b.address
    assert address is not None
    await a.transport.send(b.peer_id, address, b"one")
    await b.wait_frames(a.peer_id, 1)

    await b.transport.close()
    await a.wait(lambda: a.downs == [b.peer_id])
    assert a.transport.connected() == set()

    # Nobody listens now: the send keeps dialing with backoff; frames queued meanwhile stay.
    sending = asyncio.create_task(a.transport.send(b.peer_id, address, b"two"))
    await eventually(lambda: a.transport.stats.dial_failures >= 1, what="a failed dial")
    assert a.transport.send_nowait(b.peer_id, None, b"three")
    assert a.transport.queued(b.peer_id) == 2

    restarted = await endpoints(identity=b.identity, listen=False)
    await restarted.listen(address[1])
    await asyncio.wait_for(sending, 5)
    assert await restarted.wait_frames(a.peer_id, 2) == [b"two", b"three"]
    assert a.ups[-1] == (b.peer_id, address)


async def test_unreachable_peer_raises_after_the_retries(endpoints: Make) -> None:
    a = await endpoints(config=TransportConfig(reconnect_attempts=1, connect_timeout=1))
    b = await endpoints()
    address = b.address
    assert address is not None
    await b.transport.close()
    with pytest.raises(PeerUnreachable):
        await a.transport.send(b.peer_id, address, b"x")
    assert a.transport.stats.dial_failures == 2
    assert a.transport.queued(b.peer_id) == 0
    assert isinstance(PeerUnreachable(), ConnectionError)
    with pytest.raises(PeerUnreachable, match="no address"):
        await a.transport.send(Identity.generate().peer_id, None, b"x")


async def test_send_argument_errors(endpoints: Make) -> None:
    a = await endpoints(config=TransportConfig(max_frame=100))
    b = await endpoints()
    with pytest.raises(ValueError, match="max_frame"):
        await a.transport.send(b.peer_id, b.address, b"x" * 101)
    with pytest.raises(ValueError, match="max_frame"):
        a.transport.send_nowait(b.peer_id, b.address, b"x" * 101)
    with pytest.raises(ValueError, match="ourselves"):
        await a.transport.send(a.peer_id, a.address, b"x")
    await a.transport.send(b.peer_id, b.address, b"x" * 100)  # exactly max_frame is fine
    assert await b.wait_frames(a.peer_id, 1) == [b"x" * 100]


async def test_back_pressure_on_a_peer_that_does_not_read(endpoints: Make, raw_peers: Raw) -> None:
    a = await endpoints(config=TransportConfig(send_queue=4, drain_timeout=0.5))
    assert a.address is not None
    raw = await raw_peers(a.address)
    await raw.handshake()
    await a.wait(lambda: raw.peer_id in a.transport.connected())
    # raw reads nothing more: kernel buffers fill, then asyncio's, then our queue of 4.
    payload = bytes(64 * 1024)
    sent = 0
    blocked: asyncio.Task[None] | None = None
    for _ in range(5000):
        task = asyncio.create_task(a.transport.send(raw.peer_id, None, payload))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if not task.done():
            blocked = task
            break
        sent += 1
    assert blocked is not None, "send() never waited"
    assert a.transport.stats.queue_full_waits == 1
    assert a.transport.queued(raw.peer_id) == 4
    assert a.transport.send_nowait(raw.peer_id, None, payload) is False
    assert a.transport.stats.queue_full_rejects == 1
    # Once the peer reads, the waiting send goes through and everything arrives.
    for _ in range(sent + 1):
        assert await raw.read_data() == payload
    await asyncio.wait_for(blocked, 5)


async def test_send_nowait(endpoints: Make) -> None:
    a = await endpoints(config=TransportConfig(send_queue=2))
    b = await endpoints()
    stranger = Identity.generate().peer_id
    assert a.transport.send_nowait(stranger, None, b"x") is False  # no connection, no address
    # Not connected but an address: accepted, queued while the dial runs.
    assert a.transport.send_nowait(b.peer_id, b.address, b"1")
    assert a.transport.send_nowait(b.peer_id, None, b"2")
    assert a.transport.send_nowait(b.peer_id, None, b"3") is False  # queue of 2 is full
    assert await b.wait_frames(a.peer_id, 2) == [b"1", b"2"]
    assert a.transport.send_nowait(b.peer_id, None, b"4")
    assert await b.wait_frames(a.peer_id, 3) == [b"1", b"2", b"4"]


async def test_disconnect_is_graceful(endpoints: Make) -> None:
    a = await endpoints()
    b = await endpoints()
    for i in range(500):
        await a.transport.send(b.peer_id, b.address, seq(i))
    await a.transport.disconnect(b.peer_id)
    # Everything written before the disconnect was delivered.
    assert seqs(b.received[a.peer_id]) == list(range(500))
    assert a.downs == [b.peer_id]
    await b.wait(lambda: b.downs == [a.peer_id])
    assert a.transport.connected() == set() == b.transport.connected()
    # And the peers can talk again.
    await b.transport.send(a.peer_id, None, b"again")
    assert await a.wait_frames(b.peer_id, 1) == [b"again"]


async def test_keepalive_closes_a_silent_peer(
    endpoints: Make, raw_peers: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    config = TransportConfig(idle_ping=0.05, dead_after=0.3)
    a = await endpoints(config=config)
    assert a.address is not None
    raw = await raw_peers(a.address)
    await raw.handshake()
    # A peer that answers PINGs stays connected well past dead_after...
    answered = 0
    while answered < 8:  # 8 x 0.05 s > dead_after of silence otherwise
        body = await raw.read_frame()
        assert body == b"\x01"  # PING
        await raw.send_kind(0x02)
        answered += 1
    assert raw.peer_id in a.transport.connected()
    # ...one that stops answering is dropped.
    await raw.expect_closed()
    await a.wait(lambda: a.downs == [raw.peer_id])
    assert a.transport.stats.keepalive_timeouts == 1
    assert "nothing received" in caplog.text


async def test_keepalive_keeps_an_idle_pair_connected(endpoints: Make) -> None:
    config = TransportConfig(idle_ping=0.03, dead_after=0.25)
    a = await endpoints(config=config)
    b = await endpoints(config=config)
    await a.transport.send(b.peer_id, b.address, b"x")
    await b.wait_frames(a.peer_id, 1)
    # Idle for longer than dead_after (12 PINGs 0.03 s apart), yet still connected.
    await eventually(lambda: a.transport.stats.keepalive_pings >= 12, what="12 pings")
    assert a.transport.connected() == {b.peer_id}
    assert b.transport.connected() == {a.peer_id}
    assert a.transport.stats.keepalive_timeouts == 0


async def test_close_leaves_nothing_behind(endpoints: Make) -> None:
    a = await endpoints(config=TransportConfig(send_queue=1, reconnect_attempts=8))
    b = await endpoints()
    await a.transport.send(b.peer_id, b.address, b"x")
    await b.wait_frames(a.peer_id, 1)
    # A send stuck dialing a dead address, to be cut short by close().
    dead = await endpoints()
    dead_address = dead.address
    await dead.transport.close()
    stuck = asyncio.create_task(a.transport.send(dead.peer_id, dead_address, b"y"))
    await eventually(lambda: a.transport.stats.dial_failures >= 1, what="a failed dial")

    await a.transport.close()
    await a.transport.close()  # idempotent
    with pytest.raises(TransportClosed):
        await stuck
    with pytest.raises(TransportClosed):
        await a.transport.send(b.peer_id, b.address, b"z")
    assert a.transport.send_nowait(b.peer_id, None, b"z") is False
    await b.wait(lambda: b.downs == [a.peer_id])
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert a.transport.connected() == set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_callback_errors_do_not_break_the_connection(
    endpoints: Make, caplog: pytest.LogCaptureFixture
) -> None:
    b = await endpoints()
    calls = 0

    def boom(peer: object, payload: bytes) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("application bug")

    b.transport._on_frame = boom
    a = await endpoints()
    await a.transport.send(b.peer_id, b.address, b"1")
    await a.transport.send(b.peer_id, None, b"2")
    await eventually(lambda: calls == 2, what="both frames")
    assert b.transport.connected() == {a.peer_id}
    assert "on_frame failed" in caplog.text


async def test_probe_proves_who_listens(endpoints: Make) -> None:
    a = await endpoints()
    b = await endpoints()
    assert b.address is not None and a.address is not None
    assert await a.transport.probe(*b.address) == b.peer_id
    assert a.transport.connected() == {b.peer_id}
    assert await a.transport.probe(*b.address) == b.peer_id  # no second dial
    assert a.transport.stats.connections_opened == 1
    with pytest.raises(PeerUnreachable, match="connection to self"):
        await a.transport.probe(*a.address)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        TransportConfig(max_frame=0)
    with pytest.raises(ValueError):
        TransportConfig(send_queue=0)
    with pytest.raises(ValueError):
        TransportConfig(idle_ping=10, dead_after=5)
    with pytest.raises(ValueError):
        TransportConfig(connect_timeout=0)
    assert FAST.reconnect_attempts == 2
