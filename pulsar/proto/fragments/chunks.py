"""Which of our events travel the tree as fragments, and their blocks.

A large payload is a chunk tree (:mod:`dag.chunks`) the driver split and stored before
publishing; its event carries only the root's link. It travels as fragments when the
fragment layer is on and the payload is over the threshold (and within the event size
limit); otherwise readers pull the payload from the DHT.
"""

from __future__ import annotations

from collections.abc import Callable

from dag import CID, EventDescriptor
from dag.chunks import local_blocks, parse_node
from dag.cid import DAG_CBOR
from dag.errors import ChunkError

from .config import FragmentConfig

__all__ = ["large_blocks"]


def large_blocks(
    cfg: FragmentConfig, event: EventDescriptor, lookup: Callable[[CID], bytes | None]
) -> list[tuple[CID, bytes]] | None:
    """The chunk tree of ``event``'s payload, pre-order, if it is to travel the tree as
    fragments: fragments are on, the payload is a link to a chunk tree held here and over
    the threshold. None otherwise: the event carries only the link and readers pull the
    payload from the DHT."""
    root = event.payload
    if not cfg.enabled or not isinstance(root, CID) or root.codec != DAG_CBOR:
        return None
    block = lookup(root)
    if block is None:
        return None
    try:
        size, _ = parse_node(root, block)
    except ChunkError:
        return None
    if not cfg.threshold < size <= cfg.max_event_size:
        return None
    return local_blocks(root, lookup, max_blocks=cfg.max_fragments)
