"""Issue #28: ``stop()`` leaves nothing of the DHT pending. An embedded node that stopped
and then closed its loop printed "Task was destroyed but it is pending" and "RuntimeError:
no running event loop" from dht/replication.py: stores queued when the protocol closed
were never settled (the fallback task that would send them was refused), so whoever waited
for them waited forever, and a lookup cancelled by the stop raised CancelledError into a
caller that was not cancelled."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from pathlib import Path

import pytest

import dht
from dag.cid import RAW, cid_of_raw
from dag.identity import Identity
from dht import DhtConfig, DhtNode, PutResult, dht_key
from pulsar import Node, NodeConfig
from tests.node.conftest import FAST_CORE, FAST_TRANSPORT
from tests.waiting import eventually

from .conftest import Network
from .lossy import Deaf

pytestmark = pytest.mark.slow

DHT_DIR = str(Path(dht.__file__).parent) + os.sep
SLOW = DhtConfig(rpc_timeout=5.0, stall_after=0.0, get_timeout=10.0,
                 maintenance_interval=3600.0)
"""Long RPC timeouts: a store to a deaf node is surely still in flight at the stop."""


def dht_tasks() -> list[asyncio.Task[object]]:
    """Tasks not done whose stack runs through the dht package."""
    me = asyncio.current_task()
    return [task for task in asyncio.all_tasks()
            if task is not me and not task.done()
            and any(f.f_code.co_filename.startswith(DHT_DIR) for f in task.get_stack())]


async def test_embedded_nodes_stop_with_no_dht_task_pending(
        tmp_path: Path, network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three plain DHT nodes hold replicas; one goes deaf, so the background stores of the
    # publishes (each returns at its write quorum of 1) still wait on it at the stop.
    holders = [await network.add(config=SLOW, bootstrap=[]) for _ in range(3)]

    def config(name: str, bootstrap: tuple[tuple[str, int], ...]) -> NodeConfig:
        return NodeConfig(data_dir=tmp_path / name, bootstrap=bootstrap, core=FAST_CORE,
                          transport=FAST_TRANSPORT, dht=SLOW)

    alice = await Node.start(config("alice", tuple(h.address for h in holders)))
    bob = await Node.start(config("bob", (alice.address,)))
    try:
        topic = await alice.create_topic("stop")
        sub = await bob.subscribe(topic.cid)
        Deaf(holders[2], monkeypatch).down = True
        sent = [await alice.publish(topic.cid, b"event %d" % i) for i in range(5)]
        assert [(await sub.get(timeout=5)).cid for _ in sent] == [e.cid for e in sent]
        assert alice.dht.stats.background_stores > 0  # replicas still being written
    finally:
        await alice.stop()
        await bob.stop()
    for holder in list(network.nodes):
        await network.stop(holder)
    assert dht_tasks() == []


async def test_a_put_in_flight_returns_when_its_node_stops(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    """The put returns (with the acknowledgements it had) instead of waiting forever: its
    store to a silent target is answered "no answer" by the stop, the spare that replaces
    the target is queued after the protocol closed, and that store must be settled too
    (it was dropped: the task that would have sent it was refused)."""
    config = DhtConfig(rpc_timeout=5.0, replicas=1, get_timeout=10.0,
                       maintenance_interval=3600.0)
    a = await network.add(config=config, bootstrap=[])
    live = await network.add(config=config)
    deaf = await network.add(config=config)
    await eventually(lambda: len(a.closest_known_peers(a.node_id)) == 2)
    # it answers lookups but not STOREs (a msgpack "store" string is 0xa5 + b"store")
    Deaf(deaf, monkeypatch).drop_if = lambda datagram: b"\xa5store" in datagram
    # a block whose one replica goes to the deaf node, the live one being its spare
    block = next(b for b in (b"\x41" + os.urandom(16) for _ in range(10_000))
                 if _distance(b, deaf) < _distance(b, live))
    stores = a.stats.sent_by_rpc.get("store", 0)
    put = asyncio.ensure_future(a.put_many([block], codec=RAW))
    await eventually(lambda: a.stats.sent_by_rpc.get("store", 0) > stores)
    assert not put.done()  # waiting for the deaf node
    await network.stop(a)
    (result,) = await asyncio.wait_for(put, 1.0)
    assert result.acks == 0
    for node in list(network.nodes):
        await network.stop(node)
    assert dht_tasks() == []


def _distance(block: bytes, node: DhtNode) -> int:
    key = dht_key(cid_of_raw(block))
    return int.from_bytes(key, "big") ^ int.from_bytes(node.node_id, "big")


async def test_a_lookup_cut_short_by_the_stop_is_not_a_cancellation(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    a = await network.add(config=SLOW, bootstrap=[])
    deaf = await network.add(config=SLOW)
    await eventually(lambda: len(a.closest_known_peers(a.node_id)) == 1)
    Deaf(deaf, monkeypatch).down = True
    put = asyncio.ensure_future(a.put_many([b"\x42" + os.urandom(16)], codec=RAW))
    await eventually(lambda: a.stats.lookups == 1)  # walking: its FIND_NEAR waits
    await network.stop(a)
    (result,) = await asyncio.wait_for(put, 1.0)  # not CancelledError
    assert result.acks == 0


async def test_stop_twice_at_once_returns_when_stopped(network: Network) -> None:
    a = await network.add(config=SLOW, bootstrap=[])
    first = asyncio.ensure_future(a.stop())
    await asyncio.sleep(0)  # the first call is under way
    await a.stop()
    assert first.done()
    assert a.server.protocol.closed
    network.nodes.remove(a)


def test_a_loop_closed_after_the_stop_reports_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What the issue saw: an application stops its nodes, closes its loop, the garbage
    collector runs. A put of its own was still in flight at the stop: it must have
    returned, not be destroyed pending ("Task was destroyed but it is pending"); and no
    coroutine may fail while being closed (pytest turns that into an error here)."""
    config = DhtConfig(rpc_timeout=5.0, replicas=1, get_timeout=10.0,
                       maintenance_interval=3600.0)
    put: asyncio.Future[list[PutResult]] | None = None

    async def scenario() -> None:
        nonlocal put
        nodes = [await DhtNode.start(Identity.generate(), db_path=tmp_path / "0.db",
                                     config=config)]
        for i in (1, 2):
            nodes.append(await DhtNode.start(Identity.generate(), db_path=tmp_path / f"{i}.db",
                                             bootstrap=[nodes[0].address], config=config))
        first, live, deaf = nodes
        await eventually(lambda: len(first.closest_known_peers(first.node_id)) == 2)
        Deaf(deaf, monkeypatch).drop_if = lambda datagram: b"\xa5store" in datagram
        block = next(b for b in (b"\x43" + os.urandom(16) for _ in range(10_000))
                     if _distance(b, deaf) < _distance(b, live))
        stores = first.stats.sent_by_rpc.get("store", 0)
        put = asyncio.ensure_future(first.put_many([block], codec=RAW, quorum=1))
        await eventually(lambda: first.stats.sent_by_rpc.get("store", 0) > stores)
        for node in nodes:
            await node.stop()
        await asyncio.wait([put], timeout=1.0)

    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            loop.run_until_complete(scenario())
            assert put is not None and put.done()
            assert [t for t in asyncio.all_tasks(loop) if not t.done()] == []
    finally:
        loop.close()
        gc.collect()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
