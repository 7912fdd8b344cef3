"""Wire messages: optional fields are left out when unset and checked when present."""

from __future__ import annotations

import pytest

from dag import Identity, cid_of, decode, encode
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.tree.messages import RequestToPublish

ALICE = Identity.from_seed(b"a" * 32)
TOPIC = cid_of(b"\xa1atb")


def _request(content_type: str | None) -> RequestToPublish:
    return RequestToPublish(TOPIC, TOPIC, ALICE.peer_id, b"hi", "2026-11-25T00:00:00.000Z",
                            b"s" * 64, None, content_type)


def test_request_to_publish_carries_its_media_type_only_when_set() -> None:
    plain = encode_message(_request(None))
    assert "ct" not in decode(plain)  # as peers that predate the field send it
    assert decode_message(plain) == _request(None)
    typed = encode_message(_request("application/json"))
    assert decode(typed)["ct"] == "application/json"
    assert decode_message(typed) == _request("application/json")


@pytest.mark.parametrize("bad", ["json", 7, "a/b; c", "x/" + "y" * 200])
def test_a_bad_media_type_is_refused(bad: object) -> None:
    wire = decode(encode_message(_request(None)))
    wire["ct"] = bad
    with pytest.raises(MessageError, match=r"rtp\.ct"):
        decode_message(encode(wire))


def test_unknown_fields_are_still_refused() -> None:
    wire = decode(encode_message(_request(None)))
    wire["extra"] = 1
    with pytest.raises(MessageError, match="fields"):
        decode_message(encode(wire))
