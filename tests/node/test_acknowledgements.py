"""What an acknowledgement promises, at the edges: a node alone, a disk that fails, and the
heads record a fresh reader needs (issue: promises checked on real networks)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from api import ApiServer
from dht import BlockNotFound
from pulsar import Node, NodeConfig, NotPersisted, StorageFull
from pulsar.runtime.replay import ReplayIncomplete
from pulsar.tools.bench.delivery import crash
from pulsar.tools.devnet import Devnet
from tests.waiting import eventually

from .conftest import Network


async def test_a_lone_node_refuses_with_a_retry_after_and_a_lone_devnet_publishes(
    tmp_path: Path,
) -> None:
    lone = await Node.start(NodeConfig(data_dir=tmp_path / "lone"))
    server = await ApiServer.start(lone)
    try:
        with pytest.raises(NotPersisted):
            await lone.create_topic("nobody to store it")
        async with aiohttp.ClientSession() as http, http.post(
            server.url + "/v1/topics", json={"name": "x"},
            headers={"Authorization": f"Bearer {server.token}"},
        ) as answer:
            problem = await answer.json(content_type=None)
            assert answer.status == 503 and answer.headers["Retry-After"] == "5"
            assert problem["type"].endswith("/not-persisted")
            assert problem["indeterminate"] is False
    finally:
        await server.stop()
        await lone.stop()
    # A devnet of one is alone on purpose: it acknowledges what its own disk holds.
    devnet = Devnet(tmp_path / "devnet", 1)
    (node,) = await devnet.start()
    try:
        topic = await node.create_topic("alone")
        event = await node.publish(topic.cid, b"kept")
        assert [e.event.cid for e in node.log_entries(topic.cid)] == [event.cid]
    finally:
        await devnet.stop()


async def test_a_publish_is_acknowledged_only_once_its_writes_are_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = Network(tmp_path)
    try:
        author, reader = await net.start(2)
        topic = await author.create_topic("disk")
        sub = await reader.subscribe(topic.cid)
        real = author.store.put_many
        failing = True

        def put_many(items: Any, **kw: Any) -> Any:
            if failing:
                raise OSError(28, "No space left on device")
            return real(items, **kw)

        monkeypatch.setattr(author.store, "put_many", put_many)
        publish = asyncio.ensure_future(author.publish(topic.cid, b"waits for the disk"))
        await eventually(lambda: author.storage_failures >= 2, timeout=10,
                         what="two failed flushes")
        assert not publish.done()  # the disk refused: not acknowledged
        with pytest.raises(StorageFull):  # and new work is refused up front
            await author.publish(topic.cid, b"refused")
        failing = False  # space is back: the kept writes go through on the next retry
        event = await asyncio.wait_for(publish, timeout=10)
        assert author.store.get(event.cid) is not None
        assert [e.event.cid for e in author.log_entries(topic.cid)] == [event.cid]
        got = await sub.get(timeout=10)
        assert got.cid == event.cid
    finally:
        await net.close()


async def test_an_acknowledged_event_is_found_from_the_cid_after_its_publisher_dies(
    tmp_path: Path,
) -> None:
    """The publisher is stopped the moment its publish returns, without the clean stop's
    record flush (its tasks are cancelled as a crash would): the acknowledgement already
    waited for a heads record naming the event, so a node that never followed the topic
    replays it from the topic's CID alone."""
    net = Network(tmp_path)
    try:
        author, _holder, reader = await net.start(3)
        topic = await author.create_topic("acked")
        event = await author.publish(topic.cid, b"the last word")
        # A crash: no Flush of armed records, no waiting for writes in flight.
        await crash(author)
        net.nodes.remove(author)
        replayed = [e.cid async for e in reader.replay(topic.cid)]
        assert replayed == [event.cid]
    finally:
        await net.close()


async def test_a_replay_that_cannot_fetch_everything_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partial history is never passed off as a short one: the replay fails with what is
    missing (REST 503 replay-incomplete with Retry-After) unless partial=True."""
    net = Network(tmp_path)
    try:
        author, _holder, reader = await net.start(3)
        topic = await author.create_topic("gappy")
        first = await author.publish(topic.cid, b"one")
        second = await author.publish(topic.cid, b"two")
        real_get = reader.dht.get

        async def get(cid: Any, **kw: Any) -> bytes:
            if cid == first.cid:  # nobody has it any more
                raise BlockNotFound(str(cid))
            return await real_get(cid, **kw)

        monkeypatch.setattr(reader.dht, "get", get)
        with pytest.raises(ReplayIncomplete) as failed:
            _ = [e async for e in reader.replay(topic.cid)]
        assert failed.value.missing == [first.cid] and failed.value.found == 1
        found = [e.cid async for e in reader.replay(topic.cid, partial=True)]
        assert found == [second.cid]
        server = await ApiServer.start(reader)
        try:
            async with aiohttp.ClientSession() as http, http.get(
                f"{server.url}/v1/topics/{topic.cid}/replay") as answer:
                problem = await answer.json(content_type=None)
                assert answer.status == 503 and answer.headers["Retry-After"] == "5"
                assert problem["type"].endswith("/replay-incomplete")
                assert problem["missing_cids"] == [str(first.cid)]
        finally:
            await server.stop()
    finally:
        await net.close()
