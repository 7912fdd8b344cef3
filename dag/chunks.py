"""Chunk trees: payloads too large for one DHT RPC.

The ``kademlia`` package fits a whole RPC in one 8 KiB datagram, so a payload above the
inline limit is cut into *leaves* (raw-codec blocks of at most ``chunk_size`` bytes) and
linked from *nodes* (DAG-CBOR ``{"size": int, "links": [CID, ...]}``), built bottom-up until
one root remains. The event links the root. Every block is content-addressed, so
reassembly verifies each one against the link that named it, and a node's declared
``size`` is checked against its children, so a lying peer cannot make a reader allocate more
than the limit it asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from .cid import CID, DAG_CBOR, RAW, cid_of, cid_of_raw
from .codec import decode, encode
from .errors import ChunkError

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_FANOUT",
    "MAX_PAYLOAD_SIZE",
    "assemble",
    "local_blocks",
    "parse_node",
    "split",
]

DEFAULT_CHUNK_SIZE: Final = 6 * 1024
"""Leaf size: a leaf plus its key and the RPC framing stays under the 8 KiB datagram."""
DEFAULT_FANOUT: Final = 128
"""Links per node: 128 x 38 bytes keeps a node block under 5 KiB."""
MAX_PAYLOAD_SIZE: Final = 256 * 1024 * 1024
MAX_DEPTH: Final = 8
_FETCH_CONCURRENCY: Final = 16

Block = tuple[CID, bytes]


def split(
    payload: bytes, *, chunk_size: int = DEFAULT_CHUNK_SIZE, fanout: int = DEFAULT_FANOUT
) -> tuple[CID, list[Block]]:
    """Cut ``payload`` into a chunk tree. Returns the root CID and every block (root last),
    ready to be stored. The same payload always gives the same root."""
    if chunk_size < 1 or fanout < 2:
        raise ValueError("chunk_size must be >= 1 and fanout >= 2")
    if len(payload) > MAX_PAYLOAD_SIZE:
        raise ChunkError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_SIZE}")
    blocks: list[Block] = []
    level: list[tuple[CID, int]] = []
    for start in range(0, max(len(payload), 1), chunk_size):
        leaf = payload[start : start + chunk_size]
        cid = cid_of_raw(leaf)
        blocks.append((cid, leaf))
        level.append((cid, len(leaf)))
    # The root is always a node, even over a single leaf, so an event's payload link tells
    # a chunk tree (dag-cbor) from nothing else and carries the total size up front.
    while True:
        parents: list[tuple[CID, int]] = []
        for start in range(0, len(level), fanout):
            group = level[start : start + fanout]
            size = sum(s for _, s in group)
            node = encode({"size": size, "links": [c for c, _ in group]})
            cid = cid_of(node)
            blocks.append((cid, node))
            parents.append((cid, size))
        level = parents
        if len(level) == 1:
            break
    return level[0][0], blocks


async def assemble(
    root: CID,
    fetch: Callable[[CID], Awaitable[bytes]],
    *,
    max_size: int = MAX_PAYLOAD_SIZE,
) -> bytes:
    """Fetch and verify a chunk tree, returning the payload.

    ``fetch`` may come from anywhere (the local store, a peer, the DHT): every block it
    returns is checked against its CID here. Raises :class:`ChunkError` for a block that
    does not match, a malformed node, inconsistent sizes, too deep a tree, or a payload over
    ``max_size``.
    """
    if root.codec != DAG_CBOR:
        raise ChunkError(f"chunk tree root {root} must be a dag-cbor node")
    semaphore = asyncio.Semaphore(_FETCH_CONCURRENCY)

    async def get(cid: CID) -> bytes:
        async with semaphore:
            block = await fetch(cid)
        if not isinstance(block, bytes) or not cid.verifies(block):
            raise ChunkError(f"chunk {cid} does not match its content")
        return block

    async def walk(cid: CID, depth: int, budget: int) -> tuple[int, list[bytes]]:
        block = await get(cid)
        if cid.codec == RAW:
            if len(block) > budget:
                raise ChunkError(f"chunk tree is larger than {max_size} bytes")
            return len(block), [block]
        if cid.codec != DAG_CBOR or depth >= MAX_DEPTH:
            raise ChunkError(f"unexpected chunk {cid} at depth {depth}")
        size, links = _parse_node(cid, block)
        if size > budget:
            raise ChunkError(f"chunk tree declares {size} bytes, more than {max_size}")
        parts = await asyncio.gather(*(walk(link, depth + 1, size) for link in links))
        total = sum(n for n, _ in parts)
        if total != size:
            raise ChunkError(f"chunk node {cid} declares {size} bytes but holds {total}")
        return total, [piece for _, pieces in parts for piece in pieces]

    _, pieces = await walk(root, 0, max_size)
    return b"".join(pieces)


def local_blocks(
    root: CID, get: Callable[[CID], bytes | None], *, max_blocks: int = 1 << 16
) -> list[Block] | None:
    """Every block of the chunk tree under ``root`` that ``get`` holds, node before its
    children (pre-order: the order in which a receiver can verify each block against a CID
    it already trusts); None if one is missing or malformed, or there are more than
    ``max_blocks``."""
    out: list[Block] = []
    stack = [(root, 0)]
    while stack:
        cid, depth = stack.pop()
        block = get(cid)
        if block is None or not cid.verifies(block) or len(out) >= max_blocks:
            return None
        out.append((cid, block))
        if cid.codec == DAG_CBOR:
            if depth >= MAX_DEPTH:
                return None
            try:
                _, links = parse_node(cid, block)
            except ChunkError:
                return None
            stack.extend((link, depth + 1) for link in reversed(links))
        elif cid.codec != RAW:
            return None
    return out


def parse_node(cid: CID, block: bytes) -> tuple[int, list[CID]]:
    """The declared size and the links of a chunk-tree node (:class:`ChunkError` if it is
    not one)."""
    return _parse_node(cid, block)


def _parse_node(cid: CID, block: bytes) -> tuple[int, list[CID]]:
    try:
        node = decode(block)
    except ValueError as exc:
        raise ChunkError(f"chunk node {cid} is not DAG-CBOR: {exc}") from None
    if not isinstance(node, dict) or set(node) != {"size", "links"}:
        raise ChunkError(f"chunk node {cid} must be a map with exactly size and links")
    size, links = node["size"], node["links"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ChunkError(f"chunk node {cid} has an invalid size")
    if (
        not isinstance(links, list)
        or not links
        or not all(isinstance(link, CID) for link in links)
    ):
        raise ChunkError(f"chunk node {cid} must link at least one chunk")
    return size, links
