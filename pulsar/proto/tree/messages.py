"""The tree's wire messages (JOIN, LEAVE, EVENT, REQUEST_TO_PUBLISH, PING, PONG), as
frozen dataclasses (their fields' validators are in :mod:`pulsar.proto.fields`).

Each message is one DAG-CBOR map with a ``t`` key naming its type (``T``), the keys
``FIELDS`` and, when set, any of ``OPTIONAL``; :mod:`pulsar.proto.codec` frames and decodes
them. ``docs/protocol.md`` is the normative description. Decoding uses the fast codec
(links arrive as raw CID bytes), so every field is re-validated in ``from_wire``: a
malformed message raises :class:`MessageError` and the caller drops it with a log line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID, PeerId, check_content_type, check_event_key
from dag.errors import SchemaError
from pulsar.proto.fields import MAX_HOPS, MessageError, bytes_field, link_field, uint_field

__all__ = [
    "MAX_ALSO",
    "Event",
    "Join",
    "Leave",
    "Ping",
    "Pong",
    "RequestToPublish",
]

MAX_ALSO: Final = 64
"""Peers one EVENT may ask its receiver to push a large event's chunk tree to."""


@dataclass(frozen=True, slots=True)
class Join:
    """Ask the receiver to become our parent in ``topic``'s tree (paper, algorithm 2).
    Carries the topic block so the receiver need not fetch it to route further."""

    topic: CID
    topic_block: bytes = b""
    T: ClassVar[str] = "join"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"block", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "block": self.topic_block}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Join:
        return cls(link_field(m["topic"], "join.topic"),
                   bytes_field(m["block"], "join.block", 8192))


@dataclass(frozen=True, slots=True)
class Leave:
    """The sender leaves ``topic``'s tree: drop it as parent or child."""

    topic: CID
    T: ClassVar[str] = "leave"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Leave:
        return cls(link_field(m["topic"], "leave.topic"))


@dataclass(frozen=True, slots=True)
class Event:
    """An event block travelling ``topic``'s tree; ``hop`` counts tree edges from the
    publisher (for last-delivery-hop figures and Plumtree's tree optimisation).
    ``fragments``: the sender pushes the payload's chunk tree right behind it as FRAGMENT
    messages (a large event; see :mod:`pulsar.proto.fragments.messages`). Optional on the
    wire (``frags``), left out when false so older peers read the message. ``also``: peers
    the receiver is asked to push the chunk tree to as well (the sender's payload fan-out is
    limited; these got the EVENT from it), optional on the wire too."""

    topic: CID
    block: bytes
    hop: int
    fragments: bool = False
    also: tuple[PeerId, ...] = ()
    T: ClassVar[str] = "event"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"block", "hop", "topic"})
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"also", "frags"})

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "t": self.T, "topic": self.topic, "block": self.block, "hop": self.hop
        }
        if self.fragments:
            wire["frags"] = True
        if self.also:
            wire["also"] = [p.raw for p in self.also]
        return wire

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Event:
        frags = m.get("frags", False)
        if frags is not True and frags is not False:
            raise MessageError("event.frags must be a boolean")
        also = m.get("also", [])
        if not isinstance(also, list) or len(also) > MAX_ALSO or (also and not frags):
            raise MessageError(f"event.also must list at most {MAX_ALSO} peers, with frags")
        try:
            peers = tuple(PeerId(p) for p in also)
        except (ValueError, TypeError) as exc:
            raise MessageError(f"event.also: {exc}") from None
        return cls(
            link_field(m["topic"], "event.topic"),
            bytes_field(m["block"], "event.block", 8192),
            uint_field(m["hop"], "event.hop", MAX_HOPS),
            frags,
            peers,
        )


@dataclass(frozen=True, slots=True)
class RequestToPublish:
    """A non-publisher's signed content, travelling up the tree to the first node allowed
    to publish it (paper, algorithm 3). ``created`` and ``signature`` are exactly what
    :meth:`dag.EventDescriptor.sign_content` produced; ``parent`` is a CUSTOM link wish."""

    topic: CID
    version: CID
    author: PeerId
    payload: bytes | CID
    created: str
    signature: bytes
    parent: CID | None = None
    content_type: str | None = None
    key: str | None = None
    T: ClassVar[str] = "rtp"
    FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"author", "created", "link", "parent", "payload", "sig", "topic", "version"})
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"ct", "key"})

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": self.T,
            "topic": self.topic,
            "version": self.version,
            "author": self.author.raw,
            # Two fields, so a link never has to be told from bytes after a fast decode.
            "payload": self.payload if isinstance(self.payload, bytes) else None,
            "link": self.payload if isinstance(self.payload, CID) else None,
            "created": self.created,
            "sig": self.signature,
            "parent": self.parent,
        } | ({} if self.content_type is None else {"ct": self.content_type}) | (
            {} if self.key is None else {"key": self.key})

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> RequestToPublish:
        try:
            author = PeerId(m["author"])
        except (ValueError, TypeError) as exc:
            raise MessageError(f"rtp.author: {exc}") from None
        payload: bytes | CID
        if m["link"] is not None:
            if m["payload"] is not None:
                raise MessageError("rtp carries either payload or link, not both")
            payload = link_field(m["link"], "rtp.link")
        else:
            payload = bytes_field(m["payload"], "rtp.payload", 8192)
        if not isinstance(m["created"], str) or len(m["created"]) > 32:
            raise MessageError("rtp.created must be a timestamp")
        parent = None if m["parent"] is None else link_field(m["parent"], "rtp.parent")
        content_type = m.get("ct")
        if content_type is not None:
            try:
                check_content_type(content_type)
            except SchemaError as exc:
                raise MessageError(f"rtp.ct: {exc}") from None
        key = m.get("key")
        if key is not None:
            try:
                check_event_key(key)
            except SchemaError as exc:
                raise MessageError(f"rtp.key: {exc}") from None
        return cls(
            link_field(m["topic"], "rtp.topic"),
            link_field(m["version"], "rtp.version"),
            author,
            payload,
            m["created"],
            bytes_field(m["sig"], "rtp.sig", 64),
            parent,
            content_type,
            key,
        )


@dataclass(frozen=True, slots=True)
class Ping:
    """Liveness probe; answered with a :class:`Pong` carrying the same nonce."""

    nonce: int
    T: ClassVar[str] = "ping"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"n"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "n": self.nonce}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Ping:
        return cls(uint_field(m["n"], "ping.n", (1 << 63) - 1))


@dataclass(frozen=True, slots=True)
class Pong:
    nonce: int
    T: ClassVar[str] = "pong"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"n"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "n": self.nonce}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Pong:
        return cls(uint_field(m["n"], "pong.n", (1 << 63) - 1))
