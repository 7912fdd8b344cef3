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
from collections.abc import Callable
from typing import Final

from .errors import BadRecord, FrameTooLarge
from .noise import MAX_MESSAGE, TAGLEN, Bytes, CipherState, NoiseError

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


def seal(cipher: CipherState, data: bytes) -> bytearray:
    """``data`` (a piece of the frame stream) as records ready for the socket: cut into
    pieces of at most :data:`MAX_RECORD_PLAINTEXT` bytes, each encrypted under the cipher's
    next nonce and length-prefixed, all in one buffer (the ciphertext is written in place,
    not copied next to its prefix). Call it in the order the bytes are written to the
    socket: the nonce order is the write order."""
    size = len(data)
    records = max(1, -(-size // MAX_RECORD_PLAINTEXT))
    out = bytearray(size + records * (RECORD_PREFIX + TAGLEN))
    view = memoryview(out)
    src = memoryview(data)
    pack = _REC.pack_into
    encrypt_into = cipher.encrypt_into
    try:
        pos = 0
        for start in range(0, max(size, 1), MAX_RECORD_PLAINTEXT):
            piece = src[start : start + MAX_RECORD_PLAINTEXT]
            sealed = len(piece) + TAGLEN
            pack(out, pos, sealed)
            encrypt_into(piece, view[pos + RECORD_PREFIX : pos + RECORD_PREFIX + sealed])
            pos += RECORD_PREFIX + sealed
    finally:
        src.release()
        view.release()
    return out


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

    def open(self, data: bytes, cipher: CipherState) -> list[bytes]:
        """Take ``data`` read from the stream, decrypt every record now complete, in order,
        and return their plaintexts: the next pieces of the frame stream (none while no
        record is complete; not joined, which would copy them once more). An incomplete
        record at the end is kept for the next call.

        This is the receive hot path: records are decrypted straight out of ``data``, one AEAD
        call each; only a record that spans reads is copied (its head is kept until the rest
        arrives). At the first record that does not authenticate it stops and sets
        :attr:`error`: the authentic records before it are returned, so the caller can
        deliver what the peer really sent before it ends the connection (it must check
        :attr:`error` after every call); a later call raises :attr:`error`."""
        if self.error is not None:
            raise self.error
        if self._complete_buffered():
            # Records left by next_record() (the handshake's reads): take them with the
            # rest, once; from here on the buffer only ever holds an incomplete tail.
            data = self.take_rest() + data
        decrypt = cipher.decrypt
        out: list[bytes] = []
        view = memoryview(data)
        try:
            pos = self._complete_pending(view, decrypt, out)
            if pos < 0:  # still incomplete, or it did not authenticate
                return out
            size = len(data)
            unpack = _REC.unpack_from
            while size - pos >= RECORD_PREFIX:
                (length,) = unpack(data, pos)
                end = pos + RECORD_PREFIX + length
                if end > size:
                    break
                try:
                    out.append(decrypt(view[pos + RECORD_PREFIX : end]))
                except NoiseError as exc:
                    self.error = BadRecord(f"record does not authenticate: {exc}")
                    break
                pos = end
            if pos < size and self.error is None:
                self._buf += view[pos:]  # the incomplete tail, for the next read
        finally:
            view.release()
        return out

    def _complete_buffered(self) -> bool:
        """Whether the buffer holds at least one whole record."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < RECORD_PREFIX:
            return False
        length: int = _REC.unpack_from(buf, pos)[0]
        return RECORD_PREFIX + length <= len(buf) - pos

    def _complete_pending(
        self, view: memoryview, decrypt: Callable[[Bytes], bytes], out: list[bytes]
    ) -> int:
        """Finish the record left incomplete by earlier reads with the head of ``view``,
        copying only the bytes it lacks. Returns where the rest of ``view`` starts, or -1
        when the record is still incomplete or does not authenticate."""
        buf = self._buf
        if self._pos:
            del buf[: self._pos]
            self._pos = 0
        if not buf:
            return 0
        pos = 0
        if len(buf) < RECORD_PREFIX:
            pos = RECORD_PREFIX - len(buf)
            buf += view[:pos]
            if len(buf) < RECORD_PREFIX:
                return -1
        length: int = _REC.unpack_from(buf, 0)[0]
        missing = RECORD_PREFIX + length - len(buf)
        if missing > len(view) - pos:
            buf += view[pos:]
            return -1
        buf += view[pos : pos + missing]
        record = memoryview(buf)
        try:
            out.append(decrypt(record[RECORD_PREFIX:]))
        except NoiseError as exc:
            self.error = BadRecord(f"record does not authenticate: {exc}")
            return -1
        finally:
            record.release()
        buf.clear()
        return pos + missing

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
