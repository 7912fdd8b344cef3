"""Wire messages of the backfill layer: WANT, BLOCKS and HEADS.

They follow :mod:`pulsar.proto.tree.messages` (one DAG-CBOR map with a ``t`` key, exactly the
listed keys, every field validated on decode); :mod:`pulsar.proto.codec` lists them.

=========  =====================================================================  ============
``t``      keys                                                                   meaning
=========  =====================================================================  ============
``want``   ``topic`` link, ``head`` link, ``limit`` uint 1..1024,                 send ``head``
           ``have`` [link] (<= 32), ``after`` timestamp or null                   and ancestors
``blocks`` ``topic`` link, ``head`` link (the WANT's), ``blocks`` [bytes]         the answer
           (<= 1024 blocks, each <= 8192 bytes, <= 1 MiB in all)
``heads``  ``topic`` link, ``heads`` [link] (<= 256, no duplicates)               my DAG tips
``digest`` ``topic`` link, ``digest`` bytes (16)                                  my tips,
                                                                                  hashed
=========  =====================================================================  ============

A WANT asks for ``head`` and its ancestors, newest first, in **one** BLOCKS answer. The
answerer walks parent links from ``head`` and stops at the first block it lacks, after
``limit`` blocks, before any block named in ``have`` (the asker has it), after the first
block created before ``after`` (the asker's subscription horizon: that block is included so
the asker learns where its history begins), or when the next block would exceed its byte
budget. An empty answer means "I have nothing of that": the asker moves on to the DHT at
once instead of waiting for a timeout.

Two fields go beyond the minimal ``(topic, head, limit)`` request, because each saves a
whole batch of useless blocks: ``have`` stops the walk where the asker's history resumes
(a node back from a partition needs only what it missed, not ``limit`` more), and ``after``
stops it at the asker's subscription horizon (a fresh subscriber's first gap is one block,
not ``limit``). BLOCKS echoes ``head`` so an answer is paired with its request even when
it is empty. The caps are chosen so one answer always fits one frame
(:data:`~pulsar.proto.tree.messages.MAX_MESSAGE_SIZE`): a WANT may ask for up to 1024 blocks,
which with the usual ~400-byte events is ~400 KiB; the answerer's byte budget ends the batch
earlier when the events are large.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID, PeerId
from dag.descriptors import parse_timestamp
from dag.errors import SchemaError
from pulsar.proto.fields import MAX_MESSAGE_SIZE, MessageError, link_field, uint_field
from pulsar.proto.gossip.messages import parse_sample

__all__ = [
    "BLOCKS_OVERHEAD",
    "MAX_ANSWER_BYTES",
    "MAX_BLOCK",
    "MAX_BLOCKS",
    "MAX_BLOCKS_BYTES",
    "MAX_HAVE",
    "MAX_HEADS",
    "MAX_WANT_LIMIT",
    "block_list",
    "Blocks",
    "Heads",
    "HeadsDigest",
    "Want",
    "heads_digest",
]

MAX_WANT_LIMIT: Final = 1024
"""Most blocks one WANT may ask for."""
MAX_HAVE: Final = 32
"""Most ``have`` CIDs in a WANT (the asker's newest heads)."""
MAX_BLOCKS: Final = MAX_WANT_LIMIT
"""Most blocks in one BLOCKS answer: a full answer to the largest WANT."""
MAX_BLOCK: Final = 8192
"""Largest block in a BLOCKS answer (descriptors are at most 7 KiB; same cap as ``event``)."""
MAX_BLOCKS_BYTES: Final = 1 << 20
"""Most block bytes in one BLOCKS answer. Answerers budget less, so the frame also fits."""
MAX_HEADS: Final = 256
"""Most heads in one HEADS message."""
BLOCKS_OVERHEAD: Final = 16 * 1024
"""Room left in a frame for the BLOCKS map around its blocks (3 bytes of CBOR header per
block, the keys, two links): an answerer never budgets more than
``MAX_MESSAGE_SIZE - BLOCKS_OVERHEAD`` block bytes."""
MAX_ANSWER_BYTES: Final = MAX_MESSAGE_SIZE - BLOCKS_OVERHEAD


def _links(value: Any, what: str, limit: int) -> tuple[CID, ...]:
    if not isinstance(value, list | tuple) or len(value) > limit:
        raise MessageError(f"{what} must be a list of at most {limit} links")
    links = tuple(link_field(item, what) for item in value)
    if len(set(links)) != len(links):
        raise MessageError(f"{what} lists a link twice")
    return links


@dataclass(frozen=True, slots=True)
class Want:
    """Ask for ``head`` and its ancestors, newest first, up to ``limit`` blocks, in one
    :class:`Blocks` answer (see the module docstring for where the walk stops)."""

    topic: CID
    head: CID
    limit: int
    have: tuple[CID, ...] = ()
    after: str | None = None
    T: ClassVar[str] = "want"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"after", "have", "head", "limit", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": self.T,
            "topic": self.topic,
            "head": self.head,
            "limit": self.limit,
            "have": list(self.have),
            "after": self.after,
        }

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Want:
        limit = uint_field(m["limit"], "want.limit", MAX_WANT_LIMIT)
        if limit == 0:
            raise MessageError("want.limit must be at least 1")
        after = m["after"]
        if after is not None:
            if not isinstance(after, str) or len(after) > 32:
                raise MessageError("want.after must be a timestamp or null")
            try:
                parse_timestamp(after)
            except SchemaError as exc:
                raise MessageError(f"want.after: {exc}") from None
        return cls(
            link_field(m["topic"], "want.topic"),
            link_field(m["head"], "want.head"),
            limit,
            _links(m["have"], "want.have", MAX_HAVE),
            after,
        )


