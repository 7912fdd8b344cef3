"""One TCP connection to a peer: Noise handshake, encrypted frame I/O, keepalive, close.

A :class:`Connection` is an ``asyncio.Protocol``: the event loop calls it when bytes arrive
or the socket's write buffer fills, and it parses frames straight out of the received
chunks (no task per connection, no ``await`` per frame). It knows nothing about other
connections; everything that involves the peer as a whole (which connection is used, the
send queue, duplicate resolution, reconnects) belongs to its owner, the transport, which it
calls through the small :class:`ConnectionOwner` interface.

Lifecycle (``state``)::

    HANDSHAKE --peer verified--> OPEN --retire(), GOAWAY read--> RETIRING --GOAWAY done--> CLOSED
        |                          |                                |
        +--> CLOSED: rejected, handshake/keepalive/drain timeout, reset, abort(), close()

In OPEN the connection carries DATA in both directions; in RETIRING it sends no more DATA but
still delivers the peer's DATA until the peer's GOAWAY. The owner is told exactly once that
a connection is gone (``conn_lost``), from ``connection_lost``.

Bytes on the wire are records (:mod:`pulsar.net.secure`): the handshake's Noise messages,
then sealed pieces of the frame stream. Every write after the handshake, DATA and control
frames alike, is sealed at the moment it is handed to the socket (:meth:`Connection._write`,
:meth:`Connection.write_frames`), so records leave in nonce order whatever the fault
injector's delay line did to the frames; every record read is decrypted and authenticated
before a byte of it is parsed as a frame, and one that does not authenticate ends the
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import logging
import socket
from collections.abc import Callable
from typing import Final, Protocol, cast

from dag import Identity, PeerId

from .config import TransportConfig, TransportStats
from .errors import BadRecord, FrameTooLarge, HandshakeError, RemoteProtocolError
from .faults import FaultInjector
from .framing import HANDSHAKE_MAX_FRAME, FrameDecoder, Kind, encode_control
from .handshake import PROLOGUE, PROLOGUE_PLAINTEXT, Handshake, StaticKey
from .noise import CipherState, NoiseError
from .secure import MAX_RECORD, RecordDecoder, encode_record, seal

__all__ = ["ConnState", "Connection", "ConnectionOwner", "TransportView"]

logger = logging.getLogger("pulsar.net")

_DATA: Final = int(Kind.DATA)
_PING: Final = int(Kind.PING)
_PONG: Final = int(Kind.PONG)
_GOAWAY: Final = int(Kind.GOAWAY)
_GOAWAY_ACK: Final = int(Kind.GOAWAY_ACK)
_PING_FRAME: Final = encode_control(Kind.PING)
_PONG_FRAME: Final = encode_control(Kind.PONG)
_ACK_FRAME: Final = encode_control(Kind.GOAWAY_ACK)


class ConnState(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    RETIRING = "retiring"
    CLOSED = "closed"


class ConnectionOwner(Protocol):
    """What a connection needs from the transport that owns it."""

    @property
    def identity(self) -> Identity: ...
    @property
    def config(self) -> TransportConfig: ...
    @property
    def stats(self) -> TransportStats: ...
    @property
    def faults(self) -> FaultInjector | None: ...
    @property
    def static_key(self) -> StaticKey: ...

    def hello_listen(self) -> tuple[str, int]:
        """The listen address to advertise in our handshake payload."""

    def conn_made(self, conn: Connection) -> None:
        """TCP is up, the handshake starts."""

    def conn_admit(self, conn: Connection, peer: PeerId) -> bool:
        """Once the peer is authenticated, before we answer it: False refuses the peer
        (fault-injected partition)."""

    def conn_established(self, conn: Connection) -> None:
        """The handshake completed; ``conn.peer`` is authenticated."""

    def conn_frame(self, conn: Connection, peer: PeerId, payload: bytes) -> None:
        """A DATA payload arrived."""

    def conn_goaway(self, conn: Connection, flags: int) -> None:
        """The peer sent GOAWAY; the owner retires ``conn`` (choosing our flags) if it is
        still OPEN."""

    def conn_acked(self, conn: Connection) -> None:
        """The peer has delivered every DATA frame we sent on ``conn``."""

    def conn_writable(self, conn: Connection) -> None:
        """The socket's write buffer drained below its low-water mark."""

    def conn_lost(self, conn: Connection) -> None:
        """The connection is closed, whatever the reason; called once."""


