"""The codec against the IPLD fixtures, the `dag-cbor` reference and hand-made bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import dag_cbor
import multiformats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dag import CID, CodecError, cid_of, decode, encode
from dag.codec import encode_reference_free, is_cid_like

HELLO_CID = "bafyreidykglsfhoixmivffc5uwhcgshx4j465xwqntbmu43nb2dzqwfvae"


def _fixture_files(root: Path) -> list[tuple[str, Path]]:
    return sorted(
        (path.name.removesuffix(".dag-cbor"), path)
        for path in (root / "fixtures").glob("*/*.dag-cbor")
    )


def test_hello_world_cid() -> None:
    assert str(cid_of(encode({"hello": "world"}))) == HELLO_CID


def test_all_fixtures_decode_reencode_and_reproduce_their_cid(ipld_fixtures: Path) -> None:
    files = _fixture_files(ipld_fixtures)
    assert len(files) == 128
    for name, path in files:
        data = path.read_bytes()
        value = decode(data)
        assert encode(value) == data, name
        assert encode_reference_free(value) == data, name
        assert str(cid_of(data)) == name, name


def test_negative_fixtures_are_rejected(ipld_fixtures: Path) -> None:
    cases = list((ipld_fixtures / "negative-fixtures" / "dag-cbor" / "decode").glob("*.json"))
    assert cases
    for case_file in cases:
        for case in json.loads(case_file.read_text()):
            with pytest.raises(CodecError):
                decode(bytes.fromhex(case["hex"]))


@pytest.mark.parametrize(
    ("hex_input", "reason"),
    [
        ("", "empty"),
        ("a2616201616101", "keys out of order"),
        ("a2616101616101", "duplicate keys"),
        ("a2626161016162", "truncated"),
        ("1801", "non-minimal integer"),
        ("5801ff", "non-minimal length"),
        ("9f01ff", "indefinite array"),
        ("5f41ff", "indefinite bytes"),
        ("d82b01", "tag other than 42"),
        ("d82a4101", "link without 0x00 prefix"),
        ("d82a420001", "malformed CID in link"),
        ("d82a01", "tag 42 over a non-bytes value"),
        ("fb7ff8000000000000", "NaN"),
        ("fb7ff0000000000000", "Infinity"),
        ("fa3f800000", "32-bit float"),
        ("f93c00", "16-bit float"),
        ("f7", "undefined"),
        ("f0", "simple value"),
        ("a10101", "integer map key"),
        ("62c328", "invalid UTF-8"),
        ("0101", "trailing bytes"),
        ("1c", "reserved additional info"),
        ("9b7fffffffffffffff", "array length past the input"),
    ],
)
def test_bad_input_is_rejected_with_a_reason(hex_input: str, reason: str) -> None:
    with pytest.raises(CodecError):
        decode(bytes.fromhex(hex_input))


def test_deep_nesting_is_rejected_not_a_crash() -> None:
    with pytest.raises(CodecError, match="nesting"):
        decode(b"\x81" * 10_000 + b"\x01")
    nested: Any = 1
    for _ in range(200):
        nested = [nested]
    with pytest.raises(CodecError, match="nesting"):
        encode(nested)


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), 1 << 64, -(1 << 64) - 1, {1: 2}, {"a": object()}]
)
def test_unencodable_values_raise(value: Any) -> None:
    with pytest.raises(CodecError):
        encode(value)


def test_bytes_that_look_like_cids_stay_bytes() -> None:
    """The libipld hazard: its encoder turns CID-shaped bytes into links."""
    cid = CID.parse(HELLO_CID)
    for sneaky in (cid.raw, cid.raw + b"tail", b"\x12\x20" + bytes(32), b"\x01"):
        assert is_cid_like(sneaky)
        block = encode({"payload": sneaky})
        assert decode(block) == {"payload": sneaky}
        assert block == dag_cbor.encode({"payload": sneaky})
    assert decode(encode({"link": cid})) == {"link": cid}


# --------------------------------------------------------------------------- properties

_cids = st.binary(min_size=32, max_size=32).map(lambda digest: CID(b"\x01\x71\x12\x20" + digest))
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 64), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | st.sampled_from([b"\x01\x71\x12\x20" + bytes(32), b"\x01"])
    | _cids
)
_values = st.recursive(
    _leaves,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def _to_reference(value: Any) -> Any:
    if isinstance(value, CID):
        return multiformats.CID.decode(value.raw)
    if isinstance(value, list):
        return [_to_reference(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_reference(v) for k, v in value.items()}
    return value


def _from_reference(value: Any) -> Any:
    if isinstance(value, multiformats.CID):
        return CID(bytes(value))
    if isinstance(value, list):
        return [_from_reference(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_reference(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_roundtrip_matches_the_reference_implementation(value: Any) -> None:
    ours = encode(value)
    assert ours == dag_cbor.encode(_to_reference(value))
    assert ours == encode_reference_free(value)
    decoded = decode(ours)
    assert _same(decoded, value) or decoded == value
    assert _from_reference(dag_cbor.decode(ours)) == decoded


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    try:
        value = decode(data)
    except CodecError:
        return
    # Anything accepted must be canonical: it re-encodes to the same bytes.
    assert encode(value) == data
