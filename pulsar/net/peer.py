"""One peer as the transport keeps it, and the write path from its queue to the socket.

:class:`Peer` is the transport's record of a peer: its bounded FIFO of payloads not yet
written, the connection in use and every other one it has, the gates that hold writing back
until a retiring connection's frames are acknowledged, and where to dial it.

:class:`PeerWriter` empties that FIFO. Writing is driven by events, not by a task per peer:
a send schedules a flush for the end of the current event-loop iteration (so a burst of
sends becomes one write, and one read at the peer); the socket's "buffer drained" callback,
a new connection and a GOAWAY_ACK flush again. A flush frames the payloads, joins them into
writes of about one record, passes each frame through the fault injector if there is one,
and stops when the socket pushes back.

It is apart from :mod:`pulsar.net.transport` because it is the sending hot path, with
invariants of its own (frames leave in the order they were queued, never past a gate, and
senders waiting for room are woken); the transport decides when to flush, this decides how.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from dag import PeerId

from .connection import Connection, TransportView
from .secure import MAX_RECORD_PLAINTEXT

__all__ = ["Peer", "PeerWriter"]

logger = logging.getLogger("pulsar.net")

_BATCH_BYTES: Final = MAX_RECORD_PLAINTEXT - 4 * 1024
"""Frames are joined into writes of about this size when a queue is flushed: just under
one record, so a batch of small frames is sealed with one AEAD call (a batch exceeds this by
at most its last frame; larger frames are split into records anyway)."""
_DATA_HEAD: Final = struct.Struct(">IB")  # length, kind: the head of a DATA frame


@dataclass(eq=False, slots=True)
class Peer:
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


class PeerWriter:
    """Writes the queues of one transport's peers to their connections. Built by
    :class:`~pulsar.net.transport.Transport`, whose id, fault injector and stats it uses."""

    def __init__(self, transport: TransportView) -> None:
        self._transport = transport
        self._queue_limit = transport.config.send_queue

    def flush_soon(self, p: Peer) -> None:
        """Flush at the end of this event-loop iteration: sends made in a burst (one loop
        iteration) go out in one write, and the receiver parses them from one read."""
        if not p.flush_scheduled:
            p.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_flush, p)

    def _scheduled_flush(self, p: Peer) -> None:
        p.flush_scheduled = False
        self.flush(p)

    def flush(self, p: Peer) -> None:
        """Write queued frames to the peer's connection as far as the socket takes them."""
        queue = p.queue
        c = p.conn
        if not queue or c is None or not c.writable or p.gates:
            return
        transport = self._transport
        faults = transport.faults
        stats = transport.stats
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
                delay = faults.outgoing(transport.peer_id, p.id, len(frame), loop_time())
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

    def discard(self, p: Peer, why: str) -> None:
        """Drop every frame queued for ``p`` (logged, counted) and wake its waiting senders."""
        if p.queue:
            self._transport.stats.frames_discarded += len(p.queue)
            logger.info("discarding %d frames queued for %s (%s)", len(p.queue), p.id, why)
            p.queue.clear()
        p.space.set()
