"""Mutable heads records in the DHT (``dag.records.HeadsRecord``).

Everything else this DHT stores is content-addressed: a value is accepted only if it
hashes to its key. A heads record cannot be: it changes. It is accepted instead if it is a
valid record (canonical, within its limits, signed by its publisher) stored under the key
derived from its topic and publisher, and only if it is newer (higher ``seq``) than the
record already held there, so a replayed or forged copy never displaces a fresher genuine
one. Reads ask the holders near the key and keep the newest valid record any of them has.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kademlia.node import Node

from dag import CID, InvalidDescriptor, PeerId
from dag.records import MAX_RECORD_SIZE, HeadsRecord, heads_record_key

from .stats import DhtStats

if TYPE_CHECKING:  # protocol -> storage -> records: only the type is needed here
    from .protocol import PulsarProtocol

__all__ = ["find_record", "parse_record", "record_replaces"]

log = logging.getLogger(__name__)


def parse_record(key: bytes, value: object) -> HeadsRecord | None:
    """The record ``value`` holds if it is a valid heads record belonging under ``key``."""
    if type(value) is not bytes or len(value) > MAX_RECORD_SIZE:
        return None
    try:
        record = HeadsRecord.from_block(value)
    except InvalidDescriptor:
        return None
    return record if record.key == key else None


def record_replaces(key: bytes, value: object, held: bytes | None) -> bool:
    """Whether ``value`` may be stored under ``key`` in place of ``held``: a valid record
    for that key, newer than the one held (if any)."""
    record = parse_record(key, value)
    if record is None:
        return False
    if held is None:
        return True
    current = parse_record(key, held)
    return current is None or record.seq > current.seq


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
    learning closer nodes from their answers, as a Kademlia lookup does) and return the
    newest valid record any of them holds, or None. Unlike a block, a record can be
    stale at one holder and fresh at another, so the lookup does not stop at the first
    value. Invalid values are counted and their sender is not asked again."""
    key = heads_record_key(topic, publisher)
    me = protocol.source_node.id
    target = int.from_bytes(key, "big")
    known: dict[bytes, Node] = {n.id: n for n in protocol.closest_nodes(key, ksize)}
    asked: set[bytes] = set()
    dead: set[bytes] = set()
    best: HeadsRecord | None = None
    in_flight: dict[asyncio.Future[Any], Node] = {}
    keynode = Node(key)

    def candidates() -> list[Node]:
        live = sorted((n for i, n in known.items() if i not in dead),
                      key=lambda n: n.long_id ^ target)[:ksize]
        return [n for n in live if n.id not in asked]

    try:
        while True:
            for node in candidates()[: max(0, alpha - len(in_flight))]:
                asked.add(node.id)
                in_flight[asyncio.ensure_future(protocol.call_find_value(node, keynode))] = node
            if not in_flight:
                return best
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                node = in_flight.pop(future)
                ok, data = future.result()
                if not ok:
                    dead.add(node.id)
                    continue
                if isinstance(data, dict):
                    record = parse_record(key, data.get("value"))
                    if record is None:
                        stats.bad_values_fetched += 1
                        dead.add(node.id)
                        log.warning("peer %s returned an invalid heads record; ignored", node)
                    elif best is None or record.seq > best.seq:
                        best = record
                    continue
                for node_id, host, port in data:
                    if node_id != me and node_id not in known:
                        known[node_id] = Node(node_id, host, port)
    finally:
        for future in in_flight:
            future.cancel()
