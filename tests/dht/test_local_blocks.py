"""A node's own blocks count as DHT replicas: served to FIND_VALUE, audited by maintenance.

The blocks a node delivered or published sit pinned in its ``BlockStore``, not among the
records it holds for the network (``dht_records``). A FIND_VALUE for such a block's key is
answered with it all the same (the reader verifies it against its CID, as any holder's
answer), and the node's maintenance stores the ones that none of their closest nodes holds
back at those nodes. Real UDP on loopback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import time
from pathlib import Path

import pytest

from dag.cid import CID, cid_of, cid_of_raw
from dag.store import SCHEMA_VERSION, BlockStore
from dht import MAX_BLOCK_SIZE, DhtNode, dht_key
from dht.record_table import RecordTable
from dht.wire import MAX_HOLDS_KEYS, encode_request, holds_bitmap, parse_holds
from tests.waiting import eventually

from .conftest import FAST, Network, RawPeer, stock_address

HOUR = 3600.0


def block(tag: str | int = "") -> tuple[CID, bytes]:
    """A small dag-cbor byte string, unique per call, and its CID."""
    payload = f"{tag}:{os.urandom(8).hex()}".encode()
    data = (bytes([0x40 | len(payload)]) + payload if len(payload) < 24
            else b"\x58" + bytes([len(payload)]) + payload)
    return cid_of(data), data


def by_distance(nodes: list[DhtNode], key: bytes) -> list[DhtNode]:
    target = int.from_bytes(key, "big")
    return sorted(nodes, key=lambda n: int.from_bytes(n.node_id, "big") ^ target)


def stores_sent(node: DhtNode) -> int:
    sent = node.stats.sent_by_rpc
    return sent.get("store", 0) + sent.get("store_batch", 0)


# -- the store's index: blocks by DHT key ------------------------------------------------


def test_the_store_finds_blocks_by_their_dht_key(tmp_path: Path) -> None:
    one, two, three = block(1), block(2), block(3)
    with BlockStore(tmp_path / "node.sqlite3") as store:
        assert store.block_for_key(dht_key(one[0])) is None
        store.put(*one)
        store.put_many([two], pinned=False)
        store.put_many([three, one])  # a repeat is harmless
        for cid, data in (one, two, three):
            assert store.block_for_key(dht_key(cid)) == data
        table = RecordTable(store)  # the records live in the same file, apart
        table.put(b"r" * 20, b"a record", now=1.0)
        missing = dht_key(block(4)[0])
        assert table.held([dht_key(one[0]), missing, b"r" * 20]) == {b"r" * 20}
        # pinned only, in key order, paged
        pinned = sorted([dht_key(one[0]), dht_key(three[0])])
        assert store.pinned_keys() == pinned
        assert store.pinned_keys(after=pinned[0]) == pinned[1:]
        assert store.pinned_keys(limit=1) == pinned[:1]
        assert store.delete(one[0])
        assert store.block_for_key(dht_key(one[0])) is None
        assert store.pinned_keys() == [dht_key(three[0])]


def test_a_schema_3_database_gains_the_key_index_with_its_blocks(tmp_path: Path) -> None:
    db = tmp_path / "node.sqlite3"
    blocks = [block(i) for i in range(5)]
    with BlockStore(db) as store:
        store.put_many(blocks)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("DROP TABLE block_keys")
        conn.execute("PRAGMA user_version = 3")
        conn.commit()
    with BlockStore(db) as store:
        assert all(store.block_for_key(dht_key(cid)) == data for cid, data in blocks)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        # another SQLite client can still write blocks (the schema names no custom function)
        conn.execute("INSERT INTO blocks (cid, data, stored_at) VALUES (x'00', x'00', 0)")
        conn.commit()


# -- serving ---------------------------------------------------------------------------


async def test_a_block_held_only_in_one_nodes_store_is_found_by_another(
        network: Network) -> None:
    nodes = await network.grow(4)
    holder, reader = nodes[1], nodes[3]
    cid, data = block("delivered")
    holder._store.put(cid, data)  # pinned, as a delivered event: no DHT record anywhere
    assert all(n.records.get(dht_key(cid)) is None for n in nodes)
    assert await reader.get(cid) == data
    assert holder.stats.local_blocks_served >= 1
    assert holder.records.get(dht_key(cid)) is None  # served, not turned into a record
    # A stock kademlia client finds it too (same key, same FIND_VALUE).
    stock = await network.add_stock(bootstrap=[holder.address])
    assert await stock.get(bytes(cid)) == data


async def test_a_block_too_large_for_one_answer_is_not_served(network: Network) -> None:
    (node,) = await network.grow(1)
    data = os.urandom(MAX_BLOCK_SIZE + 1)
    cid = cid_of_raw(data)
    node._store.put(cid, data)
    assert node.records.local_block(dht_key(cid)) is None
    small_cid, small = block()
    node._store.put(small_cid, small)
    assert node.records.local_block(dht_key(small_cid)) == small


async def test_holds_says_which_keys_a_node_holds_as_records(
        network: Network, raw_peer: RawPeer) -> None:
    """Its own blocks are served, but only records count: nobody keeps the others at
    the key's closest nodes."""
    (node,) = await network.grow(1)
    record_cid, record = block("record")
    own_cid, own = block("own")
    both_cid, both = block("both")
    node.records.offer(dht_key(record_cid), record)
    node._store.put(own_cid, own)
    node._store.put(both_cid, both)
    node.records.offer(dht_key(both_cid), both)
    keys = [dht_key(record_cid), dht_key(own_cid), dht_key(block("absent")[0]),
            dht_key(both_cid)]
    await raw_peer.introduce(node.address)
    answer = await raw_peer.call(node.address, "holds", raw_peer.node_id, keys)
    assert answer == holds_bitmap([True, False, False, True]) == b"\x09"
    assert parse_holds(answer, 4) == [True, False, False, True]
    # malformed requests are dropped, not answered
    dropped = node.stats.datagrams_dropped
    for bad in ([], [b"short"], [os.urandom(20)] * (MAX_HOLDS_KEYS + 1)):
        raw_peer.request(node.address, "holds", raw_peer.node_id, bad)
    await eventually(lambda: node.stats.datagrams_dropped == dropped + 3)


