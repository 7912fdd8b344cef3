"""The reconciliation messages (docs/protocol.md §12), taken by the node's runtime, not
the core: RECON (ranges and what each side holds in them), RWANT (blocks by CID) and
RBLOCKS (its answer).

Each is one DAG-CBOR map (the codec's rules: exactly the listed keys, every field
validated on decode). A bound is ``[ms, prefix]``: a uint of at most 2^53 and a byte
string of at most 64 bytes (see :data:`~.items.Bound`).

=========  ==================================================================================
``t``      keys
=========  ==================================================================================
recon      ``topic`` (link), ``session`` (uint < 2^32), ``round`` (uint ≤ 64),
           ``fps``: ``[lo, hi, count, fingerprint (16 bytes)]`` ranges,
           ``ids``: ``[lo, hi, reply (bool), [[cid link, position uint], ...]]`` ranges,
           ≤ 2,048 ranges and ≤ 8,192 ``[cid, position]`` pairs in all
rwant      ``topic`` (link), ``session`` (uint), ``cids``: 1..512 links
rblocks    ``topic`` (link), ``session`` (uint), ``n`` (uint ≤ 512: how many of the RWANT's
           CIDs, from its first, this answer settles), ``blocks``: ≤ 512 byte strings of
           1..8192 bytes, ≤ 1 MiB in all
=========  ==================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from dag import CID
from pulsar.proto.fields import MessageError, bytes_field, link_field, uint_field
from pulsar.proto.repair.messages import block_list

from .items import MAX_MS, Bound

__all__ = ["MAX_IDS", "MAX_RANGES", "MAX_ROUNDS", "MAX_WANT", "Fingerprint",
           "IdList", "RBlocks", "RWant", "Recon"]

MAX_RANGES: Final = 2048
"""Ranges (fingerprints and id lists together) in one RECON."""
MAX_IDS: Final = 8192
"""``[cid, position]`` pairs in one RECON (~45 bytes each: well under a frame)."""
MAX_ROUNDS: Final = 64
MAX_WANT: Final = 512
"""CIDs in one RWANT, and blocks in one RBLOCKS."""
MAX_SESSION: Final = (1 << 32) - 1
MAX_PREFIX: Final = 64
MAX_POSITION: Final = 1 << 53
MAX_COUNT: Final = 1 << 53


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The sender holds ``count`` items in ``[lo, hi)``, whose fingerprint is ``fp``."""

    lo: Bound
    hi: Bound
    count: int
    fp: bytes


@dataclass(frozen=True, slots=True)
class IdList:
    """The sender's items in ``[lo, hi)`` (with their positions in its delivery log), or
    those it found the receiver lacks there. ``reply``: the receiver should answer with
    what it holds in the range that this list does not name."""

    lo: Bound
    hi: Bound
    reply: bool
    items: tuple[tuple[CID, int], ...]


def _bound(value: Any, what: str) -> Bound:
    if not isinstance(value, list) or len(value) != 2:
        raise MessageError(f"{what} must be [ms, prefix]")
    return uint_field(value[0], what, MAX_MS), bytes_field(value[1], what, MAX_PREFIX)


def _ranges(value: Any, what: str) -> list[list[Any]]:
    if not isinstance(value, list) or len(value) > MAX_RANGES:
        raise MessageError(f"{what} must be a list of at most {MAX_RANGES}")
    for entry in value:
        if not isinstance(entry, list) or len(entry) != 4:
            raise MessageError(f"{what} entries must be 4-element lists")
    return value


@dataclass(frozen=True, slots=True)
class Recon:
    """One round of a reconciliation (see :mod:`.ranges`)."""

    topic: CID
    session: int
    round: int
    fps: tuple[Fingerprint, ...]
    ids: tuple[IdList, ...]
    T: ClassVar[str] = "recon"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"topic", "session", "round", "fps", "ids"})

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": self.T, "topic": self.topic, "session": self.session, "round": self.round,
            "fps": [[list(f.lo), list(f.hi), f.count, f.fp] for f in self.fps],
            "ids": [[list(i.lo), list(i.hi), i.reply, [[cid, pos] for cid, pos in i.items]]
                    for i in self.ids],
        }

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Recon:
        fps = []
        for lo, hi, count, fp in _ranges(m["fps"], "recon.fps"):
            if not isinstance(fp, bytes) or len(fp) != 16:
                raise MessageError("recon.fps fingerprints must be 16 bytes")
            fps.append(Fingerprint(_bound(lo, "recon.fps.lo"), _bound(hi, "recon.fps.hi"),
                                   uint_field(count, "recon.fps.count", MAX_COUNT), fp))
        ids = []
        total = 0
        for lo, hi, reply, items in _ranges(m["ids"], "recon.ids"):
            if not isinstance(reply, bool) or not isinstance(items, list):
                raise MessageError("recon.ids entries must be [lo, hi, bool, list]")
            total += len(items)
            if total > MAX_IDS:
                raise MessageError(f"recon.ids name more than {MAX_IDS} items")
            pairs = []
            for item in items:
                if not isinstance(item, list) or len(item) != 2:
                    raise MessageError("recon.ids items must be [cid, position]")
                pairs.append((link_field(item[0], "recon.ids.cid"),
                              uint_field(item[1], "recon.ids.position", MAX_POSITION)))
            ids.append(IdList(_bound(lo, "recon.ids.lo"), _bound(hi, "recon.ids.hi"), reply,
                              tuple(pairs)))
        if len(fps) + len(ids) > MAX_RANGES:
            raise MessageError(f"recon holds more than {MAX_RANGES} ranges")
        return cls(link_field(m["topic"], "recon.topic"),
                   uint_field(m["session"], "recon.session", MAX_SESSION),
                   uint_field(m["round"], "recon.round", MAX_ROUNDS), tuple(fps), tuple(ids))


@dataclass(frozen=True, slots=True)
class RWant:
    """Send these blocks (the events a reconciliation found missing), in this order."""

    topic: CID
    session: int
    cids: tuple[CID, ...]
    T: ClassVar[str] = "rwant"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"topic", "session", "cids"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "session": self.session,
                "cids": list(self.cids)}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> RWant:
        cids = m["cids"]
        if not isinstance(cids, list) or not 0 < len(cids) <= MAX_WANT:
            raise MessageError(f"rwant.cids must be a list of 1..{MAX_WANT} links")
        return cls(link_field(m["topic"], "rwant.topic"),
                   uint_field(m["session"], "rwant.session", MAX_SESSION),
                   tuple(link_field(c, "rwant.cids") for c in cids))


@dataclass(frozen=True, slots=True)
class RBlocks:
    """The answer to an RWANT: of its CIDs, the first ``n`` are settled by this answer
    (their blocks are here, in order, or the answerer lacks them); the rest did not fit
    and are asked for again. Nothing in it is trusted: the asker checks every block's CID
    against those it asked for and verifies each like a backfilled event."""

    topic: CID
    session: int
    n: int
    blocks: tuple[bytes, ...]
    T: ClassVar[str] = "rblocks"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"topic", "session", "n", "blocks"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "topic": self.topic, "session": self.session, "n": self.n,
                "blocks": list(self.blocks)}

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> RBlocks:
        blocks = block_list(m["blocks"], "rblocks", MAX_WANT)
        n = uint_field(m["n"], "rblocks.n", MAX_WANT)
        if len(blocks) > n:
            raise MessageError("rblocks.blocks holds more blocks than n settles")
        return cls(link_field(m["topic"], "rblocks.topic"),
                   uint_field(m["session"], "rblocks.session", MAX_SESSION), n, blocks)
