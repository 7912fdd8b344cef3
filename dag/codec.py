"""Strict DAG-CBOR: the one codec module of pulsarcast.

Data model (what :func:`decode` returns and :func:`encode` accepts): ``None``, ``bool``,
``int`` (64-bit range), finite ``float``, ``str``, ``bytes``, ``list``, ``dict`` with ``str``
keys, and :class:`~dag.cid.CID` for links (CBOR tag 42).

Two implementations live here, on purpose:

* ``libipld`` (Rust) is the fast path. It has traps we guard against (and it loses the sign
  of ``-0.0`` on encode, so such values take the exact encoder):
  it returns links as plain ``bytes`` (so links and byte strings look alike after decoding),
  and ``encode_dag_cbor`` writes *any* ``bytes`` value that parses as a CID as a link — a user
  payload beginning with ``0x01`` could silently turn into a tag 42. It is also lenient on
  decode (it accepts non-minimal integers and 32-bit floats).
* A small pure-Python encoder/decoder that is strict by construction. :func:`decode` uses it,
  so the generic API never confuses links with bytes. The encoder is the fallback whenever a
  byte string could be mistaken for a CID by ``libipld``.

Fast typed decoding (descriptors) goes through :func:`decode_fast` and then *re-encodes* the
typed value and compares it with the input. Canonical DAG-CBOR has exactly one encoding per
value, so byte equality proves the input was canonical (sorted, unique keys; minimal
integers; 64-bit floats; no indefinite lengths) and that every link/bytes field had the type
the schema expects. That keeps blocks non-malleable: one logical descriptor, one CID.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any, Final

import libipld

from .cid import CID
from .errors import CodecError, InvalidCID

__all__ = [
    "MAX_BLOCK_SIZE",
    "MAX_DEPTH",
    "check_canonical",
    "decode",
    "decode_fast",
    "encode",
    "encode_reference_free",
    "is_cid_like",
]

MAX_BLOCK_SIZE: Final = 1 << 20
"""Largest block :func:`decode` accepts. DHT blocks are far smaller (one RPC, < 8 KiB)."""

MAX_DEPTH: Final = 64
"""Deepest nesting accepted; descriptors nest 4 levels, so this is generous."""

_UINT64_MAX: Final = (1 << 64) - 1
_NINT64_MIN: Final = -(1 << 64)


def is_cid_like(value: bytes) -> bool:
    """True when ``libipld`` would encode ``value`` as a link rather than as bytes.

    Measured against libipld 3.x: every byte string it turns into a link starts with 0x01
    (CIDv1) or is a 34-byte sha2-256 multihash (CIDv0). We test the superset, which is cheap
    and errs towards the exact pure-Python encoder.
    """
    return (len(value) > 0 and value[0] == 0x01) or (
        len(value) == 34 and value[0] == 0x12 and value[1] == 0x20
    )


# --------------------------------------------------------------------------- encoding


def encode(obj: Any) -> bytes:
    """Encode ``obj`` as canonical DAG-CBOR. Raises :class:`CodecError` for values outside
    the data model (non-str keys, NaN/Infinity, integers beyond 64 bits, unknown types)."""
    safe, prepared = _prepare(obj, 0)
    if safe:
        try:
            return libipld.encode_dag_cbor(prepared)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise CodecError(f"cannot encode: {exc}") from None
    return encode_reference_free(obj)


def _prepare(obj: Any, depth: int) -> tuple[bool, Any]:
    """Convert CIDs to libipld's link form and report whether libipld may encode the result.

    Returns ``(safe, value)``; ``safe`` is False as soon as a byte string could be read by
    libipld as a CID, or a type needs the exact encoder's checks.
    """
    if depth > MAX_DEPTH:
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(obj, str):
        return True, obj
    if isinstance(obj, CID):
        return True, obj.raw
    if isinstance(obj, bytes):
        return (not is_cid_like(obj)), obj
    if obj is None or isinstance(obj, bool):
        return True, obj
    if isinstance(obj, int):
        if not _NINT64_MIN <= obj <= _UINT64_MAX:
            raise CodecError(f"integer {obj} outside the 64-bit range DAG-CBOR allows")
        return True, obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise CodecError("NaN and Infinity are not allowed in DAG-CBOR")
        # libipld writes -0.0 as +0.0; the exact encoder keeps the sign, as the spec does.
        return not (obj == 0.0 and math.copysign(1.0, obj) < 0), obj
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        all_safe = True
        for key, value in obj.items():
            if not isinstance(key, str):
                raise CodecError(f"map keys must be strings, got {type(key).__name__}")
            safe, out[key] = _prepare(value, depth + 1)
            all_safe = all_safe and safe
        return all_safe, out
    if isinstance(obj, list | tuple):
        items = []
        all_safe = True
        for value in obj:
            safe, prepared = _prepare(value, depth + 1)
            items.append(prepared)
            all_safe = all_safe and safe
        return all_safe, items
    if isinstance(obj, bytearray | memoryview):
        return _prepare(bytes(obj), depth)
    raise CodecError(f"type {type(obj).__name__} has no DAG-CBOR encoding")


def encode_reference_free(obj: Any) -> bytes:
    """Exact canonical encoder in pure Python (no libipld). Slower; never confuses bytes
    with links. Used whenever :func:`encode` cannot trust libipld with a value."""
    out = bytearray()
    _enc(obj, out, 0)
    return bytes(out)


def _head(major: int, n: int, out: bytearray) -> None:
    mt = major << 5
    if n < 24:
        out.append(mt | n)
    elif n < 0x100:
        out.append(mt | 24)
        out.append(n)
    elif n < 0x10000:
        out.append(mt | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(mt | 26)
        out += n.to_bytes(4, "big")
    else:
        out.append(mt | 27)
        out += n.to_bytes(8, "big")


def _key_sort(item: tuple[bytes, Any]) -> tuple[int, bytes]:
    return (len(item[0]), item[0])


def _enc(obj: Any, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(obj, str):
        raw = obj.encode("utf-8")
        _head(3, len(raw), out)
        out += raw
    elif isinstance(obj, CID):
        out += b"\xd8\x2a"
        _head(2, len(obj.raw) + 1, out)
        out.append(0)
        out += obj.raw
    elif isinstance(obj, bytes | bytearray | memoryview):
        raw = bytes(obj)
        _head(2, len(raw), out)
        out += raw
    elif obj is None:
        out.append(0xF6)
    elif obj is True:
        out.append(0xF5)
    elif obj is False:
        out.append(0xF4)
    elif isinstance(obj, int):
        if 0 <= obj <= _UINT64_MAX:
            _head(0, obj, out)
        elif _NINT64_MIN <= obj < 0:
            _head(1, -1 - obj, out)
        else:
            raise CodecError(f"integer {obj} outside the 64-bit range DAG-CBOR allows")
    elif isinstance(obj, float):
        if not math.isfinite(obj):
            raise CodecError("NaN and Infinity are not allowed in DAG-CBOR")
        out.append(0xFB)
        out += struct.pack(">d", obj)
    elif isinstance(obj, Mapping):
        entries = []
        for key, value in obj.items():
            if not isinstance(key, str):
                raise CodecError(f"map keys must be strings, got {type(key).__name__}")
            entries.append((key.encode("utf-8"), value))
        entries.sort(key=_key_sort)
        _head(5, len(entries), out)
        for raw_key, value in entries:
            _head(3, len(raw_key), out)
            out += raw_key
            _enc(value, out, depth + 1)
    elif isinstance(obj, list | tuple):
        _head(4, len(obj), out)
        for value in obj:
            _enc(value, out, depth + 1)
    else:
        raise CodecError(f"type {type(obj).__name__} has no DAG-CBOR encoding")


# --------------------------------------------------------------------------- decoding


def decode(data: bytes) -> Any:
    """Decode one strict DAG-CBOR value; links come back as :class:`CID`.

    Rejects, with a :class:`CodecError` naming the offset: truncated input, trailing bytes,
    non-minimal lengths or integers, unsorted or duplicate map keys, non-string keys,
    indefinite lengths, tags other than 42, malformed CIDs, floats that are not 64-bit,
    NaN/Infinity, simple values other than true/false/null, invalid UTF-8, nesting deeper
    than :data:`MAX_DEPTH` and inputs larger than :data:`MAX_BLOCK_SIZE`.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_BLOCK_SIZE:
        raise CodecError(f"block of {len(data)} bytes exceeds the {MAX_BLOCK_SIZE}-byte limit")
    if not data:
        raise CodecError("empty input")
    value, end = _dec(data, 0, 0)
    if end != len(data):
        raise CodecError(f"{len(data) - end} trailing bytes after the value at offset {end}")
    return value


