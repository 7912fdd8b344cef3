"""The wire codec: every message a peer may send, and the one place frames become messages.

A frame's payload is one DAG-CBOR map whose ``t`` names the message type; each type's
class declares its keys (``FIELDS``, and ``OPTIONAL`` ones a sender leaves out when unset,
so peers that predate them still read it) and validates its values in ``from_wire``. The
table of types is written out here, not filled in as modules happen to be imported, so
what a node accepts is one list a reader can check against ``docs/protocol.md``.
:func:`decode_message` returns the closed union :data:`Message`; anything malformed
raises :class:`~pulsar.proto.tree.messages.MessageError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dag import encode
from dag.codec import decode_fast
from dag.errors import CodecError
from pulsar.proto.batch.messages import BATCH_KINDS, Batch
from pulsar.proto.events import Message
from pulsar.proto.flood.messages import Subs
from pulsar.proto.fragments.messages import Fragment, FWant, IDontWant
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.groups.messages import GroupBeat
from pulsar.proto.membership.messages import (
    Disconnect,
    ForwardJoin,
    HvJoin,
    Interests,
    Neighbor,
    NeighborReply,
    ViewShuffle,
    ViewShuffleReply,
)
from pulsar.proto.reconcile.messages import RBlocks, Recon, RWant
from pulsar.proto.repair.messages import Blocks, Heads, HeadsDigest, Joined, Want
from pulsar.proto.tree.messages import Event, Join, Leave, Ping, Pong, RequestToPublish

from .fields import MAX_MESSAGE_SIZE, MessageError

__all__ = ["MESSAGE_TYPES", "RUNTIME_TYPES", "Frame", "RuntimeMessage", "decode_frame",
           "decode_message", "encode_message"]

MESSAGE_TYPES: Final[tuple[type[Message], ...]] = (
    Join, Leave, Event, RequestToPublish, Ping, Pong,  # trees and events (protocol.md §3)
    IHave, Graft, Prune, Shuffle,  # lazy repair (§4)
    HvJoin, ForwardJoin, Neighbor, NeighborReply, Disconnect, ViewShuffle, ViewShuffleReply,
    Interests,  # the node-wide overlay (§4.1)
    Want, Blocks, Heads, HeadsDigest, Joined,  # backfill and anti-entropy (§5)
    Subs,  # the Floodsub baseline (§6)
    Fragment, IDontWant, FWant,  # large events (§3.4)
    Batch,  # control messages of many topics in one frame
)
"""Every message type the protocol core takes, in the order of docs/protocol.md."""
RUNTIME_TYPES: Final = (GroupBeat, Recon, RWant, RBlocks)
"""Message types the node's runtime takes itself, not the core: consumer groups
(docs/protocol.md §11) and range reconciliation (§12)."""
RuntimeMessage = GroupBeat | Recon | RWant | RBlocks
Frame = Message | RuntimeMessage
"""Whatever a frame may carry."""


class _Kind:
    """How one message type is read: its keys, and its decoder."""

    __slots__ = ("fields", "optional", "parse")

    def __init__(self, fields: frozenset[str], optional: frozenset[str],
                 parse: Callable[[dict[str, Any]], Frame]) -> None:
        self.fields = fields
        self.optional = optional
        self.parse = parse


def _kind(cls: type[Frame]) -> _Kind:
    optional: frozenset[str] = getattr(cls, "OPTIONAL", frozenset())
    if cls is Batch:
        return _Kind(Batch.FIELDS | {"t"}, optional, _batch)
    return _Kind(cls.FIELDS | {"t"}, optional, cls.from_wire)  # type: ignore[union-attr]


def _batch(wire: dict[str, Any]) -> Batch:
    items = tuple(_decode(item, BATCH_KINDS) for item in Batch.items_of(wire))
    return Batch(items)  # type: ignore[arg-type]  # _decode allowed BATCH_KINDS only


def encode_message(message: Frame) -> bytes:
    """The DAG-CBOR frame payload of ``message``."""
    return encode(message.to_wire())


def decode_message(frame: bytes) -> Message:
    """Parse a frame payload for the core; :class:`MessageError` for anything malformed,
    and for a runtime message (:data:`RUNTIME_TYPES`)."""
    message = decode_frame(frame)
    if isinstance(message, RUNTIME_TYPES):
        raise MessageError(f"a {message.T} message is not the core's")
    return message


def decode_frame(frame: bytes) -> Frame:
    """Parse a frame payload; :class:`MessageError` for anything malformed."""
    if len(frame) > MAX_MESSAGE_SIZE:
        raise MessageError("message too large")
    try:
        wire = decode_fast(frame)
    except CodecError as exc:
        raise MessageError(f"not DAG-CBOR: {exc}") from None
    if not isinstance(wire, dict):
        raise MessageError("message must be a map")
    return _decode(wire, None)


def _decode(wire: dict[str, Any], allowed: frozenset[str] | None) -> Frame:
    """One message from its decoded map (``allowed``: the message types allowed here)."""
    name = wire.get("t")
    kind = _KINDS.get(name) if isinstance(name, str) else None
    if kind is None or (allowed is not None and name not in allowed):
        raise MessageError(f"unknown message type {name!r}"[:100])
    keys = wire.keys()
    if keys != kind.fields and not (
        kind.fields <= keys and keys - kind.fields <= kind.optional
    ):
        raise MessageError(f"{name} message has fields {sorted(wire)}"[:200])
    try:
        return kind.parse(wire)
    except (KeyError, TypeError) as exc:
        raise MessageError(f"malformed {name} message: {exc}") from None


_KINDS: Final[dict[str, _Kind]] = {cls.T: _kind(cls) for cls in (*MESSAGE_TYPES, *RUNTIME_TYPES)}
