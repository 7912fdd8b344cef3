"""Event descriptors (paper, listing 2): :class:`EventDescriptor`, one signed event of a
topic's Merkle DAG.

Building and signing an event (by its author, or by a publisher for another author's
request to publish), parsing and validating a received one, its ``merges`` links, and the
signature checks of both cases. Events are parsed on every hop of every delivery, so this is
the hot path of the data model: :func:`_build_event` fills the slots directly instead of
going through the frozen dataclass's ``__init__``. Kept apart from
:mod:`dag.topic_descriptor` because the two kinds share only the wire rules
(:mod:`dag.descriptor_wire`); whether a publisher had the *right* to publish needs the topic
too and is :func:`dag.descriptors.check_rights`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Self, TypeVar

from .cid import CID
from .codec import encode
from .descriptor_wire import (
    _SIGNATURE_KEYS,
    MAX_INLINE_PAYLOAD,
    MAX_MERGES,
    PROTOCOL_VERSION,
    _check_canonical,
    _check_timestamp,
    _content_type,
    _ContentAddressed,
    _encode_wire,
    _event_key,
    _link,
    _load,
    _map,
    _peer,
    _signature,
    _version,
    _without,
    check_content_type,
    check_event_key,
    iso_timestamp,
    parse_timestamp,
)
from .errors import SchemaError, SignatureError
from .identity import Identity, PeerId

__all__ = ["EventDescriptor"]

_E = TypeVar("_E", bound="EventDescriptor")


@dataclass(frozen=True, slots=True, eq=False)
class EventDescriptor(_ContentAddressed):
    """A signed event (paper, listing 2). ``payload`` is the inline bytes, or the
    :class:`CID` of a chunk tree (see :mod:`dag.chunks`) when the payload is large."""

    topic: CID
    author: PeerId
    publisher: PeerId
    parent: CID | None
    payload: bytes | CID
    created: str
    protocol_version: str
    author_signature: bytes
    publisher_signature: bytes | None
    block: bytes = field(repr=False)
    cid: CID
    content_type: str | None = None
    """The payload's media type as its author declared it (``metadata.contentType``,
    optional; events from before it existed have none)."""
    merges: tuple[CID, ...] = ()
    """Other heads of the topic its publisher knew when it published (LAST_SEEN), besides
    ``parent``. Concurrent publishers fork the DAG; without these links every fork would
    leave a tip nothing later points to, and a walk back from a bounded set of recent heads
    (a replay from the topic's CID, a returning subscriber) would miss what lies behind
    the older tips. Merge links are walked by backfill and replay; delivery order follows
    ``parent`` alone."""
    key: str | None = None
    """The event's key (``metadata.key``, optional, signed by its author): on a topic whose
    retention compacts, only the newest event of each key is kept."""

    KIND: ClassVar[str] = "event"

    @property
    def created_at(self) -> float:
        return parse_timestamp(self.created)

    @property
    def is_inline(self) -> bool:
        return isinstance(self.payload, bytes)

    @staticmethod
    def _content(
        topic: CID,
        author: PeerId,
        payload: bytes | CID,
        created: str,
        version: str,
        content_type: str | None = None,
        key: str | None = None,
    ) -> dict[str, Any]:
        """The author's part of an event: what a request to publish carries and what the
        author signs when someone else publishes. The media type sits in the signed
        metadata, so no relay can relabel a payload."""
        metadata: dict[str, Any] = {"created": created, "protocolVersion": version}
        if content_type is not None:
            metadata["contentType"] = content_type
        if key is not None:
            metadata["key"] = key
        return {"topic": topic, "author": author.raw, "payload": payload, "metadata": metadata}

    @classmethod
    def sign_content(
        cls,
        identity: Identity,
        topic: CID,
        payload: bytes | CID,
        *,
        content_type: str | None = None,
        key: str | None = None,
        now: float | None = None,
    ) -> tuple[str, bytes]:
        """Sign a payload as its author for someone else to publish (request to publish).
        Returns ``(created, author_signature)``."""
        _check_payload(payload)
        check_content_type(content_type)
        check_event_key(key)
        created = iso_timestamp(now)
        content = cls._content(
            topic, identity.peer_id, payload, created, PROTOCOL_VERSION, content_type, key
        )
        return created, identity.sign(encode(content))

    @classmethod
    def create(
        cls,
        publisher: Identity,
        topic: CID,
        payload: bytes | CID,
        *,
        parent: CID | None = None,
        author: PeerId | None = None,
        created: str | None = None,
        author_signature: bytes | None = None,
        content_type: str | None = None,
        merges: tuple[CID, ...] = (),
        key: str | None = None,
        now: float | None = None,
    ) -> Self:
        """Build and sign an event. For a request to publish, pass the requester as
        ``author`` with the ``created`` and ``author_signature`` it sent (from
        :meth:`sign_content`); they are verified here like on any other hop. ``merges``
        are other heads to link (see :attr:`merges`)."""
        _check_payload(payload)
        check_content_type(content_type)
        check_event_key(key)
        _check_merges(merges, parent)
        me = publisher.peer_id
        signer = me if author is None else author
        own = signer == me
        wire = {
            **cls._content(
                topic,
                signer,
                payload,
                created or iso_timestamp(now),
                PROTOCOL_VERSION,
                content_type,
                key,
            ),
            "publisher": me.raw,
            "parent": parent,
        }
        if merges:
            wire["merges"] = list(merges)
        if own:
            wire["authorSignature"] = publisher.sign(encode(wire))
        else:
            if created is None or author_signature is None:
                raise SchemaError("an event published for another author needs its signature")
            wire["authorSignature"] = author_signature
            wire["publisherSignature"] = publisher.sign(encode(wire))
        # Our own signature needs no check; someone else's (a request to publish) does.
        return cls.from_block(encode(wire), verify_signature=not own)

    @classmethod
    def from_block(
        cls, block: bytes, cid: CID | None = None, *, verify_signature: bool = True
    ) -> Self:
        """Parse and validate an event block (CID, canonical schema, signatures). Whether
        the publisher was *allowed* to publish needs the topic: see :func:`check_rights`."""
        cid, wire, exact = _load(block, cls.KIND, cid)
        _map(wire, "event", _EVENT_KEYS, _EVENT_OPTIONAL)
        topic = _link(wire["topic"], "event.topic", exact=exact)
        assert topic is not None
        author = _peer(wire["author"], "event.author")
        publisher = _peer(wire["publisher"], "event.publisher")
        parent = _link(wire["parent"], "event.parent", nullable=True, exact=exact)
        payload = wire["payload"]
        if type(payload) is bytes:
            if len(payload) > MAX_INLINE_PAYLOAD:
                raise SchemaError(f"inline payload is larger than {MAX_INLINE_PAYLOAD} bytes")
        elif not isinstance(payload, CID):
            raise SchemaError("event.payload must be bytes or a link to a chunk tree")
        meta = _map(wire["metadata"], "event.metadata", _EVENT_META_KEYS, _EVENT_META_OPTIONAL)
        created = _check_timestamp(meta["created"])
        version = _version(meta["protocolVersion"])
        content_type = meta.get("contentType")
        if content_type is not None:
            _content_type(content_type, "event.metadata.contentType")
        key = meta.get("key")
        if key is not None:
            _event_key(key, "event.metadata.key")
        merges: tuple[CID, ...] = ()
        if "merges" in wire:
            merges = _merge_links(wire["merges"], parent, exact)
        author_sig = _signature(wire["authorSignature"], "event.authorSignature")
        publisher_sig: bytes | None = None
        if author == publisher:
            if "publisherSignature" in wire:
                raise SchemaError("publisherSignature must be absent when author is publisher")
        elif "publisherSignature" not in wire:
            raise SignatureError(f"event {cid}: publisher differs from author but is unsigned")
        else:
            publisher_sig = _signature(wire["publisherSignature"], "event.publisherSignature")
        _check_canonical(wire, exact, block, cls.KIND)
        if verify_signature:
            _verify_event(cid, wire, exact, author, publisher, author_sig, publisher_sig)
        return _build_event(
            cls,
            (
                topic,
                author,
                publisher,
                parent,
                payload,
                created,
                version,
                author_sig,
                publisher_sig,
                block,
                cid,
                content_type,
                merges,
                key,
            ),
        )


(
    _SET_TOPIC,
    _SET_AUTHOR,
    _SET_PUBLISHER,
    _SET_PARENT,
    _SET_PAYLOAD,
    _SET_CREATED,
    _SET_VERSION,
    _SET_AUTHOR_SIG,
    _SET_PUBLISHER_SIG,
    _SET_BLOCK,
    _SET_CID,
    _SET_CONTENT_TYPE,
    _SET_MERGES,
    _SET_KEY,
) = (getattr(EventDescriptor, f.name).__set__ for f in dataclasses.fields(EventDescriptor))


def _build_event(cls: type[_E], v: tuple[Any, ...]) -> _E:
    """Construct an :class:`EventDescriptor` from already validated field values.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    which measured 3.7 us for these 11 fields, a sixth of parsing an event; writing the
    slots directly costs about 1 us. The object is exactly what ``__init__`` would make.
    """
    e = object.__new__(cls)
    _SET_TOPIC(e, v[0])
    _SET_AUTHOR(e, v[1])
    _SET_PUBLISHER(e, v[2])
    _SET_PARENT(e, v[3])
    _SET_PAYLOAD(e, v[4])
    _SET_CREATED(e, v[5])
    _SET_VERSION(e, v[6])
    _SET_AUTHOR_SIG(e, v[7])
    _SET_PUBLISHER_SIG(e, v[8])
    _SET_BLOCK(e, v[9])
    _SET_CID(e, v[10])
    _SET_CONTENT_TYPE(e, v[11])
    _SET_MERGES(e, v[12])
    _SET_KEY(e, v[13])
    return e


def _check_merges(merges: tuple[CID, ...], parent: CID | None) -> None:
    if len(merges) > MAX_MERGES:
        raise SchemaError(f"an event links at most {MAX_MERGES} merges, not {len(merges)}")
    if len(set(merges)) != len(merges) or (parent is not None and parent in merges):
        raise SchemaError("event.merges must be distinct links, none of them the parent")


def _merge_links(value: Any, parent: CID | None, exact: bool) -> tuple[CID, ...]:
    """``event.merges`` from the wire: a non-empty list (an empty one is written by leaving
    the key out, so one event has one encoding) of distinct links other than the parent."""
    if type(value) is not list or not value:
        raise SchemaError("event.merges must be a non-empty list of links")
    links: list[CID] = []
    for item in value:
        link = _link(item, "event.merges[]", exact=exact)
        assert link is not None  # not nullable
        links.append(link)
    merges = tuple(links)
    _check_merges(merges, parent)
    return merges


_EVENT_KEYS: Final = {
    "topic",
    "author",
    "publisher",
    "parent",
    "payload",
    "metadata",
    "authorSignature",
}
_EVENT_OPTIONAL: Final = frozenset({"publisherSignature", "merges"})
_EVENT_META_KEYS: Final = {"created", "protocolVersion"}
_EVENT_META_OPTIONAL: Final = frozenset({"contentType", "key"})

_CONTENT_KEYS: Final = ("topic", "author", "payload", "metadata")


def _verify_event(
    cid: CID,
    wire: dict[str, Any],
    exact: bool,
    author: PeerId,
    publisher: PeerId,
    author_sig: bytes,
    publisher_sig: bytes | None,
) -> None:
    if publisher_sig is None:
        if not author.verify(author_sig, _encode_wire(_without(wire, _SIGNATURE_KEYS), exact)):
            raise SignatureError(f"event {cid}: author signature does not verify")
        return
    content = {k: wire[k] for k in _CONTENT_KEYS}
    if not author.verify(author_sig, _encode_wire(content, exact)):
        raise SignatureError(f"event {cid}: author signature does not verify")
    with_author = _without(wire, ("publisherSignature",))
    if not publisher.verify(publisher_sig, _encode_wire(with_author, exact)):
        raise SignatureError(f"event {cid}: publisher signature does not verify")


def _check_payload(payload: bytes | CID) -> None:
    if isinstance(payload, bytes):
        if len(payload) > MAX_INLINE_PAYLOAD:
            raise SchemaError(
                f"inline payload is {len(payload)} bytes; larger payloads go in a chunk tree "
                f"(max inline {MAX_INLINE_PAYLOAD})"
            )
    elif not isinstance(payload, CID):
        raise SchemaError("payload must be bytes or the CID of a chunk tree")
