"""Signed checkpoints of a topic's history: what lets a reader holding only the topic's
CID seek to any time or position in O(log n) DHT fetches, and stream forward from there.

A topic's author cuts its history into **segments**, each closed by a checkpoint. The
segment of checkpoint ``n`` is the events the author delivered after checkpoint ``n - 1``
up to and including the heads checkpoint ``n`` names, in the author's delivery order (a
causal order: parents first). A checkpoint carries

* ``number`` (1, 2, ...), ``size`` (events in its segment) and ``count`` (events in all
  segments up to it): positions;
* ``first_ms`` (the earliest ``created`` in its segment) and ``last_ms`` (the latest
  ``created`` in it and every earlier segment — never smaller than the previous
  checkpoint's): times, in milliseconds since the epoch;
* ``heads``: the topic's tips when it was cut (what the segment reaches up to);
* ``index``: the root of a tree of index blocks over the segment's events, in order,
  each leaf entry ``[created_ms, cid]`` and each inner entry
  ``[min_ms, max_ms, count, child]``, at most :data:`INDEX_FANOUT` per block;
* ``skips``: links to the checkpoints numbered ``n - 1, n - 2, n - 4, ...`` with their
  ``count`` and ``last_ms``, so a reader decides which to follow before fetching it;
* the author's signature over all of it.

**Seek.** The first event at or after a time ``T`` lies in the first segment whose
``last_ms >= T`` (``last_ms`` only grows); from the newest checkpoint a reader jumps each
time to the farthest skip that still reaches ``T``, which halves the distance left, so
it needs at most ``log2(n)`` checkpoint fetches, then one index block per level of the
segment's tree (two for segments up to 12,544 events). A position works the same way
with ``count``. Every checkpoint fetched is checked: its signature, that the topic's
author made it, and that it is the checkpoint the link that led to it described
(number, count, last_ms): a forged or out-of-order checkpoint is refused.

Nothing here does I/O: the seek functions take an async ``get(cid) -> block | None``,
which the node backs with its store and the DHT and a benchmark with a counter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Self

from .cid import CID, cid_of
from .codec import decode, encode
from .descriptors import iso_timestamp
from .errors import CodecError, SignatureError
from .identity import Identity, PeerId

__all__ = [
    "CHECKPOINT_TYPE",
    "INDEX_FANOUT",
    "INDEX_TYPE",
    "Checkpoint",
    "CheckpointError",
    "IndexNode",
    "Skip",
    "build_index",
    "entries_from",
    "find_segment",
    "make_checkpoint",
    "seek_entry",
    "seek_in_segment",
    "skip_numbers",
]

CHECKPOINT_TYPE: Final = "pulsarcast/checkpoint/1"
INDEX_TYPE: Final = "pulsarcast/cpindex/1"
INDEX_FANOUT: Final = 112
"""Entries per index block, so that every block fits one DHT STORE (8,137 bytes): a leaf
entry is at most 51 bytes (an array head, a 9-byte integer, a 41-byte link), an inner one
65 (two times, a count up to 2^32, a link), so an inner block of 112 is at most ~7.3 KB.
A segment of up to 12,544 events is two levels deep."""
MAX_CHECKPOINT_HEADS: Final = 64
MAX_SKIPS: Final = 63
MAX_CHECKPOINT_SIZE: Final = 16 * 1024
MAX_INDEX_DEPTH: Final = 8
MAX_MS: Final = 2**53 - 1
_KEYS: Final = frozenset({"t", "topic", "publisher", "number", "count", "size", "first_ms",
                          "last_ms", "heads", "index", "skips", "created", "signature"})

Get = Callable[[CID], Awaitable[bytes | None]]


class CheckpointError(ValueError):
    """A checkpoint or index block is malformed, forged, or not the one a link named."""


def skip_numbers(number: int) -> list[int]:
    """The checkpoints ``number`` links to: ``number - 1, number - 2, number - 4, ...``."""
    out: list[int] = []
    step = 1
    while number - step >= 1:
        out.append(number - step)
        step *= 2
    return out


@dataclass(frozen=True, slots=True)
class Skip:
    """A link to an earlier checkpoint, with what a seek decides by."""

    number: int
    count: int
    last_ms: int
    cid: CID


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint. Build with :meth:`create`, parse with :meth:`from_block`."""

    topic: CID
    publisher: PeerId
    number: int
    count: int
    size: int
    first_ms: int
    last_ms: int
    heads: tuple[CID, ...]
    index: CID
    skips: tuple[Skip, ...]
    created: str
    signature: bytes = field(repr=False)
    block: bytes = field(repr=False)
    cid: CID = field(repr=False)

    @classmethod
    def create(
        cls,
        identity: Identity,
        topic: CID,
        *,
        number: int,
        count: int,
        size: int,
        first_ms: int,
        last_ms: int,
        heads: Iterable[CID],
        index: CID,
        skips: Sequence[Skip],
        now: float | None = None,
    ) -> Self:
        """Sign a checkpoint; raises :class:`CheckpointError` if it breaks a rule."""
        unsigned: dict[str, Any] = {
            "t": CHECKPOINT_TYPE,
            "topic": topic,
            "publisher": identity.peer_id.raw,
            "number": number,
            "count": count,
            "size": size,
            "first_ms": first_ms,
            "last_ms": last_ms,
            "heads": list(heads),
            "index": index,
            "skips": [[s.number, s.count, s.last_ms, s.cid] for s in skips],
            "created": iso_timestamp(now),
        }
        unsigned["signature"] = identity.sign(encode(unsigned))
        return cls.from_block(encode(unsigned))

    @classmethod
    def from_block(cls, block: bytes, cid: CID | None = None) -> Self:
        """Parse and verify: size, canonical DAG-CBOR, exact keys and types, the rules
        between its fields, and the signature. Raises :class:`CheckpointError`."""
        if not isinstance(block, bytes) or len(block) > MAX_CHECKPOINT_SIZE:
            raise CheckpointError(f"a checkpoint is bytes of at most {MAX_CHECKPOINT_SIZE}")
        actual = cid_of(block)
        if cid is not None and actual != cid:
            raise CheckpointError(f"checkpoint block is not {cid}")
        try:
            wire = decode(block)
        except CodecError as exc:
            raise CheckpointError(f"checkpoint is not DAG-CBOR: {exc}") from None
        if not isinstance(wire, dict) or wire.keys() != _KEYS:
            raise CheckpointError(f"checkpoint must have exactly the keys {sorted(_KEYS)}")
        if wire["t"] != CHECKPOINT_TYPE:
            raise CheckpointError(f"checkpoint type must be {CHECKPOINT_TYPE!r}")
        topic, index = _link(wire["topic"]), _link(wire["index"])
        try:
            publisher = PeerId(wire["publisher"])
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint publisher: {exc}") from None
        number, count, size = _int(wire["number"]), _int(wire["count"]), _int(wire["size"])
        first_ms, last_ms = _int(wire["first_ms"]), _int(wire["last_ms"])
        if number < 1 or size < 1 or count < size or first_ms > last_ms:
            raise CheckpointError("checkpoint needs number >= 1, size >= 1, count >= size "
                                  "and first_ms <= last_ms")
        heads = wire["heads"]
        if not isinstance(heads, list) or not 1 <= len(heads) <= MAX_CHECKPOINT_HEADS:
            raise CheckpointError(f"checkpoint heads: 1 to {MAX_CHECKPOINT_HEADS} links")
        links = tuple(_link(h) for h in heads)
        skips = _skips(wire["skips"], number, count - size, last_ms)
        created, signature = wire["created"], wire["signature"]
        if not isinstance(created, str) or len(created) > 32:
            raise CheckpointError("checkpoint created must be a timestamp")
        if not isinstance(signature, bytes) or len(signature) != 64:
            raise CheckpointError("checkpoint signature must be 64 bytes")
        if encode(wire) != block:
            raise CheckpointError("checkpoint is not canonical DAG-CBOR")
        unsigned = encode({k: v for k, v in wire.items() if k != "signature"})
        try:
            if not publisher.verify(signature, unsigned):
                raise SignatureError("bad signature")
        except (SignatureError, ValueError):
            raise CheckpointError("checkpoint signature does not verify") from None
        return cls(topic, publisher, number, count, size, first_ms, last_ms, links, index,
                   skips, created, signature, block, actual)


