"""Rows from the bulk history format (:mod:`api.logblocks`), decoded in Spark's workers.

The node sends its stored event blocks as they are, so the checking it no longer does is
done here, in every worker in parallel, and the blocks are network data. Every block is
hashed and must match the CID its record names (so a row's ``cid`` is the hash of the
event it describes), and decoded with the data model's codec (:func:`dag.codec.decode_fast`).
An event of exactly the shape this version knows — the keys, links and peer ids of an
event block, an inline payload — is then taken field by field, each field type-checked
and bounded (peer ids and links fully validated, through caches); anything else (a linked
payload, which the fast decoder cannot tell from bytes, or a field this version does not
know) goes through the full parser, :meth:`EventDescriptor.from_block`. Not checked again:
signatures (the node verified them on delivery; Ed25519 would cost ~50 us per event, more
than the rest of the read) and canonical encoding (the full parser's re-encoding was 75%
of the decoding, profiled; the hash already pins the bytes).

Text forms are the costly part left (profiled): the CID of each row is new, so its base32
text is computed for the whole batch at once with numpy; ``parent`` is almost always the
previous row's CID, and authors and publishers repeat, so those come from small caches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from api.logblocks import LogRecord
from dag import CID, EventDescriptor, PeerId, check_content_type, check_event_key
from dag.codec import decode_fast, is_cid_like
from dag.descriptors import MAX_INLINE_PAYLOAD, MAX_MERGES, SIGNATURE_SIZE
from dag.errors import DagError

from .errors import PulsarcastSparkError
from .schema import ARROW_SCHEMA, ParsedBlock, rows_in_range

__all__ = ["FetchPayloads", "parse_records"]

FetchPayloads = Callable[[Sequence[str]], dict[str, bytes]]
"""Payloads of events whose payload is a chunk tree, by event CID (asked of the node)."""

_CACHE_SIZE: Final = 4096
_B32: Final = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz234567", dtype=np.uint8)
_BITS: Final = np.array([16, 8, 4, 2, 1], dtype=np.uint8)
_CID_BYTES: Final = 36
"""Every CID pulsarcast makes: v1, one-byte codec, sha2-256 (the vectorised text path)."""
_KEYS: Final = frozenset({"topic", "author", "publisher", "parent", "payload", "metadata",
                          "authorSignature"})
_KEYS_COSIGNED: Final = _KEYS | {"publisherSignature"}
_KEY_SETS: Final = (_KEYS, _KEYS_COSIGNED, _KEYS | {"merges"}, _KEYS_COSIGNED | {"merges"})
"""The shapes the fast path reads: with or without a publisher's signature, with or without
merge links (which a row does not carry: they are checked to be links and skipped)."""
_META_KEYS: Final = frozenset({"created", "protocolVersion"})
_META_OPTIONAL: Final = frozenset({"contentType", "key"})
MAX_CREATED_CHARS: Final = 40


class _Fields:
    """What a row takes from an event."""

    __slots__ = ("author", "content_type", "created", "key", "parent", "payload", "publisher")

    def __init__(self, author: bytes, publisher: bytes, parent: bytes | None,
                 payload: bytes | None, created: str, content_type: str | None,
                 key: str | None) -> None:
        self.author = author
        self.publisher = publisher
        self.parent = parent
        self.payload = payload
        self.created = created
        self.content_type = content_type
        self.key = key


def _full(block: bytes, cid: CID) -> _Fields:
    event = EventDescriptor.from_block(block, cid, verify_signature=False)
    return _Fields(event.author.raw, event.publisher.raw,
                   None if event.parent is None else event.parent.raw,
                   event.payload if isinstance(event.payload, bytes) else None, event.created,
                   event.content_type, event.key)


def _fields(block: bytes, cid: CID, previous: bytes) -> _Fields:
    """The fields of one hash-checked event block (see the module docstring); ``previous``
    is the CID of the row before, already validated, and usually this event's parent."""
    wire = decode_fast(block)
    if type(wire) is not dict or wire.keys() not in _KEY_SETS:
        return _full(block, cid)
    payload = wire["payload"]
    meta = wire["metadata"]
    parent = wire["parent"]
    if type(payload) is not bytes or is_cid_like(payload) or type(meta) is not dict \
            or not _META_KEYS <= meta.keys() <= _META_KEYS | _META_OPTIONAL \
            or any(type(wire[k]) is not bytes or len(wire[k]) != SIGNATURE_SIZE
                   for k in wire.keys() - _KEYS_FIELDS):
        return _full(block, cid)
    created = meta["created"]
    if len(payload) > MAX_INLINE_PAYLOAD or type(created) is not str \
            or len(created) > MAX_CREATED_CHARS:
        raise ValueError("payload or created out of bounds")
    content_type = meta.get("contentType")
    if content_type is not None and type(content_type) is not str:
        raise ValueError("contentType is not a string")
    check_content_type(content_type)  # a SchemaError (DagError) names what is wrong
    key = meta.get("key")
    if key is not None and type(key) is not str:
        raise ValueError("key is not a string")
    check_event_key(key)
    _link(wire["topic"])
    if parent is not None and parent != previous:
        _link(parent)
    merges = wire.get("merges")
    if merges is not None:
        if type(merges) is not list or not 0 < len(merges) <= MAX_MERGES:
            raise ValueError("merges is not a list of 1 to 8 links")
        for merged in merges:
            _link(merged)
    return _Fields(_peer(wire["author"]), _peer(wire["publisher"]), parent, payload, created,
                   content_type, key)


