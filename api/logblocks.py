"""The bulk history format (``GET /v1/topics/{cid}/events?format=blocks``): a topic's
delivery log as the node stores it, one length-prefixed binary record per event.

Why it exists: serving a history as NDJSON saturates the node's event loop (profiled: the
block of every event parsed again, the text of its CID, a JSON object and its
serialisation), while a bulk reader such as the Spark data source has several processes
that can decode blocks in parallel. Here the node copies what its store holds; the reader
decodes and checks the blocks (they are network data: their CIDs are verified by hashing).

Layout (``docs/api.md`` says the same), all integers unsigned big-endian:

* a header of 8 bytes, :data:`MAGIC` (``PCBLK`` 0x00 0x01 ``\\n``: format version 1);
* then one record per log entry, in the order asked for:
  ``seq`` u64, ``delivered_at`` IEEE 754 binary64 (seconds since the epoch),
  ``cid_length`` u8, ``block_length`` u32, the binary CID of the event
  (``cid_length`` bytes), the event's DAG-CBOR block (``block_length`` bytes).

The stream ends when the response ends; a record cut short is an error. Positions whose
event was pruned are left out, as in the other formats. Large payloads live in chunk trees
(the block links them): a reader fetches those through ``GET /v1/events/{cid}``.

This module is shared by the node and the reader, so it imports nothing but the standard
library.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

__all__ = [
    "MAGIC",
    "MAX_BLOCK_BYTES",
    "MEDIA_TYPE",
    "FormatError",
    "LogRecord",
    "RecordReader",
    "encode_record",
]

MEDIA_TYPE: Final = "application/vnd.pulsarcast.log-blocks"
MAGIC: Final = b"PCBLK\x00\x01\n"
MAX_BLOCK_BYTES: Final = 1 << 20
"""Largest block a reader accepts (event blocks are under 8 KiB; a bigger length means the
stream is not what it claims to be)."""
MAX_CID_BYTES: Final = 128
_HEAD: Final = struct.Struct(">QdBI")


class FormatError(ValueError):
    """The bytes are not a well-formed bulk history."""


class LogRecord(NamedTuple):
    seq: int
    delivered_at: float
    cid: bytes
    block: bytes


def encode_record(seq: int, delivered_at: float, cid: bytes, block: bytes) -> bytes:
    """One record, ready to write after :data:`MAGIC`."""
    return _HEAD.pack(seq, delivered_at, len(cid), len(block)) + cid + block


class RecordReader:
    """Incremental decoding: :meth:`feed` the response's bytes as they arrive, get the
    complete records; :meth:`finish` at the end checks nothing was cut short."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._started = False

    def feed(self, data: bytes) -> list[LogRecord]:
        buffer = self._buffer
        buffer += data
        pos = 0
        if not self._started:
            if len(buffer) < len(MAGIC):
                if not MAGIC.startswith(bytes(buffer)):
                    raise FormatError("the answer is not a pulsarcast bulk history")
                return []
            if buffer[:len(MAGIC)] != MAGIC:
                raise FormatError("the answer is not a pulsarcast bulk history (version 1)")
            pos = len(MAGIC)
            self._started = True
        records: list[LogRecord] = []
        view = memoryview(buffer)
        size = len(buffer)
        head = _HEAD.size
        try:
            while size - pos >= head:
                seq, at, cid_len, block_len = _HEAD.unpack_from(buffer, pos)
                if cid_len == 0 or cid_len > MAX_CID_BYTES or block_len > MAX_BLOCK_BYTES:
                    raise FormatError(f"record of position {seq} announces a {cid_len}-byte "
                                      f"CID and a {block_len}-byte block")
                end = pos + head + cid_len + block_len
                if end > size:
                    break
                cid_at = pos + head
                records.append(LogRecord(seq, at, bytes(view[cid_at:cid_at + cid_len]),
                                         bytes(view[cid_at + cid_len:end])))
                pos = end
        finally:
            view.release()
            del buffer[:pos]
        return records

    def finish(self) -> None:
        if not self._started:
            raise FormatError("the answer ended before the bulk history header")
        if self._buffer:
            raise FormatError(f"the answer ended inside a record ({len(self._buffer)} bytes "
                              "left over)")
