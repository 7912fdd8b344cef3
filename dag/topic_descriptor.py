"""Topic descriptors (paper, listing 1): :class:`TopicDescriptor` and its settings,
:class:`EventLinking` and :class:`PublishRule`.

What a topic is and who may publish on it: building and signing a topic version, parsing
and validating a received one, and the rights it grants (:meth:`TopicDescriptor.may_publish`,
:meth:`TopicDescriptor.may_request`). Kept apart from :mod:`dag.event_descriptor` because
the two kinds share only the wire rules (:mod:`dag.descriptor_wire`); the module docstring
of :mod:`dag.descriptors`, which re-exports both, says what validation checks and why.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, Self

from .cid import CID
from .codec import encode
from .descriptor_wire import (
    _SIGNATURE_KEYS,
    MAX_NAME_BYTES,
    MAX_PEERS,
    MAX_SUBTOPICS,
    MAX_VERSION_HEADS,
    PROTOCOL_VERSION,
    _check_canonical,
    _check_timestamp,
    _ContentAddressed,
    _encode_wire,
    _link,
    _load,
    _map,
    _peer,
    _signature,
    _text,
    _version,
    _without,
    iso_timestamp,
    parse_timestamp,
)
from .errors import SchemaError, SignatureError
from .identity import Identity, PeerId

__all__ = ["MAX_RETENTION", "EventLinking", "PublishRule", "Retention", "TopicDescriptor"]


class EventLinking(enum.StrEnum):
    """How a topic's events pick their parent link."""

    LAST_SEEN = "LAST_SEEN"
    """The publishing node links the event it saw last: a single publisher yields a chain."""
    CUSTOM = "CUSTOM"
    """The application names the parent (any event of the topic), or none."""


@dataclass(frozen=True, slots=True)
class PublishRule:
    """One of a topic's ``allowedPublishers`` / ``requestToPublish`` settings."""

    enabled: bool = False
    peers: tuple[PeerId, ...] = ()

    def lists(self, peer: PeerId) -> bool:
        return peer in self.peers

    def to_wire(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "peers": [p.raw for p in self.peers]}

    @classmethod
    def from_wire(cls, value: Any, what: str) -> PublishRule:
        obj = _map(value, what, {"enabled", "peers"})
        enabled = obj["enabled"]
        if not isinstance(enabled, bool):
            raise SchemaError(f"{what}.enabled must be a boolean")
        peers = obj["peers"]
        if not isinstance(peers, list):
            raise SchemaError(f"{what}.peers must be a list")
        if len(peers) > MAX_PEERS:
            raise SchemaError(f"{what}.peers has {len(peers)} entries, more than {MAX_PEERS}")
        return cls(enabled, tuple(_peer(p, f"{what}.peers[]") for p in peers))


MAX_RETENTION: Final = 2**53 - 1
"""The largest ``maxAge`` (seconds) or ``maxEvents`` a topic may declare (what a JSON
number carries exactly)."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of a topic's history every node keeps (optional ``metadata.retention``,
    signed and versioned with the rest of the topic, so every node applies the same rule):
    the newest ``max_events`` events, and those created (by their signed ``created``) in
    the last ``max_age`` seconds; an event is kept while both allow it. With ``compact``,
    an event with a key (``metadata.key``) is kept only while no newer event has the same
    key (newer: the later ``created``, then the larger CID), as Kafka's
    ``cleanup.policy=compact``; events without a key are not compacted. At least one of
    the three."""

    max_age: int | None = None
    max_events: int | None = None
    compact: bool = False

    def __post_init__(self) -> None:
        if self.max_age is None and self.max_events is None and not self.compact:
            raise SchemaError("a retention policy sets max_age, max_events, compact or more")
        if type(self.compact) is not bool:
            raise SchemaError("retention compact must be true or false")
        for name, value in (("max_age", self.max_age), ("max_events", self.max_events)):
            if value is not None and (type(value) is not int or not 1 <= value <= MAX_RETENTION):
                raise SchemaError(f"retention {name} must be an integer in 1..{MAX_RETENTION}")

    def to_wire(self) -> dict[str, int | bool]:
        wire: dict[str, int | bool] = {}
        if self.max_age is not None:
            wire["maxAge"] = self.max_age
        if self.max_events is not None:
            wire["maxEvents"] = self.max_events
        if self.compact:
            wire["compact"] = True
        return wire

    @classmethod
    def from_wire(cls, value: Any) -> Retention:
        what = "topic.metadata.retention"
        obj = _map(value, what, set(), frozenset({"maxAge", "maxEvents", "compact"}))
        if not obj:
            raise SchemaError(f"{what} must set maxAge, maxEvents, compact or more")
        for key, item in obj.items():
            if key != "compact" and type(item) is not int:
                raise SchemaError(f"{what}.{key} must be an integer")
        # Only ``true`` is written (absent means false), so one policy has one encoding.
        if "compact" in obj and obj["compact"] is not True:
            raise SchemaError(f"{what}.compact must be true when present")
        return cls(obj.get("maxAge"), obj.get("maxEvents"), "compact" in obj)


