"""Wire messages of the lazy-repair (Plumtree) layer: IHAVE, GRAFT, PRUNE, SHUFFLE.

They follow :mod:`pulsar.proto.tree.messages` (one DAG-CBOR map with a ``t`` key, every field
validated on decode); :mod:`pulsar.proto.codec` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID, PeerId
from pulsar.proto.fields import MAX_HOPS, MessageError, link_field, uint_field

__all__ = ["MAX_IHAVE", "MAX_SAMPLE", "Graft", "IHave", "Prune", "Shuffle", "parse_sample"]

MAX_IHAVE: Final = 512
MAX_SAMPLE: Final = 16


@dataclass(frozen=True, slots=True)
class IHave:
    """ "I have these events of ``topic``", with the hop count each arrived at here."""

    topic: CID
    entries: tuple[tuple[CID, int], ...]
    T: ClassVar[str] = "ihave"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"ids", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "ids": [[c, h] for c, h in self.entries]}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> IHave:
        ids = m["ids"]
        if not isinstance(ids, list) or len(ids) > MAX_IHAVE:
            raise MessageError(f"ihave.ids must be a list of at most {MAX_IHAVE}")
        entries = []
        for item in ids:
            if not isinstance(item, list) or len(item) != 2:
                raise MessageError("ihave entries are [cid, hop] pairs")
            entries.append((link_field(item[0], "ihave.id"),
                            uint_field(item[1], "ihave.hop", MAX_HOPS)))
        return cls(link_field(m["topic"], "ihave.topic"), tuple(entries))


@dataclass(frozen=True, slots=True)
class Graft:
    """Make the link to the sender eager for ``topic`` and, if ``event`` is set, send it."""

    topic: CID
    event: CID | None
    T: ClassVar[str] = "graft"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"event", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "event": self.event}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Graft:
        event = None if m["event"] is None else link_field(m["event"], "graft.event")
        return cls(link_field(m["topic"], "graft.topic"), event)


@dataclass(frozen=True, slots=True)
class Prune:
    """Make the link to the sender lazy again for ``topic`` (it sent us a duplicate)."""

    topic: CID
    T: ClassVar[str] = "prune"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Prune:
        return cls(link_field(m["topic"], "prune.topic"))


@dataclass(frozen=True, slots=True)
class Shuffle:
    """A sample of ``topic``'s members (HyParView's passive-view shuffle); ``reply`` marks
    the answer, which is not answered again."""

    topic: CID
    peers: tuple[PeerId, ...]
    reply: bool
    T: ClassVar[str] = "shuffle"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"peers", "reply", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": self.T,
            "topic": self.topic,
            "peers": [p.raw for p in self.peers],
            "reply": self.reply,
        }

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Shuffle:
        if not isinstance(m["reply"], bool):
            raise MessageError("shuffle.reply must be a boolean")
        sample = parse_sample(m["peers"], "shuffle.peers")
        return cls(link_field(m["topic"], "shuffle.topic"), sample, m["reply"])


def parse_sample(peers: Any, name: str, limit: int = MAX_SAMPLE) -> tuple[PeerId, ...]:
    """A peer sample off the wire: at most ``limit`` valid peer ids."""
    if not isinstance(peers, list) or len(peers) > limit:
        raise MessageError(f"{name} must be a list of at most {limit}")
    try:
        return tuple(PeerId(p) for p in peers)
    except (ValueError, TypeError) as exc:
        raise MessageError(f"{name}: {exc}") from None


