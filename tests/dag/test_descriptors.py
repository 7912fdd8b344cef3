"""Topic and event descriptors: building, signing, parsing and every way to reject a block."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dag import (
    CID,
    CIDMismatch,
    EventDescriptor,
    EventLinking,
    Identity,
    InvalidDescriptor,
    PublishRule,
    Retention,
    SchemaError,
    SignatureError,
    TopicDescriptor,
    check_rights,
    cid_of,
    decode,
    encode,
)
from dag.codec import encode_reference_free
from dag.descriptors import (
    MAX_DESCRIPTOR_SIZE,
    MAX_INLINE_PAYLOAD,
    MAX_MERGES,
    iso_timestamp,
    parse_timestamp,
)

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
CAROL = Identity.from_seed(b"c" * 32)
NOW = 1_763_900_000.123


@pytest.fixture(scope="module")
def meta() -> TopicDescriptor:
    return TopicDescriptor.create(ALICE, "news/meta", now=NOW)


@pytest.fixture(scope="module")
def topic(meta: TopicDescriptor) -> TopicDescriptor:
    return TopicDescriptor.create(
        ALICE,
        "news",
        meta=meta.cid,
        allowed_publishers=[BOB.peer_id],
        request_to_publish=True,
        event_linking="LAST_SEEN",
        now=NOW,
    )


def _reencode(block: bytes, change: Any) -> bytes:
    value = decode(block)
    change(value)
    return encode(value)


def test_topic_roundtrip_and_fields(meta: TopicDescriptor, topic: TopicDescriptor) -> None:
    parsed = TopicDescriptor.from_block(topic.to_block(), topic.cid)
    assert parsed == topic and hash(parsed) == hash(topic)
    assert parsed.name == "news" and parsed.author == ALICE.peer_id
    assert parsed.meta == meta.cid and not parsed.is_meta
    assert meta.is_meta and meta.meta is None
    assert parsed.allowed_publishers == PublishRule(True, (BOB.peer_id,))
    assert parsed.request_to_publish == PublishRule(True, ())
    assert parsed.event_linking is EventLinking.LAST_SEEN
    assert parsed.cid == cid_of(topic.to_block())
    assert abs(parsed.created_at - NOW) < 0.001
    wire = decode(topic.to_block())
    assert set(wire) == {"name", "author", "parent", "#", "metadata", "authorSignature"}
    assert wire["#"] == {"meta": meta.cid}
    assert wire["metadata"]["eventLinking"] == "LAST_SEEN"


def test_topic_versions_link_their_parent(meta: TopicDescriptor, topic: TopicDescriptor) -> None:
    v2 = TopicDescriptor.create(
        ALICE, "news", meta=meta.cid, parent=topic.cid, event_linking=EventLinking.CUSTOM
    )
    assert v2.parent == topic.cid and v2.meta == meta.cid
    assert TopicDescriptor.from_block(v2.block).parent == topic.cid


def test_publish_rules(topic: TopicDescriptor, meta: TopicDescriptor) -> None:
    assert topic.may_publish(ALICE.peer_id)  # the author always may
    assert topic.may_publish(BOB.peer_id)
    assert not topic.may_publish(CAROL.peer_id)
    assert topic.may_request(CAROL.peer_id)
    assert meta.may_publish(CAROL.peer_id)  # allowedPublishers disabled: anyone
    assert not meta.may_request(CAROL.peer_id)


def test_event_by_its_author(topic: TopicDescriptor) -> None:
    event = EventDescriptor.create(BOB, topic.cid, b"hello", now=NOW)
    parsed = EventDescriptor.from_block(event.block, event.cid)
    assert parsed.payload == b"hello" and parsed.author == parsed.publisher == BOB.peer_id
    assert parsed.publisher_signature is None and parsed.parent is None
    child = EventDescriptor.create(BOB, topic.cid, b"again", parent=event.cid)
    assert EventDescriptor.from_block(child.block).parent == event.cid
    check_rights(parsed, topic)


def test_request_to_publish_signatures(topic: TopicDescriptor) -> None:
    created, author_sig = EventDescriptor.sign_content(CAROL, topic.cid, b"from carol", now=NOW)
    event = EventDescriptor.create(
        BOB,
        topic.cid,
        b"from carol",
        author=CAROL.peer_id,
        created=created,
        author_signature=author_sig,
        parent=None,
    )
    parsed = EventDescriptor.from_block(event.block)
    assert parsed.author == CAROL.peer_id and parsed.publisher == BOB.peer_id
    assert parsed.publisher_signature is not None
    check_rights(parsed, topic)
    # The author's signature does not cover someone else's payload.
    with pytest.raises(SignatureError, match="author"):
        EventDescriptor.create(
            BOB,
            topic.cid,
            b"tampered",
            author=CAROL.peer_id,
            created=created,
            author_signature=author_sig,
        )


def test_content_type_is_signed_metadata(topic: TopicDescriptor) -> None:
    event = EventDescriptor.create(BOB, topic.cid, b'{"a":1}', content_type="application/json")
    assert decode(event.block)["metadata"]["contentType"] == "application/json"
    assert EventDescriptor.from_block(event.block).content_type == "application/json"
    # Older events carry no contentType and stay valid.
    plain = EventDescriptor.create(BOB, topic.cid, b"raw")
    assert "contentType" not in decode(plain.block)["metadata"]
    assert EventDescriptor.from_block(plain.block).content_type is None

    def relabel(v: dict[str, Any]) -> None:
        v["metadata"]["contentType"] = "text/html"

    with pytest.raises(SignatureError):
        EventDescriptor.from_block(_reencode(event.block, relabel))


def test_content_type_of_a_request_to_publish(topic: TopicDescriptor) -> None:
    kind = "text/plain; charset=utf-8"
    created, sig = EventDescriptor.sign_content(
        CAROL, topic.cid, b"hi", content_type=kind, now=NOW
    )
    event = EventDescriptor.create(BOB, topic.cid, b"hi", author=CAROL.peer_id,
                                   created=created, author_signature=sig, content_type=kind)
    assert EventDescriptor.from_block(event.block).content_type == kind
    # The author signed the media type: a publisher cannot change it.
    with pytest.raises(SignatureError, match="author"):
        EventDescriptor.create(BOB, topic.cid, b"hi", author=CAROL.peer_id, created=created,
                               author_signature=sig, content_type="text/html")


@pytest.mark.parametrize(
    "bad", ["json", "application/", "/json", "text/plain; charset", "a/b\n", "x/" + "y" * 130,
            "text/plain;\x00=1"]
)
def test_content_type_must_be_a_media_type(topic: TopicDescriptor, bad: str) -> None:
    with pytest.raises(SchemaError):
        EventDescriptor.create(BOB, topic.cid, b"x", content_type=bad)
    good = EventDescriptor.create(BOB, topic.cid, b"x", content_type="application/json")

    def swap(v: dict[str, Any]) -> None:
        v["metadata"]["contentType"] = bad

    with pytest.raises(SchemaError):
        EventDescriptor.from_block(_reencode(good.block, swap), verify_signature=False)


@pytest.mark.parametrize("good", ["application/json", "text/plain; charset=utf-8",
                                  'application/vnd.api+json;q="a b"', "image/svg+xml"])
def test_content_type_accepts_media_types(topic: TopicDescriptor, good: str) -> None:
    event = EventDescriptor.create(BOB, topic.cid, b"x", content_type=good)
    assert EventDescriptor.from_block(event.block).content_type == good


def test_rights_refused(topic: TopicDescriptor) -> None:
    event = EventDescriptor.create(CAROL, topic.cid, b"not allowed")
    with pytest.raises(InvalidDescriptor, match="may not publish"):
        check_rights(event, topic)


def test_large_payload_links_a_chunk_tree(topic: TopicDescriptor) -> None:
    root = cid_of(encode({"size": 1, "links": []}))
    event = EventDescriptor.create(BOB, topic.cid, root)
    parsed = EventDescriptor.from_block(event.block)
    assert parsed.payload == root and not parsed.is_inline
    with pytest.raises(SchemaError, match="chunk tree"):
        EventDescriptor.create(BOB, topic.cid, b"x" * (MAX_INLINE_PAYLOAD + 1))


def test_payload_that_looks_like_a_cid_stays_bytes(topic: TopicDescriptor) -> None:
    sneaky = topic.cid.raw
    event = EventDescriptor.create(BOB, topic.cid, sneaky)
    parsed = EventDescriptor.from_block(event.block)
    assert parsed.payload == sneaky and isinstance(parsed.payload, bytes)
    assert decode(event.block)["payload"] == sneaky


# --------------------------------------------------------------------------- rejections


def test_wrong_cid(topic: TopicDescriptor) -> None:
    other = cid_of(b"\xa0")
    with pytest.raises(CIDMismatch):
        TopicDescriptor.from_block(topic.block, other)


def test_tampered_fields_break_the_signature(topic: TopicDescriptor) -> None:
    def rename(v: dict[str, Any]) -> None:
        v["name"] = "fake news"

    with pytest.raises(SignatureError):
        TopicDescriptor.from_block(_reencode(topic.block, rename))
    event = EventDescriptor.create(BOB, topic.cid, b"payload")

    def swap(v: dict[str, Any]) -> None:
        v["payload"] = b"PAYLOAD"

    with pytest.raises(SignatureError):
        EventDescriptor.from_block(_reencode(event.block, swap))


def test_forged_publisher(topic: TopicDescriptor) -> None:
    event = EventDescriptor.create(CAROL, topic.cid, b"x")

    def claim_bob(v: dict[str, Any]) -> None:
        v["author"] = v["publisher"] = BOB.peer_id.raw

    with pytest.raises(SignatureError):
        EventDescriptor.from_block(_reencode(event.block, claim_bob))


def test_signature_checks_can_be_skipped_but_not_schema(topic: TopicDescriptor) -> None:
    def rename(v: dict[str, Any]) -> None:
        v["name"] = "fake news"

    forged = _reencode(topic.block, rename)
    assert TopicDescriptor.from_block(forged, verify_signature=False).name == "fake news"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda v: v.pop("name"), "lacks"),
        (lambda v: v.update(extra=1), "unknown"),
        (lambda v: v.update(name=""), "empty"),
        (lambda v: v.update(name="n" * 300), "longer"),
        (lambda v: v.update(name=5), "string"),
        (lambda v: v.update(author=b"\x00\x01"), "peer id"),
        (lambda v: v.update(parent=b"not a link"), "not a valid CID"),
        (lambda v: v.update({"#": []}), "map"),
        (lambda v: v["metadata"].update(created="yesterday"), "timestamp"),
        (lambda v: v["metadata"].update(eventLinking="RANDOM"), "eventLinking"),
        (lambda v: v["metadata"]["allowedPublishers"].update(enabled="yes"), "boolean"),
        (lambda v: v["metadata"]["allowedPublishers"].update(peers=[b"x"] * 200), "entries"),
        (lambda v: v.update(authorSignature=b"short"), "64 bytes"),
    ],
)
def test_topic_schema_errors(topic: TopicDescriptor, mutate: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        TopicDescriptor.from_block(_reencode(topic.block, mutate))


def test_retention_is_signed_optional_metadata(meta: TopicDescriptor) -> None:
    kept = TopicDescriptor.create(ALICE, "ticks", meta=meta.cid, now=NOW,
                                  retention=Retention(max_age=3600, max_events=10_000))
    parsed = TopicDescriptor.from_block(kept.block, kept.cid)
    assert parsed.retention == Retention(3600, 10_000)
    assert decode(kept.block)["metadata"]["retention"] == {"maxAge": 3600, "maxEvents": 10_000}
    only = TopicDescriptor.create(ALICE, "ticks", meta=meta.cid, now=NOW,
                                  retention=Retention(max_events=5))
    assert decode(only.block)["metadata"]["retention"] == {"maxEvents": 5}
    # A topic without a policy keeps everything, and its encoding has no retention key (so
    # topics made before the field existed keep their CIDs).
    plain = TopicDescriptor.create(ALICE, "ticks", meta=meta.cid, now=NOW)
    assert plain.retention is None and "retention" not in decode(plain.block)["metadata"]

    def lengthen(v: Any) -> None:
        v["metadata"]["retention"]["maxAge"] = 7200

    with pytest.raises(SignatureError):
        TopicDescriptor.from_block(_reencode(kept.block, lengthen))


@pytest.mark.parametrize(
    ("retention", "message"),
    [
        ({}, "maxAge, maxEvents, compact or more"),
        ({"compact": False}, "compact must be true"),
        ({"compact": 1}, "compact must be true"),
        ({"maxAge": 0}, "1.."),
        ({"maxEvents": -5}, "1.."),
        ({"maxEvents": 2**53}, "1.."),
        ({"maxAge": 1.5}, "integer"),
        ({"maxAge": True}, "integer"),
        ({"maxBytes": 10}, "unknown"),
        ([3600], "map"),
    ],
)
def test_retention_schema_errors(meta: TopicDescriptor, retention: Any, message: str) -> None:
    plain = TopicDescriptor.create(ALICE, "ticks", meta=meta.cid, now=NOW)

    def put(v: Any) -> None:
        v["metadata"]["retention"] = retention

    with pytest.raises(SchemaError, match=message):
        TopicDescriptor.from_block(_reencode(plain.block, put), verify_signature=False)
    with pytest.raises(SchemaError):
        Retention()


def test_link_encoded_as_plain_bytes_is_rejected(topic: TopicDescriptor) -> None:
    """Same logical content, different CBOR type: a second CID must not verify."""
    event = EventDescriptor.create(BOB, topic.cid, b"x")
    value = decode(event.block)
    value["topic"] = value["topic"].raw  # a link written as bytes
    with pytest.raises(SchemaError, match=r"canonical|wrong CBOR type"):
        EventDescriptor.from_block(encode_reference_free(value))


@pytest.mark.parametrize("field", ["topic", "parent"])
def test_link_as_bytes_is_rejected_when_a_byte_field_looks_like_a_cid(
        topic: TopicDescriptor, field: str) -> None:
    """A payload (or a signature: one in 256 starts with 0x01) that looks like a CID makes
    the parser decode exactly; a link written as bytes must still be a schema error, not
    slip through as a link (the suite once failed on such a signature)."""
    first = EventDescriptor.create(BOB, topic.cid, b"first")
    event = EventDescriptor.create(BOB, topic.cid, b"\x01 looks like a CID", parent=first.cid)
    value = decode(event.block)
    value[field] = value[field].raw
    with pytest.raises(SchemaError, match="wrong CBOR type"):
        EventDescriptor.from_block(encode_reference_free(value), verify_signature=False)


def test_non_canonical_encoding_is_rejected(topic: TopicDescriptor) -> None:
    event = EventDescriptor.create(BOB, topic.cid, b"x")
    block = bytearray(event.block)
    # Re-encode the map header's length non-minimally: 0xa7 -> 0xb8 0x07.
    assert block[0] == 0xA7
    bad = bytes([0xB8, 0x07]) + bytes(block[1:])
    with pytest.raises(SchemaError):
        EventDescriptor.from_block(bad)


def test_garbage_and_oversized_blocks() -> None:
    for block in (b"", b"\xff", b"\xa0", encode([1, 2]), b"\x00" * 8000):
        with pytest.raises(InvalidDescriptor):
            EventDescriptor.from_block(block)
        with pytest.raises(InvalidDescriptor):
            TopicDescriptor.from_block(block)


def test_publisher_signature_rules(topic: TopicDescriptor) -> None:
    event = EventDescriptor.create(BOB, topic.cid, b"x")

    def add_pub_sig(v: dict[str, Any]) -> None:
        v["publisherSignature"] = b"\x00" * 64

    with pytest.raises(SchemaError, match="absent"):
        EventDescriptor.from_block(_reencode(event.block, add_pub_sig))

    def other_publisher(v: dict[str, Any]) -> None:
        v["publisher"] = CAROL.peer_id.raw

    with pytest.raises(SignatureError, match="unsigned"):
        EventDescriptor.from_block(_reencode(event.block, other_publisher))


def test_timestamps() -> None:
    assert iso_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert parse_timestamp(iso_timestamp(NOW)) == pytest.approx(NOW, abs=0.001)
    for bad in ("2026-13-01T00:00:00.000Z", "2026-01-01 00:00:00", "2026-01-01T00:00:00Z"):
        with pytest.raises(SchemaError):
            parse_timestamp(bad)


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(max_size=300), with_parent=st.booleans())
def test_event_roundtrip_property(payload: bytes, with_parent: bool) -> None:
    topic = cid_of(b"\xa0")
    parent: CID | None = cid_of(payload) if with_parent else None
    event = EventDescriptor.create(ALICE, topic, payload, parent=parent, now=NOW)
    parsed = EventDescriptor.from_block(event.to_block(), event.cid)
    assert (parsed.payload, parsed.parent, parsed.topic) == (payload, parent, topic)
    assert encode_reference_free(decode(event.block)) == event.block


def test_merge_links_are_signed_and_bounded(topic: TopicDescriptor) -> None:
    tips = [EventDescriptor.create(BOB, topic.cid, b"tip %d" % i, now=NOW + i).cid
            for i in range(MAX_MERGES + 1)]
    parent, merges = tips[0], tuple(tips[1:MAX_MERGES + 1])
    event = EventDescriptor.create(BOB, topic.cid, b"joins", parent=parent, merges=merges)
    parsed = EventDescriptor.from_block(event.block)
    assert parsed.merges == merges and parsed.parent == parent
    # No merges: the key is left out, so events without them keep their encoding.
    plain = EventDescriptor.create(BOB, topic.cid, b"plain", parent=parent, now=NOW)
    assert "merges" not in decode(plain.block) and plain.merges == ()

    def drop_one(v: dict[str, Any]) -> None:
        v["merges"] = v["merges"][1:]

    with pytest.raises(SignatureError):  # the publisher's signature covers them
        EventDescriptor.from_block(_reencode(event.block, drop_one))
    for bad in (tips, [tips[1], tips[1]], [parent]):
        with pytest.raises(SchemaError):
            EventDescriptor.create(BOB, topic.cid, b"x", parent=parent, merges=tuple(bad))

    def empty(v: dict[str, Any]) -> None:
        v["merges"] = []

    def not_links(v: dict[str, Any]) -> None:
        v["merges"] = [b"\x01\x02"]

    for change in (empty, not_links):
        with pytest.raises(SchemaError):
            EventDescriptor.from_block(_reencode(plain.block, change), verify_signature=False)


def test_merges_of_a_request_to_publish_are_the_publishers(topic: TopicDescriptor) -> None:
    """The author signs its content only; the publisher chooses (and signs) the links."""
    tip = EventDescriptor.create(BOB, topic.cid, b"tip", now=NOW).cid
    created, author_sig = EventDescriptor.sign_content(CAROL, topic.cid, b"c", now=NOW)
    event = EventDescriptor.create(BOB, topic.cid, b"c", author=CAROL.peer_id, created=created,
                                   author_signature=author_sig, merges=(tip,))
    assert EventDescriptor.from_block(event.block).merges == (tip,)


def test_the_largest_inline_event_with_every_merge_fits_a_descriptor(
    topic: TopicDescriptor,
) -> None:
    tips = tuple(EventDescriptor.create(BOB, topic.cid, b"%d" % i, now=NOW + i).cid
                 for i in range(MAX_MERGES + 1))
    created, author_sig = EventDescriptor.sign_content(
        CAROL, topic.cid, b"x" * MAX_INLINE_PAYLOAD, content_type="a/" + "b" * 125, now=NOW)
    event = EventDescriptor.create(
        BOB, topic.cid, b"x" * MAX_INLINE_PAYLOAD, author=CAROL.peer_id, created=created,
        author_signature=author_sig, content_type="a/" + "b" * 125, parent=tips[0],
        merges=tips[1:])
    assert len(event.block) <= MAX_DESCRIPTOR_SIZE
    assert EventDescriptor.from_block(event.block).merges == tips[1:]