# -- the audit -------------------------------------------------------------------------

R2 = dataclasses.replace(FAST, replicas=2)


async def test_the_audit_stores_a_block_no_closest_node_holds(network: Network) -> None:
    nodes = await network.grow(5, config=R2)
    cid, data = block("lost replicas")
    key = dht_key(cid)
    holder = by_distance(nodes, key)[-1]  # the farthest: a walk may never reach it
    holder._store.put(cid, data)
    now = time.time()
    # Nothing happens before one audit interval has passed since the start ...
    assert (await holder.maintain(now)).audited == 0
    # ... then the block's two closest nodes are asked, hold nothing, and get it.
    report = await holder.maintain(now + HOUR + 1)
    assert (report.audited, report.repaired) == (1, 1)
    closest = [n for n in by_distance(nodes, key) if n is not holder][:2]
    assert [n.records.get(key) for n in closest] == [data, data]
    assert holder.records.get(key) is None  # still only its own block here
    assert (holder.stats.audited, holder.stats.audit_repaired) == (1, 1)
    # The round is over: the next one is an interval later.
    assert (await holder.maintain(now + HOUR + 2)).audited == 0
    sent = stores_sent(holder)
    report = await holder.maintain(now + 2 * HOUR + 2)
    assert (report.audited, report.repaired) == (1, 0)  # held now: nothing stored
    assert stores_sent(holder) == sent


async def test_the_audit_asks_only_the_closest_node_when_it_holds_the_block(
        network: Network) -> None:
    nodes = await network.grow(5, config=R2)
    cid, data = block("healthy")
    key = dht_key(cid)
    ordered = by_distance(nodes, key)
    holder, closest = ordered[-1], ordered[0]
    holder._store.put(cid, data)
    closest.records.offer(key, data)
    asked, sent = holder.stats.sent_by_rpc.get("holds", 0), stores_sent(holder)
    report = await holder.maintain(time.time() + HOUR + 1)
    assert (report.audited, report.repaired) == (1, 0)
    assert stores_sent(holder) == sent
    one_request = len(encode_request(b"\0" * 20, "holds", (holder.node_id, [key])))
    assert holder.stats.sent_by_rpc["holds"] - asked == one_request  # 75 bytes, no more
    assert ordered[1].records.get(key) is None  # left to the holder's own republish