def _skips(value: Any, number: int, before: int, last_ms: int) -> tuple[Skip, ...]:
    """The skip links, which must name exactly ``skip_numbers(number)`` in that order,
    with counts and times that only grow toward this checkpoint."""
    expected = skip_numbers(number)
    if not isinstance(value, list) or len(value) != len(expected) or len(value) > MAX_SKIPS:
        raise CheckpointError(f"checkpoint {number} must link checkpoints {expected}")
    skips: list[Skip] = []
    for item, want in zip(value, expected, strict=True):
        if not isinstance(item, list) or len(item) != 4:
            raise CheckpointError("a skip is [number, count, last_ms, link]")
        skip = Skip(_int(item[0]), _int(item[1]), _int(item[2]), _link(item[3]))
        if skip.number != want:
            raise CheckpointError(f"checkpoint {number} must link checkpoints {expected}")
        if skips and (skip.count > skips[-1].count or skip.last_ms > skips[-1].last_ms):
            raise CheckpointError("skip counts and times must not grow into the past")
        skips.append(skip)
    if skips and (skips[0].count != before or skips[0].last_ms > last_ms):
        raise CheckpointError("the previous checkpoint's count must be this one's less its "
                              "size, and its last_ms at most this one's")
    if not skips and before != 0:
        raise CheckpointError("the first checkpoint's count must be its size")
    return tuple(skips)


