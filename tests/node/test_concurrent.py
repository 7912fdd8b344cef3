"""Concurrent publishers on real nodes: the topic's DAG forks, and every node converges."""

from __future__ import annotations

import asyncio

from dag import CID, EventDescriptor
from pulsar import Node

from .conftest import Network, collect, eventually

PER_PUBLISHER = 30


def _tips(events: list[EventDescriptor]) -> set[CID]:
    """The events no other event links to (as parent or merge): the heads of a complete
    DAG."""
    linked = {e.parent for e in events} | {m for e in events for m in e.merges}
    return {e.cid for e in events} - linked


def _reachable(events: list[EventDescriptor], heads: set[CID]) -> set[CID]:
    """What a walk back from ``heads`` over parent and merge links reaches."""
    by_cid = {e.cid: e for e in events}
    seen: set[CID] = set()
    stack = list(heads)
    while stack:
        cid = stack.pop()
        if cid in seen or cid not in by_cid:
            continue
        seen.add(cid)
        event = by_cid[cid]
        stack += [c for c in (event.parent, *event.merges) if c is not None]
    return seen


async def test_two_concurrent_last_seen_publishers_every_subscriber_converges(
    network: Network,
) -> None:
    """Two publishers on one LAST_SEEN topic publish at the same time, so each links the
    last event *it* saw and the DAG forks wherever they raced. Every subscriber delivers
    all 60 events, once, each after its parent, and every node ends with the same heads
    (the DAG's tips) once heads anti-entropy has run."""
    nodes = await network.start(8)
    author, other = nodes[0], nodes[1]
    readers = nodes[2:]
    topic = await author.create_topic("race")  # allowed_publishers=None: anyone may publish
    subs = await asyncio.gather(*(n.subscribe(topic.cid) for n in readers))
    other_sub = await other.subscribe(topic.cid)

    async def publish_loop(node: Node, tag: bytes) -> list[EventDescriptor]:
        return [await node.publish(topic.cid, b"%s %d" % (tag, i)) for i in range(PER_PUBLISHER)]

    from_author, from_other = await asyncio.gather(
        publish_loop(author, b"author"), publish_loop(other, b"other")
    )
    published = from_author + from_other
    by_cid = {e.cid: e for e in published}
    assert len(by_cid) == 2 * PER_PUBLISHER
    assert {e.publisher for e in from_other} == {other.peer_id}
    # Each publisher links the last event it saw, its own or the other's.
    for event in published:
        assert event.parent is None or event.parent in by_cid
    assert any(by_cid[e.parent].publisher != e.publisher for e in published if e.parent)
    # The race forked the DAG: some events share a parent (one chain would prove little).
    parents = [e.parent for e in published if e.parent is not None]
    assert len(set(parents)) < len(parents), "no fork: the publishers did not race"
    # Merge links join the forks again: every event hangs below the last tips, so a walk
    # back from them (a replay from the topic's CID, a returning subscriber) finds it.
    tips = _tips(published)
    assert any(e.merges for e in published)
    assert len(tips) <= 2
    assert _reachable(published, tips) == set(by_cid)

    received = await asyncio.gather(*(collect(s, 2 * PER_PUBLISHER) for s in [*subs, other_sub]))
    for events in received:
        cids = [e.cid for e in events]
        assert len(set(cids)) == len(cids)  # nothing twice
        assert set(cids) == set(by_cid)  # nothing lost, nothing foreign
        position = {cid: i for i, cid in enumerate(cids)}
        for event in events:
            if event.parent is not None:
                assert position[event.parent] < position[event.cid]  # causal order

    everyone = [author, other, *readers]
    # Wait for a round of heads anti-entropy after the last delivery, then compare.
    # (A round is a HEADS, or its 16-byte digest to a neighbour told of every head.)
    def rounds() -> int:
        return sum(n.metrics["heads_sent"] + n.metrics["digests_sent"] for n in everyone)

    sent = rounds()
    await eventually(
        lambda: (
            rounds() > sent
            and all(set(n.core.backfill.heads(topic.cid)) == tips for n in everyone)
        ),
        timeout=10,
    )
    for node in everyone:
        assert node.core.backfill.held(topic.cid) == 0
        assert node.core.backfill.missing(topic.cid) == []
    for sub in [*subs, other_sub]:
        assert sub.pending() == 0  # nothing delivered twice, late
    # The durable delivery log holds the same 60 events in the order they were delivered.
    for node, events in zip([*readers, other], received, strict=True):
        logged = [e.cid async for e in node.history(topic.cid)]
        assert logged == [e.cid for e in events]
    # A node that never followed the topic replays all of it from the topic's CID: the
    # publishers' heads records name the last tips, and merge links lead to every fork.
    (reader,) = await network.start(1)
    replayed = [e.cid async for e in reader.replay(topic.cid)]
    assert sorted(replayed, key=bytes) == sorted(by_cid, key=bytes)