async def test_copies_kept_only_as_own_blocks_do_not_count(network: Network) -> None:
    """Two subscribers closest to the key serve the block, but nobody would keep it at the
    key's closest nodes once they leave: the audit turns it into records there."""
    nodes = await network.grow(5, config=R2)
    cid, data = block("delivered by the closest")
    key = dht_key(cid)
    ordered = by_distance(nodes, key)
    for node in [ordered[0], ordered[1], ordered[-1]]:
        node._store.put(cid, data)
    report = await ordered[-1].maintain(time.time() + HOUR + 1)
    assert (report.audited, report.repaired) == (1, 1)
    assert [n.records.get(key) for n in ordered[:2]] == [data, data]


async def test_the_audit_of_hundreds_of_blocks_stores_only_the_missing(
        network: Network) -> None:
    nodes = await network.grow(5, config=R2)
    auditor = nodes[0]
    blocks = [block(i) for i in range(2 * MAX_HOLDS_KEYS + 50)]
    present = blocks[::2]
    for cid, data in blocks:
        auditor._store.put(cid, data)
    for cid, data in present:  # held as records at their closest node (not the auditor)
        closest = next(n for n in by_distance(nodes, dht_key(cid)) if n is not auditor)
        closest.records.offer(dht_key(cid), data)
    report = await auditor.maintain(time.time() + HOUR + 1)
    assert (report.audited, report.repaired) == (len(blocks), len(blocks) - len(present))
    for cid, data in blocks:
        targets = [n for n in by_distance(nodes, dht_key(cid)) if n is not auditor][:2]
        assert targets[0].records.get(dht_key(cid)) == data


async def test_the_audit_leaves_a_block_held_as_a_record_to_the_republish(
        network: Network) -> None:
    nodes = await network.grow(3, config=R2)
    cid, data = block("both")
    nodes[0]._store.put(cid, data)
    nodes[0].records.offer(dht_key(cid), data)
    report = await nodes[0].maintain(time.time() + HOUR + 1)
    assert report.audited == 0 and report.republished == 1


async def test_the_audit_spreads_a_round_over_passes(network: Network) -> None:
    config = dataclasses.replace(R2, audit_batch=3)
    nodes = await network.grow(3, config=config)
    for i in range(7):
        nodes[0]._store.put(*block(i))
    later = time.time() + HOUR + 1
    assert [(await nodes[0].maintain(later + i)).audited for i in range(4)] == [3, 3, 1, 0]


async def test_the_audit_can_be_turned_off(network: Network) -> None:
    nodes = await network.grow(2, config=dataclasses.replace(R2, audit_interval=0))
    nodes[0]._store.put(*block())
    assert (await nodes[0].maintain(time.time() + 10 * HOUR)).audited == 0


async def test_a_stock_node_that_ignores_holds_is_stored_to_and_not_held_against(
        network: Network) -> None:
    first = await network.add(config=R2)
    stock = await network.add_stock(bootstrap=[first.address])
    await eventually(lambda: len(first.closest_known_peers(first.node_id)) == 1)
    cid, data = block("to a stock node")
    first._store.put(cid, data)
    report = await first.maintain(time.time() + HOUR + 1)  # HOLDS times out: not held
    assert (report.audited, report.repaired) == (1, 1)
    assert stock.storage.get(dht_key(cid)) == data
    address = stock_address(stock)
    assert first._protocol.miss_count(address) == 0  # its silence proved nothing
    assert first.routing_size() == (1, 0)
    asked = first.stats.sent_by_rpc["holds"]
    await first.maintain(time.time() + 2 * HOUR + 2)
    assert first.stats.sent_by_rpc["holds"] == asked  # not asked again for a while


@pytest.mark.parametrize("count", [1, 7, 8, 9, MAX_HOLDS_KEYS])
def test_holds_bitmaps_round_trip(count: int) -> None:
    flags = [bool(i % 3) for i in range(count)]
    bitmap = holds_bitmap(flags)
    assert len(bitmap) == (count + 7) // 8
    assert parse_holds(bitmap, count) == flags