_KEYS_FIELDS: Final = frozenset({"topic", "author", "publisher", "parent", "payload",
                                 "metadata", "merges"})
_SEEN_PEERS: set[bytes] = set()
_SEEN_LINKS: set[bytes] = set()


def _checked(value: object, seen: set[bytes], parse: Callable[[bytes], object],
             what: str) -> bytes:
    """``value`` if it is bytes that ``parse`` accepts; the same few peers and links
    repeat on every event, so accepted ones are remembered (bounded)."""
    if type(value) is not bytes:
        raise ValueError(f"{what} is not bytes")
    if value not in seen:
        parse(value)  # validates
        if len(seen) >= _CACHE_SIZE:
            seen.clear()
        seen.add(value)
    return value


def _peer(value: object) -> bytes:
    return _checked(value, _SEEN_PEERS, PeerId, "a peer id")


def _link(value: object) -> None:
    _checked(value, _SEEN_LINKS, CID, "a link")


def _bad(why: str) -> PulsarcastSparkError:
    return PulsarcastSparkError("NODE_ERROR", f"the node sent a malformed event: {why}")


class _Texts:
    """Text forms of repeated values (peer ids, parents), kept between batches."""

    def __init__(self) -> None:
        self.peers: dict[bytes, str] = {}
        self.cids: dict[bytes, str] = {}

    def peer(self, raw: bytes) -> str:
        text = self.peers.get(raw)
        if text is None:
            if len(self.peers) >= _CACHE_SIZE:
                self.peers.clear()
            text = self.peers[raw] = str(PeerId(raw))
        return text

    def cid(self, cid: CID) -> str:
        text = self.cids.get(cid.raw)
        if text is None:
            if len(self.cids) >= _CACHE_SIZE:
                self.cids.clear()
            text = self.cids[cid.raw] = str(cid)
        return text


_TEXTS = _Texts()


