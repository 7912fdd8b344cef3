"""Hypothesis strategies for hostile input: values of the DAG-CBOR data model biased towards
what the decoders look for (links, peer ids, boundary integers), and byte mutations."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from dag.cid import cid_of, cid_of_raw
from dag.identity import Identity

PEER_IDS = [bytes(Identity.generate().peer_id) for _ in range(3)]
CIDS = [cid_of_raw(b"a"), cid_of(b"\x41b"), cid_of_raw(b"")]

boundary_ints = st.sampled_from([0, 1, -1, 255, 256, 1023, 1024, 1025, 2**31, 2**32,
                                 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**64)])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64 - 1),
    boundary_ints,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.binary(max_size=80),
    st.sampled_from(PEER_IDS),
    st.sampled_from(CIDS),  # encoded as links (tag 42)
    st.sampled_from([bytes(c) for c in CIDS]),  # CID-looking bytes
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6),
                            st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=25,
)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, cut, or inserted."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = draw(st.integers(0, max(0, len(out) - 1)))
        if op == "flip" and out:
            out[pos] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del out[pos : pos + draw(st.integers(1, 8))]
        else:
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(out)
