"""Fault injection: the injector's decisions alone, then applied by real transports."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from dag import Identity
from pulsar.net import FaultInjector, PeerUnreachable, TransportConfig
from tests.waiting import eventually

from .conftest import Endpoint, seq, seqs

Make = Callable[..., Awaitable[Endpoint]]

A, B, C, D = (Identity.from_seed(bytes([i]) * 32).peer_id for i in range(1, 5))


# --- decisions ---------------------------------------------------------------------------------


def test_no_faults_by_default() -> None:
    faults = FaultInjector()
    assert all(faults.outgoing(A, B) == 0.0 for _ in range(100))
    assert faults.stats.dropped == 0


def test_drop_rate_is_seeded() -> None:
    first = FaultInjector(seed=7, drop_rate=0.3)
    second = FaultInjector(seed=7, drop_rate=0.3)
    a = [first.outgoing(A, B) is None for _ in range(1000)]
    b = [second.outgoing(A, B) is None for _ in range(1000)]
    assert a == b
    rng = random.Random(7)
    assert sum(a) == sum(rng.random() < 0.3 for _ in range(1000)) == first.stats.dropped_random


def test_partition_groups_and_the_rest() -> None:
    faults = FaultInjector()
    faults.partition([[A, B], [C]])
    assert faults.reachable(A, B)
    assert not faults.reachable(A, C)
    assert not faults.reachable(B, D)  # D is in "the rest"
    assert not faults.reachable(C, D)
    assert faults.outgoing(A, C) is None
    assert faults.stats.dropped_partition == 1
    assert not faults.connect(A, C)
    assert faults.stats.refused_connections == 1
    faults.heal()
    assert faults.reachable(A, C) and faults.outgoing(A, C) == 0.0
    with pytest.raises(ValueError, match="more than one"):
        faults.partition([[A], [A, B]])


def test_block_and_unblock() -> None:
    faults = FaultInjector()
    faults.block(B)
    assert not faults.reachable(A, B) and not faults.reachable(B, C)
    assert faults.reachable(A, C)
    assert faults.outgoing(B, A) is None
    assert not faults.incoming(B, A)
    assert faults.stats.dropped_blocked == 2
    faults.heal()  # heal is for partitions; a block stays
    assert not faults.reachable(A, B)
    faults.unblock(B)
    assert faults.reachable(A, B)


def test_latency_and_jitter() -> None:
    faults = FaultInjector(seed=1, latency=0.05, jitter=0.01)
    delays = [faults.outgoing(A, B) for _ in range(200)]
    assert all(d is not None and 0.05 <= d <= 0.06 for d in delays)
    assert len(set(delays)) > 100
    assert faults.stats.delayed == 200


@pytest.mark.parametrize(
    "kwargs",
    [{"drop_rate": 1.5}, {"drop_rate": -0.1}, {"latency": -1.0}, {"jitter": float("nan")}],
)
def test_settings_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FaultInjector(**kwargs)  # type: ignore[arg-type]


# --- applied by transports ---------------------------------------------------------------------


async def send_then_sentinel(src: Endpoint, dst: Endpoint, faults: FaultInjector, n: int) -> None:
    """Send ``n`` frames under the faults, then a sentinel with the faults off: once it
    arrives, every earlier frame that was going to arrive has (one connection, in order)."""
    for i in range(n):
        await src.transport.send(dst.peer_id, dst.address, seq(i))
    # Let the queue flush under the current settings before they change.
    await eventually(lambda: src.transport.queued(dst.peer_id) == 0, what="queue flushed")
    faults.drop_rate = 0.0
    faults.heal()
    await src.transport.send(dst.peer_id, dst.address, b"sentinel")
    await dst.wait(lambda: bool(dst.received[src.peer_id])
                   and dst.received[src.peer_id][-1] == b"sentinel")


async def test_drop_everything(endpoints: Make) -> None:
    faults = FaultInjector(seed=1, drop_rate=1.0)
    a = await endpoints(faults=faults)
    b = await endpoints()
    await send_then_sentinel(a, b, faults, 500)
    assert b.received[a.peer_id] == [b"sentinel"]
    assert faults.stats.dropped_random == 500
    assert a.transport.stats.frames_dropped == 500
    assert a.transport.connected() == {b.peer_id}  # the handshake was not touched


async def test_drop_half_deterministically(endpoints: Make) -> None:
    counts = []
    for _ in range(2):
        faults = FaultInjector(seed=42, drop_rate=0.5)
        a = await endpoints(faults=faults)
        b = await endpoints()
        await send_then_sentinel(a, b, faults, 2000)
        got = b.received[a.peer_id][:-1]
        assert seqs(got) == sorted(seqs(got))  # survivors keep their order
        counts.append(len(got))
        assert faults.stats.dropped_random + len(got) == 2000
    rng = random.Random(42)
    expected = sum(rng.random() >= 0.5 for _ in range(2000))
    assert counts == [expected, expected]
    assert 900 < expected < 1100


async def test_partition_and_heal(endpoints: Make) -> None:
    faults = FaultInjector()  # one injector for the whole "network"
    a = await endpoints(faults=faults)
    b = await endpoints(faults=faults)
    c = await endpoints(faults=faults, config=TransportConfig(reconnect_attempts=0))
    await a.transport.send(b.peer_id, b.address, b"before")
    await b.wait_frames(a.peer_id, 1)

    faults.partition([[a.peer_id], [b.peer_id, c.peer_id]])
    for i in range(100):
        await a.transport.send(b.peer_id, None, seq(i))  # dropped, both ways
        await b.transport.send(a.peer_id, None, seq(i))
    await b.transport.send(c.peer_id, c.address, b"same side")  # b and c can still talk
    assert await c.wait_frames(b.peer_id, 1) == [b"same side"]
    with pytest.raises(PeerUnreachable):  # no new connections across the cut
        await c.transport.send(a.peer_id, a.address, b"across")
    assert faults.stats.refused_connections >= 1

    faults.heal()
    await a.transport.send(b.peer_id, None, b"after")
    await b.transport.send(a.peer_id, None, b"after")
    assert await b.wait_frames(a.peer_id, 2) == [b"before", b"after"]
    assert await a.wait_frames(b.peer_id, 1) == [b"after"]
    assert faults.stats.dropped_partition == 200
    await c.transport.send(a.peer_id, a.address, b"across")
    assert await a.wait_frames(c.peer_id, 1) == [b"across"]


async def test_block_one_peer_on_one_side(endpoints: Make) -> None:
    """An injector on the receiving side only: a block still cuts both directions."""
    faults = FaultInjector()
    a = await endpoints()
    b = await endpoints(faults=faults)
    await a.transport.send(b.peer_id, b.address, b"1")
    await b.wait_frames(a.peer_id, 1)
    faults.block(a.peer_id)
    await a.transport.send(b.peer_id, None, b"2")  # dropped on arrival
    await b.transport.send(a.peer_id, None, b"3")  # dropped on departure
    await eventually(lambda: b.transport.stats.frames_dropped == 2, what="both dropped")
    faults.unblock(a.peer_id)
    await a.transport.send(b.peer_id, None, b"4")
    await b.transport.send(a.peer_id, None, b"5")
    assert await b.wait_frames(a.peer_id, 2) == [b"1", b"4"]
    assert await a.wait_frames(b.peer_id, 1) == [b"5"]
    assert faults.stats.dropped_blocked == 2


async def test_latency_delays_delivery_and_jitter_keeps_order(endpoints: Make) -> None:
    faults = FaultInjector(seed=3, latency=0.05, jitter=0.05)
    a = await endpoints(faults=faults)
    b = await endpoints()
    loop = asyncio.get_running_loop()
    await a.transport.send(b.peer_id, b.address, b"warm-up")  # connect (not delayed)
    await b.wait_frames(a.peer_id, 1)
    start = loop.time()
    for i in range(200):
        await a.transport.send(b.peer_id, None, seq(i))
    got = await b.wait_frames(a.peer_id, 201)
    assert loop.time() - start >= 0.05
    assert seqs(got[1:]) == list(range(200))
    assert faults.stats.delayed == 201
    # A graceful disconnect waits for the delayed frames: GOAWAY queues behind them.
    await a.transport.send(b.peer_id, None, b"last")
    await a.transport.disconnect(b.peer_id)
    assert b.received[a.peer_id][-1] == b"last"


async def test_jitter_with_reorder_delivers_everything(endpoints: Make) -> None:
    faults = FaultInjector(seed=5, jitter=0.05, reorder=True)
    a = await endpoints(faults=faults)
    b = await endpoints()
    for i in range(300):
        await a.transport.send(b.peer_id, b.address, seq(i))
    got = seqs(await b.wait_frames(a.peer_id, 300))
    assert sorted(got) == list(range(300))
    assert got != list(range(300))  # with this seed, some frames overtook others


async def test_long_partition_ends_in_a_keepalive_timeout(endpoints: Make) -> None:
    faults = FaultInjector()
    config = TransportConfig(idle_ping=0.02, dead_after=0.1)
    a = await endpoints(faults=faults, config=config)
    b = await endpoints(faults=faults, config=config)
    await a.transport.send(b.peer_id, b.address, b"x")
    await b.wait_frames(a.peer_id, 1)
    faults.partition([[a.peer_id]])
    await a.wait(lambda: a.downs == [b.peer_id])
    await b.wait(lambda: b.downs == [a.peer_id])
    assert faults.stats.dropped_control > 0
    assert a.transport.stats.keepalive_timeouts + b.transport.stats.keepalive_timeouts >= 1


async def test_inbound_handshake_refused_across_a_cut(
    endpoints: Make, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the listening side has an injector: it refuses the handshake itself."""
    faults = FaultInjector()
    server = await endpoints(faults=faults)
    client = await endpoints(config=TransportConfig(reconnect_attempts=0), listen=False)
    faults.block(client.peer_id)
    with pytest.raises(PeerUnreachable):
        await client.transport.send(server.peer_id, server.address, b"x")
    assert "cut off by fault injection" in caplog.text
    assert faults.stats.refused_connections == 1
    assert server.transport.stats.handshake_failures == 1
    faults.unblock(client.peer_id)
    await client.transport.send(server.peer_id, server.address, b"y")
    assert await server.wait_frames(client.peer_id, 1) == [b"y"]


def test_bandwidth_is_a_token_bucket_per_sender() -> None:
    """A sender's uplink serialises its frames at ``bandwidth``: holds grow with the
    backlog (to every peer), the first ``burst`` bytes go at once, and another sender's
    uplink is its own; latency comes on top."""
    faults = FaultInjector(bandwidth=1000.0, burst=0, latency=0.1)
    assert faults.outgoing(A, B, 100, now=0.0) == pytest.approx(0.2)
    assert faults.outgoing(A, C, 100, now=0.0) == pytest.approx(0.3)  # behind the first
    assert faults.outgoing(B, A, 100, now=0.0) == pytest.approx(0.2)  # B's own uplink
    assert faults.uplink_backlog(A, 0.05) == pytest.approx(0.15)
    assert faults.outgoing(A, B, 100, now=10.0) == pytest.approx(0.2)  # drained meanwhile
    assert faults.stats.shaped_bytes == 400
    burst = FaultInjector(bandwidth=1000.0, burst=200)
    assert burst.outgoing(A, B, 100, now=0.0) == 0.0
    assert burst.outgoing(A, B, 100, now=0.0) == 0.0
    assert burst.outgoing(A, B, 100, now=0.0) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        FaultInjector(bandwidth=0.0)


async def test_bandwidth_limit_slows_a_real_transfer(endpoints: Make) -> None:
    """Through real transports: 40 frames of 1 KiB at 100 KiB/s take about 0.4 s, in
    order."""
    faults = FaultInjector(bandwidth=100 * 1024, burst=0)
    a = await endpoints(faults=faults)
    b = await endpoints()
    loop = asyncio.get_running_loop()
    await a.transport.send(b.peer_id, b.address, b"warm-up")
    await b.wait_frames(a.peer_id, 1)
    start = loop.time()
    for i in range(40):
        await a.transport.send(b.peer_id, None, seq(i) + bytes(1024))
    got = await b.wait_frames(a.peer_id, 41)
    assert loop.time() - start >= 0.35
    assert seqs([f[: len(seq(0))] for f in got[1:]]) == list(range(40))