def cid_texts(raws: Sequence[bytes]) -> list[str]:
    """``str(CID(raw))`` for many CIDs at once: base32 of 36-byte CIDs with numpy (the
    per-CID Python version was ~6 us, a third of the decoding), others one by one."""
    if not raws:
        return []
    if any(len(r) != _CID_BYTES for r in raws):
        return [str(CID.parse(r)) for r in raws]
    data = np.frombuffer(b"".join(raws), dtype=np.uint8).reshape(len(raws), _CID_BYTES)
    bits = np.unpackbits(data, axis=1)  # 288 bits per CID
    bits = np.concatenate([bits, np.zeros((len(raws), 2), dtype=np.uint8)], axis=1)
    groups = bits.reshape(len(raws), 58, 5) @ _BITS  # 58 base32 digits
    text = _B32[groups.astype(np.intp)]
    return ["b" + t for t in text.view("S58").ravel().astype("U58").tolist()]


def parse_records(records: Sequence[LogRecord], topic: str, previous: int, end: int,
                  fetch: FetchPayloads) -> ParsedBlock:
    """The rows of ``records`` with positions ``previous < seq < end``, checked. Positions
    must increase strictly, continuing from ``previous``."""
    if not records:
        return ParsedBlock(None, previous, False)
    seqs = [r.seq for r in records]
    keep, reached = rows_in_range(seqs, previous, end)
    if keep == 0:
        return ParsedBlock(None, previous, True)
    texts = _TEXTS
    parent_raws: list[bytes | None] = []
    authors: list[str] = []
    publishers: list[str] = []
    created: list[str] = []
    payloads: list[bytes | None] = []
    content_types: list[str | None] = []
    keys: list[str | None] = []
    linked: list[int] = []
    raws: list[bytes] = []
    delivered: list[float] = []
    previous_cid = b""
    for i in range(keep):
        record = records[i]
        try:
            cid = CID.parse(record.cid)
            if not cid.verifies(record.block):
                raise ValueError(f"the block does not hash to {cid}")
            event = _fields(record.block, cid, previous_cid)
        except (DagError, ValueError) as exc:
            raise _bad(f"position {record.seq}: {exc}") from None
        raws.append(cid.raw)
        previous_cid = cid.raw
        parent_raws.append(event.parent)
        authors.append(texts.peer(event.author))
        publishers.append(texts.peer(event.publisher))
        created.append(event.created)
        payloads.append(event.payload)
        content_types.append(event.content_type)
        keys.append(event.key)
        if event.payload is None:
            linked.append(i)
        delivered.append(record.delivered_at)
    cids = cid_texts(raws)
    # A parent is almost always an event of this batch (the row before) or the last one
    # of the previous batch, kept in the cache.
    here = dict(zip(raws, cids, strict=True))
    parents = [None if raw is None else here.get(raw) or texts.cid(CID.parse(raw))
               for raw in parent_raws]
    texts.cids[raws[-1]] = cids[-1]
    if linked:
        wanted = [cids[i] for i in linked]
        fetched = fetch(wanted)
        for i in linked:
            payload = fetched.get(cids[i])
            if payload is None:
                raise _bad(f"no payload for event {cids[i]}")
            payloads[i] = payload
    at = pa.array(delivered, pa.float64())
    if not pc.all(pc.is_finite(at)).as_py() or pc.min(at).as_py() < 0 \
            or pc.max(at).as_py() >= 1e11:
        raise _bad("delivered_at is not a time in seconds")
    try:
        created_ts = pa.array(created, pa.string()).cast(pa.timestamp("us", tz="UTC"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _bad(f"created does not parse as a time: {exc}") from None
    micros = pc.cast(pc.round(pc.multiply(at, 1e6)), pa.int64())
    columns = [
        pa.array([topic] * keep, pa.string()),
        pa.array(seqs[:keep], pa.int64()),
        pa.array(cids, pa.string()),
        pa.array(parents, pa.string()),
        pa.array(authors, pa.string()),
        pa.array(publishers, pa.string()),
        micros.cast(pa.timestamp("us", tz="UTC")),
        created_ts,
        pa.array(payloads, pa.binary()),
        pa.array(content_types, pa.string()),
        pa.array(keys, pa.string()),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    return ParsedBlock(batch, seqs[keep - 1], reached)
