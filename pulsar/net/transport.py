"""The peer transport: one encrypted, authenticated TCP connection per peer, queues, dialing,
reconnect.

:class:`Transport` owns the per-peer state and every :class:`~pulsar.net.connection.Connection`.
Per peer it keeps one bounded FIFO of payloads not yet written, the connection in use, and
the address to dial. Frames are written from that FIFO to whichever connection is in use, so
they survive a reconnect or a duplicate-connection switch without being copied anywhere.

Writing is driven by events, not by a task per peer: a send appends to the queue and
schedules a flush for the end of the current event-loop iteration (so a burst of sends
becomes one write, and one read at the peer); the socket's "buffer drained" callback, a new
connection and a GOAWAY_ACK flush again. A flush writes as far as the socket takes it.

Back-pressure has three layers: the kernel socket buffers, asyncio's write buffer (paused
above its high-water mark, 64 KiB by default) and our per-peer queue of ``send_queue`` frames.
Only when all three are full does :meth:`Transport.send` wait, and
:meth:`Transport.send_nowait` refuse.

This module is the transport's public face and what its users call (sending, probing,
queries, disconnect, close); the parts it is made of are :mod:`pulsar.net.peer` (the
per-peer record and the write path), :mod:`pulsar.net.dialer` (dial bursts and single dials)
and :mod:`pulsar.net.registry` (the connections, which one each peer uses, up and down).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from dag import Identity, PeerId

from .config import TransportConfig, TransportStats
from .connection import Connection, ConnState
from .dialer import Dialer, DialFailed, fmt_address
from .errors import PeerUnreachable, TransportClosed
from .faults import FaultInjector
from .handshake import StaticKey
from .peer import Peer, PeerWriter
from .registry import ConnectionRegistry, PeerDownHandler, PeerUpHandler

__all__ = ["ConnectionInfo", "FrameHandler", "PeerDownHandler", "PeerUpHandler", "Transport"]

logger = logging.getLogger("pulsar.net")

FrameHandler = Callable[[PeerId, bytes], None]


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """An established connection, for diagnostics."""

    peer: PeerId
    local: tuple[str, int] | None
    remote: tuple[str, int] | None
    outbound: bool
    state: str
    """"open" (in use or about to be) or "retiring" (finishing its GOAWAY exchange)."""
    in_use: bool
    """Whether this is the connection the peer's frames are written to."""


