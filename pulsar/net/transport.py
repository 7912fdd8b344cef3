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
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

from dag import Identity, PeerId

from .config import TransportConfig, TransportStats
from .connection import Connection, ConnState
from .errors import PeerUnreachable, TransportClosed
from .faults import FaultInjector
from .framing import FLAG_ORPHAN
from .handshake import StaticKey
from .secure import MAX_RECORD_PLAINTEXT

__all__ = ["ConnectionInfo", "FrameHandler", "PeerDownHandler", "PeerUpHandler", "Transport"]

logger = logging.getLogger("pulsar.net")

FrameHandler = Callable[[PeerId, bytes], None]
PeerUpHandler = Callable[[PeerId, tuple[str, int]], None]
PeerDownHandler = Callable[[PeerId], None]

_BATCH_BYTES: Final = MAX_RECORD_PLAINTEXT - 4 * 1024
"""Frames are joined into writes of about this size when a queue is flushed: just under
one record, so a batch of small frames is sealed with one AEAD call (a batch exceeds this by
at most its last frame; larger frames are split into records anyway)."""
_DUPLICATE: Final = "duplicate connection"
_DATA_HEAD: Final = struct.Struct(">IB")  # length, kind: the head of a DATA frame


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


@dataclass(eq=False, slots=True)
class _Peer:
    """Everything the transport keeps per peer."""

    id: PeerId
    queue: deque[bytes] = field(default_factory=deque)
    """Payloads accepted but not yet written, oldest first."""
    conn: Connection | None = None
    """The connection frames go to (OPEN), or one finishing its GOAWAY exchange with no
    successor yet (RETIRING): the peer is "up" while this is set."""
    conns: set[Connection] = field(default_factory=set)
    """Every established connection to the peer, including retiring ones."""
    gates: set[Connection] = field(default_factory=set)
    """Retiring connections carrying our frames that the peer has not acknowledged: nothing
    is written to the successor until they are, so frames stay in order."""
    address: tuple[str, int] | None = None
    """Where to dial: the last address given to send() or that a handshake verified."""
    dialer: asyncio.Task[bool] | None = None
    space: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever senders waiting for room should look again."""
    failures: int = 0
    """Dial bursts that failed; lets waiting senders tell "room" from "unreachable"."""
    up: bool = False
    flush_scheduled: bool = False


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
        self._on_peer_up = on_peer_up
        self._on_peer_down = on_peer_down
        self._peers: dict[PeerId, _Peer] = {}
        self._conns: set[Connection] = set()  # every connection with a socket, any state
        self._pending = 0  # connections still in their handshake
        self._seq = 0
        self._server: asyncio.Server | None = None
        self._listen: tuple[str, int] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None

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
                self._flush_soon(p)
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
            if p.dialer is None or p.dialer.done():
                p.dialer = self._spawn(self._dial_burst(p))
        p.queue.append(payload)
        self._flush_soon(p)
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
            conn = await self._open(address, None)
        except _DialFailed as exc:
            self.stats.dial_failures += 1
            raise PeerUnreachable(f"cannot prove who listens at {_fmt(address)}: {exc}") from None
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
        self._flush(p)  # what the socket takes now still goes out, ahead of the GOAWAY
        self._discard(p, "disconnect")
        if p.dialer is not None and not p.dialer.done():
            p.dialer.cancel()
            await asyncio.wait([p.dialer])
        conns = list(p.conns)
        for c in conns:
            self._retire(p, c, "disconnect")
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
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)
            for p in self._peers.values():
                self._flush(p)  # what the socket takes now still goes out
                self._discard(p, "close")
            conns = list(self._conns)
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

    # --- sending ---------------------------------------------------------------------------

    def _prepare(self, peer: PeerId, address: tuple[str, int] | None, payload: bytes) -> _Peer:
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
            p = self._peers[peer] = _Peer(peer)
        if address is not None:
            p.address = address
        return p

    async def _send_slow(self, p: _Peer, payload: bytes) -> None:
        while True:
            if self._closed:
                raise TransportClosed("transport is closed")
            if len(p.queue) < self._queue_limit:
                if p.conn is not None:
                    p.queue.append(payload)
                    self._flush_soon(p)
                    return
                if p.address is None and (p.dialer is None or p.dialer.done()):
                    raise PeerUnreachable(f"no connection to {p.id} and no address to dial")
                # Queue first, then wait for the dial: frames keep the order of the calls,
                # and a failed dial discards this frame with the rest of the queue.
                p.queue.append(payload)
                await self._connect(p)
                return
            self.stats.queue_full_waits += 1
            failures = p.failures
            p.space.clear()
            await p.space.wait()
            if self._closed:
                raise TransportClosed("transport is closed")
            if p.failures != failures and p.conn is None:
                raise PeerUnreachable(f"{p.id} became unreachable")

    def _flush_soon(self, p: _Peer) -> None:
        """Flush at the end of this event-loop iteration: sends made in a burst (one loop
        iteration) go out in one write, and the receiver parses them from one read."""
        if not p.flush_scheduled:
            p.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_flush, p)

    def _scheduled_flush(self, p: _Peer) -> None:
        p.flush_scheduled = False
        self._flush(p)

    def _flush(self, p: _Peer) -> None:
        """Write queued frames to the peer's connection as far as the socket takes them."""
        queue = p.queue
        c = p.conn
        if not queue or c is None or not c.writable or p.gates:
            return
        faults = self.faults
        stats = self.stats
        pack = _DATA_HEAD.pack
        loop_time = asyncio.get_running_loop().time
        batch: list[bytes] = []
        size = 0
        sent = 0
        sent_bytes = 0
        while queue:
            payload = queue.popleft()
            frame = pack(len(payload) + 1, 0) + payload  # framing.encode_data, inlined
            if faults is not None:
                delay = faults.outgoing(self.peer_id, p.id, len(frame), loop_time())
                if delay is None:
                    stats.frames_dropped += 1
                    continue
                if delay > 0.0 or c.has_delayed:
                    if batch:
                        c.write_frames(batch)
                        batch, size = [], 0
                    c.write_delayed(frame, delay, reorder=faults.reorder)
                    sent += 1
                    sent_bytes += len(payload)
                    continue
            batch.append(frame)
            size += len(frame)
            sent += 1
            sent_bytes += len(payload)
            if size >= _BATCH_BYTES:
                c.write_frames(batch)
                batch, size = [], 0
                if c.paused:
                    break
        if batch:
            c.write_frames(batch)
        stats.frames_sent += sent
        stats.bytes_sent += sent_bytes
        if len(queue) < self._queue_limit:
            p.space.set()

    def _discard(self, p: _Peer, why: str) -> None:
        if p.queue:
            self.stats.frames_discarded += len(p.queue)
            logger.info("discarding %d frames queued for %s (%s)", len(p.queue), p.id, why)
            p.queue.clear()
        p.space.set()

    # --- dialing ---------------------------------------------------------------------------

    async def _connect(self, p: _Peer) -> None:
        """Wait for a dial burst to ``p`` (starting one if none is running)."""
        if p.dialer is None or p.dialer.done():
            p.dialer = self._spawn(self._dial_burst(p))
        await asyncio.wait([p.dialer])
        if self._closed:
            raise TransportClosed("transport is closed")
        if p.conn is None:
            raise PeerUnreachable(f"cannot connect to {p.id} at {_fmt(p.address)}")

    async def _dial_burst(self, p: _Peer) -> bool:
        """Dial until connected: 1 + ``reconnect_attempts`` tries with exponential backoff.
        On failure, frames queued for the peer are discarded and waiting senders told."""
        attempts = self.config.reconnect_attempts + 1
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(0.1 * 2 ** (attempt - 1))
            if p.conn is not None:
                return True
            address = p.address
            if self._closed or address is None:
                break
            try:
                await self._dial_once(p, address)
            except _DialFailed as exc:
                self.stats.dial_failures += 1
                logger.info("dial to %s at %s failed (attempt %d of %d): %s",
                            p.id, _fmt(address), attempt + 1, attempts, exc)
                continue
            if p.conn is not None:
                return True
        if p.conn is not None:
            return True
        p.failures += 1
        if p.queue:
            logger.warning("%s is unreachable at %s", p.id, _fmt(p.address))
        self._discard(p, "peer unreachable")
        return False

    async def _dial_once(self, p: _Peer, address: tuple[str, int]) -> None:
        if self.faults is not None and not self.faults.connect(self.peer_id, p.id):
            raise _DialFailed("cut off by fault injection")
        await self._open(address, p.id)

    async def _open(self, address: tuple[str, int], expected: PeerId | None) -> Connection:
        """One dial: TCP connect, then the handshake. The connection registers itself with
        us when its handshake completes; raises :class:`_DialFailed` otherwise."""
        loop = asyncio.get_running_loop()
        conn = Connection(self, outbound=True, expected=expected, dial_address=address)
        try:
            async with asyncio.timeout(self.config.connect_timeout):
                await loop.create_connection(lambda: conn, address[0], address[1])
        except TimeoutError:
            raise _DialFailed(f"connect timed out after {self.config.connect_timeout} s") from None
        except OSError as exc:
            raise _DialFailed(str(exc) or type(exc).__name__) from None
        try:
            ok = await conn.handshake_result
        except BaseException:
            conn.abort()  # cancelled (disconnect, close): don't let it complete later
            raise
        if not ok:
            raise _DialFailed(conn.failure or "handshake failed")
        return conn

    def _spawn(self, coro: Coroutine[Any, Any, bool]) -> asyncio.Task[bool]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
        self._conns.add(conn)
        self._pending += 1
        if self._closed:
            conn.abort()

    def conn_admit(self, conn: Connection, peer: PeerId) -> bool:
        return self.faults is None or self.faults.connect(self.peer_id, peer)

    def conn_established(self, conn: Connection) -> None:
        self._pending -= 1
        self.stats.connections_opened += 1
        peer = conn.peer
        assert peer is not None
        if self._closed:
            conn.close()
            return
        p = self._peers.get(peer)
        if p is None:
            p = self._peers[peer] = _Peer(peer)
        self._seq += 1
        conn.seq = self._seq
        p.conns.add(conn)
        if conn.outbound and conn.dial_address is not None:
            p.address = conn.dial_address
        elif conn.listen_address is not None and conn.listen_address[1]:
            p.address = conn.listen_address
        current = p.conn
        if current is None or current.state is not ConnState.OPEN:
            p.conn = conn
            if not p.up:
                self._up(p, conn)
        else:
            keep = self._preferred(current, conn)
            drop = conn if keep is current else current
            self.stats.duplicate_connections += 1
            logger.debug("two connections with %s; keeping the %s one",
                         peer, "outbound" if keep.outbound else "inbound")
            p.conn = keep
            self._retire(p, drop, _DUPLICATE)
        self._flush(p)

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
        assert conn.peer is not None
        p = self._peers.get(conn.peer)
        if p is None:
            return
        if conn.state is ConnState.OPEN:
            # The peer retired it first. Tell it whether we have any other way to reach it:
            # if not, the connection it kept instead is stale (see framing: ORPHAN).
            orphan = self._pending == 0 and not any(
                o is not conn and o.state is ConnState.OPEN for o in p.conns
            )
            self._retire(p, conn, "peer sent GOAWAY", FLAG_ORPHAN if orphan else 0)
        elif flags & FLAG_ORPHAN and conn.retire_reason == _DUPLICATE:
            kept = p.conn
            if kept is not None and kept is not conn and kept.state is ConnState.OPEN:
                logger.info("%s has no other connection to us: %s is stale, closing it",
                            conn.peer, kept.describe())
                kept.abort()

    def conn_acked(self, conn: Connection) -> None:
        assert conn.peer is not None
        p = self._peers.get(conn.peer)
        if p is not None:
            p.gates.discard(conn)
            self._flush(p)

    def conn_writable(self, conn: Connection) -> None:
        assert conn.peer is not None
        p = self._peers.get(conn.peer)
        if p is not None and p.conn is conn:
            self._flush(p)

    def conn_lost(self, conn: Connection) -> None:
        self._conns.discard(conn)
        if not conn.established:
            self._pending -= 1
            return
        assert conn.peer is not None
        p = self._peers.get(conn.peer)
        if p is None:
            return
        p.conns.discard(conn)
        p.gates.discard(conn)
        if p.conn is conn:
            p.conn = next((o for o in p.conns if o.state is ConnState.OPEN), None)
            if p.conn is None:
                self._down(p)
                if p.queue and not self._closed and (p.dialer is None or p.dialer.done()):
                    # Frames are waiting: reconnect without waiting for the next send.
                    p.dialer = self._spawn(self._dial_burst(p))
        self._flush(p)

    # --- helpers ---------------------------------------------------------------------------

    def _preferred(self, a: Connection, b: Connection) -> Connection:
        """Which of two open connections to the same peer to keep; both sides agree."""
        if a.outbound != b.outbound:
            # Dialed by different sides: keep the one dialed by the lower peer id.
            assert a.peer is not None
            we_are_lower = self.peer_id.raw < a.peer.raw
            return a if a.outbound == we_are_lower else b
        # Dialed by the same side, which only dials when it has no connection: the older
        # one is stale for it.
        return a if a.seq > b.seq else b

    def _retire(self, p: _Peer, conn: Connection, reason: str, flags: int = 0) -> None:
        if conn.state is not ConnState.OPEN:
            return
        if conn.data_out:
            p.gates.add(conn)
        conn.retire(flags, reason)

    def _up(self, p: _Peer, conn: Connection) -> None:
        p.up = True
        address = conn.listen_address or ("", 0)
        logger.info("peer %s up (%s, listens on %s)", p.id, conn.describe(), _fmt(address))
        if self._on_peer_up is not None:
            try:
                self._on_peer_up(p.id, address)
            except Exception:
                logger.exception("on_peer_up failed for %s", p.id)

    def _down(self, p: _Peer) -> None:
        if not p.up:
            return
        p.up = False
        logger.info("peer %s down", p.id)
        if self._on_peer_down is not None:
            try:
                self._on_peer_down(p.id)
            except Exception:
                logger.exception("on_peer_down failed for %s", p.id)


class _DialFailed(Exception):
    """One dial attempt failed (internal; a burst of them becomes PeerUnreachable)."""


def _fmt(address: tuple[str, int] | None) -> str:
    return f"{address[0]}:{address[1]}" if address is not None else "(no address)"
