"""The wire rules both descriptor kinds share: limits, timestamps, media types, the field
validators, loading a block and the canonical-encoding check.

:mod:`dag.topic_descriptor` and :mod:`dag.event_descriptor` parse their blocks through the
same checks: a block within :data:`MAX_DESCRIPTOR_SIZE` that hashes to its CID
(:func:`_load`), maps with exactly the schema's keys (:func:`_map`), peer ids, links,
signatures, texts and timestamps of the right type and size, and an encoding that is the
one canonical encoding of what was decoded (:func:`_check_canonical`). They live apart from
the two descriptor classes so each class's module reads as its schema, and so the limits
the API and the Spark reader derive from (``api.limits``, ``pulsar.tools.spark.blocks``) sit in
one table. :mod:`dag.descriptors` re-exports the public names.

The peer-id and CID caches (:func:`_peer`, :func:`_link`) are on the hot path of parsing
every event; :func:`_load` seeds the CID cache with each block's own CID.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any, Final

import libipld

from .cid import CID, cid_of
from .codec import decode, decode_fast, encode_reference_free, is_cid_like
from .errors import CIDMismatch, CodecError, SchemaError
from .identity import PeerId

__all__ = [
    "CONTENT_TYPE_PATTERN",
    "MAX_CONTENT_TYPE",
    "MAX_DESCRIPTOR_SIZE",
    "MAX_INLINE_PAYLOAD",
    "MAX_MERGES",
    "MAX_NAME_BYTES",
    "MAX_PEERS",
    "MAX_SUBTOPICS",
    "MAX_VERSION_CHARS",
    "MAX_VERSION_HEADS",
    "PROTOCOL_VERSION",
    "SIGNATURE_SIZE",
    "check_content_type",
    "iso_timestamp",
    "parse_timestamp",
]

PROTOCOL_VERSION: Final = "pulsarcast/1.0.0"
MAX_DESCRIPTOR_SIZE: Final = 7 * 1024
"""Every descriptor block fits in one DHT RPC (the ``kademlia`` package caps an RPC at 8 KiB)."""
MAX_INLINE_PAYLOAD: Final = 6 * 1024
"""Hard cap on an inline payload on the wire; nodes default to inlining at most 4 KiB."""
MAX_NAME_BYTES: Final = 256
MAX_PEERS: Final = 128
MAX_SUBTOPICS: Final = 64
MAX_VERSION_CHARS: Final = 64
MAX_VERSION_HEADS: Final = 64
"""Most event links a topic version records as the topic's heads when it was made."""
MAX_MERGES: Final = 8
"""Most merge links an event carries: other heads its publisher knew (see
:attr:`~dag.descriptors.EventDescriptor.merges`). Eight keep the largest inline event under
:data:`MAX_DESCRIPTOR_SIZE` and absorb tips faster than concurrent publishers make them."""
SIGNATURE_SIZE: Final = 64

_TIMESTAMP_RE: Final = re.compile(
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{3}Z\Z"
)


