"""The exception tree of the transport.

A caller's fault and a peer's fault are kept apart: the first is raised to the caller, the
second only ever ends the one connection that carried it (with a log line), so a misbehaving
peer can never raise into the event loop or into application code::

    ConnectionError
     ├── PeerUnreachable        send(): no connection to the peer could be made, even after
     │                          the reconnect attempts (queued frames to it were discarded)
     └── TransportClosed        the transport is closed (or closing); nothing more is sent
    ValueError
     └── RemoteProtocolError    a peer broke the wire protocol; never escapes a connection
          ├── FrameTooLarge     a length prefix above the limit (before any allocation)
          ├── HandshakeError    a handshake message that is malformed, does not
          │                     authenticate, is ours, or names a peer we did not dial
          └── BadRecord         an encrypted record that does not authenticate (tampered,
                                replayed, reordered or forged on the way)

Callers' misuse (a payload larger than ``max_frame``, sending to ourselves) raises a plain
``ValueError`` at the call site.
"""

from __future__ import annotations

__all__ = [
    "BadRecord",
    "FrameTooLarge",
    "HandshakeError",
    "PeerUnreachable",
    "RemoteProtocolError",
    "TransportClosed",
]


class PeerUnreachable(ConnectionError):
    """No connection to the peer could be established (dial, handshake or partition)."""


class TransportClosed(ConnectionError):
    """The transport was closed; it neither sends nor accepts anything any more."""


class RemoteProtocolError(ValueError):
    """Bytes from a peer that break the transport's wire protocol."""


class FrameTooLarge(RemoteProtocolError):
    """A frame whose length prefix exceeds the limit in force on the connection."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame length {length} exceeds the limit of {limit} bytes")
        self.length = length
        self.limit = limit


class HandshakeError(RemoteProtocolError):
    """A handshake that must not succeed: malformed, unverifiable, to ourselves, or to the
    wrong peer."""


class BadRecord(RemoteProtocolError):
    """An encrypted record that does not authenticate: tampered with, replayed, reordered or
    forged on the way. The connection cannot go on (the nonces are out of step for good)."""
