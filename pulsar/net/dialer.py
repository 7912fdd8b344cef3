"""Dialing peers: bursts of attempts with backoff, and one attempt (TCP connect, handshake).

A send to a peer with no connection starts a *dial burst* (at most one per peer at a time):
1 + ``reconnect_attempts`` tries, 0.1 s apart and doubling. A burst that fails discards the
frames queued for the peer and tells its waiting senders. One attempt is a TCP connect
within ``connect_timeout`` and the authenticated handshake; the connection registers itself
with the transport when the handshake completes (:mod:`pulsar.net.registry`), so a dial
only waits for that and reports failure as :class:`DialFailed`.

It is apart from :mod:`pulsar.net.transport` because it is the one part that retries and
sleeps: it owns the dial tasks (cancelled by :meth:`Dialer.stop` when the transport closes)
and knows nothing of what is sent once a connection is up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from dag import PeerId

from .connection import Connection, TransportView
from .errors import PeerUnreachable, TransportClosed
from .peer import Peer, PeerWriter

__all__ = ["DialFailed", "Dialer", "fmt_address"]

logger = logging.getLogger("pulsar.net")


class DialFailed(Exception):
    """One dial attempt failed (internal; a burst of them becomes PeerUnreachable)."""


def fmt_address(address: tuple[str, int] | None) -> str:
    """``host:port`` for log lines and errors."""
    return f"{address[0]}:{address[1]}" if address is not None else "(no address)"


class Dialer:
    """The dials of one transport. Built by :class:`~pulsar.net.transport.Transport`, which
    owns the connections it opens; ``writer`` discards what a failed burst leaves queued."""

    def __init__(self, transport: TransportView, writer: PeerWriter) -> None:
        self._transport = transport
        self._writer = writer
        self._tasks: set[asyncio.Task[Any]] = set()

    def ensure(self, p: Peer) -> asyncio.Task[bool]:
        """Start a dial burst to ``p`` unless one is running; returns the one running."""
        if p.dialer is None or p.dialer.done():
            p.dialer = self._spawn(self._dial_burst(p))
        return p.dialer

    async def connect(self, p: Peer) -> None:
        """Wait for a dial burst to ``p`` (starting one if none is running)."""
        await asyncio.wait([self.ensure(p)])
        if self._transport.closed:
            raise TransportClosed("transport is closed")
        if p.conn is None:
            raise PeerUnreachable(f"cannot connect to {p.id} at {fmt_address(p.address)}")

    async def _dial_burst(self, p: Peer) -> bool:
        """Dial until connected: 1 + ``reconnect_attempts`` tries with exponential backoff.
        On failure, frames queued for the peer are discarded and waiting senders told."""
        transport = self._transport
        attempts = transport.config.reconnect_attempts + 1
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(0.1 * 2 ** (attempt - 1))
            if p.conn is not None:
                return True
            address = p.address
            if transport.closed or address is None:
                break
            try:
                await self._dial_once(p, address)
            except DialFailed as exc:
                transport.stats.dial_failures += 1
                logger.info("dial to %s at %s failed (attempt %d of %d): %s",
                            p.id, fmt_address(address), attempt + 1, attempts, exc)
                continue
            if p.conn is not None:
                return True
        if p.conn is not None:
            return True
        p.failures += 1
        if p.queue:
            logger.warning("%s is unreachable at %s", p.id, fmt_address(p.address))
        self._writer.discard(p, "peer unreachable")
        return False

    async def _dial_once(self, p: Peer, address: tuple[str, int]) -> None:
        transport = self._transport
        if transport.faults is not None and not transport.faults.connect(transport.peer_id, p.id):
            raise DialFailed("cut off by fault injection")
        await self.open(address, p.id)

    async def open(self, address: tuple[str, int], expected: PeerId | None) -> Connection:
        """One dial: TCP connect, then the handshake. The connection registers itself with
        the transport when its handshake completes; raises :class:`DialFailed` otherwise."""
        config = self._transport.config
        loop = asyncio.get_running_loop()
        conn = Connection(self._transport, outbound=True, expected=expected,
                          dial_address=address)
        try:
            async with asyncio.timeout(config.connect_timeout):
                await loop.create_connection(lambda: conn, address[0], address[1])
        except TimeoutError:
            raise DialFailed(f"connect timed out after {config.connect_timeout} s") from None
        except OSError as exc:
            raise DialFailed(str(exc) or type(exc).__name__) from None
        try:
            ok = await conn.handshake_result
        except BaseException:
            conn.abort()  # cancelled (disconnect, close): don't let it complete later
            raise
        if not ok:
            raise DialFailed(conn.failure or "handshake failed")
        return conn

    def _spawn(self, coro: Coroutine[Any, Any, bool]) -> asyncio.Task[bool]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        """Cancel every dial under way and wait until they are all done."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