def iso_timestamp(now: float | None = None) -> str:
    """``now`` (seconds since the epoch, default the clock) as ISO 8601 UTC with milliseconds,
    the only timestamp form descriptors accept (one encoding per instant)."""
    ts = time.time() if now is None else now
    ms = round(ts * 1000)
    dt = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch of a descriptor timestamp; :class:`SchemaError` if malformed.

    The pattern pins every field's range, so only days 29-31 need a calendar check; that
    keeps this off the profile of descriptor parsing, where it runs on every event."""
    if type(text) is not str or not _TIMESTAMP_RE.match(text):
        raise SchemaError(f"timestamp {text!r} is not of the form YYYY-MM-DDTHH:MM:SS.mmmZ")
    try:
        dt = datetime(
            int(text[0:4]),
            int(text[5:7]),
            int(text[8:10]),
            int(text[11:13]),
            int(text[14:16]),
            int(text[17:19]),
            tzinfo=UTC,
        )
    except ValueError:
        raise SchemaError(f"timestamp {text!r} is not a valid date") from None
    return dt.timestamp() + int(text[20:23]) / 1000


def _check_timestamp(text: Any) -> str:
    if type(text) is not str or not _TIMESTAMP_RE.match(text):
        raise SchemaError(f"timestamp {text!r} is not of the form YYYY-MM-DDTHH:MM:SS.mmmZ")
    if text[8:10] > "28":
        parse_timestamp(text)
    return text


# --------------------------------------------------------------------------- media types

MAX_CONTENT_TYPE: Final = 127
"""Longest media type an event may declare (RFC 6838 caps type and subtype names at 127
characters each; one short limit on the whole string keeps events small)."""

# type "/" subtype, then optional ";" parameters: RFC 6838's restricted-name characters,
# parameter values as tokens or quoted strings, all printable ASCII.
_NAME: Final = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_PARAM_VALUE: Final = r'(?:[!#$%&\'*+.^_`|~0-9A-Za-z-]+|"[ !#-\[\]-~]*")'
CONTENT_TYPE_PATTERN: Final = rf"{_NAME}/{_NAME}(?:[ \t]*;[ \t]*{_NAME}={_PARAM_VALUE})*"
"""What ``metadata.contentType`` must match in full (also the API's JSON Schema pattern)."""
_CONTENT_TYPE_RE: Final = re.compile(CONTENT_TYPE_PATTERN)


def _content_type(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{what} must be a string")
    if len(value) > MAX_CONTENT_TYPE:
        raise SchemaError(f"{what} is longer than {MAX_CONTENT_TYPE} characters")
    if not _CONTENT_TYPE_RE.fullmatch(value):
        raise SchemaError(f"{what} {value!r} is not a media type like 'application/json'")
    return value


def check_content_type(value: str | None) -> None:
    """Raise :class:`SchemaError` unless ``value`` is None or a media type such as
    ``application/json`` or ``text/plain; charset=utf-8``."""
    if value is not None:
        _content_type(value, "content type")


# --------------------------------------------------------------------------- event keys

MAX_EVENT_KEY: Final = 256
"""Longest event key, in UTF-8 bytes (a Kafka key or a JetStream subject is of this order;
the key is in every event block of a compacted topic and in the compaction table)."""


def _event_key(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{what} must be a string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise SchemaError(f"{what} must be valid Unicode (no lone surrogates)") from None
    if not 1 <= size <= MAX_EVENT_KEY:
        raise SchemaError(f"{what} must be 1 to {MAX_EVENT_KEY} bytes of UTF-8")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise SchemaError(f"{what} must not contain control characters")
    return value


def check_event_key(value: str | None) -> None:
    """Raise :class:`SchemaError` unless ``value`` is None or an event key: 1 to
    :data:`MAX_EVENT_KEY` bytes of UTF-8 without control characters."""
    if value is not None:
        _event_key(value, "event key")


# --------------------------------------------------------------------------- helpers


def _map(value: Any, what: str, keys: set[str], optional: frozenset[str] = frozenset()) -> Any:
    if not isinstance(value, dict):
        raise SchemaError(f"{what} must be a map, got {type(value).__name__}")
    present = value.keys()
    if present == keys:
        return value
    missing = keys - present
    if missing:
        raise SchemaError(f"{what} lacks field(s) {sorted(missing)}")
    extra = present - keys - optional
    if extra:
        raise SchemaError(f"{what} has unknown field(s) {sorted(extra)}")
    return value


_PEER_CACHE: dict[bytes, PeerId] = {}
_PEER_CACHE_SIZE: Final = 4096


def _peer(value: Any, what: str) -> PeerId:
    """A validated :class:`PeerId`. The same few publishers sign most events, so validated
    ids are kept in a small bounded cache (cleared when full: cheap and never stale)."""
    cached = _PEER_CACHE.get(value) if type(value) is bytes else None
    if cached is not None:
        return cached
    if not isinstance(value, bytes):
        raise SchemaError(f"{what} must be peer-id bytes")
    try:
        peer = PeerId(value)
    except ValueError as exc:
        raise SchemaError(f"{what} is not a valid peer id: {exc}") from None
    if len(_PEER_CACHE) >= _PEER_CACHE_SIZE:
        _PEER_CACHE.clear()
    _PEER_CACHE[value] = peer
    return peer


_CID_CACHE: dict[bytes, CID] = {}
_CID_CACHE_SIZE: Final = 4096


def _link(value: Any, what: str, *, nullable: bool = False, exact: bool = False) -> CID | None:
    """A validated :class:`CID` from a decoded link. Topic links repeat on every event of a
    topic and parent links on the next event, so parsed CIDs are cached (bounded). The fast
    decoder gives links as raw bytes; after an ``exact`` decode (see :func:`_load`) a link
    is a :class:`CID` and bytes there were written as a byte string, not a link."""
    if type(value) is bytes and exact:
        raise SchemaError(f"{what} has the wrong CBOR type (bytes, not a link)")
    if type(value) is bytes:
        cached = _CID_CACHE.get(value)
        if cached is not None:
            return cached
        try:
            cid = CID(value)
        except ValueError as exc:
            raise SchemaError(f"{what} is not a valid CID: {exc}") from None
        if len(_CID_CACHE) >= _CID_CACHE_SIZE:
            _CID_CACHE.clear()
        _CID_CACHE[value] = cid
        return cid
    if value is None and nullable:
        return None
    if isinstance(value, CID):
        return value
    raise SchemaError(f"{what} must be a link")


def _version(value: Any) -> str:
    if type(value) is not str or len(value) > MAX_VERSION_CHARS or not value.isascii():
        raise SchemaError(f"protocolVersion must be ASCII of at most {MAX_VERSION_CHARS} chars")
    return value


def _signature(value: Any, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != SIGNATURE_SIZE:
        raise SchemaError(f"{what} must be {SIGNATURE_SIZE} bytes")
    return value


def _text(value: Any, what: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{what} must be a string")
    if len(value.encode("utf-8")) > max_bytes:
        raise SchemaError(f"{what} is longer than {max_bytes} bytes")
    return value


def _load(block: bytes, kind: str, cid: CID | None) -> tuple[CID, dict[str, Any], bool]:
    """Size and CID check, then decode into a map.

    Returns ``(cid, wire, exact)``. The fast decoder returns links as raw CID bytes; when a
    field that must be *bytes* (a signature, a payload) looks like a CID, its type is
    ambiguous there, so the block is decoded again with the exact decoder (links become
    :class:`CID` objects) and ``exact`` is True.
    """
    if not isinstance(block, bytes):
        raise SchemaError(f"{kind} block must be bytes")
    if len(block) > MAX_DESCRIPTOR_SIZE:
        raise SchemaError(f"{kind} block is {len(block)} bytes, more than {MAX_DESCRIPTOR_SIZE}")
    if cid is None:
        cid = cid_of(block)
    elif not cid.verifies(block):
        raise CIDMismatch(f"{kind} block does not hash to {cid}")
    if len(_CID_CACHE) < _CID_CACHE_SIZE:
        _CID_CACHE[cid.raw] = cid  # this event is likely the next one's parent
    try:
        wire = decode_fast(block)
    except CodecError as exc:
        raise SchemaError(f"{kind} block is not DAG-CBOR: {exc}") from None
    if not isinstance(wire, dict):
        raise SchemaError(f"{kind} block must be a map, got {type(wire).__name__}")
    for key in _AMBIGUOUS:
        value = wire.get(key)
        if type(value) is bytes and is_cid_like(value):
            try:
                return cid, decode(block), True
            except CodecError as exc:
                raise SchemaError(f"{kind} block is not strict DAG-CBOR: {exc}") from None
    return cid, wire, False


_AMBIGUOUS: Final = ("payload", "authorSignature", "publisherSignature")
_SIGNATURE_KEYS: Final = ("authorSignature", "publisherSignature")


def _encode_wire(wire: dict[str, Any], exact: bool) -> bytes:
    """Re-encode a decoded map the way it was decoded (see :func:`_load`)."""
    return encode_reference_free(wire) if exact else libipld.encode_dag_cbor(wire)


def _without(wire: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in wire.items() if k not in keys}


def _check_canonical(wire: dict[str, Any], exact: bool, block: bytes, kind: str) -> None:
    """Canonical DAG-CBOR has one encoding per value: if re-encoding what we decoded does
    not give the same bytes, the block was non-canonical or a link/bytes field had the
    wrong CBOR type. Either way it is refused, so each descriptor has exactly one CID."""
    if _encode_wire(wire, exact) != block:
        raise SchemaError(
            f"{kind} block is not canonical DAG-CBOR, or a field has the wrong CBOR type"
        )


class _ContentAddressed:
    """Descriptors are values whose identity is their CID: equal when their blocks are equal,
    hashed by CID, and serialised as the very block they were parsed from."""

    __slots__ = ()
    cid: CID
    block: bytes

    def to_block(self) -> bytes:
        return self.block

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.cid == self.cid

    def __hash__(self) -> int:
        return hash(self.cid)
