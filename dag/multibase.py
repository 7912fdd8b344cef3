"""Unsigned varints and the multibase alphabets pulsarcast prints identifiers in.

CIDs are printed base32 (``b`` prefix) and peer ids base58btc; both are small enough that a
dependency would cost more than the code. Decoding is strict: a character outside the
alphabet, a non-minimal varint or a truncated input raises ``ValueError`` (subclasses of it
elsewhere in ``dag`` narrow the meaning).
"""

from __future__ import annotations

import base64
import binascii

__all__ = [
    "b32decode",
    "b32encode",
    "b58decode",
    "b58encode",
    "read_varint",
    "varint",
]

_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}
_MAX_VARINT_BYTES = 9  # multiformats caps unsigned varints at 63 bits / 9 bytes


def varint(n: int) -> bytes:
    """Encode ``n`` as an unsigned LEB128 varint (multiformats' unsigned-varint)."""
    if n < 0:
        raise ValueError("varint must be non-negative")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes, offset: int = 0) -> tuple[int, int]:
    """Read a minimal unsigned varint at ``offset``; return ``(value, next_offset)``."""
    value = 0
    shift = 0
    for i in range(_MAX_VARINT_BYTES):
        pos = offset + i
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and i > 0:
                raise ValueError("non-minimal varint")
            return value, pos + 1
        shift += 7
    raise ValueError("varint longer than 9 bytes")


def b32encode(data: bytes) -> str:
    """RFC 4648 base32, lower case, no padding (multibase ``b``)."""
    return base64.b32encode(data).decode("ascii").rstrip("=").lower()


def b32decode(text: str) -> bytes:
    """Inverse of :func:`b32encode`; accepts either case, no padding."""
    upper = text.upper()
    pad = (-len(upper)) % 8
    if pad in (2, 5, 7):
        raise ValueError("invalid base32 length")
    try:
        return base64.b32decode(upper + "=" * pad)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"invalid base32: {exc}") from None


def b58encode(data: bytes) -> str:
    """Bitcoin-alphabet base58 (multibase ``z`` without its prefix)."""
    zeros = len(data) - len(data.lstrip(b"\0"))
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, rem = divmod(n, 58)
        out.append(_B58_ALPHABET[rem])
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Inverse of :func:`b58encode`."""
    n = 0
    for ch in text:
        try:
            n = n * 58 + _B58_INDEX[ch]
        except KeyError:
            raise ValueError(f"invalid base58 character {ch!r}") from None
    zeros = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * zeros + body
