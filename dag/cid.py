"""Content identifiers (CIDs) as immutable values.

A CID is kept as its binary form (``raw``) only; version, codec and multihash are read off it.
Equality and hashing use ``raw``, so a CID is the same value however it was printed
(base32 ``b…``, base58btc ``z…`` or a v0 ``Qm…``). Pulsarcast itself only *creates*
CIDv1 / dag-cbor (or raw) / sha2-256, but parses any well-formed CID so it can carry links
written by other IPLD software.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from .errors import InvalidCID
from .multibase import b32decode, b32encode, b58decode, b58encode, read_varint, varint

__all__ = ["CID", "DAG_CBOR", "RAW", "SHA2_256", "cid_of", "cid_of_raw"]

DAG_CBOR: Final = 0x71
RAW: Final = 0x55
SHA2_256: Final = 0x12
DAG_PB: Final = 0x70
_SHA2_256_LEN: Final = 32
MAX_CID_BYTES: Final = 128  # far above any real CID; bounds what the network can make us parse


@dataclass(frozen=True, slots=True)
class CID:
    """A parsed, validated CID. Build with :meth:`parse` or :func:`cid_of`."""

    raw: bytes

    def __post_init__(self) -> None:
        _validate(self.raw)

    @classmethod
    def parse(cls, value: str | bytes | CID) -> CID:
        """Parse a multibase string (``b``/``B``/``z``/``f``/``F``/``u`` prefixes, or v0
        ``Qm…``) or a binary CID. Raises :class:`InvalidCID` with the reason."""
        if isinstance(value, CID):
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
            if data[:1] == b"\x00":  # the identity-multibase form used inside tag 42
                data = data[1:]
            return cls(data)
        if not isinstance(value, str):
            raise InvalidCID(f"expected str or bytes, got {type(value).__name__}")
        return cls(_decode_string(value))

    @property
    def version(self) -> int:
        return 0 if _is_v0(self.raw) else 1

    @property
    def codec(self) -> int:
        if _is_v0(self.raw):
            return DAG_PB
        return read_varint(self.raw, 1)[0]

    @property
    def multihash(self) -> bytes:
        if _is_v0(self.raw):
            return self.raw
        _, off = read_varint(self.raw, 1)
        return self.raw[off:]

    @property
    def hash_code(self) -> int:
        return read_varint(self.multihash, 0)[0]

    @property
    def digest(self) -> bytes:
        mh = self.multihash
        _, off = read_varint(mh, 0)
        _, off = read_varint(mh, off)
        return mh[off:]

    def verifies(self, block: bytes) -> bool:
        """True when ``block`` hashes to this CID. Only sha2-256 is checked; any other hash
        function is refused (False) rather than trusted."""
        raw = self.raw
        if raw[2:4] == _SHA256_HEADER and len(raw) == 36:  # v1, one-byte codec: the hot path
            return hashlib.sha256(block).digest() == raw[4:]
        if self.hash_code != SHA2_256:
            return False
        return hashlib.sha256(block).digest() == self.digest

    def __bytes__(self) -> bytes:
        return self.raw

    def __str__(self) -> str:
        if _is_v0(self.raw):
            return b58encode(self.raw)
        return "b" + b32encode(self.raw)

    def __repr__(self) -> str:
        return f"CID({str(self)!r})"


def cid_of(block: bytes) -> CID:
    """The CIDv1 (dag-cbor, sha2-256) of an encoded DAG-CBOR block."""
    return CID(_V1_DAG_CBOR_SHA256 + hashlib.sha256(block).digest())


def cid_of_raw(data: bytes) -> CID:
    """The CIDv1 (raw, sha2-256) of opaque bytes."""
    return CID(_V1_RAW_SHA256 + hashlib.sha256(data).digest())


_SHA256_HEADER: Final = bytes([SHA2_256, _SHA2_256_LEN])
_V1_DAG_CBOR_SHA256: Final = varint(1) + varint(DAG_CBOR) + varint(SHA2_256) + varint(32)
_V1_RAW_SHA256: Final = varint(1) + varint(RAW) + varint(SHA2_256) + varint(32)


def _is_v0(raw: bytes) -> bool:
    return len(raw) == 34 and raw[0] == SHA2_256 and raw[1] == _SHA2_256_LEN


def _validate(raw: object) -> None:
    # Hot path: CIDv1 with a one-byte codec and sha2-256, i.e. every CID pulsarcast makes.
    if (
        type(raw) is bytes
        and len(raw) == 36
        and raw[0] == 1
        and raw[1] < 0x80
        and raw[2:4] == _SHA256_HEADER
    ):
        return
    if not isinstance(raw, bytes):
        raise InvalidCID(f"CID bytes must be bytes, got {type(raw).__name__}")
    if not raw:
        raise InvalidCID("empty CID")
    if len(raw) > MAX_CID_BYTES:
        raise InvalidCID(f"CID is {len(raw)} bytes, more than {MAX_CID_BYTES}")
    if _is_v0(raw):
        return
    try:
        version, off = read_varint(raw, 0)
        if version != 1:
            raise InvalidCID(f"unsupported CID version {version}")
        _, off = read_varint(raw, off)  # codec
        _, off = read_varint(raw, off)  # multihash code
        length, off = read_varint(raw, off)
    except ValueError as exc:
        if isinstance(exc, InvalidCID):
            raise
        raise InvalidCID(f"malformed CID: {exc}") from None
    if len(raw) - off != length:
        raise InvalidCID(f"multihash digest is {len(raw) - off} bytes, header says {length}")


def _decode_string(text: str) -> bytes:
    if not text:
        raise InvalidCID("empty CID string")
    if len(text) > 2 * MAX_CID_BYTES:
        raise InvalidCID("CID string too long")
    if len(text) == 46 and text.startswith("Qm"):
        try:
            return b58decode(text)
        except ValueError as exc:
            raise InvalidCID(f"invalid CIDv0: {exc}") from None
    prefix, body = text[0], text[1:]
    try:
        if prefix in "bB":
            if body != body.lower() and body != body.upper():
                raise ValueError("mixed case")
            return b32decode(body)
        if prefix == "z":
            return b58decode(body)
        if prefix in "fF":
            return bytes.fromhex(body)
        if prefix == "u":
            import base64

            return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except ValueError as exc:
        raise InvalidCID(f"invalid CID string {text[:80]!r}: {exc}") from None
    raise InvalidCID(f"unsupported multibase prefix {prefix!r} in {text[:80]!r}")
