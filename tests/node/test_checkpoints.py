"""An author checkpoints its topic; a reader holding only the topic's CID seeks to a
time through the checkpoints and streams the history from there. Real nodes (UDP DHT,
TCP transport, SQLite) on loopback."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

import api.replay
from api.server import ApiServer
from dag.checkpoints import fetch_checkpoint, find_segment
from dht.keys import dht_key
from pulsar import Node
from tests.waiting import eventually

from .conftest import Network, collect


async def _next_millisecond() -> None:
    """Return once the clock is in a later millisecond than when called (events published
    after it have distinct ``created`` times to seek between), polling with a deadline."""
    start = int(time.time() * 1000)
    deadline = time.monotonic() + 1.0
    while int(time.time() * 1000) == start:
        assert time.monotonic() < deadline, "the clock did not move"
        await asyncio.sleep(0)


async def test_a_reader_seeks_through_the_authors_checkpoints(network: Network) -> None:
    network.checkpoint_every = 5
    nodes = await network.start(6)
    author, reader = nodes[0], nodes[5]
    topic = await author.create_topic("checkpointed")
    sub = await author.subscribe(topic.cid)
    published = []
    for i in range(23):
        published.append(await author.publish(topic.cid, b"event %d" % i))
        await _next_millisecond()  # distinct created milliseconds, to seek between
    await collect(sub, 23)
    # Four checkpoints of five events; the last three wait for the next one (or the
    # interval). The author's heads record names the newest.
    await eventually(lambda: author.metrics["checkpoints_made"] == 4, timeout=15)
    newest = author._driver.checkpoints.table.last(topic.cid)
    assert newest is not None and newest.number == 4 and newest.count == 20

    async def record_names_it() -> bool:
        record = await reader.dht.get_record(topic.cid, author.peer_id)
        return record is not None and record.checkpoint == newest.cid

    await eventually(record_names_it, timeout=15)

    async def get(cid):  # type: ignore[no-untyped-def]
        return await reader.dht.get(cid)

    latest = await fetch_checkpoint(get, newest.cid, author.peer_id, topic.cid)
    for i in (0, 7, 12, 19):  # the segment of each event, found by its time
        at_ms = round(published[i].created_at * 1000)
        found = await find_segment(get, latest, author.peer_id, at_ms=at_ms)
        assert found is not None and found.number == i // 5 + 1

    # The replay from a time streams through the checkpoints, then the three events
    # after the newest, exactly what was published from there on.
    for i in (0, 6, 18, 21):
        since = published[i].created_at
        got = [e.cid async for e in reader.replay(topic.cid, since=since)]
        assert got == [e.cid for e in published[i:]]
    assert [e.cid async for e in reader.replay(topic.cid, since=published[-1].created_at + 1)
            ] == []


async def test_a_restarted_author_names_its_checkpoint_again(network: Network) -> None:
    network.checkpoint_every = 3
    nodes = await network.start(5)
    author = nodes[0]
    topic = await author.create_topic("restarted")
    sub = await author.subscribe(topic.cid)
    for i in range(7):
        await author.publish(topic.cid, b"%d" % i)
    await collect(sub, 7)
    await eventually(lambda: author.metrics["checkpoints_made"] == 2, timeout=15)
    second = author._driver.checkpoints.table.last(topic.cid)
    assert second is not None
    author = await network.restart(author)
    await eventually(lambda: author.core.tree(topic.cid) is not None, timeout=10)
    observer = nodes[2]
    before = await observer.dht.get_record(topic.cid, author.peer_id)
    assert before is not None and before.checkpoint == second.cid
    # A publish is acknowledged once a record naming it is stored: that new record still
    # names the checkpoint made before the restart.
    await author.publish(topic.cid, b"after 0")
    after = await observer.dht.get_record(topic.cid, author.peer_id)
    assert after is not None and after.seq > before.seq and after.checkpoint == second.cid
    await author.publish(topic.cid, b"after 1")
    await eventually(lambda: author.metrics["checkpoints_made"] == 1, timeout=15)
    third = author._driver.checkpoints.table.last(topic.cid)
    assert third is not None and third.number == 3 and third.count == 9
    reader: Node = nodes[3]
    got = [e async for e in reader.replay(topic.cid, since=0.0)]
    assert len(got) == 9


async def test_the_rest_replay_streams_a_long_history_from_a_time(
    network: Network, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past its first STREAM_AFTER events the REST replay writes events as it reads them
    (made 3 here): the answer is the same history, whole and in order."""
    monkeypatch.setattr(api.replay, "STREAM_AFTER", 3)
    network.checkpoint_every = 4
    nodes = await network.start(5)
    author, reader = nodes[0], nodes[4]
    topic = await author.create_topic("streamed")
    sub = await author.subscribe(topic.cid)
    published = []
    for i in range(13):
        published.append(await author.publish(topic.cid, b"%d" % i))
        await _next_millisecond()
    await collect(sub, 13)
    await eventually(lambda: author.metrics["checkpoints_made"] == 3, timeout=15)
    server = await ApiServer.start(reader)
    try:
        async with aiohttp.ClientSession() as http:
            since = published[2].created_at
            async with http.get(f"{server.url}/v1/topics/{topic.cid}/replay",
                                params={"since": str(since)}) as answer:
                assert answer.status == 200
                lines = [json.loads(line) for line in (await answer.text()).splitlines()]
    finally:
        await server.stop()
    assert [line["cid"] for line in lines] == [str(e.cid) for e in published[2:]]


