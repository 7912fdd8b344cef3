"""The datagram parser: what the protocol lets through and what it drops."""

from __future__ import annotations

import os

import pytest
import umsgpack
from hypothesis import given
from hypothesis import strategies as st

from dht import wire
from dht.wire import FoundValue, MalformedDatagram, Request, Response, decode_datagram

MSG = b"m" * 20
NODE = b"n" * 20


def request(name: str, *args: object) -> bytes:
    return b"\x00" + MSG + umsgpack.packb([name, list(args)])


@pytest.mark.parametrize("count", [0, 1, 7, 15, 16, 40])
@pytest.mark.parametrize("size", [0, 200, 255, 256, 1000, 7000])
def test_store_batch_fast_path_is_byte_identical_to_umsgpack(count: int, size: int) -> None:
    items = [[os.urandom(20), os.urandom(size)] for _ in range(count)]
    if sum(size + 27 for _ in items) > 8000:
        items = items[: max(1, 8000 // (size + 27))]
    datagram = wire.encode_request(MSG, "store_batch", (NODE, items))
    assert datagram == request("store_batch", NODE, items)
    decoded = decode_datagram(datagram)
    assert decoded == Request(MSG, "store_batch", (NODE, [tuple(i) for i in items]))


def test_a_store_batch_that_deviates_from_the_layout_still_parses_via_umsgpack() -> None:
    # a value sent as a string: not the fast layout; umsgpack reads it, the handler refuses
    decoded = decode_datagram(request("store_batch", NODE, [[os.urandom(20), "text"]]))
    assert isinstance(decoded, Request)
    assert decoded.args[1][0][1] == "text"  # type: ignore[index]


def test_requests_are_checked_against_their_signature() -> None:
    assert decode_datagram(request("ping", NODE)) == Request(MSG, "ping", (NODE,))
    assert decode_datagram(request("find_value", NODE, NODE)).args == (NODE, NODE)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "datagram",
    [
        b"",
        b"\x00" + MSG,  # nothing after the id
        b"\x02" + MSG + umsgpack.packb(["ping", [NODE]]),  # unknown type
        b"\x00" + MSG + b"\xc1",  # never-used msgpack byte
        b"\x00" + MSG + b"\x91" * 5000 + b"\x90",  # deep nesting
        request("shutdown"),  # unknown RPC
        request("ping"),  # wrong arity
        request("ping", b"short"),  # node id of the wrong size
        request("find_node", NODE, 12),  # key of the wrong type
        request("store_batch", NODE, [[NODE]]),
        request("store_batch", NODE, "items"),
        b"\x00" + MSG + umsgpack.packb({"ping": [NODE]}),
        b"\x00" + MSG + umsgpack.packb([1, [NODE]]),
        b"\x00" + MSG + umsgpack.packb(["store", [NODE, NODE, bytes(9000)]]),  # oversized
        b"\x01" + MSG + umsgpack.packb(bytes(20000)),  # oversized response
    ],
)
def test_malformed_datagrams_raise_one_exception_type(datagram: bytes) -> None:
    with pytest.raises(MalformedDatagram):
        decode_datagram(datagram)


@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_raise_anything_else(data: bytes) -> None:
    for kind in (b"", b"\x00" + MSG, b"\x01" + MSG):
        try:
            result = decode_datagram(kind + data)
        except MalformedDatagram:
            continue
        assert isinstance(result, Request | Response)


def test_contact_lists_keep_only_literal_ips_and_valid_ports() -> None:
    good = [NODE, "127.0.0.1", 4000]
    answer = [good, [NODE, "evil.example", 53], [NODE, "10.0.0.1", 0], [NODE, "::1", 70000],
              [b"x", "10.0.0.1", 1], [NODE, "10.0.0.1", True], "junk", [NODE, "::1", 5]]
    assert wire.parse_find_node(answer) == [(NODE, "127.0.0.1", 4000), (NODE, "::1", 5)]
    assert len(wire.parse_find_node([good] * 500)) == wire.MAX_NODES_IN_RESPONSE
    with pytest.raises(MalformedDatagram):
        wire.parse_find_node({"nodes": []})


def test_find_value_answers() -> None:
    assert wire.parse_find_value({"value": b"v"}) == FoundValue(b"v")
    assert wire.parse_find_value([]) == []
    for bad in ({"value": "v"}, {"value": b"v", "x": 1}, {}):
        with pytest.raises(MalformedDatagram):
            wire.parse_find_value(bad)


def test_store_batch_answers_must_match_the_batch() -> None:
    assert wire.parse_store_batch([True, False, 1], 3) == [True, False, False]
    with pytest.raises(MalformedDatagram):
        wire.parse_store_batch([True], 2)


@pytest.mark.parametrize("count", range(16))
def test_store_batch_answers_are_encoded_and_read_like_umsgpack(count: int) -> None:
    flags = [i % 3 != 1 for i in range(count)]
    datagram = wire.encode_response(MSG, flags)
    assert datagram == b"\x01" + MSG + umsgpack.packb(flags)
    assert decode_datagram(datagram) == Response(MSG, flags)


def test_other_answers_still_go_through_umsgpack() -> None:
    for data in ([True, 1], [True] * 20, {"value": b"v"}, [[NODE, "127.0.0.1", 1]], True):
        datagram = wire.encode_response(MSG, data)
        assert datagram == b"\x01" + MSG + umsgpack.packb(data)
        assert decode_datagram(datagram) == Response(MSG, data)


def test_requests_over_the_rpc_limit_are_not_sent() -> None:
    with pytest.raises(ValueError, match="limit"):
        wire.encode_request(MSG, "store", (NODE, NODE, bytes(8200)))


def test_a_store_batch_cut_after_its_value_header_is_malformed() -> None:
    """Found by tests/fuzz: the fast path indexed past the end of such a datagram."""
    for size in (100, 300):  # bin8 and bin16 value headers
        good = wire.encode_request(b"m" * 20, "store_batch",
                                   [b"n" * 20, [[b"k" * 20, b"v" * size]]])
        assert decode_datagram(good).name == "store_batch"
        for cut in range(len(good) - size - 30, len(good)):
            with pytest.raises(MalformedDatagram):
                decode_datagram(good[:cut])
