"""Wire messages of the node-wide membership layer (HyParView), and topic interests.

One overlay per node, shared by every topic (:mod:`pulsar.proto.membership.overlay`):

* ``hvjoin`` — a node entering the overlay asks a contact to take it as a neighbour;
* ``fwdjoin`` — the contact spreads the newcomer on random walks of ``ttl`` steps;
* ``neighbor`` / ``neighbor_reply`` — ask to become neighbours (``high`` priority cannot be
  refused: the asker has no neighbour left) and the answer;
* ``disconnect`` — the link is dropped (``alive``: the sender stays up, keep it as a
  passive peer);
* ``vshuffle`` / ``vshuffle_reply`` — the periodic exchange of passive-view samples, on a
  random walk from ``origin``;
* ``interests`` — the topics a neighbour is in, told when the link comes up and when the
  node joins a tree, so lazy links (Plumtree) can be drawn from the overlay.

Like every message (:mod:`pulsar.proto.tree.messages`) each is one DAG-CBOR map with a ``t``
key and every field is checked on decode; the lists are bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID, PeerId
from pulsar.proto.fields import MessageError, link_field, uint_field
from pulsar.proto.gossip.messages import parse_sample

__all__ = [
    "MAX_INTERESTS",
    "MAX_VIEW_SAMPLE",
    "MAX_WALK",
    "Disconnect",
    "ForwardJoin",
    "HvJoin",
    "Interests",
    "Neighbor",
    "NeighborReply",
    "ViewShuffle",
    "ViewShuffleReply",
]

MAX_WALK: Final = 16
"""The longest random walk a message may ask for (a receiver also caps it at its own)."""
MAX_VIEW_SAMPLE: Final = 32
"""Peers in one shuffle sample."""
MAX_INTERESTS: Final = 512
"""Topics in one INTERESTS message (a node in more sends several)."""


def _peer(value: Any, what: str) -> PeerId:
    return parse_sample([value], what, 1)[0]


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise MessageError(f"{what} must be a boolean")
    return value


@dataclass(frozen=True, slots=True)
class HvJoin:
    """Take me as a neighbour and introduce me to the overlay."""

    T: ClassVar[str] = "hvjoin"
    FIELDS: ClassVar[frozenset[str]] = frozenset()

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> HvJoin:
        return cls()


@dataclass(frozen=True, slots=True)
class ForwardJoin:
    """``peer`` joined; pass this on for ``ttl`` more steps, then link with it."""

    peer: PeerId
    ttl: int
    T: ClassVar[str] = "fwdjoin"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"peer", "ttl"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "peer": self.peer.raw, "ttl": self.ttl}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> ForwardJoin:
        return cls(_peer(m["peer"], "fwdjoin.peer"), uint_field(m["ttl"], "fwdjoin.ttl", MAX_WALK))


@dataclass(frozen=True, slots=True)
class Neighbor:
    """Be my neighbour; ``high`` when the sender has no neighbour at all."""

    high: bool
    T: ClassVar[str] = "neighbor"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"high"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "high": self.high}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Neighbor:
        return cls(_bool(m["high"], "neighbor.high"))


@dataclass(frozen=True, slots=True)
class NeighborReply:
    """The answer to NEIGHBOR: ``accept`` means the sender now holds the link."""

    accept: bool
    T: ClassVar[str] = "neighbor_reply"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"accept"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "accept": self.accept}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> NeighborReply:
        return cls(_bool(m["accept"], "neighbor_reply.accept"))


@dataclass(frozen=True, slots=True)
class Disconnect:
    """The sender dropped the link; ``alive``: it is still up (keep it as passive)."""

    alive: bool
    T: ClassVar[str] = "disconnect"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"alive"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "alive": self.alive}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Disconnect:
        return cls(_bool(m["alive"], "disconnect.alive"))


@dataclass(frozen=True, slots=True)
class ViewShuffle:
    """A sample of ``origin``'s views, walking ``ttl`` more steps before it is answered."""

    origin: PeerId
    ttl: int
    peers: tuple[PeerId, ...]
    T: ClassVar[str] = "vshuffle"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"origin", "peers", "ttl"})

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": self.T, "origin": self.origin.raw, "ttl": self.ttl,
            "peers": [p.raw for p in self.peers],
        }

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> ViewShuffle:
        return cls(
            _peer(m["origin"], "vshuffle.origin"),
            uint_field(m["ttl"], "vshuffle.ttl", MAX_WALK),
            parse_sample(m["peers"], "vshuffle.peers", MAX_VIEW_SAMPLE),
        )


@dataclass(frozen=True, slots=True)
class ViewShuffleReply:
    """The answer to a VSHUFFLE, sent straight to its origin: a sample of passive peers."""

    peers: tuple[PeerId, ...]
    T: ClassVar[str] = "vshuffle_reply"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"peers"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "peers": [p.raw for p in self.peers]}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> ViewShuffleReply:
        return cls(parse_sample(m["peers"], "vshuffle_reply.peers", MAX_VIEW_SAMPLE))


@dataclass(frozen=True, slots=True)
class Interests:
    """Topics whose trees the sender is in (not a complete list: added to what it said)."""

    topics: tuple[CID, ...]
    T: ClassVar[str] = "interests"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"topics"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topics": list(self.topics)}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Interests:
        topics = m["topics"]
        if not isinstance(topics, list) or not 1 <= len(topics) <= MAX_INTERESTS:
            raise MessageError(f"interests.topics must be a list of 1 to {MAX_INTERESTS} CIDs")
        return cls(tuple(link_field(t, "interests.topic") for t in topics))


MembershipMessage = (
    HvJoin | ForwardJoin | Neighbor | NeighborReply | Disconnect | ViewShuffle | ViewShuffleReply
)
"""What :class:`pulsar.proto.membership.overlay.Membership` handles (INTERESTS goes to the core)."""