class Transport:
    """Persistent, authenticated TCP connections to peers, carrying opaque frame payloads.

    ``on_frame(peer, payload)`` is called in the event loop for every payload received, in
    the order the peer sent them. ``on_peer_up(peer, address)`` is called when a peer gets a
    connection (after a verified handshake; ``address`` is where the peer listens: the
    observed IP and its advertised port, port 0 if it does not listen) and
    ``on_peer_down(peer)`` when it has none any more. Exceptions from the callbacks are
    logged and otherwise ignored.

    Use it as ``async with Transport(...) as t:`` or call :meth:`close`.
    """

    def __init__(
        self,
        identity: Identity,
        config: TransportConfig | None = None,
        *,
        on_frame: FrameHandler,
        on_peer_up: PeerUpHandler | None = None,
        on_peer_down: PeerDownHandler | None = None,
        faults: FaultInjector | None = None,
    ) -> None:
        self.identity = identity
        self.peer_id = identity.peer_id
        self.static_key = StaticKey.generate(identity)
        """Our Noise static key, signed by ``identity``. Fresh per transport, as in libp2p:
        the binding signature, not the key's age, ties it to the peer id."""
        self.config = config if config is not None else TransportConfig()
        self._queue_limit = self.config.send_queue
        self._max_frame = self.config.max_frame
        self.stats = TransportStats()
        self.faults = faults
        self._on_frame = on_frame
        self._peers: dict[PeerId, Peer] = {}
        self._server: asyncio.Server | None = None
        self._listen: tuple[str, int] | None = None
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None
        self._writer = PeerWriter(self)
        self._dialer = Dialer(self, self._writer)
        self._registry = ConnectionRegistry(self, self._peers, self._writer, self._dialer,
                                            on_peer_up=on_peer_up, on_peer_down=on_peer_down)

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- public API ------------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        """Accept connections on ``host``:``port`` (TCP; in a node, the same port number as
        its UDP DHT port). Port 0 picks a free port. Returns the bound address, which is
        also what our handshake payload advertises."""
        if self._closed:
            raise TransportClosed("transport is closed")
        if self._server is not None:
            raise RuntimeError("already listening")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self, outbound=False), host, port
        )
        name = self._server.sockets[0].getsockname()
        self._listen = (str(name[0]), int(name[1]))
        logger.info("%s listening on %s:%d", self.peer_id, *self._listen)
        return self._listen

    @property
    def listen_address(self) -> tuple[str, int] | None:
        return self._listen

    async def send(self, peer: PeerId, address: tuple[str, int] | None, payload: bytes) -> None:
        """Queue ``payload`` for ``peer``, dialing ``address`` (or the last known one) if
        there is no connection.

        Returns once the payload is queued or written, not when it is delivered. Waits while
        the peer's queue is full. Raises :class:`PeerUnreachable` when no connection could be
        made after the reconnect attempts, :class:`TransportClosed` after :meth:`close`, and
        ``ValueError`` for a payload over ``max_frame`` or a send to ourselves."""
        p = self._peers.get(peer)
        if (
            p is not None  # the common case, checked with as few steps as possible
            and p.conn is not None
            and (address is None or address == p.address)
            and len(p.queue) < self._queue_limit
            and len(payload) <= self._max_frame
            and not self._closed
        ):
            p.queue.append(payload)
            if not p.flush_scheduled:
                self._writer.flush_soon(p)
            return
        p = self._prepare(peer, address, payload)
        if self._closed:
            raise TransportClosed("transport is closed")
        await self._send_slow(p, payload)

    def send_nowait(self, peer: PeerId, address: tuple[str, int] | None, payload: bytes) -> bool:
        """Queue ``payload`` for ``peer`` without waiting.

        True when the payload was accepted: written, queued on the connection, or queued
        while a dial (started here if needed) is under way; such frames are discarded if the
        dial fails. False when it was not accepted: the queue is full, there is no connection
        and no address to dial, or the transport is closed. A False is never a partial
        success, so the caller may fall back to :meth:`send` without duplicating anything."""
        p = self._prepare(peer, address, payload)
        if self._closed:
            return False
        c = p.conn
        if len(p.queue) >= self.config.send_queue:
            self.stats.queue_full_rejects += 1
            return False
        if c is None:
            if p.address is None:
                return False
            self._dialer.ensure(p)
        p.queue.append(payload)
        self._writer.flush_soon(p)
        return True

    async def probe(self, host: str, port: int) -> PeerId:
        """The peer id proven by whoever listens at ``host``:``port``.

        Dials without knowing the peer in advance and runs the authenticated handshake; the
        connection is kept as that peer's connection (so it is ready for the traffic that
        usually follows). If a connected peer already has this verified listen address, no
        dial is made. One attempt, no retries. This is the DHT's ``PeerProver``: a peer id
        proven here maps to its Kademlia id ``sha1(peer id)``. Raises
        :class:`PeerUnreachable` (connection refused or timed out, handshake failed, the
        address is our own, or a partition)."""
        if self._closed:
            raise TransportClosed("transport is closed")
        address = (host, port)
        for p in self._peers.values():
            if p.up and p.conn is not None and p.conn.listen_address == address:
                return p.id
        try:
            conn = await self._dialer.open(address, None)
        except DialFailed as exc:
            self.stats.dial_failures += 1
            raise PeerUnreachable(
                f"cannot prove who listens at {fmt_address(address)}: {exc}") from None
        assert conn.peer is not None
        return conn.peer

    def connected(self) -> set[PeerId]:
        """Peers with a connection (between their on_peer_up and on_peer_down)."""
        return {p.id for p in self._peers.values() if p.up}

    def address_of(self, peer: PeerId) -> tuple[str, int] | None:
        """The verified listen address of a connected peer; None if not connected."""
        p = self._peers.get(peer)
        if p is None or not p.up or p.conn is None:
            return None
        return p.conn.listen_address

    def queued(self, peer: PeerId) -> int:
        """Frames waiting in the peer's queue (not yet handed to the socket)."""
        p = self._peers.get(peer)
        return len(p.queue) if p is not None else 0

    def connections(self, peer: PeerId | None = None) -> list[ConnectionInfo]:
        """Established connections (to ``peer``, or to everyone), for diagnostics."""
        if peer is None:
            peers = list(self._peers.values())
        else:
            peers = [self._peers[peer]] if peer in self._peers else []
        out: list[ConnectionInfo] = []
        for p in peers:
            for c in sorted(p.conns, key=lambda c: c.seq):
                if c.state in (ConnState.OPEN, ConnState.RETIRING):
                    out.append(ConnectionInfo(
                        p.id, c.local, c.remote, c.outbound, c.state.value, c is p.conn
                    ))
        return out

    async def disconnect(self, peer: PeerId) -> None:
        """Close our connections to ``peer`` gracefully: queued frames are written as far as
        the socket takes them without waiting (the rest are discarded), everything written is
        delivered before the GOAWAY exchange ends. The peer may connect again; this is not a
        block."""
        p = self._peers.get(peer)
        if p is None:
            return
        self._writer.flush(p)  # what the socket takes now still goes out, ahead of the GOAWAY
        self._writer.discard(p, "disconnect")
        if p.dialer is not None and not p.dialer.done():
            p.dialer.cancel()
            await asyncio.wait([p.dialer])
        conns = list(p.conns)
        for c in conns:
            self._registry.retire(p, c, "disconnect")
        await self._wait_closed(conns, self.config.drain_timeout)

    async def close(self) -> None:
        """Stop listening, close every connection and cancel every dial. Queued frames are
        written as far as the sockets take them without waiting, the rest discarded; what
        was written is flushed to the peers (a peer that does not read gets a reset
        instead). Pending sends raise :class:`TransportClosed`."""
        if self._close_done is not None:
            await asyncio.shield(self._close_done)
            return
        self._close_done = asyncio.get_running_loop().create_future()
        self._closed = True
        try:
            if self._server is not None:
                self._server.close()
            await self._dialer.stop()
            for p in self._peers.values():
                self._writer.flush(p)  # what the socket takes now still goes out
                self._writer.discard(p, "close")
            conns = list(self._registry.conns)
            for c in conns:
                if c.paused:
                    c.abort()  # its peer is not reading; a flush would never finish
                else:
                    c.close()
            await self._wait_closed(conns, self.config.drain_timeout)
            if self._server is not None:
                await self._server.wait_closed()
        finally:
            self._close_done.set_result(None)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    # --- sending ---------------------------------------------------------------------------

    def _prepare(self, peer: PeerId, address: tuple[str, int] | None, payload: bytes) -> Peer:
        if len(payload) > self.config.max_frame:
            raise ValueError(
                f"payload of {len(payload)} bytes exceeds max_frame ({self.config.max_frame})"
            )
        p = self._peers.get(peer)
        if p is None:
            if not isinstance(peer, PeerId):
                raise TypeError(f"peer must be a PeerId, got {type(peer).__name__}")
            if peer == self.peer_id:
                raise ValueError("cannot send to ourselves")
            p = self._peers[peer] = Peer(peer)
        if address is not None:
            p.address = address
        return p

    async def _send_slow(self, p: Peer, payload: bytes) -> None:
        while True:
            if self._closed:
                raise TransportClosed("transport is closed")
            if len(p.queue) < self._queue_limit:
                if p.conn is not None:
                    p.queue.append(payload)
                    self._writer.flush_soon(p)
                    return
                if p.address is None and (p.dialer is None or p.dialer.done()):
                    raise PeerUnreachable(f"no connection to {p.id} and no address to dial")
                # Queue first, then wait for the dial: frames keep the order of the calls,
                # and a failed dial discards this frame with the rest of the queue.
                p.queue.append(payload)
                await self._dialer.connect(p)
                return
            self.stats.queue_full_waits += 1
            failures = p.failures
            p.space.clear()
            await p.space.wait()
            if self._closed:
                raise TransportClosed("transport is closed")
            if p.failures != failures and p.conn is None:
                raise PeerUnreachable(f"{p.id} became unreachable")

    # --- closing -------------------------------------------------------------------------

    async def _wait_closed(self, conns: list[Connection], timeout: float) -> None:
        pending = [c.closed for c in conns if not c.closed.done()]
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout)
        if late:
            for c in conns:
                if not c.closed.done():
                    c.abort()
            await asyncio.wait(late)

    # --- ConnectionOwner: called by connections -----------------------------------------------

    def hello_listen(self) -> tuple[str, int]:
        return self._listen if self._listen is not None else ("", 0)

    def conn_made(self, conn: Connection) -> None:
        self._registry.made(conn)

    def conn_admit(self, conn: Connection, peer: PeerId) -> bool:
        return self.faults is None or self.faults.connect(self.peer_id, peer)

    def conn_established(self, conn: Connection) -> None:
        self._registry.established(conn)

    def conn_frame(self, conn: Connection, peer: PeerId, payload: bytes) -> None:
        faults = self.faults
        if faults is not None and not faults.incoming(peer, self.peer_id):
            self.stats.frames_dropped += 1
            return
        stats = self.stats
        stats.frames_received += 1
        stats.bytes_received += len(payload)
        try:
            self._on_frame(peer, payload)
        except Exception:
            logger.exception("on_frame failed for a frame from %s", peer)

    def conn_goaway(self, conn: Connection, flags: int) -> None:
        self._registry.goaway(conn, flags)

    def conn_acked(self, conn: Connection) -> None:
        assert conn.peer is not None
        p = self._peers.get(conn.peer)
        if p is not None:
            p.gates.discard(conn)
            self._writer.flush(p)

    def conn_writable(self, conn: Connection) -> None:
        assert conn.peer is not None
        p = self._peers.get(conn.peer)
        if p is not None and p.conn is conn:
            self._writer.flush(p)

    def conn_lost(self, conn: Connection) -> None:
        self._registry.lost(conn)
