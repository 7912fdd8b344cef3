"""Rows from the bulk history format (:mod:`api.logblocks`), decoded in Spark's workers.

The node sends its stored event blocks as they are, so the checking it no longer does is
done here, in every worker in parallel, and the blocks are network data: each is parsed
with the data model's own parser (:meth:`EventDescriptor.from_block`: DAG-CBOR, canonical
encoding, schema, and the CID the record names checked against the block by hashing). The
signatures are not checked again — the node checked them when it delivered the event, and
an Ed25519 verification would cost ~50 us per event, more than the rest of the read — so
what a row vouches for is that its ``cid`` is the hash of the event it describes.

Text forms are the costly part left (profiled): the CID of each row is new, so its base32
text is computed for the whole batch at once with numpy; ``parent`` is almost always the
previous row's CID, and authors and publishers repeat, so those come from small caches.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from api.logblocks import LogRecord
from dag import CID, EventDescriptor, PeerId
from dag.errors import DagError

from .errors import PulsarcastSparkError
from .schema import ARROW_SCHEMA

__all__ = ["FetchPayloads", "ParsedRecords", "parse_records"]

FetchPayloads = Callable[[Sequence[str]], dict[str, bytes]]
"""Payloads of events whose payload is a chunk tree, by event CID (asked of the node)."""

_CACHE_SIZE: Final = 4096
_B32: Final = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz234567", dtype=np.uint8)
_BITS: Final = np.array([16, 8, 4, 2, 1], dtype=np.uint8)
_CID_BYTES: Final = 36
"""Every CID pulsarcast makes: v1, one-byte codec, sha2-256 (the vectorised text path)."""


def _bad(why: str) -> PulsarcastSparkError:
    return PulsarcastSparkError("NODE_ERROR", f"the node sent a malformed event: {why}")


@dataclass(frozen=True)
class ParsedRecords:
    """Rows of the records that fall in the range read, and where they ended."""

    batch: pa.RecordBatch | None
    last_seq: int
    reached_end: bool


class _Texts:
    """Text forms of repeated values (peer ids, parents), kept between batches."""

    def __init__(self) -> None:
        self.peers: dict[PeerId, str] = {}
        self.cids: dict[bytes, str] = {}

    def peer(self, peer: PeerId) -> str:
        text = self.peers.get(peer)
        if text is None:
            if len(self.peers) >= _CACHE_SIZE:
                self.peers.clear()
            text = self.peers[peer] = str(peer)
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
                  fetch: FetchPayloads) -> ParsedRecords:
    """The rows of ``records`` with positions ``previous < seq < end``, checked. Positions
    must increase strictly, continuing from ``previous``."""
    if not records:
        return ParsedRecords(None, previous, False)
    seqs = [r.seq for r in records]
    if seqs[0] <= previous or any(b <= a for a, b in itertools.pairwise(seqs)):
        raise _bad(f"positions are not increasing (after {previous}: {seqs[:3]}...)")
    keep = bisect.bisect_left(seqs, end)  # rows at or beyond the end are not ours
    reached = keep < len(seqs)
    if keep == 0:
        return ParsedRecords(None, previous, True)
    texts = _TEXTS
    parent_raws: list[bytes | None] = []
    authors: list[str] = []
    publishers: list[str] = []
    created: list[str] = []
    payloads: list[bytes | None] = []
    linked: list[int] = []
    raws: list[bytes] = []
    delivered: list[float] = []
    for i in range(keep):
        record = records[i]
        try:
            cid = CID.parse(record.cid)
            event = EventDescriptor.from_block(record.block, cid, verify_signature=False)
        except (DagError, ValueError) as exc:
            raise _bad(f"position {record.seq}: {exc}") from None
        raws.append(cid.raw)
        parent_raws.append(None if event.parent is None else event.parent.raw)
        authors.append(texts.peer(event.author))
        publishers.append(texts.peer(event.publisher))
        created.append(event.created)
        if isinstance(event.payload, bytes):
            payloads.append(event.payload)
        else:
            payloads.append(None)
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
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    return ParsedRecords(batch, seqs[keep - 1], reached)
