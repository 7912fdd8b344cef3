"""Settings and counters of the transport."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .framing import MAX_FRAME_LIMIT

__all__ = ["TransportConfig", "TransportStats"]


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """How the transport behaves; every value is validated once, here.

    Times are seconds. The defaults suit a real network; tests shrink them.
    """

    max_frame: int = 1 << 20
    """Largest payload, in bytes. send() refuses larger ones (ValueError); a peer announcing a
    larger frame is disconnected. 1 MiB is the largest block the codec decodes."""

    send_queue: int = 1024
    """Frames queued per peer (not yet handed to the socket) before send() waits and
    send_nowait() refuses: the back-pressure bound, and what a slow peer can cost us."""

    handshake_timeout: float = 5.0
    """From TCP connect to a completed handshake; a silent or slow client is dropped after
    it."""

    connect_timeout: float = 5.0
    """For the TCP connect of one dial attempt."""

    idle_ping: float = 15.0
    """Send a PING after this long without receiving anything on a connection."""

    dead_after: float = 45.0
    """Close a connection after this long without receiving anything (PONGs included)."""

    reconnect_attempts: int = 3
    """Retries after a failed dial, waiting 0.1, 0.2, 0.4 ... s before each: a send to an
    unreachable peer fails after 1 + reconnect_attempts dials."""

    drain_timeout: float = 5.0
    """How long a retired connection may take to finish its GOAWAY exchange before it is
    simply closed (and how long close() waits for peers to see our GOAWAY)."""

    encrypt: bool = True
    """Encrypt and authenticate every frame after the handshake (ChaCha20-Poly1305 records).
    Off only for the benchmark's plaintext baseline and tests: the Noise handshake still
    authenticates both peers, but frames then travel in the clear, unprotected. The setting
    is part of the handshake's prologue, so two transports that disagree on it fail the
    handshake instead of misreading each other. Never turn it off in a node."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_frame <= MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame must be in 1..{MAX_FRAME_LIMIT}, got {self.max_frame}")
        if self.send_queue < 1:
            raise ValueError(f"send_queue must be at least 1, got {self.send_queue}")
        if self.reconnect_attempts < 0:
            raise ValueError("reconnect_attempts must not be negative")
        for name in (
            "handshake_timeout", "connect_timeout", "idle_ping", "dead_after", "drain_timeout",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.dead_after <= self.idle_ping:
            raise ValueError("dead_after must be longer than idle_ping")


@dataclass(slots=True)
class TransportStats:
    """Counters since the transport was created. Plain integers, updated in the event loop;
    :meth:`snapshot` gives a dict for logs, metrics and JSON."""

    frames_sent: int = 0
    """DATA frames handed to the network (written, or put on a fault-injected delay line)."""
    bytes_sent: int = 0
    """Payload bytes of :attr:`frames_sent` (framing overhead not included)."""
    wire_bytes_sent: int = 0
    """Every byte handed to the sockets: handshake messages, and after them whole records
    (length prefixes, frame headers, AEAD tags) carrying DATA, PING, PONG and GOAWAY
    frames alike. TCP/IP headers and retransmissions are the kernel's and not counted."""
    frames_received: int = 0
    """DATA frames delivered to ``on_frame``."""
    bytes_received: int = 0
    frames_dropped: int = 0
    """DATA frames dropped by the fault injector (outgoing, or incoming from a cut-off peer)."""
    frames_discarded: int = 0
    """Queued frames thrown away: peer unreachable, disconnect() or close()."""
    queue_full_waits: int = 0
    """Times send() had to wait for room in a peer's queue (back-pressure)."""
    queue_full_rejects: int = 0
    """Times send_nowait() returned False because the queue was full."""
    connections_opened: int = 0
    """Handshakes completed (inbound and outbound)."""
    connections_closed: int = 0
    """Established connections that ended, for any reason."""
    duplicate_connections: int = 0
    """Connections retired because another one to the same peer was kept."""
    handshake_failures: int = 0
    """Connections that ended before their handshake completed (rejected, timed out, reset)."""
    oversized_frames: int = 0
    """Connections closed for a length prefix above the limit."""
    protocol_errors: int = 0
    """Connections closed for other wire protocol violations after the handshake."""
    keepalive_pings: int = 0
    """PINGs sent on idle connections."""
    keepalive_timeouts: int = 0
    """Connections closed because nothing was received for ``dead_after`` seconds."""
    dial_failures: int = 0
    """Failed dial attempts (refused, timed out, handshake failed, partitioned)."""
    bad_records: int = 0
    """Connections closed for an encrypted record that did not authenticate (tampered,
    replayed, reordered or forged)."""

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)
