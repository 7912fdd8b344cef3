"""Caps on concurrent connections, per client address and in total, and the send-buffer
bound of each connection.

aiohttp has no connection limit of its own, so :class:`GuardedSite` listens like
``web.TCPSite`` but puts a thin protocol in front of each aiohttp request handler. When a
connection arrives over a cap it never reaches aiohttp: it gets a ``503`` problem document
(``unavailable``) with ``Connection: close``, its write side is shut, whatever it sends is
discarded, and it is closed after :data:`REFUSED_LINGER_S` (closing at once, with the
request unread, would make the kernel send a reset that can destroy the answer).

Each accepted transport's write buffer gets ``ServerLimits.write_buffer`` as its high-water
mark; aiohttp's ``StreamResponse.write`` waits (``drain``) while the buffer is above it, so a
client that stops reading stops the response that feeds it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from aiohttp import web

from .limits import ServerLimits
from .problems import PROBLEM_BASE, PROBLEM_TYPES

__all__ = ["GUARD_KEY", "ClientGone", "ConnectionGuard", "GuardedSite", "unless_client_gone"]

REFUSED_LINGER_S = 1.0

T = TypeVar("T")


def _refusal(detail: str) -> bytes:
    body = json.dumps({"type": PROBLEM_BASE + "unavailable",
                       "title": PROBLEM_TYPES["unavailable"], "status": 503,
                       "detail": detail}).encode() + b"\n"
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class ConnectionGuard:
    """Counts open connections per remote address; tells which to admit."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.per_client: Counter[str] = Counter()
        self.total = 0
        self.refused = 0
        self.transports: set[asyncio.Transport] = set()
        self._lost: dict[asyncio.Transport, asyncio.Future[None]] = {}

    def admit(self, client: str) -> str | None:
        """``None`` if a connection from ``client`` may open, else why not."""
        if self.total >= self.limits.max_connections:
            return (f"the API serves at most {self.limits.max_connections} connections; "
                    "try again later")
        if self.per_client[client] >= self.limits.max_connections_per_client:
            return (f"at most {self.limits.max_connections_per_client} connections per "
                    "client address; close some or try again later")
        return None

    def opened(self, client: str, transport: asyncio.Transport) -> None:
        self.per_client[client] += 1
        self.total += 1
        self.transports.add(transport)

    def closed(self, client: str, transport: asyncio.Transport) -> None:
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]
        self.total -= 1
        self.transports.discard(transport)
        lost = self._lost.pop(transport, None)
        if lost is not None and not lost.done():
            lost.set_result(None)

    def lost(self, transport: asyncio.Transport) -> asyncio.Future[None]:
        """A future done once ``transport``'s connection is closed (done already if it
        is): aiohttp does not cancel a handler whose client went away, so a handler that
        waits long (a consumer's fetch) races its wait against this."""
        future = self._lost.get(transport)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            if transport in self.transports:
                self._lost[transport] = future
            else:
                future.set_result(None)
        return future

    def buffered(self) -> int:
        """Bytes waiting in the send buffers of every open connection (for tests/metrics)."""
        return sum(t.get_write_buffer_size() for t in self.transports if not t.is_closing())

    def protocol(self, inner: asyncio.Protocol) -> asyncio.Protocol:
        return _Guarded(self, inner)


class _Guarded(asyncio.Protocol):
    """Forwards everything to aiohttp's handler, once admitted."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner: asyncio.Protocol | None = inner
        self._client = ""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport: no isinstance).
        transport = cast(asyncio.Transport, base)
        peer = transport.get_extra_info("peername")
        self._client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        refusal = self._guard.admit(self._client)
        if refusal is not None:
            self._inner = None
            self._guard.refused += 1
            transport.write(_refusal(refusal))
            if transport.can_write_eof():
                transport.write_eof()
            asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)
            return
        self._transport = transport
        self._guard.opened(self._client, transport)
        high = self._guard.limits.write_buffer
        transport.set_write_buffer_limits(high=high, low=high // 4)
        assert self._inner is not None
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return None  # a refused connection: close it

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            assert self._transport is not None
            self._guard.closed(self._client, self._transport)
            self._inner.connection_lost(exc)
            self._inner = None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GuardedSite(web.BaseSite):
    """``web.TCPSite`` with a :class:`ConnectionGuard` in front of every connection."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard,
                 *, backlog: int = 128) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self.guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def factory() -> Any:
            return self.guard.protocol(server())

        self._server = await loop.create_server(
            factory, self._host, self._port, backlog=self._backlog, reuse_address=True)


GUARD_KEY: web.AppKey[ConnectionGuard] = web.AppKey("connections", ConnectionGuard)
"""The server's :class:`ConnectionGuard` (absent where the app is served another way)."""


class ClientGone(Exception):
    """The client closed its connection while the handler waited."""


async def unless_client_gone(request: web.Request, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` until it is done or the request's client closes its connection; then
    ``work`` is cancelled and :class:`ClientGone` raised. A consumer's long poll must not
    go on after its client is gone: what it took then would be handed out to nobody and
    cost a delivery attempt."""
    guard = request.app.get(GUARD_KEY)
    transport = request.transport
    if guard is None or transport is None:
        return await work
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    waits: list[asyncio.Future[Any]] = [task, guard.lost(transport)]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # its end (cancelled), without raising it here
    raise ClientGone
