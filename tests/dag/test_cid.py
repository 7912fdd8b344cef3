"""CIDs as values: parsing, printing, equality."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dag import CID, InvalidCID, cid_of, cid_of_raw
from dag.cid import DAG_CBOR, RAW, SHA2_256

HELLO = "bafyreidykglsfhoixmivffc5uwhcgshx4j465xwqntbmu43nb2dzqwfvae"


def test_parse_print_roundtrip_and_fields() -> None:
    cid = CID.parse(HELLO)
    assert str(cid) == HELLO
    assert cid.version == 1 and cid.codec == DAG_CBOR and cid.hash_code == SHA2_256
    assert len(cid.digest) == 32
    assert CID.parse(bytes(cid)) == cid
    assert CID.parse(b"\x00" + bytes(cid)) == cid  # tag-42 form
    assert CID.parse(HELLO.upper().replace("B", "B", 1)) == cid


def test_equality_is_by_value_whatever_the_base() -> None:
    cid = CID.parse(HELLO)
    z = CID.parse("zdpuAtX7ZibcWdSKQwiDCkPjWwRvtcKCPku9H7LhgA4qJW4Wk")
    assert CID.parse(str(z)) == z
    assert len({cid, CID.parse(HELLO), CID.parse(bytes(cid))}) == 1
    hexed = CID.parse("f" + bytes(cid).hex())
    assert hexed == cid and hash(hexed) == hash(cid)


def test_v0() -> None:
    v0 = CID.parse("QmQg1v4o9xdT3Q14wh4S7dxZkDjyZ9ssFzFzyep1YrVJBY")
    assert v0.version == 0 and str(v0) == "QmQg1v4o9xdT3Q14wh4S7dxZkDjyZ9ssFzFzyep1YrVJBY"


def test_verifies() -> None:
    block = b"\xa0"
    assert cid_of(block).verifies(block)
    assert not cid_of(block).verifies(b"\xa1")
    assert cid_of_raw(b"x").codec == RAW


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "bafy",
        "xyz",
        "b!!!",
        "bafyreidykglsfhoixmivffc5uwhcgshx4j465xwqntbmu43nb2dzqwfva",
        "z0OIl",
        b"",
        b"\x02\x71\x12\x20" + bytes(32),
        b"\x01\x71\x12\x20" + bytes(31),
        b"\x01\x71\x12\x20" + bytes(33),
        b"\x01" * 200,
        12,
    ],
)
def test_invalid_cids(bad: object) -> None:
    with pytest.raises(InvalidCID):
        CID.parse(bad)  # type: ignore[arg-type]


@given(st.binary(max_size=50))
def test_cid_of_roundtrip(data: bytes) -> None:
    cid = cid_of(data)
    assert CID.parse(str(cid)) == cid
    assert CID.parse(bytes(cid)) == cid
