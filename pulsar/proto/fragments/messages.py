"""The messages of large events along the tree: FRAGMENT, IDONTWANT and FWANT.

A large event's payload is a chunk tree (:mod:`dag.chunks`): the signed event links its
root, the root and inner nodes link their children, and every block is content-addressed.
Those very blocks travel the tree as FRAGMENTs right behind the event, so a receiver checks
each one against a CID it already trusts (named by the event or by a node it verified)
before it keeps or forwards it. ``docs/protocol.md`` is the normative description.

Nothing here is trusted: sizes and counts are bounded at decode time, and what a fragment
*means* (whether its CID is one the receiver expects) is the core's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID
from pulsar.proto.fields import MessageError, link_field

__all__ = [
    "MAX_FRAGMENT",
    "MAX_IDONTWANT",
    "MAX_WANTED",
    "FWant",
    "Fragment",
    "IDontWant",
]

MAX_FRAGMENT: Final = 64 * 1024
"""Largest block one FRAGMENT carries (the chunk trees this node builds use 6 KiB leaves
and nodes under 5 KiB; other implementations may cut larger leaves, up to this)."""
MAX_IDONTWANT: Final = 64
"""Events one IDONTWANT names."""
MAX_WANTED: Final = 256
"""Blocks one FWANT asks for."""


@dataclass(frozen=True, slots=True)
class Fragment:
    """One block of the chunk tree of ``event``'s payload, on ``topic``'s tree. ``cid`` is
    the block's CID (its codec tells a raw leaf from a DAG-CBOR node)."""

    topic: CID
    event: CID
    cid: CID
    block: bytes
    T: ClassVar[str] = "frag"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"block", "cid", "event", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": self.T, "topic": self.topic, "event": self.event, "cid": self.cid,
            "block": self.block,
        }

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Fragment:
        block = m["block"]
        if not isinstance(block, bytes) or not 0 < len(block) <= MAX_FRAGMENT:
            raise MessageError(f"frag.block must be 1..{MAX_FRAGMENT} bytes")
        return cls(
            link_field(m["topic"], "frag.topic"),
            link_field(m["event"], "frag.event"),
            link_field(m["cid"], "frag.cid"),
            block,
        )


@dataclass(frozen=True, slots=True)
class IDontWant:
    """The sender has (or is receiving) these large events of ``topic``: send it none of
    their fragments."""

    topic: CID
    events: tuple[CID, ...]
    T: ClassVar[str] = "idontwant"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"events", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "events": list(self.events)}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> IDontWant:
        events = m["events"]
        if not isinstance(events, list) or not 1 <= len(events) <= MAX_IDONTWANT:
            raise MessageError(f"idontwant.events must list 1..{MAX_IDONTWANT} events")
        return cls(
            link_field(m["topic"], "idontwant.topic"),
            tuple(link_field(e, "idontwant.events") for e in events),
        )


@dataclass(frozen=True, slots=True)
class FWant:
    """Ask a neighbour for blocks of ``event``'s chunk tree that did not arrive; it answers
    with a FRAGMENT for each it holds (and says nothing of the others)."""

    topic: CID
    event: CID
    cids: tuple[CID, ...]
    T: ClassVar[str] = "fwant"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"cids", "event", "topic"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "event": self.event, "cids": list(self.cids)}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> FWant:
        cids = m["cids"]
        if not isinstance(cids, list) or not 1 <= len(cids) <= MAX_WANTED:
            raise MessageError(f"fwant.cids must list 1..{MAX_WANTED} blocks")
        return cls(
            link_field(m["topic"], "fwant.topic"),
            link_field(m["event"], "fwant.event"),
            tuple(link_field(c, "fwant.cids") for c in cids),
        )


