"""Every connection of a transport, and which one each peer uses.

:class:`ConnectionRegistry` follows connections from TCP up to closed: it counts handshakes
in flight, files each established connection under its (authenticated) peer, learns the
peer's address from it, and decides which connection the peer's frames go to. Two open
connections to one peer (both sides dialed at once) are resolved the same way on both sides
(:meth:`ConnectionRegistry.preferred`) and the loser retired with a GOAWAY exchange; a peer
that retires the connection we kept, while we have no other, is told so (ORPHAN) and closes
the stale one. When a peer's last connection goes, it is "down", and frames still queued
for it start a new dial. ``on_peer_up`` and ``on_peer_down`` are called from here.

It is apart from :mod:`pulsar.net.transport` because it is the connection side of the
transport (what :class:`~pulsar.net.connection.Connection` reports, through the transport's
``ConnectionOwner`` callbacks), while the transport proper is the sending side its users
call; they share the table of peers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from dag import PeerId

from .connection import Connection, ConnState, TransportView
from .dialer import Dialer, fmt_address
from .framing import FLAG_ORPHAN
from .peer import Peer, PeerWriter

__all__ = ["ConnectionRegistry", "PeerDownHandler", "PeerUpHandler"]

PeerUpHandler = Callable[[PeerId, tuple[str, int]], None]
PeerDownHandler = Callable[[PeerId], None]

logger = logging.getLogger("pulsar.net")

_DUPLICATE: Final = "duplicate connection"


class ConnectionRegistry:
    """The connections of one transport. Built by :class:`~pulsar.net.transport.Transport`,
    with its table of peers (shared: both add to it), its writer and its dialer."""

    def __init__(
        self,
        transport: TransportView,
        peers: dict[PeerId, Peer],
        writer: PeerWriter,
        dialer: Dialer,
        *,
        on_peer_up: PeerUpHandler | None,
        on_peer_down: PeerDownHandler | None,
    ) -> None:
        self._transport = transport
        self._peers = peers
        self._writer = writer
        self._dialer = dialer
        self._on_peer_up = on_peer_up
        self._on_peer_down = on_peer_down
        self.conns: set[Connection] = set()
        """Every connection with a socket, any state."""
        self._pending = 0  # connections still in their handshake
        self._seq = 0

    def made(self, conn: Connection) -> None:
        """TCP is up, the handshake starts."""
        self.conns.add(conn)
        self._pending += 1
        if self._transport.closed:
            conn.abort()

    def established(self, conn: Connection) -> None:
        """The handshake completed: file ``conn`` under its peer, and choose which of the
        peer's connections to use."""
        transport = self._transport
        self._pending -= 1
        transport.stats.connections_opened += 1
        peer = conn.peer
        assert peer is not None
        if transport.closed:
            conn.close()
            return
        p = self._peers.get(peer)
        if p is None:
            p = self._peers[peer] = Peer(peer)
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
            keep = self.preferred(current, conn)
            drop = conn if keep is current else current
            transport.stats.duplicate_connections += 1
            logger.debug("two connections with %s; keeping the %s one",
                         peer, "outbound" if keep.outbound else "inbound")
            p.conn = keep
            self.retire(p, drop, _DUPLICATE)
        self._writer.flush(p)

    def goaway(self, conn: Connection, flags: int) -> None:
        """The peer sent GOAWAY on ``conn``."""
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
            self.retire(p, conn, "peer sent GOAWAY", FLAG_ORPHAN if orphan else 0)
        elif flags & FLAG_ORPHAN and conn.retire_reason == _DUPLICATE:
            kept = p.conn
            if kept is not None and kept is not conn and kept.state is ConnState.OPEN:
                logger.info("%s has no other connection to us: %s is stale, closing it",
                            conn.peer, kept.describe())
                kept.abort()

    def lost(self, conn: Connection) -> None:
        """``conn`` is closed: the peer falls back on another connection, or is down."""
        self.conns.discard(conn)
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
                if p.queue and not self._transport.closed:
                    # Frames are waiting: reconnect without waiting for the next send.
                    self._dialer.ensure(p)
        self._writer.flush(p)

    def preferred(self, a: Connection, b: Connection) -> Connection:
        """Which of two open connections to the same peer to keep; both sides agree."""
        if a.outbound != b.outbound:
            # Dialed by different sides: keep the one dialed by the lower peer id.
            assert a.peer is not None
            we_are_lower = self._transport.peer_id.raw < a.peer.raw
            return a if a.outbound == we_are_lower else b
        # Dialed by the same side, which only dials when it has no connection: the older
        # one is stale for it.
        return a if a.seq > b.seq else b

    def retire(self, p: Peer, conn: Connection, reason: str, flags: int = 0) -> None:
        """Start the GOAWAY exchange on ``conn`` if it is open; until the peer acknowledges
        the frames it carried, nothing is written to its successor."""
        if conn.state is not ConnState.OPEN:
            return
        if conn.data_out:
            p.gates.add(conn)
        conn.retire(flags, reason)

    def _up(self, p: Peer, conn: Connection) -> None:
        p.up = True
        address = conn.listen_address or ("", 0)
        logger.info("peer %s up (%s, listens on %s)", p.id, conn.describe(), fmt_address(address))
        if self._on_peer_up is not None:
            try:
                self._on_peer_up(p.id, address)
            except Exception:
                logger.exception("on_peer_up failed for %s", p.id)

    def _down(self, p: Peer) -> None:
        if not p.up:
            return
        p.up = False
        logger.info("peer %s down", p.id)
        if self._on_peer_down is not None:
            try:
                self._on_peer_down(p.id)
            except Exception:
                logger.exception("on_peer_down failed for %s", p.id)