def decode_fast(data: bytes) -> Any:
    """libipld's decoder: fast, but lenient and link-blind (links come back as ``bytes``).

    Only for callers that know their schema and re-encode to check canonical form, as the
    descriptor decoder does. Raises :class:`CodecError`.
    """
    if len(data) > MAX_BLOCK_SIZE:
        raise CodecError(f"block of {len(data)} bytes exceeds the {MAX_BLOCK_SIZE}-byte limit")
    try:
        return libipld.decode_dag_cbor(data)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CodecError(f"not DAG-CBOR: {exc}") from None


def _arg(data: bytes, pos: int, info: int) -> tuple[int, int]:
    """Read the argument of a head whose additional info is ``info``; enforce minimality."""
    if info < 24:
        return info, pos
    if info == 24:
        end = pos + 1
        if end > len(data):
            raise CodecError(f"truncated at offset {pos}")
        n = data[pos]
        if n < 24:
            raise CodecError(f"non-minimal length/integer at offset {pos - 1}")
        return n, end
    if info in (25, 26, 27):
        size = 1 << (info - 24)
        end = pos + size
        if end > len(data):
            raise CodecError(f"truncated at offset {pos}")
        n = int.from_bytes(data[pos:end], "big")
        if n < (1 << (4 * size)):  # fits in half the width: a shorter form existed
            raise CodecError(f"non-minimal length/integer at offset {pos - 1}")
        return n, end
    if info == 31:
        raise CodecError(f"indefinite length at offset {pos - 1}")
    raise CodecError(f"reserved additional information {info} at offset {pos - 1}")


