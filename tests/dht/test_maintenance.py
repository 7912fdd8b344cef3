"""Republish, expiry and handoff, driven by explicit maintenance passes."""

from __future__ import annotations

import os
import time

import pytest

from dag import Identity
from dag.cid import cid_of
from dht import DhtConfig, dht_key
from tests.waiting import eventually

from .conftest import Network

pytestmark = pytest.mark.slow

HOUR, DAY = 3600.0, 86400.0
SMALL_K = DhtConfig(ksize=2, rpc_timeout=1.0, get_timeout=5.0, maintenance_interval=3600)


def record() -> tuple[bytes, bytes]:
    value = b"\x50" + os.urandom(16)
    return dht_key(cid_of(value)), value


async def test_a_misplaced_record_moves_to_the_closest_nodes_then_expires(
        network: Network) -> None:
    nodes = await network.grow(6, config=SMALL_K)
    key, value = record()
    by_distance = sorted(nodes, key=lambda n: int.from_bytes(n.node_id, "big")
                         ^ int.from_bytes(key, "big"))
    far = by_distance[-1]
    assert far.records.offer(key, value)  # held by the node farthest from the key
    now = time.time()

    report = await far.maintain(now + HOUR + 1)
    assert report.republished == 1 and report.kept == 0 and report.expired == 0
    assert [n.records.get(key) for n in by_distance[:2]] == [value, value]

    # a day later it pushes the record once more (due again), then drops its own copy
    report = await far.maintain(now + DAY + 10)
    assert report.republished == 1 and report.kept == 0
    assert report.expired == 1 and far.records.get(key) is None
    assert far.stats.expired == 1 and far.stats.republished == 2
    assert await far.get(cid_of(value)) == value  # still in the network


async def test_a_closest_holder_keeps_its_record_however_long_it_was_down(
        network: Network) -> None:
    nodes = await network.grow(4, config=SMALL_K)
    key, value = record()
    near = min(nodes, key=lambda n: int.from_bytes(n.node_id, "big") ^ int.from_bytes(key, "big"))
    near.records.offer(key, value)
    later = time.time() + 30 * DAY  # as after a month offline: republish comes first
    report = await near.maintain(later)
    assert report.kept == 1 and report.expired == 0
    assert near.records.get(key) == value
    # and it keeps it at the next pass too (it was restamped, not only marked)
    assert (await near.maintain(later + DAY - 1)).expired == 0


async def test_an_isolated_node_never_drops_what_it_cannot_hand_over(
        network: Network) -> None:
    (alone,) = await network.grow(1)
    key, value = record()
    alone.records.offer(key, value)
    report = await alone.maintain(time.time() + 10 * DAY)
    assert report.kept == 1 and report.expired == 0 and alone.records.get(key) == value


async def test_republishing_is_skipped_when_someone_else_just_did(network: Network) -> None:
    a, b = await network.grow(2)
    key, value = record()
    a.records.offer(key, value)
    report = await a.maintain(time.time() + HOUR + 1)
    assert report.republished == 1
    assert b.records.get(key) == value  # b was stored to just now ...
    assert (await b.maintain(time.time() + 10)).republished == 0  # ... so it has nothing due


async def test_a_new_node_is_handed_the_records_it_should_hold(network: Network) -> None:
    first = await network.add(config=SMALL_K)
    results = await first.put_many([b"\x50" + os.urandom(16) for _ in range(30)])
    assert all(r.acks == 0 for r in results)  # nobody else yet
    newcomer = await network.add(config=SMALL_K)
    keys = [dht_key(r.cid) for r in results]
    await eventually(lambda: first.stats.handed_off == 30)
    assert all(newcomer.records.get(k) is not None for k in keys)


@pytest.mark.parametrize("away_long", [False, True])
async def test_a_restarted_node_is_not_handed_what_it_kept(network: Network,
                                                           away_long: bool) -> None:
    """A contact that went silent and comes back under the same id within the republish
    interval restarted with its store: no hand-off. Away longer, it is handed off again."""
    config = DhtConfig(ksize=2, rpc_timeout=0.5, get_timeout=5.0, maintenance_interval=3600,
                       silent_for=0, returning_window=0.0 if away_long else HOUR)
    first = await network.add(config=config)
    results = await first.put_many([b"\x50" + os.urandom(16) for _ in range(20)])
    identity = Identity.generate()
    newcomer = await network.add(identity=identity, name="returning", config=config)
    await eventually(lambda: first.stats.handed_off == 20)
    await network.stop(newcomer)
    # A put to the stopped node times out: it is dropped from the routing table.
    await first.put_many([b"\x51" + os.urandom(16)])
    assert first.stats.returns_without_handoff == 0
    back = await network.add(identity=identity, name="returning", config=config)
    keys = [dht_key(r.cid) for r in results]
    assert all(back.records.get(k) is not None for k in keys)  # kept on disk
    if away_long:  # handed every record again (stores that change nothing are not acked)
        await eventually(lambda: back.stats.stores_accepted >= 20)
    else:
        await eventually(lambda: first.stats.returns_without_handoff == 1)
        await first.put_many([b"\x52" + os.urandom(16)])  # the contact is live again ...
        await eventually(lambda: back.stats.stores_accepted >= 1)
        assert back.stats.stores_accepted == 1  # ... and got that put, no hand-off


async def test_a_restarted_node_pushes_nothing_while_it_joins(network: Network) -> None:
    """The contacts a node meets during its own bootstrap are the network it joins, which
    holds the records already: no hand-off from it (a restart met every contact anew and
    pushed each of them the records they were closer to)."""
    # k = 20 so that its bootstrap meets all four; two replicas per record
    config = DhtConfig(ksize=20, replicas=2, rpc_timeout=1.0, get_timeout=5.0,
                       maintenance_interval=3600)
    nodes = await network.grow(4, config=config)
    results = await nodes[0].put_many([b"\x53" + os.urandom(16) for _ in range(40)])
    assert all(r.acks == 2 for r in results)
    identity = Identity.generate()
    returning = await network.add(identity=identity, name="back", config=config)
    keys = [dht_key(r.cid) for r in results]
    # it is handed its share by the nodes that held it
    await eventually(lambda: any(returning.records.get(k) is not None for k in keys))
    await network.stop(returning)
    before = sum(n.stats.stores_accepted for n in nodes)
    back = await network.add(identity=identity, name="back", config=config)
    assert sum(1 for _ in back._protocol.router.contacts()) == 4  # met them all joining
    (mine,) = await back.put_many([b"\x54" + os.urandom(16)])
    assert mine.acks == 2
    # the others took exactly that put's two replicas: nothing was pushed on joining
    assert sum(n.stats.stores_accepted for n in nodes) - before == 2


async def test_what_a_lone_node_put_reaches_the_network_it_joins(network: Network) -> None:
    lone = await network.add(config=SMALL_K, bootstrap=[])
    results = await lone.put_many([b"\x55" + os.urandom(16) for _ in range(10)])
    assert all(r.acks == 0 for r in results)
    others = [await network.add(config=SMALL_K, bootstrap=[]) for _ in range(2)]
    await others[1].bootstrap([others[0].address])
    await lone.bootstrap([others[0].address])  # joins: it pushes what only it holds
    keys = [dht_key(r.cid) for r in results]
    await eventually(lambda: all(any(o.records.get(k) is not None for o in others)
                                 for k in keys))
