"""Real UDP on loopback: many nodes, restarts, interoperability with stock ``kademlia``."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from pathlib import Path

import pytest
from kademlia.node import Node

from dag.cid import CID, RAW, cid_of, cid_of_raw
from dag.identity import Identity
from dht import (
    MAX_BLOCK_SIZE,
    BlockNotFound,
    BlockTooLarge,
    DhtConfig,
    DhtNode,
    NotStarted,
    UnsupportedCID,
    dht_key,
)
from tests.waiting import eventually

from .conftest import FAST, Network, stock_address

pytestmark = pytest.mark.slow


def block(tag: str | int = "") -> bytes:
    """A small dag-cbor byte string, unique per call."""
    payload = f"{tag}:{os.urandom(8).hex()}".encode()
    return bytes([0x40 | len(payload)]) + payload if len(payload) < 24 else (
        b"\x58" + bytes([len(payload)]) + payload)


async def test_any_of_30_nodes_gets_what_any_other_put(network: Network) -> None:
    nodes = await network.grow(30)
    puts = [(await node.put(block(i)), i) for i, node in enumerate(nodes)]
    cids = [cid for cid, _ in puts]
    for getter in nodes:
        got = await asyncio.gather(*(getter.get(cid) for cid in cids))
        assert [cid_of(b) for b in got] == cids


async def test_put_many_reports_replication(network: Network) -> None:
    nodes = await network.grow(6)
    results = await nodes[2].put_many([block(i) for i in range(40)])
    assert len(results) == 40
    assert all(r.targets == 5 and r.acks == 5 for r in results)
    for r in results[:5]:
        assert await nodes[4].get(r.cid) is not None


async def test_blocks_go_to_the_replicas_closest_nodes_not_to_all_k(network: Network) -> None:
    config = dataclasses.replace(FAST, replicas=3)
    nodes = await network.grow(12, config=config)
    writer = nodes[0]
    results = await writer.put_many([block(i) for i in range(10)])
    for r in results:
        assert (r.targets, r.acks) == (3, 3)
        key = dht_key(r.cid)
        target = int.from_bytes(key, "big")
        others = sorted(nodes[1:], key=lambda n: int.from_bytes(n.node_id, "big") ^ target)
        holders = {n.node_id for n in nodes[1:] if n.records.get(key) is not None}
        assert holders == {n.node_id for n in others[:3]}
    # Every byte sent is counted once, under the RPC that sent it.
    for node in nodes:
        assert sum(node.stats.sent_by_rpc.values()) == node.stats.bytes_sent
    sent = writer.stats.sent_by_rpc
    assert any(rpc.startswith("store") for rpc in sent), sent
    answered = set().union(*(n.stats.sent_by_rpc for n in nodes[1:]))
    assert any(rpc.endswith("+answer") for rpc in answered), answered


async def test_a_lone_node_stores_locally_and_reports_no_acks(network: Network) -> None:
    (node,) = await network.grow(1)
    data = block("alone")
    (result,) = await node.put_many([data])
    assert (result.acks, result.targets) == (0, 0)
    assert await node.get(result.cid) == data


async def test_large_payloads_go_through_a_chunk_tree(network: Network) -> None:
    a, b, c = await network.grow(3)
    payload = os.urandom(100_000)
    root = await a.put_large(payload)
    assert await c.get_large(root) == payload
    with pytest.raises(BlockTooLarge):
        await a.put(os.urandom(MAX_BLOCK_SIZE + 1), codec=RAW)
    assert await b.put(bytes(MAX_BLOCK_SIZE), codec=RAW) == cid_of_raw(bytes(MAX_BLOCK_SIZE))


async def test_a_block_survives_the_restart_of_every_node_that_held_it(
        network: Network) -> None:
    config = DhtConfig(ksize=3, rpc_timeout=0.5, get_timeout=5.0, maintenance_interval=3600)
    seeds = [os.urandom(32) for _ in range(8)]
    nodes = [await network.add(identity=Identity.from_seed(s), name=f"n{i}", config=config)
             for i, s in enumerate(seeds)]
    data = block("durable")
    cid = await nodes[5].put(data)
    key = dht_key(cid)
    holders = [i for i, n in enumerate(nodes) if n.records.get(key) is not None]
    assert 5 in holders and 2 <= len(holders) < len(nodes)
    ports = {i: nodes[i].address[1] for i in holders}
    for i in holders:
        await network.stop(nodes[i])
    survivor = next(n for i, n in enumerate(nodes) if i not in holders)
    for i in holders:  # same identity, same data directory, same port
        nodes[i] = await network.add(identity=Identity.from_seed(seeds[i]), name=f"n{i}",
                                     port=ports[i], bootstrap=[survivor.address],
                                     config=config)
        assert nodes[i].records.get(key) == data
    newcomer = await network.add(name="newcomer", bootstrap=[survivor.address], config=config)
    assert await newcomer.get(cid) == data
    assert await survivor.get(cid) == data


async def test_a_stock_kademlia_server_bootstraps_off_us_and_reads_a_block(
        network: Network) -> None:
    nodes = await network.grow(4)
    data = block("interop")
    cid = await nodes[1].put(data)
    stock = await network.add_stock(bootstrap=[nodes[0].address])
    assert await stock.get(bytes(cid)) == data
    # and a stock client's writes are verified like everyone's
    other = block("from stock")
    await stock.set(bytes(cid_of(other)), other)
    assert await nodes[2].get(cid_of(other)) == other
    await stock.set(b"not a cid", b"anything goes")
    assert all(n.records.get(dht_key(cid_of(b"anything goes"))) is None for n in nodes)
    assert sum(n.stats.stores_refused for n in nodes) >= 1


async def test_stores_to_a_stock_node_fall_back_from_batches(network: Network) -> None:
    first = await network.add()
    stock = await network.add_stock(bootstrap=[first.address])
    # The first lookup asks the stock node FIND_NEAR, which it ignores, then FIND_NODE: two
    # RPC timeouts. A lookup stops waiting for a query after stall_after, so here it must
    # wait longer than that for the stock node to be found at all.
    publisher = await network.add(config=dataclasses.replace(FAST, stall_after=3.0))
    await eventually(lambda: len(publisher.closest_known_peers(publisher.node_id)) == 2)
    results = await publisher.put_many([block(i) for i in range(10)])
    assert all(r.acks == 2 for r in results)  # our node and the stock one
    assert stock.storage.get(dht_key(results[0].cid)) is not None


async def test_a_node_whose_peers_all_died_reports_not_found_in_bounded_time(
        network: Network) -> None:
    config = DhtConfig(rpc_timeout=0.5, get_timeout=4.0, maintenance_interval=3600)
    nodes = await network.grow(6, config=config)
    lonely = nodes[-1]
    cid = await nodes[0].put(block("gone"))
    lonely.records.expire(time.time() + 1)  # it held a copy; drop it
    for node in nodes[:-1]:
        await network.stop(node)
    async with asyncio.timeout(60):  # a guard against a hang, not a measure
        with pytest.raises(BlockNotFound, match="no holder left to ask") as caught:
            await lonely.get(cid)
    # Bounded by the dead peers' RPC timeouts, not by the get's deadline: the lookup ran
    # out of peers to ask (5 dead, 0.5 s each) before its 4 s were up.
    assert not caught.value.timed_out and caught.value.queried == 0
    with pytest.raises(BlockNotFound):  # and with nobody left in the table: at once
        await lonely.get(cid, timeout=0.1)


async def test_get_gives_up_at_its_deadline(network: Network) -> None:
    config = DhtConfig(rpc_timeout=30.0, get_timeout=0.3, maintenance_interval=3600)
    a, b = await network.grow(2, config=config)
    await network.stop(a)
    # The RPC to the dead peer would take 30 s to time out; the get must give up at its own
    # 0.3 s deadline. The guard sits far from both: only a get that waited for the RPC
    # (and then reported a timeout it did not enforce) runs into it.
    async with asyncio.timeout(config.rpc_timeout / 2):
        with pytest.raises(BlockNotFound, match="lookup timed out") as caught:
            await b.get(cid_of(b"\xa0"))
    assert caught.value.timed_out


async def test_misuse_is_reported(network: Network) -> None:
    (node,) = await network.grow(1)
    with pytest.raises(UnsupportedCID):
        await node.get(CID(b"\x01\x55\x00\x03abc"))
    with pytest.raises(ValueError, match="dag-cbor"):
        await node.put(b"x", codec=0x70)
    await node.stop()
    with pytest.raises(NotStarted):
        await node.put(block())


async def test_start_needs_exactly_one_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        await DhtNode.start(Identity.generate())


async def test_gets_run_concurrently(network: Network) -> None:
    nodes = await network.grow(8)
    results = await nodes[0].put_many([block(i) for i in range(100)])
    reader = nodes[7]
    reader.records.expire(time.time() + 1)
    sample = random.sample(results, 30)
    got = await asyncio.gather(*(reader.get(r.cid) for r in sample))
    assert [cid_of(g) for g in got] == [r.cid for r in sample]


async def test_the_kademlia_id_is_the_sha1_of_the_peer_id(network: Network) -> None:
    identity = Identity.generate()
    node = await network.add(identity=identity)
    assert node.node_id == identity.peer_id.kademlia_id()
    assert node.peer_id == identity.peer_id


async def test_a_put_with_a_quorum_returns_at_it_and_the_rest_follow(network: Network) -> None:
    nodes = await network.grow(6)
    writer = nodes[2]
    results = await writer.put_many([block(f"quorum {i}") for i in range(20)], quorum=2)
    assert all(r.targets == 5 and 2 <= r.acks <= 5 for r in results)
    # Every replica is written all the same, behind the returned puts.
    for r in results:
        await eventually(lambda r=r: sum(n.records.get(dht_key(r.cid)) is not None
                                         for n in nodes if n is not writer) == 5)
    # ... and counted: every acknowledgement that came after its put returned.
    assert writer.stats.background_stores == sum(1 for r in results if r.acks < 5)
    await eventually(lambda: writer.stats.background_acks == sum(5 - r.acks for r in results))


async def test_put_lookups_ask_for_only_the_replicas_they_need(network: Network) -> None:
    """A put converges on r nodes, so each peer is asked FIND_NEAR for r contacts instead
    of FIND_NODE's k; the answers shrink, and every block is still found."""
    config = dataclasses.replace(FAST, replicas=3, neighbourhood_ttl=0)
    nodes = await network.grow(12, config=config)
    writer = nodes[-1]
    results = await writer.put_many([block(f"near {i}") for i in range(40)])
    assert all(r.acks == 3 for r in results)
    assert writer.stats.sent_by_rpc.get("find_near", 0) > 0
    for cid in (r.cid for r in results[:5]):
        assert await nodes[0].get(cid) is not None
    protocol = writer._protocol
    peer = next(iter(protocol.router.contacts()))
    ok, contacts = await protocol.call_find_near(peer, Node(os.urandom(20)), 3)
    assert ok and 1 <= len(contacts) <= 3
    ok, contacts = await protocol.call_find_node(peer, Node(os.urandom(20)))
    assert ok and len(contacts) > 3