def block_list(value: Any, kind: str, limit: int) -> tuple[bytes, ...]:
    """The ``blocks`` field of a ``kind`` message: at most ``limit`` byte strings of
    1..:data:`MAX_BLOCK` bytes, :data:`MAX_BLOCKS_BYTES` in all."""
    if not isinstance(value, list) or len(value) > limit:
        raise MessageError(f"{kind}.blocks must be a list of at most {limit}")
    total = 0
    for block in value:
        if not isinstance(block, bytes) or not 0 < len(block) <= MAX_BLOCK:
            raise MessageError(f"{kind}.blocks entries must be 1..{MAX_BLOCK} bytes")
        total += len(block)
    if total > MAX_BLOCKS_BYTES:
        raise MessageError(f"{kind} carry {total} bytes, more than {MAX_BLOCKS_BYTES}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class Blocks:
    """The one-batch answer to a :class:`Want` for ``head``: event blocks, newest first.
    Nothing in it is trusted: the asker checks every block against the CID it is missing
    and verifies it like an event from the tree."""

    topic: CID
    head: CID
    blocks: tuple[bytes, ...]
    T: ClassVar[str] = "blocks"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"blocks", "head", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "head": self.head, "blocks": list(self.blocks)}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Blocks:
        return cls(link_field(m["topic"], "blocks.topic"), link_field(m["head"], "blocks.head"),
                   block_list(m["blocks"], "blocks", MAX_BLOCKS))


@dataclass(frozen=True, slots=True)
class Heads:
    """The sender's heads of ``topic`` (events with no known children): anti-entropy
    between tree and lazy neighbours, so branches nobody forwarded are found."""

    topic: CID
    heads: tuple[CID, ...]
    T: ClassVar[str] = "heads"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"heads", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "heads": list(self.heads)}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Heads:
        return cls(link_field(m["topic"], "heads.topic"),
                   _links(m["heads"], "heads.heads", MAX_HEADS))


DIGEST_BYTES: Final = 16


def heads_digest(heads: Iterable[CID]) -> bytes:
    """The digest of a set of heads: SHA-256 over the binary CIDs in byte order, first
    16 bytes. Order-free, so two nodes with the same heads compute the same digest."""
    hasher = hashlib.sha256()
    for raw in sorted({cid.raw for cid in heads}):
        hasher.update(len(raw).to_bytes(2, "big"))
        hasher.update(raw)
    return hasher.digest()[:DIGEST_BYTES]


@dataclass(frozen=True, slots=True)
class HeadsDigest:
    """A quiet topic's heads refresh to a neighbour that was sent or told of every head:
    the digest of the sender's heads instead of the list (16 bytes instead of ~40 per
    head). A receiver whose heads differ answers with its HEADS; a sender that finds the
    answer differs from its own heads sends its HEADS back, so whichever side lacks
    something learns it in at most two more messages."""

    topic: CID
    digest: bytes
    T: ClassVar[str] = "digest"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"digest", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "digest": self.digest}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> HeadsDigest:
        digest = m["digest"]
        if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
            raise MessageError(f"digest.digest must be {DIGEST_BYTES} bytes")
        return cls(link_field(m["topic"], "digest.topic"), digest)


@dataclass(frozen=True, slots=True)
class Joined(Heads):
    """The answer to a JOIN: the parent took the sender as a child. Shaped like HEADS (the
    parent's heads, so the child backfills at once) but of its own kind, because it is the
    only acknowledgement of the edge: a parent also sends HEADS (and IHAVE) to lazy links,
    so those prove only that it knows the sender, not that it forwards to it. ``peers`` is
    a sample of the topic's other members the parent knows: the child's first lazy links,
    with no SHUFFLE needed. ``up``, from a node that is in the tree only to relay (it is
    not subscribed), names its own parent: join there instead, so events do not take a
    detour through a node that does not want them (left out when unset)."""

    peers: tuple[PeerId, ...] = ()
    up: PeerId | None = None
    T: ClassVar[str] = "joined"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"heads", "peers", "topic"})
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"up"})

    def to_wire(self) -> dict[str, Any]:
        wire = {"t": self.T, "topic": self.topic, "heads": list(self.heads),
                "peers": [p.raw for p in self.peers]}
        if self.up is not None:
            wire["up"] = self.up.raw
        return wire

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Joined:
        up = parse_sample([m["up"]], "joined.up", 1)[0] if "up" in m else None
        return cls(link_field(m["topic"], "joined.topic"),
                   _links(m["heads"], "joined.heads", MAX_HEADS),
                   parse_sample(m["peers"], "joined.peers"), up)