def _int(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= MAX_MS:
        raise CheckpointError(f"checkpoint numbers are integers in 0..{MAX_MS}")
    return value


def _link(value: Any) -> CID:
    if not isinstance(value, CID):
        raise CheckpointError("checkpoint links must be CIDs")
    return value


# ---------------------------------------------------------------------------- the index

@dataclass(frozen=True, slots=True)
class IndexNode:
    """One index block: a leaf's ``entries`` (``(created_ms, event)``) or an inner
    node's ``children`` (``(min_ms, max_ms, count, child)``)."""

    entries: tuple[tuple[int, CID], ...] = ()
    children: tuple[tuple[int, int, int, CID], ...] = ()

    @property
    def leaf(self) -> bool:
        return not self.children

    @classmethod
    def from_block(cls, block: bytes, cid: CID) -> Self:
        if cid_of(block) != cid:
            raise CheckpointError(f"index block is not {cid}")
        try:
            wire = decode(block)
        except CodecError as exc:
            raise CheckpointError(f"index block is not DAG-CBOR: {exc}") from None
        if not isinstance(wire, dict) or wire.get("t") != INDEX_TYPE or len(wire) != 2:
            raise CheckpointError("not an index block")
        if "entries" in wire:
            raw = wire["entries"]
            if not isinstance(raw, list) or not 1 <= len(raw) <= INDEX_FANOUT:
                raise CheckpointError(f"an index leaf holds 1 to {INDEX_FANOUT} entries")
            entries = []
            for item in raw:
                if not isinstance(item, list) or len(item) != 2:
                    raise CheckpointError("an index entry is [created_ms, cid]")
                entries.append((_int(item[0]), _link(item[1])))
            return cls(entries=tuple(entries))
        raw = wire.get("children")
        if not isinstance(raw, list) or not 1 <= len(raw) <= INDEX_FANOUT:
            raise CheckpointError(f"an index node holds 1 to {INDEX_FANOUT} children")
        children = []
        for item in raw:
            if not isinstance(item, list) or len(item) != 4:
                raise CheckpointError("an index child is [min_ms, max_ms, count, cid]")
            low, high, count = _int(item[0]), _int(item[1]), _int(item[2])
            if low > high or count < 1:
                raise CheckpointError("an index child needs min_ms <= max_ms and count >= 1")
            children.append((low, high, count, _link(item[3])))
        return cls(children=tuple(children))


def build_index(entries: Sequence[tuple[int, CID]]) -> tuple[CID, list[tuple[CID, bytes]]]:
    """The index over a segment's ``(created_ms, cid)`` entries, in order: its root and
    every block (leaves first), ready to store."""
    if not entries:
        raise CheckpointError("a segment has at least one event")
    blocks: list[tuple[CID, bytes]] = []
    level: list[tuple[int, int, int, CID]] = []
    for i in range(0, len(entries), INDEX_FANOUT):
        chunk = entries[i:i + INDEX_FANOUT]
        block = encode({"t": INDEX_TYPE, "entries": [[ms, cid] for ms, cid in chunk]})
        cid = cid_of(block)
        blocks.append((cid, block))
        times = [ms for ms, _ in chunk]
        level.append((min(times), max(times), len(chunk), cid))
    while len(level) > 1:
        upper: list[tuple[int, int, int, CID]] = []
        for i in range(0, len(level), INDEX_FANOUT):
            kids = level[i:i + INDEX_FANOUT]
            block = encode({"t": INDEX_TYPE, "children": [list(c) for c in kids]})
            cid = cid_of(block)
            blocks.append((cid, block))
            upper.append((min(c[0] for c in kids), max(c[1] for c in kids),
                          sum(c[2] for c in kids), cid))
        level = upper
    return level[0][3], blocks


# ---------------------------------------------------------------------------- seeking

async def fetch_checkpoint(get: Get, cid: CID, author: PeerId, topic: CID,
                           expected: Skip | None = None) -> Checkpoint:
    """Fetch and check a checkpoint of ``topic``: made by its ``author`` and, when a skip
    link led to it, the one the link described."""
    block = await get(cid)
    if block is None:
        raise LookupError(f"checkpoint {cid} not found")
    checkpoint = Checkpoint.from_block(block, cid)
    if checkpoint.topic != topic or checkpoint.publisher != author:
        raise CheckpointError(f"checkpoint {cid} is not one the author of {topic} made")
    if expected is not None and (checkpoint.number, checkpoint.count, checkpoint.last_ms) != (
            expected.number, expected.count, expected.last_ms):
        raise CheckpointError(f"checkpoint {cid} is not the one its link described")
    return checkpoint


async def find_segment(get: Get, latest: Checkpoint, author: PeerId, *,
                       at_ms: int | None = None, position: int | None = None,
                       ) -> Checkpoint | None:
    """The checkpoint whose segment holds the first event at or after ``at_ms`` (or the
    event at 1-based ``position``); None when even ``latest`` does not reach it (the
    event, if any, is newer than every checkpoint)."""
    if (at_ms is None) == (position is None):
        raise ValueError("seek by at_ms or by position, not both")

    def reaches(count: int, last_ms: int) -> bool:
        if at_ms is not None:
            return last_ms >= at_ms
        assert position is not None
        return count >= position

    if not reaches(latest.count, latest.last_ms):
        return None
    current = latest
    while True:
        best: Skip | None = None
        for skip in current.skips:
            if reaches(skip.count, skip.last_ms) and (best is None or skip.number < best.number):
                best = skip
        if best is None:
            return current
        current = await fetch_checkpoint(get, best.cid, author, latest.topic, best)


async def seek_in_segment(get: Get, checkpoint: Checkpoint, *, at_ms: int | None = None,
                          position: int | None = None) -> int:
    """The 0-based offset, within ``checkpoint``'s segment, of the first event at or after
    ``at_ms`` (or of the event at 1-based topic ``position``): one index block per level."""
    if position is not None:
        offset = position - (checkpoint.count - checkpoint.size) - 1
        if not 0 <= offset < checkpoint.size:
            raise ValueError(f"position {position} is not in checkpoint {checkpoint.number}")
        return offset
    assert at_ms is not None
    offset, _ = await seek_entry(get, checkpoint, at_ms)
    return offset


async def seek_entry(get: Get, checkpoint: Checkpoint, at_ms: int) -> tuple[int, tuple[int, CID]]:
    """The offset and the ``(created_ms, event)`` entry of the first event at or after
    ``at_ms`` in ``checkpoint``'s segment, read from the leaf the descent reaches."""
    offset, cid = 0, checkpoint.index
    for _ in range(MAX_INDEX_DEPTH):
        node = await _index_node(get, cid)
        if node.leaf:
            for i, entry in enumerate(node.entries):
                if entry[0] >= at_ms:
                    return offset + i, entry
            raise CheckpointError("the index does not hold the time its parent promised")
        for _, high, count, child in node.children:
            if high >= at_ms:
                cid = child
                break
            offset += count
        else:
            raise CheckpointError("the index does not hold the time its checkpoint promised")
    raise CheckpointError(f"index deeper than {MAX_INDEX_DEPTH}")


async def entries_from(get: Get, checkpoint: Checkpoint, offset: int = 0
                       ) -> AsyncIterator[tuple[int, CID]]:
    """The segment's ``(created_ms, event)`` entries from ``offset`` on, in order, holding
    one index block per level at a time."""
    yielded = 0

    async def walk(cid: CID, skip: int, depth: int) -> AsyncIterator[tuple[int, CID]]:
        nonlocal yielded
        if depth > MAX_INDEX_DEPTH:
            raise CheckpointError(f"index deeper than {MAX_INDEX_DEPTH}")
        node = await _index_node(get, cid)
        if node.leaf:
            for entry in node.entries[skip:]:
                yielded += 1
                yield entry
            return
        for _, _, count, child in node.children:
            if skip >= count:
                skip -= count
                continue
            async for entry in walk(child, skip, depth + 1):
                yield entry
            skip = 0

    async for entry in walk(checkpoint.index, offset, 0):
        yield entry
    if yielded != checkpoint.size - offset:
        raise CheckpointError(f"checkpoint {checkpoint.number}'s index holds "
                              f"{yielded + offset} events, not {checkpoint.size}")


async def _index_node(get: Get, cid: CID) -> IndexNode:
    block = await get(cid)
    if block is None:
        raise LookupError(f"index block {cid} not found")
    return IndexNode.from_block(block, cid)


def make_checkpoint(
    identity: Identity,
    topic: CID,
    number: int,
    entries: Sequence[tuple[int, CID]],
    heads: Iterable[CID],
    earlier: Callable[[int], Skip],
    *,
    now: float | None = None,
) -> tuple[Checkpoint, list[tuple[CID, bytes]]]:
    """Checkpoint ``number`` over a segment's ``(created_ms, cid)`` entries (in delivery
    order), linking the earlier checkpoints ``earlier(n)`` names; with its index blocks
    (store them before the checkpoint, and the checkpoint before naming it)."""
    root, blocks = build_index(entries)
    skips = [earlier(n) for n in skip_numbers(number)]
    before = skips[0].count if skips else 0
    last_before = skips[0].last_ms if skips else 0
    times = [ms for ms, _ in entries]
    checkpoint = Checkpoint.create(
        identity, topic, number=number, count=before + len(entries), size=len(entries),
        first_ms=min(times), last_ms=max(last_before, *times), heads=heads, index=root,
        skips=skips, now=now,
    )
    return checkpoint, [*blocks, (checkpoint.cid, checkpoint.block)]
