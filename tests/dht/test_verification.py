"""Values that do not hash to their CID are refused when stored and never returned."""

from __future__ import annotations

import asyncio
import os

import pytest

from dag.cid import cid_of
from dht import BlockNotFound, DhtConfig, dht_key
from tests.waiting import eventually

from .conftest import Network, RawPeer, stock_address

pytestmark = pytest.mark.slow


def genuine() -> bytes:
    return b"\x50" + os.urandom(16)  # a dag-cbor byte string


async def test_a_tampered_store_rpc_is_refused(network: Network, raw_peer: RawPeer) -> None:
    node, other = await network.grow(2)
    data = genuine()
    cid = cid_of(data)
    key = dht_key(cid)
    answer = await raw_peer.call(node.address, "store", raw_peer.node_id, key, data + b"!")
    assert answer is False
    answer = await raw_peer.call(node.address, "store_batch", raw_peer.node_id,
                                 [[key, b"evil"], [key, data[:-1]]])
    assert answer == [False, False]
    assert node.records.get(key) is None
    assert node.stats.stores_refused == 3
    with pytest.raises(BlockNotFound):
        await other.get(cid, timeout=2.0)
    # the genuine value is welcome
    assert await raw_peer.call(node.address, "store", raw_peer.node_id, key, data) is True
    assert await other.get(cid) == data


async def test_a_tampered_value_held_by_a_stock_node_is_never_returned(
        network: Network, raw_peer: RawPeer) -> None:
    config = DhtConfig(alpha=1, rpc_timeout=1.0, get_timeout=5.0, maintenance_interval=3600)
    data = genuine()
    cid = cid_of(data)
    key = dht_key(cid)
    holder = await network.add(config=config)
    # a stock node with the id right next to the key: every lookup asks it first
    liar = await network.add_stock(node_id=(int.from_bytes(key, "big") ^ 1).to_bytes(20, "big"),
                                   bootstrap=[holder.address])
    reader = await network.add(config=config)
    await eventually(lambda: len(reader.closest_known_peers(key)) == 2)

    # 1. only the liar has anything: not found, the bad value counted and not kept
    assert await raw_peer.call(stock_address(liar), "store", raw_peer.node_id, key,
                               b"tampered") is True
    with pytest.raises(BlockNotFound) as caught:
        await reader.get(cid)
    assert caught.value.bad_values == 1 and reader.stats.bad_values_fetched == 1
    assert reader.records.get(key) is None and holder.records.get(key) is None

    # 2. the genuine block exists too (the liar is re-poisoned after the put reached it)
    await holder.put(data)
    await raw_peer.call(stock_address(liar), "store", raw_peer.node_id, key, b"tampered")
    reader.records.expire(float("inf"))
    assert await reader.get(cid) == data
    assert reader.stats.bad_values_fetched == 2  # asked the liar first, discarded, moved on
    # and the lie was not spread: no pulsarcast node holds anything but the genuine block
    await asyncio.sleep(0)
    assert {holder.records.get(key), reader.records.get(key)} <= {None, data}