@dataclass(frozen=True, slots=True, eq=False)
class TopicDescriptor(_ContentAddressed):
    """A signed topic (paper, listing 1). Build with :meth:`create`; parse with
    :meth:`from_block`. ``subtopics`` holds the ``#`` links; every topic except a meta topic
    links its meta topic as ``#meta``."""

    name: str
    author: PeerId
    parent: CID | None
    subtopics: Mapping[str, CID]
    created: str
    protocol_version: str
    allowed_publishers: PublishRule
    request_to_publish: PublishRule
    event_linking: EventLinking
    signature: bytes
    block: bytes = field(repr=False)
    cid: CID
    heads: tuple[CID, ...] = ()
    """The topic's heads (DAG tips) when the author made this version: events published
    under an *earlier* version by a publisher this version no longer allows are valid
    only if they are among these or their ancestors (optional ``metadata.heads``)."""
    retention: Retention | None = None
    """How much history nodes keep (None: all of it)."""

    KIND: ClassVar[str] = "topic"

    @property
    def meta(self) -> CID | None:
        """The meta topic's CID; ``None`` for a meta topic itself."""
        return self.subtopics.get("meta")

    @property
    def is_meta(self) -> bool:
        return "meta" not in self.subtopics

    @property
    def created_at(self) -> float:
        return parse_timestamp(self.created)

    def may_publish(self, peer: PeerId) -> bool:
        """Whether ``peer`` may publish (sign as publisher) events of this topic. The author
        always may; with ``allowedPublishers`` disabled, everyone may."""
        return (
            peer == self.author
            or not self.allowed_publishers.enabled
            or self.allowed_publishers.lists(peer)
        )

    def may_request(self, peer: PeerId) -> bool:
        """Whether ``peer`` may ask an allowed publisher to publish on its behalf."""
        rule = self.request_to_publish
        return rule.enabled and (not rule.peers or rule.lists(peer))

    @classmethod
    def create(
        cls,
        identity: Identity,
        name: str,
        *,
        meta: CID | None = None,
        parent: CID | None = None,
        subtopics: Mapping[str, CID] | None = None,
        allowed_publishers: PublishRule | Iterable[PeerId] | None = None,
        request_to_publish: PublishRule | Iterable[PeerId] | bool | None = None,
        event_linking: EventLinking | str = EventLinking.LAST_SEEN,
        heads: Iterable[CID] = (),
        retention: Retention | None = None,
        now: float | None = None,
    ) -> Self:
        """Build and sign a topic. ``meta`` is required unless this *is* a meta topic (pass
        ``meta=None`` and no ``"meta"`` sub-topic). Peers lists may be given as rules or as
        plain iterables (an iterable means "enabled, these peers"; ``True`` for
        ``request_to_publish`` means "enabled, anyone")."""
        links = dict(subtopics or {})
        if meta is not None:
            links["meta"] = meta
        try:
            linking = EventLinking(event_linking)
        except ValueError:
            raise SchemaError(
                f"eventLinking must be LAST_SEEN or CUSTOM, not {event_linking!r}"
            ) from None
        unsigned: dict[str, Any] = {
            "name": name,
            "author": identity.peer_id.raw,
            "parent": parent,
            "#": links,
            "metadata": {
                "created": iso_timestamp(now),
                "protocolVersion": PROTOCOL_VERSION,
                "allowedPublishers": _rule(allowed_publishers).to_wire(),
                "requestToPublish": _rule(request_to_publish).to_wire(),
                "eventLinking": linking.value,
            },
        }
        recorded = list(dict.fromkeys(heads))[-MAX_VERSION_HEADS:]
        if recorded:
            unsigned["metadata"]["heads"] = recorded
        if retention is not None:
            unsigned["metadata"]["retention"] = retention.to_wire()
        unsigned["authorSignature"] = identity.sign(encode(unsigned))
        # Parse what we built through the same checks as a received block: one set of rules
        # (bar checking the signature we just made).
        return cls.from_block(encode(unsigned), verify_signature=False)

    @classmethod
    def from_block(
        cls, block: bytes, cid: CID | None = None, *, verify_signature: bool = True
    ) -> Self:
        """Parse and validate a topic block; see :mod:`dag.descriptors` for what is checked.
        Raises :class:`~dag.errors.InvalidDescriptor` (a ``ValueError``)."""
        cid, wire, exact = _load(block, cls.KIND, cid)
        _map(wire, "topic", _TOPIC_KEYS)
        name = _text(wire["name"], "topic.name", MAX_NAME_BYTES)
        if not name:
            raise SchemaError("topic.name must not be empty")
        author = _peer(wire["author"], "topic.author")
        parent = _link(wire["parent"], "topic.parent", nullable=True, exact=exact)
        subs_wire = wire["#"]
        if not isinstance(subs_wire, dict):
            raise SchemaError("topic.# must be a map of names to links")
        if len(subs_wire) > MAX_SUBTOPICS:
            raise SchemaError(f"topic.# has more than {MAX_SUBTOPICS} links")
        subtopics: dict[str, CID] = {}
        for key, value in subs_wire.items():
            link = _link(value, f"topic.#{key}", exact=exact)
            assert link is not None
            subtopics[_text(key, "topic.# key", MAX_NAME_BYTES)] = link
        meta = _map(wire["metadata"], "topic.metadata", _TOPIC_META_KEYS, _TOPIC_META_OPTIONAL)
        created = _check_timestamp(meta["created"])
        version = _version(meta["protocolVersion"])
        allowed = PublishRule.from_wire(meta["allowedPublishers"], "allowedPublishers")
        request = PublishRule.from_wire(meta["requestToPublish"], "requestToPublish")
        try:
            linking = EventLinking(meta["eventLinking"])
        except (ValueError, TypeError):
            raise SchemaError("eventLinking must be LAST_SEEN or CUSTOM") from None
        heads = _heads(meta["heads"], exact) if "heads" in meta else ()
        retention = Retention.from_wire(meta["retention"]) if "retention" in meta else None
        signature = _signature(wire["authorSignature"], "topic.authorSignature")
        _check_canonical(wire, exact, block, cls.KIND)
        if verify_signature:
            unsigned = _encode_wire(_without(wire, _SIGNATURE_KEYS), exact)
            if not author.verify(signature, unsigned):
                raise SignatureError(f"topic {cid}: author signature does not verify")
        return cls(
            name,
            author,
            parent,
            MappingProxyType(subtopics),
            created,
            version,
            allowed,
            request,
            linking,
            signature,
            block,
            cid,
            heads,
            retention,
        )


