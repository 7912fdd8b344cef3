"""Storage quotas: how many bytes of new records a source may make this node hold.

Anyone may STORE any valid block here, so validity alone does not stop a dump: one source
sent 20,000 valid 8 KiB raw blocks and 19,958 were stored (+157 MB) before this module. Two
budgets now apply to every *new* key offered by the network (re-storing a key we already
hold costs nothing: that is how replicas are refreshed):

* **per source address**, over a fixed window of ``store_quota_window`` seconds (a record
  lifetime, a day, by default): ``source_store_quota`` bytes (8 MiB) for an address that
  is not a proven peer, ``peer_store_quota`` bytes for one where a peer proved its
  identity in the transport handshake (:meth:`dht.peers.PeerBook.proven_peer_id`);
* **in total**, ``max_bytes`` of DHT records (2 GiB by default), counted from the database
  at start and kept as an over-estimate (every admitted new key adds its size; expiry
  is not subtracted until the estimate reaches the cap, when it is re-counted exactly).

The node's own puts are never refused (they are ours to keep) but count toward the total
(:meth:`StoreQuota.added_locally`), so the estimate stays an over-estimate.

**When the total is reached**, a new record from a source within its budget is not
refused: room is made (a hundredth of the cap at once) by evicting records in a written
order (:meth:`dht.record_table.RecordTable.evict`): first the copies of blocks the node
holds as its own (it serves them from its store anyway), then the records stored longest
ago; heads records never. Only when nothing is left to evict is the record refused.
Sources are whole ``(host, port)`` addresses; what that leaves open is written in
``docs/operations.md`` (DHT security).

Pure state: the caller passes ``now`` and a way to count the stored bytes.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Hashable

__all__ = ["Refusal", "StoreQuota"]


class Refusal(enum.Enum):
    SOURCE = "source"
    """The source used up its byte budget for the current window."""
    TOTAL = "total"
    """The node holds ``max_bytes`` of records already."""


class StoreQuota:
    """Admits or refuses new records by size, per source and in total."""

    def __init__(self, *, source_quota: int, peer_quota: int, window: float, max_bytes: int,
                 measure: Callable[[], int], max_sources: int = 65536,
                 evict: Callable[[int], int] | None = None) -> None:
        self._source_quota = source_quota
        self._peer_quota = peer_quota
        self._window = window
        self._max_bytes = max_bytes
        self._measure = measure
        self._max_sources = max_sources
        self._sources: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()
        self._total = measure()
        self._evict = evict
        """Frees at least the bytes asked (records evicted) and says how many it freed."""

    @property
    def total_bytes(self) -> int:
        """Bytes of records held (an over-estimate between re-counts)."""
        return self._total

    def used(self, source: Hashable, now: float) -> int:
        """Bytes ``source`` has had admitted in its current window."""
        entry = self._sources.get(source)
        if entry is None or now - entry[0] >= self._window:
            return 0
        return entry[1]

    def admit(self, source: Hashable, size: int, now: float, *, peer: bool = False
              ) -> Refusal | None:
        """Charge ``size`` bytes of a new record to ``source``; None if admitted. A source
        within its budget at a node that holds ``max_bytes`` has room made for it (a
        hundredth of the cap at once) when the node was given a way to evict."""
        start, used = self._sources.get(source, (now, 0))
        if now - start >= self._window:
            start, used = now, 0
        if used + size > (self._peer_quota if peer else self._source_quota):
            return Refusal.SOURCE
        if self._total + size > self._max_bytes:
            self._total = self._measure()  # the estimate only grows: re-count when it bites
            if self._total + size > self._max_bytes and self._evict is not None:
                needed = self._total + size - self._max_bytes
                self._total -= self._evict(max(needed, self._max_bytes // 100))
            if self._total + size > self._max_bytes:
                return Refusal.TOTAL
        self._sources[source] = (start, used + size)
        self._sources.move_to_end(source)
        while len(self._sources) > self._max_sources:
            self._sources.popitem(last=False)
        self._total += size
        return None

    def added_locally(self, size: int) -> None:
        """The node stored ``size`` bytes of its own: counts toward the total only."""
        self._total += size
