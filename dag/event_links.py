"""Reading an event block's links without verifying it.

Walks over the DAG (answering a WANT, passing vouching down, replaying, cutting history)
need only where an event points and when it was made, and they read many blocks: they
decode the block without checking its signature or CID. Whoever *uses* an event verifies
it in full (:class:`~dag.descriptors.EventDescriptor`); these readers only return None
for a block that is not shaped like an event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from .cid import CID
from .codec import decode_fast
from .descriptors import MAX_MERGES
from .errors import CodecError

__all__ = ["EventLinks", "event_key", "event_links", "event_version", "newest"]


class EventLinks(NamedTuple):
    """What a walk over event blocks needs of one, read without checking signatures."""

    parent: CID | None
    created: str
    merges: tuple[CID, ...]


def event_links(block: bytes) -> EventLinks | None:
    """The links and creation time of an event block, read without checking signatures:
    enough to walk a chain when answering a WANT or replaying (whoever uses the events
    verifies everything). None when the block is not shaped like an event."""
    try:
        wire = decode_fast(block)
        if not isinstance(wire, dict) or "publisher" not in wire or "payload" not in wire:
            return None
        created = wire["metadata"]["created"]
        raw = wire["parent"]
        if not isinstance(created, str):
            return None
        if raw is not None and not isinstance(raw, bytes):
            return None
        merges: tuple[CID, ...] = ()
        listed = wire.get("merges")
        if listed is not None:
            if not isinstance(listed, list) or len(listed) > MAX_MERGES:
                return None
            merges = tuple(CID(item) for item in listed if isinstance(item, bytes))
        return EventLinks(None if raw is None else CID(raw), created, merges)
    except (CodecError, KeyError, TypeError, ValueError):
        return None


def event_key(block: bytes) -> tuple[str | None, str] | None:
    """``(key, created)`` of an event block (``metadata.key``, None if it has none), read
    without checking anything else (compaction reads blocks the node verified when it
    stored them); None when it is not shaped like an event."""
    try:
        wire = decode_fast(block)
        if not isinstance(wire, dict) or "publisher" not in wire or "payload" not in wire:
            return None
        meta = wire["metadata"]
        key, created = meta.get("key"), meta["created"]
        if not isinstance(created, str) or not (key is None or isinstance(key, str)):
            return None
        return key, created
    except (CodecError, KeyError, TypeError, ValueError, AttributeError):
        return None


def event_version(block: bytes) -> tuple[CID, CID | None] | None:
    """``(topic version, parent)`` of an event block, read without checking anything else;
    None when it is not shaped like an event."""
    try:
        wire = decode_fast(block)
        if not isinstance(wire, dict) or "publisher" not in wire or "payload" not in wire:
            return None
        topic, parent = wire["topic"], wire["parent"]
        if not isinstance(topic, bytes) or not (parent is None or isinstance(parent, bytes)):
            return None
        return CID(topic), None if parent is None else CID(parent)
    except (CodecError, KeyError, TypeError, ValueError):
        return None


def newest(cids: Sequence[CID], lookup: Callable[[CID], bytes | None]) -> CID:
    """The CID among ``cids`` (not empty) whose block, if held, was created last; ties
    and blocks not held are ordered by CID bytes, so every node picks the same."""

    def key(cid: CID) -> tuple[str, bytes]:
        block = lookup(cid)
        links = None if block is None else event_links(block)
        return ("" if links is None else links.created, cid.raw)

    return max(cids, key=key)