async def test_a_stock_node_that_ignores_find_near_is_asked_find_node(
        network: Network) -> None:
    first = await network.add()
    stock = await network.add_stock(bootstrap=[first.address])
    protocol = first._protocol
    contact = Node(stock.node.id, "127.0.0.1", stock_address(stock)[1])
    ok, contacts = await protocol.call_find_near(contact, Node(os.urandom(20)), 3)
    assert ok and contacts is not None  # one FIND_NEAR timed out, then FIND_NODE
    near = protocol.stats.sent_by_rpc.get("find_near", 0)
    ok, _ = await protocol.call_find_near(contact, Node(os.urandom(20)), 3)
    assert ok and protocol.stats.sent_by_rpc.get("find_near", 0) == near  # FIND_NODE now
    assert protocol.stats.sent_by_rpc.get("find_near", 0) > 0
    assert protocol.stats.sent_by_rpc.get("find_node", 0) > 0


async def test_value_lookups_ask_for_only_the_replicas_they_need(network: Network) -> None:
    """A value lives at the r closest nodes, so a get's misses are answered with r
    contacts (FIND_VALUE_NEAR), not k; a hit still carries the value, and a stock node
    that ignores the RPC is asked plain FIND_VALUE."""
    config = dataclasses.replace(FAST, replicas=3)
    nodes = await network.grow(12, config=config)
    data = block("narrow")
    cid = await nodes[-1].put(data)
    reader = next(n for n in nodes if n.records.get(dht_key(cid)) is None)
    assert await reader.get(cid) == data
    protocol = reader._protocol
    peer = next(iter(protocol.router.contacts()))
    ok, contacts = await protocol.call_find_value(peer, Node(os.urandom(20)), 3)
    assert ok and isinstance(contacts, list) and 1 <= len(contacts) <= 3
    ok, contacts = await protocol.call_find_value(peer, Node(os.urandom(20)))
    assert ok and isinstance(contacts, list) and len(contacts) > 3
    holder = next(n for n in nodes if n.records.get(dht_key(cid)) is not None and n is not reader)
    ok, found = await protocol.call_find_value(
        Node(holder.node_id, *holder.address), Node(dht_key(cid)), 3)
    assert ok and found == {"value": data}
    assert protocol.stats.sent_by_rpc.get("find_value_near", 0) > 0

    stock = await network.add_stock(bootstrap=[reader.address])
    contact = Node(stock.node.id, "127.0.0.1", stock_address(stock)[1])
    ok, contacts = await protocol.call_find_value(contact, Node(os.urandom(20)), 3)
    assert ok and contacts is not None  # one FIND_VALUE_NEAR timed out, then FIND_VALUE
    near = protocol.stats.sent_by_rpc.get("find_value_near", 0)
    ok, _ = await protocol.call_find_value(contact, Node(os.urandom(20)), 3)
    assert ok and protocol.stats.sent_by_rpc.get("find_value_near", 0) == near


async def test_a_node_not_in_our_buckets_is_located_by_a_crawl(network: Network) -> None:
    nodes = [await network.add() for _ in range(6)]
    asker, target = nodes[1], nodes[5]
    # Forget the target, as if we had only heard its peer id (an overlay walk, a sample).
    asker._protocol.router.remove_contact(Node(target.node_id))
    assert all(c.node_id != target.node_id for c in asker.closest_known_peers(target.node_id))
    assert await asker.locate(target.peer_id) == target.address
    # Nobody by that id: None, after one crawl.
    assert await asker.locate(Identity.generate().peer_id) is None
