"""Chunk trees: split, reassemble, and refuse anything that does not verify."""

from __future__ import annotations

import os

import pytest

from dag import CID, ChunkError, cid_of, encode
from dag.chunks import DEFAULT_CHUNK_SIZE, assemble, split
from dag.cid import DAG_CBOR


async def _assemble(blocks: dict[CID, bytes], root: CID, **kw: int) -> bytes:
    async def fetch(cid: CID) -> bytes:
        return blocks[cid]

    return await assemble(root, fetch, **kw)


@pytest.mark.parametrize("size", [0, 1, DEFAULT_CHUNK_SIZE, DEFAULT_CHUNK_SIZE + 1, 1_000_000])
async def test_roundtrip(size: int) -> None:
    payload = os.urandom(size)
    root, blocks = split(payload)
    assert root.codec == DAG_CBOR and blocks[-1][0] == root
    assert all(len(b) <= DEFAULT_CHUNK_SIZE for _, b in blocks)
    assert await _assemble(dict(blocks), root) == payload
    assert split(payload)[0] == root  # deterministic


async def test_multi_level_tree() -> None:
    payload = os.urandom(50_000)
    root, blocks = split(payload, chunk_size=100, fanout=4)
    assert len(blocks) > 500
    assert await _assemble(dict(blocks), root) == payload


async def test_tampered_leaf_is_refused() -> None:
    root, blocks = split(os.urandom(20_000))
    store = dict(blocks)
    leaf = blocks[0][0]
    store[leaf] = b"evil" + store[leaf][4:]
    with pytest.raises(ChunkError, match="does not match"):
        await _assemble(store, root)


async def test_lying_size_is_refused() -> None:
    leaf = b"abc"
    leaf_cid = split(leaf)[1][0][0]
    node = encode({"size": 10, "links": [leaf_cid]})
    store = {leaf_cid: leaf, cid_of(node): node}
    with pytest.raises(ChunkError, match="declares"):
        await _assemble(store, cid_of(node))


async def test_size_limit() -> None:
    root, blocks = split(os.urandom(10_000))
    with pytest.raises(ChunkError, match="more than"):
        await _assemble(dict(blocks), root, max_size=5_000)


async def test_malformed_nodes() -> None:
    for node in (encode({"size": 1}), encode([1]), encode({"size": -1, "links": []})):
        with pytest.raises(ChunkError):
            await _assemble({cid_of(node): node}, cid_of(node))
