"""Fuzzing the pub-sub wire: ``decode_message`` (every message type of the wire table, the repair,
gossip and floodsub ones included) and the transport's ``FrameDecoder``.

The contract under test: whatever the bytes, the decoders either return a value or raise
their documented error (:class:`MessageError`, :class:`FrameTooLarge`); nothing else escapes.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dag.codec import encode
from dag.errors import CodecError
from pulsar.net.errors import FrameTooLarge
from pulsar.net.framing import FrameDecoder, encode_frame
from pulsar.proto.codec import MESSAGE_TYPES, decode_message, encode_message
from pulsar.proto.fields import MessageError

from .conftest import FUZZ
from .strategies import mutated, values

FIELDS = {cls.T: cls.FIELDS for cls in MESSAGE_TYPES}
KINDS = sorted(FIELDS)


def _decode(frame: bytes) -> Any:
    try:
        return decode_message(frame)
    except MessageError:
        return None


def test_the_wire_table_names_every_message_type_once() -> None:
    assert len(KINDS) == len(MESSAGE_TYPES) == 28
    assert {"join", "event", "ping", "want", "blocks", "heads", "ihave", "graft",
            "subs", "batch", "hvjoin"} <= set(KINDS)


@FUZZ
@given(st.binary(max_size=2000))
def test_any_bytes(frame: bytes) -> None:
    _decode(frame)


@st.composite
def wire_maps(draw: st.DrawFn) -> bytes:
    """A DAG-CBOR map with a registered ``t`` and exactly its fields (so decoding reaches
    the type's own ``from_wire``), or with one field missing or extra."""
    kind = draw(st.sampled_from(KINDS))
    fields = set(FIELDS[kind])
    wire: dict[str, Any] = {"t": kind, **{f: draw(values) for f in fields}}
    shape = draw(st.sampled_from(["exact", "exact", "exact", "missing", "extra"]))
    if shape == "missing" and fields:
        del wire[draw(st.sampled_from(sorted(fields)))]
    elif shape == "extra":
        wire[draw(st.text(max_size=6))] = draw(values)
    try:
        return encode(wire)
    except CodecError:
        return encode({"t": kind})


@FUZZ
@given(wire_maps())
def test_messages_of_every_type_with_hostile_fields(frame: bytes) -> None:
    message = _decode(frame)
    if message is not None:  # whatever is accepted re-encodes and decodes to itself
        assert decode_message(encode_message(message)) == message


@FUZZ
@given(wire_maps().flatmap(mutated))
def test_mutated_messages(frame: bytes) -> None:
    _decode(frame)


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=8), st.data())
def test_frame_decoder_on_any_stream_in_any_chunks(bodies: list[bytes],
                                                   data: st.DataObject) -> None:
    limit = data.draw(st.integers(0, 400))
    stream = b"".join(encode_frame(b) for b in bodies)
    stream = data.draw(st.one_of(st.just(stream), mutated(stream) if stream else
                                 st.binary(max_size=50)))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    one = FrameDecoder(limit)
    many = FrameDecoder(limit)
    got_one: list[bytes] = []
    got_many: list[bytes] = []
    one_error = many_error = False
    for chunk in chunks:
        one.feed(chunk)
        many.feed(chunk)
        try:
            while not one_error and (frame := one.next_frame()) is not None:
                got_one.append(frame)
        except FrameTooLarge:
            one_error = True
        try:
            if not many_error:
                got_many += many.frames()
        except FrameTooLarge:
            many_error = True
    try:  # frames() returns what precedes an oversized prefix, then raises
        if not many_error:
            got_many += many.frames()
    except FrameTooLarge:
        many_error = True
    # both ways of reading agree, never return more than the limit, and stop at an
    # oversized prefix
    assert got_one == got_many
    assert all(len(f) <= limit for f in got_one)
    assert one_error == many_error
    if stream == b"".join(encode_frame(b) for b in bodies) and not one_error:
        assert got_one == bodies
