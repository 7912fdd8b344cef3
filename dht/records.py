"""Mutable heads records in the DHT (``dag.records.HeadsRecord``).

Everything else this DHT stores is content-addressed: a value is accepted only if it
hashes to its key. A heads record cannot be: it changes. It is accepted instead if it is a
valid record (canonical, within its limits, signed by its publisher) stored under the key
derived from its topic and publisher, and only if it is newer (higher ``seq``) than the
record already held there, so a replayed or forged copy never displaces a fresher genuine
one. Reads ask the holders near the key and keep the newest valid record any of them has.
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from typing import TYPE_CHECKING

from dag import CID, PeerId
from dag.records import HeadsRecord, heads_record_key

from .keys import parse_record
from .lookup import ValueLookup
from .stats import DhtStats

if TYPE_CHECKING:  # protocol -> storage -> records: only the type is needed here
    from .protocol import PulsarProtocol

__all__ = ["find_record"]

log = logging.getLogger(__name__)


async def find_record(
    protocol: PulsarProtocol,
    topic: CID,
    publisher: PeerId,
    *,
    ksize: int,
    alpha: int,
    stats: DhtStats,
) -> HeadsRecord | None:
    """Ask the ``ksize`` live nodes closest to the record's key (``alpha`` at a time,
    learning closer nodes from their answers of ``ksize`` contacts, as a Kademlia lookup
    does; callers pass the replication factor: a record is put at that many) and return the
    newest valid record any of them holds, or None. Unlike a block, a record can be
    stale at one holder and fresh at another, so the lookup does not stop at the first
    value. Invalid values are counted and their sender is not asked again."""
    key = heads_record_key(topic, publisher)
    walk = ValueLookup(protocol, key, ksize=ksize, alpha=alpha, count=ksize)
    best: HeadsRecord | None = None
    async with aclosing(walk.values()) as answers:
        async for node, value in answers:
            record = parse_record(key, value)
            if record is None:
                stats.bad_values_fetched += 1
                walk.distrust(node)
                log.warning("peer %s returned an invalid heads record; ignored", node)
            elif best is None or record.seq > best.seq:
                best = record
    return best
