"""The frame codec, without sockets."""

from __future__ import annotations

import struct

import pytest

from pulsar.net import FrameTooLarge
from pulsar.net.framing import (
    FrameDecoder,
    Kind,
    encode_control,
    encode_data,
    encode_frame,
)


def test_kinds_are_pinned() -> None:
    assert {k.name: int(k) for k in Kind} == {
        "DATA": 0, "PING": 1, "PONG": 2, "GOAWAY": 3, "GOAWAY_ACK": 4,
    }


def test_frame_layout() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert encode_data(b"xy") == b"\x00\x00\x00\x03\x00xy"
    assert encode_control(Kind.PING) == b"\x00\x00\x00\x01\x01"
    assert encode_control(Kind.GOAWAY, b"\x01") == b"\x00\x00\x00\x02\x03\x01"


def test_decoder_reassembles_byte_by_byte() -> None:
    stream = b"".join(encode_frame(bytes([i]) * i) for i in range(20))
    decoder = FrameDecoder(100)
    out = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        while (body := decoder.next_frame()) is not None:
            out.append(body)
    assert out == [bytes([i]) * i for i in range(20)]
    assert decoder.buffered == 0


def test_frames_returns_everything_complete() -> None:
    decoder = FrameDecoder(100)
    decoder.feed(encode_frame(b"one") + encode_frame(b"") + encode_frame(b"three")[:5])
    assert decoder.frames() == [b"one", b""]
    assert decoder.frames() == []
    decoder.feed(encode_frame(b"three")[5:])
    assert decoder.frames() == [b"three"]


def test_oversized_prefix_raises_before_the_body_arrives() -> None:
    decoder = FrameDecoder(10)
    decoder.feed(struct.pack(">I", 11))  # the prefix alone is enough
    with pytest.raises(FrameTooLarge) as info:
        decoder.next_frame()
    assert (info.value.length, info.value.limit) == (11, 10)
    assert isinstance(info.value, ValueError)


def test_frames_before_an_oversized_one_are_returned_first() -> None:
    decoder = FrameDecoder(10)
    decoder.feed(encode_frame(b"ok") + struct.pack(">I", 0xFFFFFFFF))
    assert decoder.frames() == [b"ok"]
    with pytest.raises(FrameTooLarge):
        decoder.frames()


def test_limit_can_change_between_frames() -> None:
    decoder = FrameDecoder(4)
    decoder.feed(encode_frame(b"tiny") + encode_frame(b"x" * 50))
    assert decoder.next_frame() == b"tiny"
    decoder.max_body = 64
    assert decoder.frames() == [b"x" * 50]
