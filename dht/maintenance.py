"""Keeping records where they belong: republish, expiry, bucket refresh, handoff.

The package republishes through ``Server.set_digest``, which writes the record back into its
own storage and so resets the record's age: a node that is no longer among the k closest for
a key keeps it (and keeps pushing it) forever, while its ``ForgetfulStorage`` loses
everything a week after first store or at the first restart. The rules here:

* ``stored_at`` is when anyone (us included) last stored the record here; ``republished_at``
  when we last pushed it out or someone else pushed it to us (a fresh STORE means the other
  closest nodes just got it too: the Kademlia paper's optimisation, so only one holder
  republishes per interval).
* Every ``republish_interval`` a record is stored again at the r closest nodes (r is
  ``replicas``) found by a lookup. If we are among those r (or nobody else acknowledged),
  we are a rightful holder and restamp the record, so it never expires while we hold it.
  Otherwise we only note the republish; nobody will store it here again, and
  ``record_ttl`` later it expires. Records thus migrate to the nodes closest to them and
  persist there, after any publisher is gone.
* Expiry runs only once every due republish is done, so a node that was down for longer
  than the TTL first hands its records over (or finds it still holds them rightfully)
  instead of dropping them on start.
* A newly met node gets the records it is closer to than the r-th closest node we knew, from
  the one holder that was closest (section 2.5), in a background task over pages of storage.
* The node's own blocks (pinned: the events it delivered or published) are not records, but
  it serves them to FIND_VALUE all the same (``RecordStorage.local_block``), and every
  ``audit_interval`` it checks that one of the r closest nodes of each holds it as a
  record: those nobody there holds are stored there again (:meth:`Maintainer.audit`). So a
  block whose replicas all went with their holders — written behind a write quorum that
  landed on nodes that then left for good — comes back into the DHT from any node that
  kept it, and is then kept at its closest nodes by their republish, like any record.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kademlia.node import Node

from .config import DhtConfig
from .lookup import crawl
from .protocol import PulsarProtocol
from .replication import Replicator
from .stats import DhtStats
from .storage import RecordStorage
from .wire import MAX_HOLDS_KEYS

__all__ = ["Maintainer", "MaintenanceReport"]

log = logging.getLogger(__name__)

_HANDOFF_PAGE = 256
_MAX_ID = (1 << 160) - 1


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    refreshed_buckets: int
    republished: int
    kept: int
    """Of the republished records, those we hold rightfully and restamped."""
    expired: int
    backlog: bool
    """True when more records were due than one pass handles (expiry was skipped)."""
    audited: int = 0
    """Own blocks whose closest nodes were asked whether they hold them (``audit``)."""
    repaired: int = 0
    """Of those, the blocks none of them held, stored at them again."""


class Maintainer:
    """Runs one node's periodic upkeep; :meth:`tick` is one pass at a given wall-clock time."""

    def __init__(self, protocol: PulsarProtocol, storage: RecordStorage,
                 replicator: Replicator, config: DhtConfig, stats: DhtStats,
                 clock: Callable[[], float] = time.time) -> None:
        self._protocol = protocol
        self._storage = storage
        self._replicator = replicator
        self._config = config
        self._stats = stats
        self._clock = clock
        self._new_contacts: list[Node] = []
        self._handoff_running = False
        self._joining = 0  # bootstraps (and reconnect rounds) under way
        # The audit of own blocks: where the round under way has got to (None: no round
        # under way), and when the next round starts (one interval after the start, so a
        # restart costs nothing: the blocks were audited before it, or will be).
        self._audit_cursor: bytes | None = None
        self._audit_next = clock() + config.audit_interval
        protocol.on_new_contact = self.contact_added

    def start(self) -> None:
        """Start the periodic passes (the first one runs at once)."""
        self._protocol.spawn(self._run())

    async def _run(self) -> None:
        while True:
            try:
                report = await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("DHT maintenance pass failed")
            else:
                if report.backlog:
                    continue  # more is due: go on at once (each pass yields to the loop)
            await asyncio.sleep(self._config.maintenance_interval)

    async def tick(self, now: float | None = None) -> MaintenanceReport:
        now = self._clock() if now is None else now
        refreshed = await self.refresh_buckets()
        republished, kept, backlog = await self.republish(now)
        audited, repaired = await self.audit(now)
        expired = 0 if backlog else self._storage.expire(now - self._config.record_ttl)
        self._stats.expired += expired
        return MaintenanceReport(refreshed, republished, kept, expired, backlog, audited,
                                 repaired)

    async def republish(self, now: float) -> tuple[int, int, bool]:
        """Republish due records; returns (republished, kept, more are due)."""
        batch = self._config.republish_batch
        due = self._storage.due_for_republish(now - self._config.republish_interval,
                                              limit=batch + 1)
        backlog = len(due) > batch
        due = due[:batch]
        if not due:
            return 0, 0, False
        results = await self._replicator.replicate_many(due)
        settled: list[bytes] = []
        kept = 0
        for (key, value), result in zip(due, results, strict=True):
            if result.we_are_close or result.acks == 0:
                self._storage.touch(key, value, now)  # a rightful (or the only) holder keeps it
                kept += 1
            else:
                settled.append(key)
        self._storage.mark_republished(settled, now)
        self._stats.republished += len(due)
        log.info("republished %d DHT records (%d kept as a closest holder)", len(due), kept)
        return len(due), kept, backlog

    async def audit(self, now: float) -> tuple[int, int]:
        """One pass of the audit of the node's own blocks; returns ``(audited, repaired)``.

        A node answers FIND_VALUE with the blocks it delivered or published, but a reader's
        walk reaches only the nodes nearest a key, and a block's replicas may all be gone:
        a publish returns at its write quorum and writes the other replicas behind, so
        when those stores miss (the nodes were cut off) and the quorum's holders leave for
        good, the DHT has no copy left while subscribers still hold the event.

        Every ``audit_interval`` a round goes through the pinned blocks in key order,
        ``audit_batch`` of them per pass (keys in order share their neighbourhood, so one
        placement walk serves many). The closest node of each key is asked with one HOLDS
        per node (22 bytes per key, a bitmap back) whether it holds the block as a record;
        for the keys it lacks, the others of the ``replicas`` closest are asked; a block
        none of them holds is stored at all of them (spares standing in for those that do
        not acknowledge). A block one of them holds is left to that holder's hourly
        republish (which restores the others), and a block this node also holds as a
        record to its own. Copies other nodes keep only as their own blocks do not count:
        nobody maintains those at the key's closest nodes. A node that does not answer
        HOLDS (a stock node ignores it) counts as not holding."""
        config = self._config
        if config.audit_interval <= 0:
            return 0, 0
        if self._audit_cursor is None:
            if now < self._audit_next:
                return 0, 0
            self._audit_cursor = b""
            self._audit_next = now + config.audit_interval
        keys = self._storage.own_keys(self._audit_cursor, config.audit_batch)
        self._audit_cursor = keys[-1] if len(keys) == config.audit_batch else None
        items: list[tuple[bytes, bytes, list[Node], list[Node]]] = []
        for key in keys:
            if key in self._storage:
                continue  # held as a record too: republished as one
            block = self._storage.local_block(key)
            if block is None:
                continue  # deleted since, or too large for one RPC (a chunk tree's root)
            targets, spares = await self._replicator.placement(key)  # one at a time: the
            if targets:  # first walk of a neighbourhood serves the next keys from cache
                items.append((key, block, targets, spares))
        if not items:
            return 0, 0
        held = await self._held((key, targets[:1]) for key, _, targets, _ in items)
        held |= await self._held((key, targets[1:]) for key, _, targets, _ in items
                                 if key not in held)
        stores = [self._replicator.batcher.store_all(targets, key, block, spares)
                  for key, block, targets, spares in items if key not in held]
        repaired = sum(1 for acks in await asyncio.gather(*stores) if acks)
        self._stats.audited += len(items)
        self._stats.audit_repaired += repaired
        if stores:
            log.info("audited %d own blocks: %d had no copy at their closest nodes, %d of "
                     "them stored there again", len(items), len(stores), repaired)
        return len(items), repaired

    async def _held(self, asks: Iterable[tuple[bytes, list[Node]]]) -> set[bytes]:
        """Which of the keys one of their nodes says it holds: one HOLDS per node and
        ``MAX_HOLDS_KEYS`` keys, all at once."""
        per_node: dict[bytes, tuple[Node, list[bytes]]] = {}
        for key, nodes in asks:
            for node in nodes:
                per_node.setdefault(node.id, (node, []))[1].append(key)
        chunks = [(node, keys[i:i + MAX_HOLDS_KEYS]) for node, keys in per_node.values()
                  for i in range(0, len(keys), MAX_HOLDS_KEYS)]
        answers = await asyncio.gather(*(self._protocol.call_holds(node, chunk)
                                         for node, chunk in chunks))
        held: set[bytes] = set()
        for (_, chunk), flags in zip(chunks, answers, strict=True):
            if flags is not None:
                held.update(key for key, flag in zip(chunk, flags, strict=True) if flag)
        return held

    async def refresh_buckets(self) -> int:
        """Look up a random id in every bucket not touched for ``bucket_refresh_interval``."""
        cutoff = time.monotonic() - self._config.bucket_refresh_interval
        stale = [b for b in self._protocol.router.buckets if b.last_updated < cutoff]
        lookups = []
        for bucket in stale:
            low, high = bucket.range
            target = Node(random.randint(low, min(high, _MAX_ID)).to_bytes(20, "big"))
            seeds = self._protocol.closest_nodes(target.id, self._config.alpha)
            if seeds:
                lookups.append(crawl(self._protocol, target.id, ksize=self._config.ksize,
                                     alpha=self._config.alpha, seeds=seeds))
            bucket.touch_last_updated()
        await asyncio.gather(*lookups)
        return len(stale)

    # -- handoff to new contacts ---------------------------------------------------------

    def joining(self) -> None:
        """Our own bootstrap starts: the contacts it meets are the network we join, not
        nodes new to it, so they get no hand-off. A restarted node met every contact anew
        and pushed them each record they were closer to than itself, which they already
        held: under churn that was every STORE_BATCH byte (12 MiB in the 100-node churn
        scenario, all from restarted nodes). Calls nest: each is ended by one
        :meth:`joined`."""
        self._joining += 1

    def joined(self) -> None:
        """Our bootstrap ended: from now on a contact we meet is new to the network. The
        records we put while nobody else was reachable (a lone node's puts), which the
        network we joined cannot have, are pushed to their closest nodes in the
        background."""
        self._joining = max(0, self._joining - 1)
        if self._joining:
            return
        if self._replicator.unplaced and any(True for _ in self._protocol.router.contacts()):
            self._protocol.spawn(self._place_unplaced())

    async def _place_unplaced(self) -> None:
        keys = list(self._replicator.unplaced)
        items = [(key, value) for key in keys if (value := self._storage.get(key)) is not None]
        results = await self._replicator.replicate_many(items)
        self._stats.handed_off += sum(1 for r in results if r.acks > 0)

    def contact_added(self, node: Node) -> None:
        if self._joining:
            return
        self._new_contacts.append(node)
        if not self._handoff_running:
            self._handoff_running = True
            self._protocol.spawn(self._handoff_loop())

    async def _handoff_loop(self) -> None:
        try:
            while self._new_contacts:
                await asyncio.sleep(0)  # let a burst of arrivals (a bootstrap) gather
                nodes, self._new_contacts = self._new_contacts, []
                await self._hand_off(nodes)
        finally:
            self._handoff_running = False

    async def _hand_off(self, newcomers: list[Node]) -> None:
        protocol, k = self._protocol, self._config.replication
        new_ids = {n.id for n in newcomers}
        me = protocol.source_node.long_id
        # The other known nodes as integers, once per hand-off: per record, only XOR
        # distances are compared (building contact objects per record per contact made
        # hand-off the busiest loop of a 100-node network).
        old = [n.long_id for n in protocol.router.contacts()
               if n.id not in new_ids and n.id != protocol.source_node.id]
        pending: list[asyncio.Future[bool]] = []
        for scanned, (key, value) in enumerate(self._storage, 1):
            if scanned % _HANDOFF_PAGE == 0:
                await asyncio.sleep(0)  # a large store must not stall the event loop
            target = int.from_bytes(key, "big")
            nearest = heapq.nsmallest(k, [o ^ target for o in old])
            if nearest and me ^ target >= nearest[0]:
                continue  # another known node is closer: it hands this record off
            for node in newcomers:
                if len(nearest) < k or node.long_id ^ target < nearest[-1]:
                    pending.append(self._replicator.batcher.store(node, key, value))
            if len(pending) >= _HANDOFF_PAGE:
                self._stats.handed_off += sum(await asyncio.gather(*pending))
                pending = []
        if pending:
            self._stats.handed_off += sum(await asyncio.gather(*pending))