class TransportView(ConnectionOwner, Protocol):
    """What the transport's own parts (the peer writer, the dialer, the connection
    registry) read of the transport that builds them: they are handed this view rather
    than the transport class, so none of them imports the module that imports them."""

    @property
    def peer_id(self) -> PeerId: ...
    @property
    def closed(self) -> bool: ...


class Connection(asyncio.Protocol):
    """One TCP connection, inbound or outbound, from handshake to close."""

    def __init__(
        self,
        owner: ConnectionOwner,
        *,
        outbound: bool,
        expected: PeerId | None = None,
        dial_address: tuple[str, int] | None = None,
    ) -> None:
        self._owner = owner
        self._config = owner.config
        self._loop = asyncio.get_running_loop()
        self.outbound = outbound
        self.dial_address = dial_address
        self.state = ConnState.HANDSHAKE
        self.closing = False
        """True once CLOSED (a plain flag: read once per frame on the hot path)."""
        self.established = False
        self.handshake = Handshake(
            owner.static_key,
            owner.hello_listen(),
            initiator=outbound,
            expected=expected,
            prologue=PROLOGUE if self._config.encrypt else PROLOGUE_PLAINTEXT,
        )
        self.records = RecordDecoder(HANDSHAKE_MAX_FRAME)
        self.decoder = FrameDecoder(self._config.max_frame + 1)
        self._send_cipher: CipherState | None = None
        self._recv_cipher: CipherState | None = None
        self._admitted = False
        self.peer: PeerId | None = None
        self.listen_address: tuple[str, int] | None = None
        self.remote: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self.seq = 0
        """Order in which the owner saw connections complete their handshakes."""
        self.paused = False
        self.data_out = 0
        """DATA frames written (or put on the delay line) on this connection."""
        self.goaway_sent = False
        self.goaway_received = False
        self.ack_received = False
        self.retire_reason = ""
        self.failure: str | None = None
        self.handshake_result: asyncio.Future[bool] = self._loop.create_future()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.last_rx = self._loop.time()
        self._last_ping = self.last_rx
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None  # handshake, keepalive or drain
        # Fault-injected delay line: a heap of (due, seq, frame, is_data).
        self._delayed: list[tuple[float, int, bytes, bool]] = []
        self._delay_seq = 0
        self._last_due = 0.0
        self._delay_timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                # Frames are written whole; don't let Nagle hold small ones back.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.remote = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self._owner.conn_made(self)
        if self.state is ConnState.CLOSED:  # the owner refused it (closing)
            return
        first = self.handshake.start()
        if first is not None:  # we dialed: the initiator speaks first
            self._write(encode_record(first))
        self._set_timer(self._config.handshake_timeout, self._handshake_expired)

    def data_received(self, data: bytes) -> None:
        if self.state is ConnState.CLOSED:
            return
        self.last_rx = self._loop.time()
        decoder = self.decoder
        try:
            recv = self._recv_cipher
            if recv is not None:  # the hot path
                for piece in self.records.open(data, recv):
                    decoder.feed(piece)
            elif self.established:  # encrypt=False (benchmark baseline, tests)
                decoder.feed(data)
            else:
                self._handshake_data(data)
            peer = self.peer
            if peer is None or self.closing:  # closed during or right after the handshake
                return
            deliver = self._owner.conn_frame
            while frames := decoder.frames():
                for body in frames:
                    if body and body[0] == _DATA and not self.goaway_received:
                        deliver(self, peer, body[1:])
                    else:
                        self._control(body)
                    if self.closing:  # a callback or a control frame closed us
                        return
            if self.records.error is not None:  # after the authentic frames before it
                raise self.records.error
        except FrameTooLarge as exc:
            self._owner.stats.oversized_frames += 1
            self._fail(f"oversized frame: {exc}")
        except HandshakeError as exc:
            self._fail(f"handshake rejected: {exc}")
        except BadRecord as exc:
            self._owner.stats.bad_records += 1
            self._fail(f"bad record: {exc}")
        except RemoteProtocolError as exc:
            self._owner.stats.protocol_errors += 1
            self._fail(f"protocol error: {exc}")
        except Exception:
            # A bug of ours must cost one connection, not the event loop.
            logger.exception("internal error on %s; closing it", self.describe())
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.state is ConnState.OPEN:
            self._owner.conn_writable(self)

    def connection_lost(self, exc: Exception | None) -> None:
        was_established = self.established
        self._shutdown()
        if not was_established:
            self._owner.stats.handshake_failures += 1
            if self.failure is None:
                logger.info(
                    "%s closed before the handshake completed%s",
                    self.describe(),
                    f" ({exc})" if exc else "",
                )
        else:
            self._owner.stats.connections_closed += 1
            if exc is not None and self.failure is None:
                logger.info("%s lost: %s", self.describe(), exc)
        if not self.handshake_result.done():
            self.handshake_result.set_result(False)
        self._owner.conn_lost(self)
        if not self.closed.done():
            self.closed.set_result(None)

    # --- writing, for the owner ------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """May DATA be written now (open, socket buffer not above its high-water mark)?"""
        return self.state is ConnState.OPEN and not self.paused

    @property
    def has_delayed(self) -> bool:
        return bool(self._delayed)

    def write_frames(self, frames: list[bytes]) -> None:
        """Write encoded DATA frames now, in one system call where the kernel allows."""
        self.data_out += len(frames)
        self._write(b"".join(frames) if len(frames) > 1 else frames[0])

    def write_delayed(self, frame: bytes, delay: float, *, reorder: bool) -> None:
        """Write an encoded DATA frame after ``delay`` seconds (fault injection). Unless
        ``reorder``, it is never written before a frame delayed earlier on this connection."""
        self.data_out += 1
        due = self._loop.time() + delay
        if not reorder:
            due = max(due, self._last_due)
        self._push_delayed(due, frame, is_data=True)

    def retire(self, flags: int, reason: str) -> None:
        """Stop sending DATA and send GOAWAY; the connection closes once the peer has
        answered (or the drain timeout expires)."""
        if self.state is not ConnState.OPEN:
            return
        self.state = ConnState.RETIRING
        self.retire_reason = reason
        self.goaway_sent = True
        self._send_ordered(encode_control(Kind.GOAWAY, bytes([flags])))
        self._set_timer(self._config.drain_timeout, self._drain_expired)
        self._maybe_finish()

    def close(self) -> None:
        """Close now: GOAWAY if it was open (so the peer knows it was deliberate), then FIN
        once the socket's buffer is flushed. Frames still on the delay line are lost."""
        if self.state is ConnState.CLOSED:
            return
        if self.state is ConnState.OPEN and self._control_allowed():
            self.goaway_sent = True
            self._write(encode_control(Kind.GOAWAY, b"\x00"))
        self._shutdown()
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close now, discarding anything unsent (RST). Also ends a graceful close that is
        stuck flushing to a peer that does not read."""
        self._shutdown()
        if self._transport is not None:
            self._transport.abort()

    def describe(self) -> str:
        direction = "connection to" if self.outbound else "connection from"
        where = f"{self.remote[0]}:{self.remote[1]}" if self.remote else "?"
        peer = self.peer or self.handshake.peer
        return f"{direction} {where}" + (f" ({peer})" if peer else "")

    # --- handshake -------------------------------------------------------------------------

    def _handshake_data(self, data: bytes) -> None:
        """Bytes read during the handshake: records one at a time (each may change the
        state); what follows the last one in the same read is the frame stream."""
        records = self.records
        records.feed(data)
        while self.state is ConnState.HANDSHAKE:
            message = records.next_record()
            if message is None:
                return
            self._handshake_message(message)
        if self.closing:  # refused, or a callback closed us
            return
        recv = self._recv_cipher
        for piece in [records.take_rest()] if recv is None else records.open(b"", recv):
            self.decoder.feed(piece)

    def _handshake_message(self, message: bytes) -> None:
        handshake = self.handshake
        reply = handshake.receive(message)
        peer = handshake.peer
        if peer is not None and not self._admitted:
            # Authenticated just now (initiator: message 2, responder: message 3); refuse
            # before answering, so the other side never takes the connection for accepted.
            if not self._owner.conn_admit(self, peer):
                raise HandshakeError(f"{peer} is cut off by fault injection")
            self._admitted = True
        if reply is not None:
            self._write(encode_record(reply))
        if handshake.done:
            self._established()

    def _established(self) -> None:
        their = self.handshake.their
        assert their is not None
        self.peer = their.peer
        host = self.remote[0] if self.remote else their.listen[0]
        self.listen_address = (host, their.listen[1])
        if self._config.encrypt:
            # From here on every write is sealed and every read opened (see _write).
            self._send_cipher, self._recv_cipher = self.handshake.ciphers()
            self.records.max_record = MAX_RECORD
        self.state = ConnState.OPEN
        self.established = True
        now = self._loop.time()
        self.last_rx = self._last_ping = now
        self._set_timer(self._config.idle_ping, self._keepalive)
        self._owner.conn_established(self)
        if not self.handshake_result.done():
            self.handshake_result.set_result(True)

    def _handshake_expired(self) -> None:
        self._timer = None
        if self.state is ConnState.HANDSHAKE:
            self._fail(f"handshake timed out after {self._config.handshake_timeout} s")

    # --- control frames --------------------------------------------------------------------

    def _control(self, body: bytes) -> None:
        if not body:
            raise RemoteProtocolError("empty frame")
        kind = body[0]
        if kind == _PING:
            _expect_len(body, 1, "PING")
            if self._control_allowed():
                self._write(_PONG_FRAME)
        elif kind == _PONG:
            _expect_len(body, 1, "PONG")
        elif kind == _GOAWAY:
            _expect_len(body, 2, "GOAWAY")
            if self.goaway_received:
                raise RemoteProtocolError("second GOAWAY")
            self.goaway_received = True
            self._owner.conn_goaway(self, body[1])
            if self.state is ConnState.OPEN:
                self.retire(0, "peer sent GOAWAY")
            if self.state is ConnState.CLOSED:
                return
            self._send_ordered(_ACK_FRAME)
            self._maybe_finish()
        elif kind == _GOAWAY_ACK:
            _expect_len(body, 1, "GOAWAY_ACK")
            if not self.goaway_sent or self.ack_received:
                raise RemoteProtocolError("GOAWAY_ACK without our GOAWAY")
            self.ack_received = True
            self._owner.conn_acked(self)
            self._maybe_finish()
        elif kind == _DATA:
            raise RemoteProtocolError("DATA after GOAWAY")
        else:
            raise RemoteProtocolError(f"unknown frame kind 0x{kind:02x}")

    def _maybe_finish(self) -> None:
        if (
            self.state is ConnState.RETIRING
            and self.goaway_received
            and self.ack_received
            and not self._delayed
        ):
            self._shutdown()
            if self._transport is not None:
                self._transport.close()  # flushes our GOAWAY_ACK first

    def _drain_expired(self) -> None:
        self._timer = None
        if self.state is ConnState.RETIRING:
            logger.info("%s did not finish its GOAWAY exchange in time; closing it",
                        self.describe())
            self.abort()

    def _keepalive(self) -> None:
        self._timer = None
        if self.state is not ConnState.OPEN:
            return
        cfg = self._config
        now = self._loop.time()
        idle = now - self.last_rx
        if idle >= cfg.dead_after:
            self._owner.stats.keepalive_timeouts += 1
            self.failure = "keepalive timeout"
            logger.warning("%s: nothing received for %.1f s; closing it", self.describe(), idle)
            self.abort()
            return
        if idle >= cfg.idle_ping and now - self._last_ping >= cfg.idle_ping:
            self._last_ping = now
            if self._control_allowed():
                self._owner.stats.keepalive_pings += 1
                self._write(_PING_FRAME)
        due = min(self.last_rx + cfg.dead_after, max(self.last_rx, self._last_ping) + cfg.idle_ping)
        self._timer = self._loop.call_at(max(due, now + 0.001), self._keepalive)

    # --- the delay line (fault injection) ---------------------------------------------------

    def _send_ordered(self, frame: bytes) -> None:
        """A control frame that must follow every DATA frame written so far (GOAWAY, ACK)."""
        if not self._control_allowed():
            return
        if self._delayed:
            self._push_delayed(self._last_due, frame, is_data=False)
        else:
            self._write(frame)

    def _push_delayed(self, due: float, frame: bytes, *, is_data: bool) -> None:
        self._last_due = max(self._last_due, due)
        self._delay_seq += 1
        heapq.heappush(self._delayed, (due, self._delay_seq, frame, is_data))
        if self._delayed[0][1] == self._delay_seq:  # new earliest: re-arm
            if self._delay_timer is not None:
                self._delay_timer.cancel()
            self._delay_timer = self._loop.call_at(due, self._release_delayed)

    def _release_delayed(self) -> None:
        self._delay_timer = None
        if self.state is ConnState.CLOSED:
            return
        now = self._loop.time()
        out: list[bytes] = []
        while self._delayed and self._delayed[0][0] <= now:
            out.append(heapq.heappop(self._delayed)[2])
        if out:
            self._write(b"".join(out))
        if self._delayed:
            self._delay_timer = self._loop.call_at(self._delayed[0][0], self._release_delayed)
        else:
            self._maybe_finish()

    # --- helpers ---------------------------------------------------------------------------

    def _control_allowed(self) -> bool:
        faults = self._owner.faults
        peer = self.peer
        if faults is None or peer is None:
            return True
        return faults.control(self._owner.identity.peer_id, peer)

    def _write(self, data: bytes) -> None:
        """Hand bytes to the socket. After the handshake they are frames, sealed into
        records here and nowhere else: the order of the nonces is the order of the writes,
        whatever was delayed or reordered before."""
        if self._transport is None or self.state is ConnState.CLOSED:
            return
        cipher = self._send_cipher
        stats = self._owner.stats
        if cipher is None:
            self._transport.write(data)
            stats.wire_bytes_sent += len(data)
            return
        try:
            record = seal(cipher, data)
        except NoiseError as exc:  # 2^64 - 1 records sent: the session must end
            self._fail(f"cannot send: {exc}")
            return
        self._transport.write(record)
        stats.wire_bytes_sent += len(record)

    def _set_timer(self, delay: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(delay, callback)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        logger.warning("%s: %s; closing it", self.describe(), reason)
        self.abort()

    def _shutdown(self) -> None:
        """Enter CLOSED: no more reads or writes, no timers."""
        self.state = ConnState.CLOSED
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        self._delayed.clear()


def _expect_len(body: bytes, length: int, what: str) -> None:
    if len(body) != length:
        raise RemoteProtocolError(f"{what} frame of {len(body)} bytes (expected {length})")


def _address(value: object) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