def _heads(value: Any, exact: bool) -> tuple[CID, ...]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_VERSION_HEADS:
        raise SchemaError(f"topic.metadata.heads must list 1..{MAX_VERSION_HEADS} links")
    links = tuple(_link(v, "topic.metadata.heads[]", exact=exact) for v in value)
    if len(set(links)) != len(links):
        raise SchemaError("topic.metadata.heads has duplicates")
    return links  # type: ignore[return-value]


_TOPIC_KEYS: Final = {"name", "author", "parent", "#", "metadata", "authorSignature"}
_TOPIC_META_KEYS: Final = {
    "created",
    "protocolVersion",
    "allowedPublishers",
    "requestToPublish",
    "eventLinking",
}
_TOPIC_META_OPTIONAL: Final = frozenset({"heads", "retention"})


def _rule(value: PublishRule | Iterable[PeerId] | bool | None) -> PublishRule:
    if value is None or value is False:
        return PublishRule()
    if value is True:
        return PublishRule(enabled=True)
    if isinstance(value, PublishRule):
        return value
    peers = tuple(PeerId.parse(p) for p in value)
    if len(peers) > MAX_PEERS:
        raise SchemaError(f"at most {MAX_PEERS} peers may be listed")
    return PublishRule(enabled=True, peers=peers)
