"""Records: Noise messages on a TCP stream, and the sealing and opening of the frame stream.

Every byte on a connection, from the first handshake message on, travels inside a *record*::

    +------------------------------+-----------------------------------+
    | length: uint16, big-endian   | Noise message: exactly length bytes |
    +------------------------------+-----------------------------------+

During the handshake a record is one Noise handshake message; afterwards it is one Noise
transport message: ChaCha20-Poly1305 ciphertext of up to :data:`MAX_RECORD_PLAINTEXT` bytes
of the *frame stream* plus the 16-byte tag, under the sender's next nonce. The frame stream
is the byte stream of 4-byte-length-prefixed frames (:mod:`pulsar.net.framing`), cut into
records wherever the writer likes: a record may hold many small frames or a piece of a large
one. So a frame larger than a Noise message (65,535 bytes) is simply carried by several
records and reassembled by the frame decoder, whose ``max_frame`` limit still applies; and a
write of many small frames costs one AEAD call, not one per frame.

Why a 2-byte prefix and not the frames' 4: it is the Noise message limit, so a length can
never announce more than one Noise message (the receiver buffers at most 64 KiB per
record), and it is what libp2p's Noise channel uses.

A record that does not authenticate (tampered with, replayed, reordered, dropped before it,
or forged) is a :class:`~pulsar.net.errors.BadRecord`: the nonces are then out of step for
good, so the connection must end; nothing of that record is ever parsed.
"""

from __future__ import annotations

import struct
from typing import Final

from .errors import BadRecord, FrameTooLarge
from .noise import MAX_MESSAGE, TAGLEN, CipherState, NoiseError

__all__ = [
    "MAX_RECORD",
    "MAX_RECORD_PLAINTEXT",
    "RECORD_PREFIX",
    "RecordDecoder",
    "encode_record",
    "seal",
]

RECORD_PREFIX: Final = 2
"""Bytes of the big-endian length prefix in front of every record."""

MAX_RECORD: Final = MAX_MESSAGE
"""Largest record body: one Noise message, tag included (65,535 bytes)."""

MAX_RECORD_PLAINTEXT: Final = MAX_RECORD - TAGLEN
"""Largest piece of the frame stream sealed into one record (65,519 bytes)."""

_REC: Final = struct.Struct(">H")


def encode_record(message: bytes) -> bytes:
    """One record on the wire: the 2-byte length of ``message``, then ``message``."""
    return _REC.pack(len(message)) + message


def seal(cipher: CipherState, data: bytes) -> bytes:
    """``data`` (a piece of the frame stream) as records ready for the socket: cut into
    pieces of at most :data:`MAX_RECORD_PLAINTEXT` bytes, each encrypted under the cipher's
    next nonce and length-prefixed. Call it in the order the bytes are written to the socket:
    the nonce order is the write order."""
    size = len(data)
    encrypt = cipher.encrypt
    if size <= MAX_RECORD_PLAINTEXT:
        sealed = encrypt(data)
        return _REC.pack(len(sealed)) + sealed
    out: list[bytes] = []
    view = memoryview(data)
    try:
        for start in range(0, size, MAX_RECORD_PLAINTEXT):
            sealed = encrypt(view[start : start + MAX_RECORD_PLAINTEXT])
            out.append(_REC.pack(len(sealed)))
            out.append(sealed)
    finally:
        view.release()
    return b"".join(out)


class RecordDecoder:
    """Splits a byte stream into records; no I/O.

    :attr:`max_record` starts small for the handshake (an unauthenticated peer must not
    make us buffer 64 KiB); a longer prefix raises :class:`FrameTooLarge` as soon as the two
    prefix bytes are in. After the handshake it is :data:`MAX_RECORD`, which the prefix
    cannot exceed.
    """

    __slots__ = ("_buf", "_pos", "error", "max_record")

    def __init__(self, max_record: int = MAX_RECORD) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_record = max_record
        self.error: BadRecord | None = None
        """Set by :meth:`open` at the first record that does not authenticate."""

    def feed(self, data: bytes) -> None:
        """Append bytes read from the stream."""
        if self._pos:
            del self._buf[: self._pos]  # O(1) at the front of a bytearray in CPython
            self._pos = 0
        self._buf += data

    def next_record(self) -> bytes | None:
        """The next complete record body, or None until more bytes are fed."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < RECORD_PREFIX:
            return None
        (length,) = _REC.unpack_from(buf, pos)
        if length > self.max_record:
            raise FrameTooLarge(length, self.max_record)
        end = pos + RECORD_PREFIX + length
        if len(buf) < end:
            return None
        self._pos = end
        return bytes(buf[pos + RECORD_PREFIX : end])

    def open(self, data: bytes, cipher: CipherState) -> bytes:
        """Take ``data`` read from the stream, decrypt every record now complete, in order,
        and return their plaintexts joined: the next piece of the frame stream (empty while
        no record is complete). An incomplete record at the end is kept for the next call.

        This is the receive hot path: records are decrypted straight out of ``data`` (or the
        buffer, when a record spans reads), one AEAD call each, and only an incomplete tail
        is copied. At the first record that does not authenticate it stops and sets
        :attr:`error`: the authentic records before it are returned, so the caller can
        deliver what the peer really sent before it ends the connection (it must check
        :attr:`error` after every call); a later call raises :attr:`error`."""
        if self.error is not None:
            raise self.error
        if self._pos < len(self._buf):  # a record spans reads: go through the buffer
            self.feed(data)
            src: bytes | bytearray = self._buf
            pos = self._pos
        else:
            src, pos = data, 0
        size = len(src)
        decrypt = cipher.decrypt
        unpack = _REC.unpack_from
        out: list[bytes] = []
        view = memoryview(src)
        try:
            while size - pos >= RECORD_PREFIX:
                (length,) = unpack(src, pos)
                end = pos + RECORD_PREFIX + length
                if end > size:
                    break
                try:
                    out.append(decrypt(view[pos + RECORD_PREFIX : end]))
                except NoiseError as exc:
                    self.error = BadRecord(f"record does not authenticate: {exc}")
                    break
                pos = end
        finally:
            view.release()  # a live view would stop feed() from resizing the buffer
        if src is data:
            self._buf.clear()
            self._pos = 0
            if pos < size:
                self._buf += data[pos:]
        else:
            self._pos = pos
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    def take_rest(self) -> bytes:
        """Everything buffered and not yet returned; the decoder is left empty."""
        rest = bytes(self._buf[self._pos :])
        self._buf.clear()
        self._pos = 0
        return rest

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as records."""
        return len(self._buf) - self._pos
