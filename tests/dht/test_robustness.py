"""Garbage, oversized and unknown datagrams, and floods: the node logs, drops, stays up."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
import umsgpack

from dag.cid import cid_of_raw
from dht import DhtConfig, dht_key
from tests.waiting import eventually

from .conftest import FAST, Network, RawPeer

pytestmark = pytest.mark.slow


async def test_malformed_datagrams_are_dropped_and_logged(
        network: Network, raw_peer: RawPeer, caplog: pytest.LogCaptureFixture) -> None:
    node, other = await network.grow(2)
    addr = node.address
    junk = [
        b"",
        b"\x00" * 5,
        os.urandom(300),
        b"\x00" + os.urandom(20) + b"\xc1\xc1",
        b"\x00" + os.urandom(20) + umsgpack.packb(["shutdown", []]),
        b"\x00" + os.urandom(20) + umsgpack.packb(["store", [b"x"]]),
        b"\x00" + os.urandom(20) + umsgpack.packb(["find_node", [7, None]]),
        b"\x00" + os.urandom(20) + umsgpack.packb(["store", [b"n" * 20, b"k" * 20,
                                                             bytes(20000)]]),
        b"\x00" + os.urandom(20) + b"\x91" * 8000,
        b"\x01" + os.urandom(20) + umsgpack.packb("an answer to nothing"),
        b"\x07" + os.urandom(40),
    ]
    with caplog.at_level(logging.WARNING, logger="dht.protocol"):
        for datagram in junk:
            raw_peer.send(datagram, addr)
        # the node is still up and still answers a well-formed request
        assert await raw_peer.call(addr, "ping", raw_peer.node_id) == node.node_id
        await eventually(lambda: node.stats.datagrams_dropped >= len(junk) - 1)
    assert node.stats.handler_errors == 0
    assert any("dropped a datagram" in r.getMessage() for r in caplog.records)
    # ... and still does its job
    cid = await other.put(b"\x41z")
    assert await node.get(cid) == b"\x41z"


async def test_garbage_contact_lists_do_not_poison_lookups(
        network: Network, raw_peer: RawPeer) -> None:
    node, _ = await network.grow(2)
    # a FIND_NODE answer we never asked for is dropped; one we asked for is checked
    raw_peer.send(b"\x01" + os.urandom(20) + umsgpack.packb([[b"x", "evil.example", 53]]),
                  node.address)
    cid = await node.put(b"\x41y")
    assert await node.get(cid) == b"\x41y"
    assert all(c.host == "127.0.0.1" for c in node.closest_known_peers(node.node_id))


async def test_a_flood_of_stores_is_rate_limited(
        network: Network, raw_peer: RawPeer, caplog: pytest.LogCaptureFixture) -> None:
    config = DhtConfig(rpc_timeout=1.0, get_timeout=5.0, maintenance_interval=3600,
                       store_rate=100, store_burst=200)
    node = await network.add(config=config)
    await raw_peer.introduce(node.address)
    values = [os.urandom(64) for _ in range(2000)]
    with caplog.at_level(logging.WARNING, logger="dht.protocol"):
        answers = [raw_peer.request(node.address, "store", raw_peer.node_id,
                                    dht_key(cid_of_raw(v)), v) for v in values]
        done = await asyncio.wait_for(asyncio.gather(*answers), 10)
    accepted = sum(1 for a in done if a is True)
    assert 200 <= accepted < len(values) // 2  # the burst, plus what refilled meanwhile
    assert node.stats.stores_rate_limited == len(values) - accepted
    assert any("rate limit" in r.getMessage() for r in caplog.records)
    # a flood of forged values costs a hash each and is refused
    forged = [raw_peer.request(node.address, "store", raw_peer.node_id, os.urandom(20),
                               os.urandom(64)) for _ in range(50)]
    await asyncio.wait_for(asyncio.gather(*forged), 10)
    # still alive, other peers still served
    other = await network.add(config=FAST)
    cid = await other.put(b"\x41x")
    assert await node.get(cid) == b"\x41x"


async def test_the_record_quota_holds_against_valid_floods(
        network: Network, raw_peer: RawPeer) -> None:
    config = DhtConfig(rpc_timeout=1.0, maintenance_interval=3600, max_records=50)
    node = await network.add(config=config)
    await raw_peer.introduce(node.address)
    values = [os.urandom(64) for _ in range(80)]
    answers = await asyncio.gather(*(
        raw_peer.call(node.address, "store", raw_peer.node_id, dht_key(cid_of_raw(v)), v)
        for v in values))
    # Each new key past the bound evicts the oldest record: the node holds 50, the newest.
    assert answers.count(True) == 80 and len(node.records) == 50
    assert node.stats.stores_over_quota == 0 and node.stats.records_evicted == 30


async def test_an_address_that_timed_out_is_not_waited_for_again(network: Network) -> None:
    """After a crash, lookups keep meeting the dead node in other peers' answers; each
    meeting must not cost another ``rpc_timeout``."""
    config = DhtConfig(rpc_timeout=0.5, get_timeout=5.0, maintenance_interval=3600,
                       neighbourhood_ttl=0)
    node, dead, _ = await network.grow(3, config=config)
    dead_address = dead.address
    await network.stop(dead)
    protocol = node._protocol
    loop = asyncio.get_running_loop()

    started = loop.time()
    first = await protocol.find_node(dead_address, node.node_id, os.urandom(20))
    assert first == (False, None)
    assert loop.time() - started >= config.rpc_timeout * 0.9  # waited out once

    started = loop.time()
    again = await protocol.find_node(dead_address, node.node_id, os.urandom(20))
    assert again == (False, None)
    assert loop.time() - started < config.rpc_timeout / 2  # failed at once
    assert node.stats.rpcs_skipped == 1

    # PING still goes out (it is how a node proves itself back), and any datagram from the
    # address ends the quarantine.
    revived = await network.add(port=dead_address[1], config=config)
    assert await protocol.ping(dead_address, node.node_id) == (True, revived.node_id)
    assert (await protocol.find_node(dead_address, node.node_id, os.urandom(20)))[0]
    assert node.stats.rpcs_skipped == 1


async def test_a_batching_peer_that_goes_silent_is_quarantined(network: Network) -> None:
    """STORE_BATCH silence counts once the address has answered a STORE_BATCH: it is then
    one of ours gone quiet, not a stock node that does not know the RPC."""
    config = DhtConfig(rpc_timeout=0.5, get_timeout=5.0, maintenance_interval=3600)
    node, dead = await network.grow(2, config=config)
    protocol = node._protocol
    block = b"\x41batch"
    key = bytes(cid_of_raw(block))
    ok, _ = await protocol.store_batch(dead.address, node.node_id, [(key, block)])
    assert ok
    address = dead.address
    await network.stop(dead)
    assert (await protocol.store_batch(address, node.node_id, [(key, block)]))[0] is False
    skipped = node.stats.rpcs_skipped
    assert (await protocol.find_node(address, node.node_id, os.urandom(20)))[0] is False
    assert node.stats.rpcs_skipped == skipped + 1
