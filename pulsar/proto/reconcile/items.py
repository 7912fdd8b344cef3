"""A node's history of one topic as reconciliation sees it: items sorted by
``(created_ms, CID bytes)``, with prefix sums that give any range's fingerprint at once.

Sorting by the signed ``created`` time is what makes the technique pay: what a node missed
while it was away is one range at the end, and a partition's two sides differ in one range
of time, so almost every range of the two histories matches and is settled by one
fingerprint. The CID breaks ties, so two nodes sort the same events the same way.

A range's **fingerprint** is the first 16 bytes of SHA-256 over the sum of its items'
digests (the 32 bytes after the CID's multihash header, read little-endian, added modulo
2^256) as 32 bytes little-endian, followed by its item count as 8 bytes little-endian.
Addition makes it order-free and lets prefix sums answer any range in O(log n) (two
bisections); the count makes a missing item visible even if the sums collide by chance.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable
from typing import Final

__all__ = ["INFINITY", "MAX_MS", "Bound", "ItemIndex", "fingerprint_of"]

MAX_MS: Final = 1 << 53
"""Bigger than any ``created_ms`` (the timestamp form ends in year 9999)."""
Bound = tuple[int, bytes]
"""``(ms, CID-bytes prefix)``: an item ``(ms, cid)`` is below the bound when the pair is
smaller (bytes compare lexicographically, so an empty prefix is below every CID of that
millisecond)."""
INFINITY: Final[Bound] = (MAX_MS, b"")
_MASK: Final = (1 << 256) - 1
_DIGEST: Final = 32


def fingerprint_of(total: int, count: int) -> bytes:
    """The fingerprint of a range whose digests sum to ``total`` (mod 2^256)."""
    return hashlib.sha256(total.to_bytes(32, "little") + count.to_bytes(8, "little")).digest()[:16]



class ItemIndex:
    """One node's items of one topic: ``(created_ms, cid_bytes, position)`` rows, where
    the position is the item's place in this node's delivery log (a causal order, which a
    peer fetching the items uses to ask for parents before children)."""

    __slots__ = ("_keys", "_members", "_positions", "_sums")

    def __init__(self, rows: Iterable[tuple[int, bytes, int]]) -> None:
        ordered = sorted(rows)
        self._keys: list[Bound] = [(ms, raw) for ms, raw, _ in ordered]
        self._positions = [position for _, _, position in ordered]
        self._members = {raw for _, raw in self._keys}
        self._sums = [0]
        """Prefix sums of the digests; shorter than ``len + 1`` after an insertion in the
        middle (completed when next needed)."""
        self._complete()

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, rows: Iterable[tuple[int, bytes, int]]) -> None:
        """Take in newly logged items. New events are mostly the newest, so they are
        appended; one that sorts earlier is inserted, and the sums after it are
        recomputed when next needed."""
        for ms, raw, position in sorted(rows):
            if raw in self._members:
                continue
            key = (ms, raw)
            self._members.add(raw)
            if not self._keys or key > self._keys[-1]:
                self._keys.append(key)
                self._positions.append(position)
                continue
            at = bisect_left(self._keys, key)
            self._keys.insert(at, key)
            self._positions.insert(at, position)
            del self._sums[at + 1:]

    def _complete(self) -> None:
        sums = self._sums
        total = sums[-1]
        for _, raw in self._keys[len(sums) - 1:]:
            total = (total + int.from_bytes(raw[-_DIGEST:], "little")) & _MASK
            sums.append(total)

    def has(self, raw: bytes) -> bool:
        return raw in self._members

    def span(self, lo: Bound, hi: Bound) -> tuple[int, int]:
        """The index range ``[i, j)`` of the items in ``[lo, hi)``."""
        i = bisect_left(self._keys, lo)
        return i, max(i, bisect_left(self._keys, hi))

    def fingerprint(self, i: int, j: int) -> bytes:
        if len(self._sums) <= j:
            self._complete()
        return fingerprint_of((self._sums[j] - self._sums[i]) & _MASK, j - i)

    def key(self, i: int) -> Bound:
        return self._keys[i]

    def items(self, i: int, j: int) -> list[tuple[bytes, int]]:
        """``(cid_bytes, position)`` of the items ``[i, j)``."""
        return [(self._keys[k][1], self._positions[k]) for k in range(i, j)]
