"""The ``kademlia`` ``IStorage`` on the node's SQLite store: durable, verified, bounded.

The package's ``ForgetfulStorage`` keeps records in a dict, stamps them with
``time.monotonic()`` (meaningless after a restart) and drops them a week after they were
*first* stored. Here records live in the ``dht_records`` table of the node's database file
(:class:`dag.store.BlockStore`; the SQL is :class:`dht.record_table.RecordTable`'s) with
wall-clock ``stored_at`` / ``republished_at`` stamps, so a restarted node still holds and
serves what it held, and ``dht.maintenance`` can republish and expire them properly.

Every write is verified first (:func:`dht.keys.record_matches`): a value is accepted only if it
hashes to its key, whether it came from a STORE request, a local put, or the package's own
code calling ``storage[key] = value``.

**The node's own blocks are replicas too.** What the node delivered, published or fetched
for itself sits in the store's ``blocks`` table (pinned), not among the records it holds for
the network; a FIND_VALUE that finds no record is nevertheless answered from there
(:meth:`RecordStorage.local_block`), through the store's key index
(``BlockStore.block_for_key``: the key is ``sha1(bytes(cid))``, which cannot be inverted).
The reader checks the value against its CID as it checks any holder's answer, so nothing new
is trusted. These blocks are not records: they are not counted in ``len``, not iterated,
republished, handed off nor expired as records are (``dht.maintenance`` audits them instead,
see ``Maintainer.audit``).

**Group commit.** One SQLite commit costs about as much as writing 10-30 rows inside one,
and a pipelined put makes every node receive thousands of values per second. Values from the
network therefore go through :meth:`RecordStorage.submit`: they are verified at once, queued,
and written together at the end of the event-loop turn or after ``commit_delay`` (or as soon
as ``commit_batch`` are queued); the
STORE is acknowledged only after that commit, so an acknowledgement still means "on disk".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator

from kademlia.storage import IStorage

from dag.store import BlockStore

from .keys import MAX_BLOCK_SIZE, record_matches, record_replaces
from .record_table import RecordTable
from .stats import DhtStats

__all__ = ["RecordStorage"]

log = logging.getLogger(__name__)


class RecordStorage(IStorage):  # type: ignore[misc]  # kademlia is untyped
    """DHT records of one node, keyed by the 20-byte Kademlia key.

    ``max_records`` bounds how many distinct keys the network can make us hold. Counting
    exactly would cost a query per STORE, so an over-estimate is kept (every accepted value
    counts as new) and re-counted from the database only when it reaches the bound.
    """

    def __init__(self, store: BlockStore, *, max_records: int, stats: DhtStats,
                 commit_delay: float = 0.0, commit_batch: int = 256,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store  # the node's own blocks (local_block, own_keys)
        self._table = RecordTable(store)  # the records held for the network
        self._max_records = max_records
        self._stats = stats
        self._commit_delay = commit_delay
        self._commit_batch = commit_batch
        self._clock = clock
        self._approx_count = self._table.count()
        self._queued: list[tuple[bytes, bytes]] = []
        self._waiters: list[tuple[asyncio.Future[list[bool]], list[bool]]] = []
        self._commit_timer: asyncio.TimerHandle | None = None
        self.on_written: Callable[[list[tuple[bytes, bytes]]], None] | None = None
        """Told every batch of records written (after its commit): the node above notes
        those a policy of its own will drop later (a topic's checkpoints). It must not
        raise; an exception is logged and the records stay written."""

    # -- writes (all verified) -----------------------------------------------------------

    def accepts(self, key: bytes, value: object) -> bool:
        """Whether ``value`` may be stored under ``key``: it hashes to the key, and there is
        room. Counts refusals in the stats."""
        if not record_matches(key, value) and not self._newer_record(key, value):
            self._stats.stores_refused += 1
            return False
        if not self._has_room(key):
            self._stats.stores_over_quota += 1
            return False
        self._approx_count += 1
        return True

    def _newer_record(self, key: bytes, value: object) -> bool:
        """A heads record (:mod:`dht.records`) newer than the one held under ``key``
        (one queued for the next commit counts as held)."""
        held = next((v for k, v in reversed(self._queued) if k == key), None)
        return record_replaces(key, value, held if held is not None else self.get(key))

    def offer_many(self, items: Iterable[tuple[bytes, object]]) -> list[bool]:
        """Verify and write ``items`` now, in one commit; flags say which were accepted."""
        flags: list[bool] = []
        rows: list[tuple[bytes, bytes]] = []
        for key, value in items:
            ok = self.accepts(key, value)
            flags.append(ok)
            if ok:
                rows.append((key, value))  # type: ignore[arg-type]  # accepts() checked it
        self._write(rows, self._clock())
        return flags

    def offer(self, key: bytes, value: object) -> bool:
        return self.offer_many([(key, value)])[0]

    def submit(self, items: Iterable[tuple[bytes, object]]) -> asyncio.Future[list[bool]]:
        """Verify ``items`` now and write them with the next group commit; the future gives
        the flags once they are committed (all False if the commit failed)."""
        loop = asyncio.get_running_loop()
        flags: list[bool] = []
        for key, value in items:
            ok = self.accepts(key, value)
            flags.append(ok)
            if ok:
                self._queued.append((key, value))  # type: ignore[arg-type]  # accepts() checked it
        future: asyncio.Future[list[bool]] = loop.create_future()
        if not any(flags):
            future.set_result(flags)
            return future
        self._waiters.append((future, flags))
        if len(self._queued) >= self._commit_batch:
            if self._commit_timer is not None:
                self._commit_timer.cancel()
            self._commit_timer = None
            self.commit()
        elif self._commit_timer is None:
            # delay 0: at the end of this event-loop turn, with whatever else arrived in it
            self._commit_timer = loop.call_later(self._commit_delay, self.commit)
        return future

    def commit(self) -> None:
        """Write everything queued by :meth:`submit` in one transaction and answer waiters."""
        self._commit_timer = None
        rows, self._queued = self._queued, []
        waiters, self._waiters = self._waiters, []
        try:
            self._write(rows, self._clock())
        except Exception:
            log.exception("could not commit %d DHT records; refusing them", len(rows))
            for future, flags in waiters:
                if not future.done():
                    future.set_result([False] * len(flags))
            return
        for future, flags in waiters:
            if not future.done():
                future.set_result(flags)

    def close(self) -> None:
        """Commit what is queued; call before closing the store."""
        if self._commit_timer is not None:
            self._commit_timer.cancel()
        if self._queued or self._waiters:
            self.commit()

    def _write(self, rows: list[tuple[bytes, bytes]], now: float) -> None:
        if not rows:
            return
        self._table.put_many(rows, now)  # one transaction
        if self.on_written is not None:
            try:
                self.on_written(rows)
            except Exception:
                log.exception("the on_written hook failed on %d records", len(rows))

    def touch(self, key: bytes, value: bytes, now: float) -> None:
        """Restamp a record we keep holding (``stored_at`` and ``republished_at`` = now)."""
        self._write([(key, value)], now)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        # The package calls this from Server.set_digest; the contract has no return value,
        # so a refusal has to be an exception.
        if not self.offer(key, value):
            raise ValueError(f"refused to store a value that does not hash to key {key.hex()}")

    def _has_room(self, key: bytes) -> bool:
        if self._approx_count < self._max_records:
            return True
        self._approx_count = self._table.count() + len(self._queued)
        if self._approx_count < self._max_records:
            return True
        if self._table.get(key) is not None:
            return True  # refreshing a held key is always fine
        # Full: make room for a hundredth of the bound at once (the eviction query sorts).
        self.make_room(rows=max(1, self._max_records // 100))
        return self._approx_count < self._max_records

    def make_room(self, *, rows: int = 0, size: int = 0) -> int:
        """Evict records to free at least ``rows`` records and ``size`` bytes, in
        :meth:`dht.record_table.RecordTable.evict`'s order (what the node also holds as its
        own first, then the oldest stored; never heads records); returns the bytes freed.
        Counted in the stats (``records_evicted``, ``bytes_evicted``)."""
        evicted, freed = self._table.evict(rows, size)
        self._approx_count = max(0, self._approx_count - evicted)
        self._stats.records_evicted += evicted
        self._stats.bytes_evicted += freed
        if evicted:
            log.warning("DHT storage full: evicted %d record(s), %d bytes, to make room",
                        evicted, freed)
        return freed

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        value = self._table.get(key)
        return default if value is None else value

    def local_block(self, key: bytes) -> bytes | None:
        """The node's own block under ``key`` (what it delivered, published or fetched
        for itself; not a record), if it fits one STORE or FIND_VALUE answer
        (``MAX_BLOCK_SIZE``): what a FIND_VALUE that finds no record is answered with."""
        block = self._store.block_for_key(key)
        if block is None or len(block) > MAX_BLOCK_SIZE:
            return None
        return block

    def holds_many(self, keys: Iterable[bytes]) -> set[bytes]:
        """Those of ``keys`` held as records (queued for the next group commit counts):
        what this node keeps for the network and republishes. Its own blocks are served
        but not counted here: a copy only the nodes that delivered it keep is not
        maintained at the key's closest nodes (see ``Maintainer.audit``)."""
        keys = list(keys)
        held = self._table.held(keys)
        if self._queued:
            queued = {k for k, _ in self._queued}
            held.update(k for k in keys if k in queued)
        return held

    def own_keys(self, after: bytes, limit: int) -> list[bytes]:
        """Keys of the node's own pinned blocks after ``after``, in key order (a cursor
        for ``Maintainer.audit``)."""
        return self._store.pinned_keys(after, limit)

    def __getitem__(self, key: bytes) -> bytes:
        value = self._table.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self._table.get(key) is not None

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)``, paged through the database (bounded memory)."""
        for key, value, _ in self._table.iter_records():
            yield key, value

    def __len__(self) -> int:
        return self._table.count()

    def stored_bytes(self) -> int:
        """Total size of the values held (what ``dht.quota`` caps)."""
        return self._table.total_bytes()

    def __bool__(self) -> bool:
        return True  # an empty storage is still a storage (Server.__init__ tests truthiness)

    def iter_older_than(self, seconds_old: float) -> list[tuple[bytes, bytes]]:
        """Records last *republished* more than ``seconds_old`` ago (the package's republish
        hook; ``dht.maintenance`` uses :meth:`due_for_republish` instead)."""
        return self.due_for_republish(self._clock() - seconds_old)

    # -- maintenance ---------------------------------------------------------------------

    def due_for_republish(self, cutoff: float, limit: int | None = None
                          ) -> list[tuple[bytes, bytes]]:
        """Records not republished (nor stored here by anyone) since ``cutoff``, oldest
        first."""
        due = self._table.items_older_than(cutoff)
        return due if limit is None else due[:limit]

    def mark_republished(self, keys: Iterable[bytes], now: float) -> None:
        self._table.mark_republished(keys, now)

    def forget(self, keys: Iterable[bytes]) -> int:
        """Drop the records of ``keys``: blocks a policy this node applies says nobody
        keeps any more (a topic's retention, cut at a subscriber that is also a holder).
        Returns the bytes freed; counted as ``records_cut`` and ``bytes_cut``."""
        dropped, freed = self._table.forget(keys)
        if dropped:
            self._approx_count = max(0, self._approx_count - dropped)
            self._stats.records_cut += dropped
            self._stats.bytes_cut += freed
        return freed

    def expire(self, cutoff: float) -> int:
        """Drop records nobody stored here since ``cutoff``; returns how many."""
        dropped = self._table.expire(cutoff)
        if dropped:
            self._approx_count = self._table.count()
            log.info("expired %d DHT records", dropped)
        return dropped