async def test_a_revoked_publishers_checkpointed_events_replay_from_a_time(
    network: Network,
) -> None:
    """Streaming forward, a revoked publisher's events come before the later events that
    vouch for them: the checkpoint that lists them vouches instead (the author signed
    their CIDs), so they are replayed, as a subscriber delivers them."""
    network.checkpoint_every = 3
    nodes = await network.start(6)
    author, bob, reader = nodes[0], nodes[1], nodes[5]
    topic = await author.create_topic("revoked", allowed_publishers=[bob.peer_id])
    sub = await author.subscribe(topic.cid)
    await bob.subscribe(topic.cid)
    published = [await bob.publish(topic.cid, b"bob %d" % i) for i in range(2)]
    await collect(sub, 2)
    published.append(await author.publish(topic.cid, b"author"))
    await collect(sub, 1)
    await eventually(lambda: author.metrics["checkpoints_made"] == 1, timeout=15)
    revoked = await author.update_topic(topic.cid, allowed_publishers=[])
    assert not revoked.may_publish(bob.peer_id)
    newest = author._driver.checkpoints.table.last(topic.cid)

    async def record_names_it() -> bool:
        record = await reader.dht.get_record(topic.cid, author.peer_id)
        return (record is not None and newest is not None
                and record.checkpoint == newest.cid and record.version == revoked.cid)

    await eventually(record_names_it, timeout=15)
    got = [e.cid async for e in reader.replay(topic.cid, since=0.0)]
    assert got == [e.cid for e in published]


async def test_a_quiet_topic_is_checkpointed_after_the_interval(network: Network) -> None:
    """Fewer events than ``checkpoint_every`` are checkpointed once ``checkpoint_interval``
    passed since they waited; later ones wait for the next interval."""
    network.checkpoint_every, network.checkpoint_interval = 100, 1.5
    nodes = await network.start(4)
    author = nodes[0]
    topic = await author.create_topic("quiet")
    sub = await author.subscribe(topic.cid)
    for i in range(3):
        await author.publish(topic.cid, b"%d" % i)
    await collect(sub, 3)
    await eventually(lambda: author.metrics["checkpoints_made"] == 1, timeout=15)
    first = author._driver.checkpoints.table.last(topic.cid)
    assert first is not None and first.count == 3
    await author.publish(topic.cid, b"later")
    await collect(sub, 1)
    await eventually(lambda: author.metrics["checkpoints_made"] == 2, timeout=15)
    second = author._driver.checkpoints.table.last(topic.cid)
    assert second is not None and second.count == 4 and second.made_at - first.made_at >= 1.5


async def test_a_segment_of_several_index_blocks_is_stored_in_the_dht(network: Network) -> None:
    """A segment bigger than one index block: every block goes through a real DHT STORE
    (with a fanout of 256 the leaf of a 1,000-event segment was over the STORE limit, and
    the exception ended the author's checkpointing)."""
    from dag.checkpoints import INDEX_FANOUT

    size = 2 * INDEX_FANOUT + 1
    network.checkpoint_every = size
    nodes = await network.start(3)
    author, reader = nodes[0], nodes[2]
    topic = await author.create_topic("wide segments")
    for i in range(size):
        await author.publish(topic.cid, b"event %d" % i)
    await eventually(lambda: author.metrics["checkpoints_made"] == 1, timeout=30)
    newest = author._driver.checkpoints.table.last(topic.cid)
    assert newest is not None and newest.count == size
    assert author.metrics["checkpoint_stores_failed"] == 0
    got = [e async for e in reader.replay(topic.cid, since=0.0)]
    assert len(got) == size


async def test_checkpoints_retention_passed_go_at_the_author_and_the_holders(
        network: Network) -> None:
    """Every node that follows the topic notes the checkpoints the DHT writes to it; once
    retention has passed one, it goes with its index, and seeking into what is retained
    still works through the newer ones."""
    network.checkpoint_every = 5
    author, reader, third = await network.start(3)
    topic = await author.create_topic("cut checkpoints", retention={"max_events": 100})
    sub = await reader.subscribe(topic.cid)
    published = []
    for i in range(12):
        published.append(await author.publish(topic.cid, b"event %d" % i))
        await _next_millisecond()
    await collect(sub, 12)
    await eventually(lambda: author.metrics["checkpoints_made"] == 2, timeout=15)
    first = author._driver.checkpoints.table.skip(topic.cid, 1)
    second = author._driver.checkpoints.table.skip(topic.cid, 2)
    for node in (author, reader):
        held = node._driver.held_checkpoints
        await eventually(lambda held=held: held.held(topic.cid) == [first.cid, second.cid],
                         timeout=15, what="both checkpoints noted")
    # third follows nothing: it holds the blocks for the DHT and notes none of them.
    assert third._driver.held_checkpoints.held(topic.cid) == []
    assert third.dht.records.get(dht_key(first.cid)) is not None

    # Every event of the first segment was created before the sixth event.
    before = published[5].created_at
    for node in (author, reader):
        assert node._driver.held_checkpoints.cut(topic.cid, before) >= 2
        assert node.dht.records.get(dht_key(first.cid)) is None
        assert node.dht.records.get(dht_key(second.cid)) is not None
    assert author.store.get(first.cid) is None
    assert author.metrics["checkpoint_blocks_cut"] >= 2
    since = published[6].created_at
    got = [e.cid async for e in reader.replay(topic.cid, since=since)]
    assert got == [e.cid for e in published[6:]]
