"""The pub-sub message vectors (messages.json): every frame body decodes to the recorded
fields, is strict canonical DAG-CBOR, and encodes back to the same bytes; every message
type the wire codec knows has a vector."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dag import CID, EventDescriptor, TopicDescriptor, cid_of, decode
from dag.chunks import assemble
from pulsar.net.framing import Kind, encode_data
from pulsar.proto.codec import MESSAGE_TYPES, RUNTIME_TYPES, decode_frame, encode_message
from pulsar.proto.groups.messages import GroupBeat

from .generate import HERE, readable

DATA: dict[str, Any] = json.loads((HERE / "messages.json").read_text())
VECTORS: list[dict[str, Any]] = DATA["vectors"]


def check_message(vector: dict[str, Any]) -> None:
    """Raise AssertionError unless the vector's bytes are exactly the recorded message."""
    body = bytes.fromhex(vector["body"])
    assert body[:1] == bytes([Kind.DATA]), "a pub-sub message travels in a DATA frame"
    payload = body[1:]
    try:
        message = decode_frame(payload)
        strict = decode(payload)  # the strict decoder: canonical form, links as tag 42
    except ValueError as exc:
        raise AssertionError(f"{vector['name']}: does not decode: {exc}") from None
    assert vector["t"] == type(message).T
    assert readable(message.to_wire()) == vector["fields"], vector["name"]
    assert readable(strict) == vector["fields"], vector["name"]
    assert encode_message(message) == payload, vector["name"]
    if isinstance(message, GroupBeat):
        assert message.verify(), f"{vector['name']}: the signature does not verify"
    assert encode_data(payload) == len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
def test_vector_decodes_to_its_fields_and_encodes_back(vector: dict[str, Any]) -> None:
    check_message(vector)


def test_every_message_type_of_the_codec_has_a_vector() -> None:
    assert {cls.T for cls in (*MESSAGE_TYPES, *RUNTIME_TYPES)} == {v["t"] for v in VECTORS}


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
def test_a_changed_byte_fails_the_check(vector: dict[str, Any]) -> None:
    body = bytes.fromhex(vector["body"])
    for position in sorted({0, 1, len(body) // 2, len(body) - 1, *range(2, len(body), 29)}):
        changed = bytearray(body)
        changed[position] ^= 0x01
        with pytest.raises(AssertionError):
            check_message(vector | {"body": changed.hex()})


def test_the_descriptor_blocks_verify_against_their_cids() -> None:
    blocks = {name: (CID.parse(b["cid"]), bytes.fromhex(b["hex"]))
              for name, b in DATA["blocks"].items()}
    for cid, block in blocks.values():
        assert cid_of(block) == cid
    meta = TopicDescriptor.from_block(blocks["meta_topic"][1], blocks["meta_topic"][0])
    topic = TopicDescriptor.from_block(blocks["topic"][1], blocks["topic"][0])
    assert meta.is_meta and topic.meta == meta.cid and topic.parent is None
    author = DATA["identities"]["author"]["peer_id"]
    for name in ("event_1", "event_2", "event_large"):
        event = EventDescriptor.from_block(blocks[name][1], blocks[name][0])
        assert event.topic == topic.cid and str(event.author) == author
    assert EventDescriptor.from_block(blocks["event_large"][1]).payload == blocks[
        "event_large_root"][0]


async def test_the_chunk_tree_payload_is_its_leaves_depth_first() -> None:
    tree = DATA["chunk_tree"]
    blocks = {CID.parse(b["cid"]): bytes.fromhex(b["hex"]) for b in tree["blocks"]}

    async def fetch(cid: CID) -> bytes:
        return blocks[cid]

    payload = await assemble(CID.parse(tree["root"]), fetch)
    assert payload == bytes.fromhex(tree["payload"])

    # The same by hand, as another implementation reads it: walk the links in order.
    def walk(cid: CID) -> bytes:
        block = blocks[cid]
        if cid.codec == 0x55:
            return block
        node = decode(block)
        assert sum(len(walk(link)) for link in node["links"]) == node["size"]
        return b"".join(walk(link) for link in node["links"])

    assert walk(CID.parse(tree["root"])) == payload
