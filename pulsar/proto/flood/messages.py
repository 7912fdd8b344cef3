"""Floodsub's one message of its own, SUBS (events travel in the shared EVENT message).

It follows :mod:`pulsar.proto.tree.messages` (one DAG-CBOR map with a ``t`` key, exactly the
listed keys, every field validated); :mod:`pulsar.proto.codec` lists it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID
from pulsar.proto.fields import MessageError, link_field

__all__ = ["MAX_SUBS", "Subs"]

MAX_SUBS: Final = 1024


@dataclass(frozen=True, slots=True)
class Subs:
    """A subscription announcement: the sender is (``on``) or is no longer a member."""

    topics: tuple[CID, ...]
    on: bool
    T: ClassVar[str] = "subs"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"on", "topics"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topics": list(self.topics), "on": self.on}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Subs:
        topics, on = m["topics"], m["on"]
        if not isinstance(topics, list) or len(topics) > MAX_SUBS:
            raise MessageError(f"subs.topics must be a list of at most {MAX_SUBS} links")
        if not isinstance(on, bool):
            raise MessageError("subs.on must be a boolean")
        parsed = tuple(link_field(t, "subs.topics[]") for t in topics)
        if len(set(parsed)) != len(parsed):
            raise MessageError("subs.topics has duplicates")
        return cls(parsed, on)