def _dec(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
    if pos >= len(data):
        raise CodecError(f"truncated at offset {pos}")
    initial = data[pos]
    major, info = initial >> 5, initial & 0x1F
    pos += 1
    if major == 7:
        return _dec_simple(data, pos, info)
    n, pos = _arg(data, pos, info)
    if major == 0:
        return n, pos
    if major == 1:
        return -1 - n, pos
    if major in (2, 3):
        end = pos + n
        if end > len(data):
            raise CodecError(f"string of {n} bytes at offset {pos} runs past the end")
        chunk = data[pos:end]
        if major == 2:
            return chunk, end
        try:
            return chunk.decode("utf-8"), end
        except UnicodeDecodeError:
            raise CodecError(f"invalid UTF-8 in string at offset {pos}") from None
    if major == 4:
        if n > len(data) - pos:
            raise CodecError(f"array of {n} items at offset {pos} cannot fit in the input")
        items = []
        for _ in range(n):
            item, pos = _dec(data, pos, depth + 1)
            items.append(item)
        return items, pos
    if major == 5:
        if n > len(data) - pos:
            raise CodecError(f"map of {n} entries at offset {pos} cannot fit in the input")
        result: dict[str, Any] = {}
        prev: bytes | None = None
        for _ in range(n):
            key_at = pos
            if pos >= len(data) or data[pos] >> 5 != 3:
                raise CodecError(f"map key at offset {pos} is not a string")
            klen, kpos = _arg(data, pos + 1, data[pos] & 0x1F)
            kend = kpos + klen
            if kend > len(data):
                raise CodecError(f"map key at offset {key_at} runs past the end")
            raw_key = data[kpos:kend]
            if prev is not None:
                if raw_key == prev:
                    raise CodecError(f"duplicate map key at offset {key_at}")
                if (len(raw_key), raw_key) < (len(prev), prev):
                    raise CodecError(f"map keys out of canonical order at offset {key_at}")
            prev = raw_key
            try:
                key = raw_key.decode("utf-8")
            except UnicodeDecodeError:
                raise CodecError(f"invalid UTF-8 in map key at offset {key_at}") from None
            result[key], pos = _dec(data, kend, depth + 1)
        return result, pos
    # major == 6: tags
    if n != 42:
        raise CodecError(f"tag {n} at offset {pos} is not allowed (only 42, links)")
    if pos >= len(data) or data[pos] >> 5 != 2:
        raise CodecError(f"tag 42 at offset {pos} does not wrap a byte string")
    raw, end = _dec(data, pos, depth + 1)
    if not raw or raw[0] != 0:
        raise CodecError(f"link at offset {pos} lacks the 0x00 multibase prefix")
    try:
        return CID(raw[1:]), end
    except InvalidCID as exc:
        raise CodecError(f"invalid link at offset {pos}: {exc}") from None


def _dec_simple(data: bytes, pos: int, info: int) -> tuple[Any, int]:
    if info == 20:
        return False, pos
    if info == 21:
        return True, pos
    if info == 22:
        return None, pos
    if info == 27:
        end = pos + 8
        if end > len(data):
            raise CodecError(f"truncated float at offset {pos}")
        (value,) = struct.unpack(">d", data[pos:end])
        if not math.isfinite(value):
            raise CodecError(f"NaN or Infinity at offset {pos - 1}")
        return value, end
    if info in (25, 26):
        raise CodecError(f"float at offset {pos - 1} is not 64-bit")
    raise CodecError(f"simple value {info} at offset {pos - 1} is not allowed")


def check_canonical(value_bytes: bytes, expected: bytes) -> None:
    """Raise :class:`CodecError` unless ``value_bytes`` (a re-encoding) equals ``expected``."""
    if value_bytes != expected:
        raise CodecError("block is not in canonical DAG-CBOR form (or a field has the wrong type)")

