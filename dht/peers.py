"""The address book: which node id sits at which address, and which peer id it has proven.

Kademlia contacts are self-described: a datagram says "I am node id X" and nothing checks
it. A node id is meant to be ``sha1(peer id)``, but sha1 cannot be inverted, so the DHT
alone can neither learn a contact's peer id nor tell an honest contact from one that copied
somebody's id. The proof comes from elsewhere: the peer-to-peer transport's handshake, in
which the remote side signs our nonce with the key behind its peer id. The transport reports
that with :meth:`PeerBook.record_proof`; from then on a contact at that very address with
that node id carries the proven peer id.

A proof is tied to an address. Another address claiming the same node id (an impostor, or
the same peer after a move) shows ``peer_id=None`` until it is proven there too.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .errors import PeerIdMismatch
from .keys import KEY_SIZE

if TYPE_CHECKING:
    from dag.identity import PeerId

__all__ = ["Contact", "HasKademliaId", "PeerBook", "closest", "kademlia_key"]


class HasKademliaId(Protocol):
    """Anything that maps to a Kademlia id, i.e. ``dag.identity.PeerId``."""

    def kademlia_id(self) -> bytes: ...


def kademlia_key(key: bytes | HasKademliaId) -> bytes:
    """A 20-byte Kademlia key from raw key bytes or from a peer id."""
    if isinstance(key, bytes | bytearray):
        if len(key) != KEY_SIZE:
            raise ValueError(f"a Kademlia key is {KEY_SIZE} bytes, got {len(key)}")
        return bytes(key)
    return key.kademlia_id()


@dataclass(frozen=True, slots=True)
class Contact:
    """A peer as the routing table knows it. ``peer_id`` is set only once proven."""

    node_id: bytes
    host: str
    port: int
    peer_id: PeerId | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def distance_to(self, key: bytes) -> int:
        """XOR distance between this contact's node id and a 20-byte key."""
        return int.from_bytes(self.node_id, "big") ^ int.from_bytes(key, "big")


@dataclass(frozen=True, slots=True)
class _Proof:
    peer_id: PeerId
    host: str
    port: int
    proven_at: float


class PeerBook:
    """Node id -> last address seen, when, and the peer id proven at an address.

    Sightings are kept for at most ``max_seen`` node ids (least recently seen evicted);
    proofs only come from our own transport, so they are not capped beyond that.
    """

    def __init__(self, *, max_seen: int = 10_000) -> None:
        self._max_seen = max_seen
        self._seen: OrderedDict[bytes, tuple[str, int, float]] = OrderedDict()
        self._proofs: dict[bytes, _Proof] = {}

    def saw(self, node_id: bytes, host: str, port: int, now: float) -> None:
        """Record a valid message from ``node_id`` at ``(host, port)``."""
        self._seen[node_id] = (host, port, now)
        self._seen.move_to_end(node_id)
        while len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)

    def last_seen(self, node_id: bytes) -> float | None:
        entry = self._seen.get(node_id)
        return None if entry is None else entry[2]

    def address_of(self, node_id: bytes) -> tuple[str, int] | None:
        entry = self._seen.get(node_id)
        if entry is not None:
            return entry[0], entry[1]
        proof = self._proofs.get(node_id)
        return None if proof is None else (proof.host, proof.port)

    def record_proof(self, peer_id: PeerId, host: str, port: int, now: float,
                     *, expected_node_id: bytes | None = None) -> bytes:
        """Note that ``peer_id`` proved itself at ``(host, port)``; returns its node id.

        ``expected_node_id`` is the id the contact claimed, if the transport dialled a
        contact: a proof for a different identity raises :class:`PeerIdMismatch`."""
        node_id = peer_id.kademlia_id()
        if expected_node_id is not None and expected_node_id != node_id:
            raise PeerIdMismatch(
                f"{host}:{port} claimed node id {expected_node_id.hex()} but proved "
                f"{peer_id}, whose node id is {node_id.hex()}"
            )
        self._proofs[node_id] = _Proof(peer_id, host, port, now)
        self.saw(node_id, host, port, now)
        return node_id

    def forget_proof(self, node_id: bytes) -> None:
        self._proofs.pop(node_id, None)

    def proven_peer_id(self, node_id: bytes, host: str, port: int) -> PeerId | None:
        """The peer id proven by ``node_id`` at exactly this address, if any."""
        proof = self._proofs.get(node_id)
        if proof is None or (proof.host, proof.port) != (host, port):
            return None
        return proof.peer_id

    def contact(self, node_id: bytes, host: str, port: int) -> Contact:
        return Contact(node_id, host, port, self.proven_peer_id(node_id, host, port))


def closest(key: bytes, contacts: Iterable[Contact], k: int) -> list[Contact]:
    """The ``k`` contacts nearest ``key`` by XOR distance, nearest first (exact, not the
    bucket-walk approximation of ``kademlia.routing.RoutingTable.find_neighbors``)."""
    target = int.from_bytes(key, "big")
    return heapq.nsmallest(
        k, contacts, key=lambda c: int.from_bytes(c.node_id, "big") ^ target
    )
