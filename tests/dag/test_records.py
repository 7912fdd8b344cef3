"""Heads records: exact round trips and every way a record is refused."""

from __future__ import annotations

from typing import Any

import pytest

from dag import EventDescriptor, Identity, InvalidDescriptor, TopicDescriptor, encode
from dag.codec import decode
from dag.records import (
    MAX_RECORD_HEADS,
    MAX_RECORD_PEERS,
    HeadsRecord,
    heads_record_key,
)

ALICE, BOB = Identity.from_seed(b"a" * 32), Identity.from_seed(b"b" * 32)
META = TopicDescriptor.create(ALICE, "t/meta")
TOPIC = TopicDescriptor.create(ALICE, "t", meta=META.cid)
EVENTS = [EventDescriptor.create(ALICE, TOPIC.cid, b"%d" % i) for i in range(20)]


def _record(**kw: Any) -> HeadsRecord:
    args: dict[str, Any] = {"heads": (EVENTS[0].cid,), "peers": (BOB.peer_id,), "now": 5.0}
    args.update(kw)
    return HeadsRecord.create(ALICE, TOPIC.cid, 7, TOPIC.cid, **args)


def _resigned(mutate: Any, signer: Identity = ALICE) -> bytes:
    """A record's map changed by ``mutate`` and signed again (a well-formed forgery)."""
    wire = decode(_record().block)
    del wire["signature"]
    mutate(wire)
    wire["signature"] = signer.sign(encode(wire))
    return encode(wire)


def test_a_record_round_trips_and_is_stored_under_its_topic_and_publisher() -> None:
    record = _record()
    parsed = HeadsRecord.from_block(record.block)
    assert parsed == record
    assert (parsed.topic, parsed.publisher, parsed.seq) == (TOPIC.cid, ALICE.peer_id, 7)
    assert parsed.heads == (EVENTS[0].cid,) and parsed.peers == (BOB.peer_id,)
    assert parsed.key == heads_record_key(TOPIC.cid, ALICE.peer_id)
    assert parsed.key != heads_record_key(TOPIC.cid, BOB.peer_id)
    assert len(parsed.key) == 20


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda w: w.update(seq=-1), "seq"),
        (lambda w: w.update(t="pulsarcast/heads/0"), "type"),
        (lambda w: w.update(extra=1), "keys"),
        (lambda w: w.update(heads=[e.cid for e in EVENTS[: MAX_RECORD_HEADS + 1]]), "heads"),
        (lambda w: w.update(heads=[EVENTS[0].cid, EVENTS[0].cid]), "twice"),
        (lambda w: w.update(peers=[Identity.from_seed(bytes([i]) * 32).peer_id.raw
                                   for i in range(MAX_RECORD_PEERS + 1)]), "peers"),
        (lambda w: w.update(peers=[ALICE.peer_id.raw]), "publisher"),
        (lambda w: w.update(version=b"not a link"), "version"),
    ],
)
def test_malformed_records_are_refused(mutate: Any, message: str) -> None:
    with pytest.raises(InvalidDescriptor, match=message):
        HeadsRecord.from_block(_resigned(mutate))


def test_a_record_signed_by_anyone_but_its_publisher_is_refused() -> None:
    forged = _resigned(lambda w: w.update(seq=99), signer=BOB)
    with pytest.raises(InvalidDescriptor, match="signature"):
        HeadsRecord.from_block(forged)
    tampered = bytearray(_record().block)
    tampered[-1] ^= 1
    with pytest.raises(InvalidDescriptor):
        HeadsRecord.from_block(bytes(tampered))


def test_records_and_descriptors_never_parse_as_each_other() -> None:
    with pytest.raises(InvalidDescriptor):
        TopicDescriptor.from_block(_record().block)
    with pytest.raises(InvalidDescriptor):
        EventDescriptor.from_block(_record().block)
    for block in (TOPIC.block, EVENTS[0].block):
        with pytest.raises(InvalidDescriptor):
            HeadsRecord.from_block(block)


def test_oversized_or_trailing_bytes_are_refused() -> None:
    with pytest.raises(InvalidDescriptor, match="at most"):
        HeadsRecord.from_block(b"\xa0" * 3000)
    with pytest.raises(InvalidDescriptor):
        HeadsRecord.from_block(_record().block + b"\x00")


def test_the_key_space_of_records_is_not_the_key_space_of_blocks() -> None:
    from dht.keys import dht_key

    assert heads_record_key(TOPIC.cid, ALICE.peer_id) != dht_key(TOPIC.cid)
