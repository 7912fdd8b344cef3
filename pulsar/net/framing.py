"""Framing of the peer transport: sans-I/O encoder and decoder, and the wire format notes.

Wire format (transport v2)
==========================

These notes and ``docs/protocol.md`` §2 describe the same format; the code below, in
:mod:`pulsar.net.secure` (records) and in :mod:`pulsar.net.handshake` (the Noise XX
handshake) follows them exactly.

Connection
----------
Pulsarcast peers talk over persistent TCP connections. A node listens on the **same port
number** as its UDP Kademlia port, so one (host, port) names a node for both the DHT and the
pub-sub protocol. There is at most one connection per pair of peers, carrying every topic
(see "Duplicate connections" below). Every byte on a connection is inside a *record* (a
2-byte length and one Noise message): first the three handshake messages and the
listener's empty confirmation, then records sealing pieces of the frame stream
(:mod:`pulsar.net.secure`).

Frames
------
After the handshake each direction carries a stream of frames, cut into records anywhere
(a record may hold many frames or a piece of one). Every frame is::

    +--------------------------------+---------------------------+
    | length: uint32, big-endian     | body: exactly length bytes |
    +--------------------------------+---------------------------+

No padding, no checksum (each record's AEAD tag authenticates it), no trailer. A receiver
reads the 4-byte prefix and compares it with its limit, ``max_frame + 1`` bytes (``max_frame``,
default 1 MiB, is the largest payload and the ``+ 1`` the kind byte), *before* buffering the
body; a prefix above the limit closes the connection (and is logged). During the handshake
records are limited to :data:`HANDSHAKE_MAX_FRAME` (1024) bytes, so an unauthenticated peer
cannot make us buffer more than about 1 KiB.

Handshake
---------
``Noise_XX_25519_ChaChaPoly_SHA256`` with prologue ``b"pulsarcast/transport/2"``; the
dialer is the initiator. Messages 2 and 3 carry the sender's payload, a canonical DAG-CBOR
map ``{"peer": peer id, "sig": Ed25519 signature of b"noise-libp2p-static-key:" || X25519
static public key, "listen": [host, port]}``: the identity binding of libp2p's Noise spec.
The listener answers an accepted message 3 with an empty transport record; the dialer is
done once it has decrypted it. The details, and every reason a handshake is refused, are in
:mod:`pulsar.net.handshake` and ``docs/protocol.md`` §2.3.

The address recorded for a peer is the *observed* IP address of the TCP connection with
the *advertised* listen port: the same address the DHT learns from a UDP datagram's source,
and one that a peer cannot point at a third party's host.

Frames after the handshake
--------------------------
Every later frame body starts with one **kind** byte::

    kind  name         rest of the body
    0x00  DATA         the payload: opaque bytes (one DAG-CBOR message of the protocol layer)
    0x01  PING         empty; the receiver answers PONG
    0x02  PONG         empty
    0x03  GOAWAY       1 byte of flags; bit 0 (ORPHAN): "I have no other connection to you"
    0x04  GOAWAY_ACK   empty

An unknown kind, an empty body, or a control frame with a malformed rest closes the
connection. A kind byte rather than a field inside the payload keeps payloads opaque (the
transport never decodes them) and lets control frames be recognised with one comparison.

*Keepalive.* A side that has received nothing for ``idle_ping`` seconds (default 15) sends
PING; one that has received nothing for ``dead_after`` seconds (default 45) closes the
connection.

*Graceful close (GOAWAY).* A side retiring a connection sends GOAWAY after its last DATA
frame and sends no DATA after it. A side reading GOAWAY retires the connection too (if it
had not), then answers GOAWAY_ACK, which therefore means "every DATA frame you sent here has
been delivered". A side closes the TCP connection once it has sent GOAWAY, read the peer's
GOAWAY and read the peer's GOAWAY_ACK, or when the drain timeout (default 5 s) expires.

*Duplicate connections.* When a second connection between the same two peers completes its
handshake (both dialed at once, or one side re-dialed), each side keeps, independently and
with the same result:

* if the two were dialed by different sides: the one dialed by the peer whose peer id bytes
  are lower;
* if both were dialed by the same side: the newer one (a peer only dials when it has no
  connection, so the older one is stale from its point of view).

The other one is retired with GOAWAY. A sender moves its not-yet-written frames to the kept
connection but writes nothing there until the retired connection's GOAWAY_ACK has arrived
(or the retired connection has died), so frames are delivered in order across the switch and
none written to the retired connection is lost. A side that reads GOAWAY on a connection
while it has no other open connection to that peer and no handshake in progress answers with
ORPHAN set; the side that retired the connection in favour of another then knows the other
one is stale (the peer restarted) and closes it, instead of waiting for the keepalive.

Ordering and loss
-----------------
DATA frames from one peer are delivered in the order they were sent, across reconnects and
duplicate-connection switches. Delivery is at most once: a frame is lost only when the
connection it was written to dies (the transport cannot know what the peer read) or by fault
injection. Frames still queued when a connection dies are written to the next connection;
they are discarded when the peer stays unreachable after the reconnect attempts.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

from .errors import FrameTooLarge

__all__ = [
    "FLAG_ORPHAN",
    "HANDSHAKE_MAX_FRAME",
    "LENGTH_PREFIX",
    "MAX_FRAME_LIMIT",
    "FrameDecoder",
    "Kind",
    "encode_control",
    "encode_data",
    "encode_frame",
]

LENGTH_PREFIX: Final = 4
"""Bytes of the big-endian length prefix in front of every frame."""

HANDSHAKE_MAX_FRAME: Final = 1024
"""Largest record accepted during the handshake. The largest, message 2, is 32 + 48 + 16
bytes of Noise plus a payload of about 120 bytes and the host name (at most 255), so this is
generous while keeping unauthenticated peers from costing memory."""

MAX_FRAME_LIMIT: Final = (1 << 32) - 2
"""The largest ``max_frame`` the 32-bit length prefix can express (payload + kind byte)."""

FLAG_ORPHAN: Final = 0x01
"""GOAWAY flag: "I have no other connection to you" (see the duplicate-connection rules)."""


class Kind(enum.IntEnum):
    """The first byte of every frame body after the handshake."""

    DATA = 0x00
    PING = 0x01
    PONG = 0x02
    GOAWAY = 0x03
    GOAWAY_ACK = 0x04


_LEN: Final = struct.Struct(">I")
_DATA_HEAD: Final = struct.Struct(">IB")
_DATA: Final = int(Kind.DATA)


def encode_frame(body: bytes) -> bytes:
    """One frame on the wire: the 4-byte length of ``body``, then ``body``."""
    return _LEN.pack(len(body)) + body


def encode_data(payload: bytes) -> bytes:
    """A DATA frame carrying ``payload`` (the caller has checked it against ``max_frame``)."""
    return _DATA_HEAD.pack(len(payload) + 1, _DATA) + payload


def encode_control(kind: Kind, rest: bytes = b"") -> bytes:
    """A control frame (PING, PONG, GOAWAY, GOAWAY_ACK) with its ``rest`` of the body."""
    return _DATA_HEAD.pack(len(rest) + 1, kind) + rest


class FrameDecoder:
    """Splits a byte stream into frame bodies; no I/O.

    Feed it whatever the socket produced with :meth:`feed`, then call :meth:`next_frame`
    until it returns None. :attr:`max_body` may be changed between frames (the transport
    raises it once the handshake is done); a length prefix above it raises
    :class:`FrameTooLarge` as soon as the 4 prefix bytes are in, before the body is buffered,
    so a peer cannot make us hold more than ``max_body + 4`` bytes.
    """

    __slots__ = ("_buf", "_error", "_pos", "max_body")

    def __init__(self, max_body: int) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._error: FrameTooLarge | None = None
        self.max_body = max_body

    def feed(self, data: bytes) -> None:
        """Append bytes read from the stream."""
        if self._pos:
            # Drop what was consumed; CPython deletes from the front of a bytearray in O(1).
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or None until more bytes are fed."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < LENGTH_PREFIX:
            return None
        (length,) = _LEN.unpack_from(buf, pos)
        if length > self.max_body:
            raise FrameTooLarge(length, self.max_body)
        start = pos + LENGTH_PREFIX
        end = start + length
        if len(buf) < end:
            return None
        self._pos = end
        return bytes(buf[start:end])

    def frames(self) -> list[bytes]:
        """Every complete frame body buffered, oldest first (the fast path once the limit no
        longer changes). Frames before an oversized prefix are returned first; the next call
        raises :class:`FrameTooLarge`."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        size = len(buf)
        limit = self.max_body
        unpack = _LEN.unpack_from
        out: list[bytes] = []
        view = memoryview(buf)  # slicing a view copies once; slicing the bytearray twice
        try:
            while size - pos >= LENGTH_PREFIX:
                (length,) = unpack(buf, pos)
                if length > limit:
                    self._error = FrameTooLarge(length, limit)
                    if not out:
                        raise self._error
                    break
                end = pos + LENGTH_PREFIX + length
                if end > size:
                    break
                out.append(bytes(view[pos + LENGTH_PREFIX : end]))
                pos = end
        finally:
            view.release()  # a live view would stop feed() from resizing the buffer
        self._pos = pos
        return out

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos
