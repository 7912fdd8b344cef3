"""Heads records: a publisher's signed, sequence-numbered pointer to a topic's tips.

Events and topics are immutable and content-addressed; what a node holding only a topic's
CID lacks is where the history *ends*. Each publisher therefore keeps one mutable record
per topic in the DHT, under a key derived from (topic, publisher): the newest heads it
knows (DAG tips), the latest topic version it knows, and other publishers it saw lately.
Anyone can verify a record (the publisher's Ed25519 signature, the key it is stored under)
and the newest ``seq`` wins, so a stale or forged copy never displaces a fresher genuine
one. ``docs/protocol.md`` ("Heads records") is the normative description.

Records are small and rare (one per publisher and topic, rewritten at most a few times a
second), so they are parsed with the exact decoder and checked byte for byte against
their canonical re-encoding, like every descriptor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Self

from .cid import CID
from .codec import decode, encode
from .descriptors import iso_timestamp
from .errors import CodecError, SchemaError, SignatureError
from .identity import Identity, PeerId

__all__ = [
    "MAX_RECORD_HEADS",
    "MAX_RECORD_PEERS",
    "MAX_RECORD_SIZE",
    "RECORD_TYPE",
    "HeadsRecord",
    "heads_record_key",
]

RECORD_TYPE: Final = "pulsarcast/heads/1"
"""The record's ``t`` field: no topic or event descriptor has a ``t`` key, and no record
lacks it, so one can never be read as the other."""
MAX_RECORD_HEADS: Final = 16
MAX_RECORD_PEERS: Final = 8
MAX_RECORD_SIZE: Final = 2048
MAX_SEQ: Final = 2**63 - 1
_KEY_DOMAIN: Final = b"pulsarcast/heads/v1\x00"
_KEYS: Final = frozenset(
    {"t", "topic", "publisher", "seq", "version", "heads", "peers", "created", "signature"}
)


def heads_record_key(topic: CID, publisher: PeerId) -> bytes:
    """The 20-byte DHT key of ``publisher``'s record for ``topic``. A block's key is
    ``sha1(CID bytes)``; this hashes a domain prefix first, so the two spaces never meet."""
    return hashlib.sha1(_KEY_DOMAIN + topic.raw + publisher.raw).digest()


@dataclass(frozen=True, slots=True)
class HeadsRecord:
    """One publisher's heads of one topic. Build with :meth:`create`, parse with
    :meth:`from_block`; equal when their blocks are equal."""

    topic: CID
    """The topic's first version (trees and records are named by it)."""
    publisher: PeerId
    seq: int
    """Strictly increasing per (topic, publisher): the newest record wins everywhere."""
    version: CID
    """The latest topic version the publisher knows."""
    heads: tuple[CID, ...]
    peers: tuple[PeerId, ...]
    """Other publishers of the topic seen lately: where a reader looks next."""
    created: str
    signature: bytes = field(repr=False)
    block: bytes = field(repr=False)
    checkpoint: CID | None = None
    """The newest checkpoint of the topic the publisher knows (the author's records name
    it; :mod:`dag.checkpoints`): where a seek starts. Absent from the block when None."""

    @property
    def key(self) -> bytes:
        return heads_record_key(self.topic, self.publisher)

    @classmethod
    def create(
        cls,
        identity: Identity,
        topic: CID,
        seq: int,
        version: CID,
        heads: Iterable[CID],
        peers: Iterable[PeerId] = (),
        *,
        now: float | None = None,
        checkpoint: CID | None = None,
    ) -> Self:
        """Sign a record; raises :class:`~dag.errors.SchemaError` beyond the limits."""
        unsigned: dict[str, Any] = {
            "t": RECORD_TYPE,
            "topic": topic,
            "publisher": identity.peer_id.raw,
            "seq": seq,
            "version": version,
            "heads": list(heads),
            "peers": [p.raw for p in peers],
            "created": iso_timestamp(now),
        }
        if checkpoint is not None:
            unsigned["checkpoint"] = checkpoint
        unsigned["signature"] = identity.sign(encode(unsigned))
        return cls.from_block(encode(unsigned))

    @classmethod
    def from_block(cls, block: bytes) -> Self:
        """Parse and verify a record: size, canonical DAG-CBOR, exact keys and types,
        limits, and the publisher's signature. Raises
        :class:`~dag.errors.InvalidDescriptor` (a ``ValueError``)."""
        if not isinstance(block, bytes) or len(block) > MAX_RECORD_SIZE:
            raise SchemaError(f"a heads record is bytes of at most {MAX_RECORD_SIZE}")
        try:
            wire = decode(block)
        except CodecError as exc:
            raise SchemaError(f"heads record is not DAG-CBOR: {exc}") from None
        if not isinstance(wire, dict) or wire.keys() - {"checkpoint"} != _KEYS:
            raise SchemaError(f"heads record must have exactly the keys {sorted(_KEYS)} "
                              "and may have checkpoint")
        if wire["t"] != RECORD_TYPE:
            raise SchemaError(f"heads record type must be {RECORD_TYPE!r}")
        topic = _link(wire["topic"], "topic")
        version = _link(wire["version"], "version")
        publisher = _peer(wire["publisher"], "publisher")
        seq = wire["seq"]
        if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
            raise SchemaError(f"heads record seq must be an integer in 0..{MAX_SEQ}")
        heads = _list(wire["heads"], "heads", MAX_RECORD_HEADS)
        links = tuple(_link(h, "heads[]") for h in heads)
        peers = tuple(_peer(p, "peers[]") for p in _list(wire["peers"], "peers",
                                                         MAX_RECORD_PEERS))
        if len(set(links)) != len(links) or len(set(peers)) != len(peers):
            raise SchemaError("heads record lists a head or a peer twice")
        if publisher in peers:
            raise SchemaError("heads record names its publisher among the peers")
        created = wire["created"]
        if not isinstance(created, str) or len(created) > 32:
            raise SchemaError("heads record created must be a timestamp")
        signature = wire["signature"]
        if not isinstance(signature, bytes) or len(signature) != 64:
            raise SchemaError("heads record signature must be 64 bytes")
        if encode(wire) != block:
            raise SchemaError("heads record is not canonical DAG-CBOR")
        unsigned = encode({k: v for k, v in wire.items() if k != "signature"})
        if not publisher.verify(signature, unsigned):
            raise SignatureError("heads record signature does not verify")
        checkpoint = _link(wire["checkpoint"], "checkpoint") if "checkpoint" in wire else None
        return cls(topic, publisher, seq, version, links, peers, created, signature, block,
                   checkpoint)


def _link(value: Any, what: str) -> CID:
    if not isinstance(value, CID):
        raise SchemaError(f"heads record {what} must be a link")
    return value


def _peer(value: Any, what: str) -> PeerId:
    if not isinstance(value, bytes):
        raise SchemaError(f"heads record {what} must be peer-id bytes")
    try:
        return PeerId(value)
    except ValueError as exc:
        raise SchemaError(f"heads record {what} is not a peer id: {exc}") from None


def _list(value: Any, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > limit:
        raise SchemaError(f"heads record {what} must be a list of at most {limit}")
    return value

