"""Replay a topic's history from its CID alone: heads records, then a DHT walk.

This is what :meth:`pulsar.Node.replay` (and the REST ``/replay`` endpoint, and the history
replay client through it) runs for a node that does not follow the topic. Nothing here
needs a live publisher or subscriber: the publishers' signed heads records in the DHT name
the latest topic version and the DAG's tips, and every event is fetched by CID (local store
first, then the DHT) and judged exactly as a subscriber judges it (CID, signatures, the
rights rule under the latest version), so a replay never yields what a subscriber would
refuse.

The walk follows parent and merge links from the heads — or from ``until`` when it is an event —
breadth first with up to :data:`CONCURRENCY` fetches in flight (a parent's fetch starts
as soon as its child's block arrives, before the child is verified), and stops at
``since`` (an event CID: that event and what precedes it; a time: events created before
it). The events
found are then yielded in :func:`dag.history.causal_order`, oldest first. An event that
could not be fetched makes the replay fail with :class:`ReplayIncomplete` (a partial
history must not look like a short one); with ``partial=True`` it is logged and skipped
instead (its descendants still come, as a subscriber's gap report would let them).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, Protocol

from dag import CID, EventDescriptor, InvalidDescriptor, PeerId, TopicDescriptor
from dag.checkpoints import (
    Checkpoint,
    entries_from,
    fetch_checkpoint,
    find_segment,
    seek_in_segment,
)
from dag.descriptors import parse_timestamp
from dag.event_links import event_links
from dag.history import causal_order
from dag.records import HeadsRecord
from dht import BlockNotFound, DhtNode
from pulsar.proto.versions.lineage import MAX_VERSION_CHAIN, TopicVersions

__all__ = ["CONCURRENCY", "MAX_REPLAY_EVENTS", "ReplayError", "ReplayIncomplete",
           "ReplaySource", "replay_history"]

log = logging.getLogger("pulsar.replay")

CONCURRENCY: Final = 32
"""Blocks fetched at once during the walk (branches and records in parallel)."""
MAX_REPLAY_EVENTS: Final = 1_000_000
"""The walk holds what it found to order it; beyond this it stops with an error (narrow
the range with ``since``/``until``)."""
RECORD_ROUNDS: Final = 2
MAX_RECORD_KEYS: Final = 32


class ReplayError(RuntimeError):
    """The history could not be replayed (too long for one walk)."""


class ReplayIncomplete(ReplayError):
    """Part of the history could not be read from the network: events the walk needed
    were found nowhere (``missing``), or the node reached nobody at all. A partial
    history is never passed off as a short one; ``partial=True`` asks for what was
    found instead. Trying again later may succeed."""

    def __init__(self, reason: str, missing: list[CID], found: int) -> None:
        super().__init__(reason)
        self.missing = missing
        self.found = found


class ReplaySource(Protocol):
    """What a replay needs of the node (:class:`pulsar.Node` is one): its DHT, and its
    topic versions. A protocol, so that this module, a part of the node, does not import
    :mod:`pulsar.node`."""

    @property
    def dht(self) -> DhtNode: ...

    async def get_topic(self, cid: CID) -> TopicDescriptor: ...

    async def _lineage(self, topic_cid: CID
                       ) -> tuple[TopicDescriptor, tuple[TopicDescriptor, ...]]: ...


async def replay_history(
    node: ReplaySource,
    topic_cid: CID,
    *,
    since: CID | float | None = None,
    until: CID | float | None = None,
    limit: int | None = None,
    partial: bool = False,
) -> AsyncIterator[EventDescriptor]:
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    first, later = await node._lineage(topic_cid)
    versions = TopicVersions()
    versions.add(first)
    for version in later:
        versions.add(version)
    heads, checkpoint = await _discover(node, first, versions)
    if not heads and not partial and node.dht.routing_size()[0] == 0:
        # No record found may mean an empty topic, or a node that reached nobody.
        raise ReplayIncomplete("this node has no DHT contacts: the topic's heads records "
                               "could not be read", [], 0)
    if checkpoint is not None and isinstance(since, float | int) and not isinstance(until, CID):
        # The author's checkpoints reach the start in log2 fetches, and the history streams
        # from there: no walk back through everything after ``since``.
        stream = _from_checkpoints(node, first, versions, checkpoint, heads, float(since),
                                   partial)
        count = 0
        async for event in stream:
            if until is not None and event.created_at >= float(until):
                continue
            if limit is not None and count >= limit:
                return
            count += 1
            yield event
        return
    if isinstance(until, CID):
        heads = [until]
    missing: list[CID] = []
    events = await _walk(node, first, versions, heads, since, missing)
    if missing and not partial:
        raise ReplayIncomplete(
            f"{len(missing)} event(s) of the history could not be fetched from the network "
            f"(first: {missing[0]}); {len(events)} were; try again, or ask for the partial "
            "history", missing, len(events))
    count = 0
    for event in causal_order(events):
        if isinstance(until, float | int) and event.created_at >= float(until):
            continue
        if limit is not None and count >= limit:
            return
        count += 1
        yield event


async def _discover(node: ReplaySource, first: TopicDescriptor,
                    versions: TopicVersions) -> tuple[list[CID], CID | None]:
    """The heads named by the records of the author and the allowed publishers (then of
    the publishers those records name), and the newest checkpoint the author's record
    names; the versions they name are learned on the way."""
    asked: set[PeerId] = set()
    heads: dict[CID, None] = {}
    checkpoint: CID | None = None
    latest = versions.latest(first.cid) or first
    wanted = [first.author]
    if latest.allowed_publishers.enabled:
        wanted += list(latest.allowed_publishers.peers)
    for _ in range(RECORD_ROUNDS):
        batch = [p for p in dict.fromkeys(wanted) if p not in asked][: MAX_RECORD_KEYS - len(asked)]
        if not batch:
            break
        asked.update(batch)
        found = await asyncio.gather(*(_record(node, first.cid, p) for p in batch))
        wanted = []
        for record in found:
            if record is None:
                continue
            await _learn_version(node, versions, record.version)
            heads.update(dict.fromkeys(record.heads))
            wanted += [p for p in record.peers if p not in asked]
            if record.publisher == first.author and record.checkpoint is not None:
                checkpoint = record.checkpoint
    return list(heads), checkpoint


async def _record(node: ReplaySource, topic: CID, publisher: PeerId) -> HeadsRecord | None:
    try:
        return await node.dht.get_record(topic, publisher)
    except Exception as exc:  # the lookup failed: other publishers' records may do
        log.info("heads record of %s by %s: %s", topic, publisher, exc)
        return None


async def _learn_version(node: ReplaySource, versions: TopicVersions, cid: CID) -> None:
    """Register ``cid`` and the versions between it and what is known (author checked)."""
    chain: list[TopicDescriptor] = []
    cursor: CID | None = cid
    while (cursor is not None and versions.get(cursor) is None
           and len(chain) < MAX_VERSION_CHAIN):
        try:
            topic = await node.get_topic(cursor)
        except LookupError:
            return
        chain.append(topic)
        cursor = topic.parent
    for topic in reversed(chain):
        versions.add(topic)


async def _walk(
    node: ReplaySource,
    first: TopicDescriptor,
    versions: TopicVersions,
    heads: list[CID],
    since: CID | float | None,
    missing: list[CID],
    stop: frozenset[CID] = frozenset(),
) -> list[EventDescriptor]:
    """Walk parent and merge links back from ``heads``. A block's links are read (without the
    signature check) as soon as the block arrives, and its fetch starts before the block
    is verified, so a chain's network round trips overlap with the verification."""
    found: dict[CID, EventDescriptor] = {}
    deferred: dict[CID, EventDescriptor] = {}
    wanted: set[CID] = set()
    fetching: dict[CID, asyncio.Task[bytes | None]] = {}
    order: deque[CID] = deque()
    slots = asyncio.Semaphore(CONCURRENCY)

    async def block_of(cid: CID) -> bytes | None:
        async with slots:
            return await _fetch(node, cid)

    def want(cid: CID) -> None:
        if cid != since and cid not in wanted and cid not in stop:
            wanted.add(cid)
            fetching[cid] = asyncio.ensure_future(block_of(cid))
            order.append(cid)

    for head in heads:
        want(head)
    try:
        while order:
            cid = order.popleft()
            block = await fetching.pop(cid)
            if block is None:
                log.warning("replay of %s: event %s not found; its ancestors are skipped",
                            first.cid, cid)
                missing.append(cid)
                continue
            links = event_links(block)
            if links is None:
                log.warning("replay of %s: %s is not an event", first.cid, cid)
                continue
            if isinstance(since, float | int) and parse_timestamp(links.created) < float(since):
                continue  # before the range: neither it nor its ancestors
            if links.parent is not None:
                want(links.parent)
            for merged in links.merges:  # other tips its publisher knew: their histories
                want(merged)
            event = await _verified(node, first, versions, cid, block, deferred)
            if event is None:
                continue
            found[cid] = event
            if len(found) > MAX_REPLAY_EVENTS:
                raise ReplayError(
                    f"more than {MAX_REPLAY_EVENTS} events to replay; narrow it with since/until"
                )
    finally:
        for task in fetching.values():
            task.cancel()
    # A revoked publisher's event is valid when it is in the history the revoking version
    # records: a recorded head or an ancestor of one. Judged during the walk, that depends
    # on meeting each child before its parent, which a DAG walked from several heads does
    # not ensure; events refused for it are judged again once the whole walk is known.
    if deferred:
        # Vouched for = an ancestor of a vouched event, whichever order the walk met them.
        events = {**found, **deferred}
        stack = [c for c in versions.sanctioned(first.cid) if c in events]
        seen: set[CID] = set()
        while stack:
            cid = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            versions.vouch(first.cid, cid)
            event = events[cid]
            for link in (event.parent, *event.merges):
                if link is not None and link in events:
                    stack.append(link)
        for cid, event in list(deferred.items()):
            if versions.admit(first.cid, event) is None:
                found[cid] = event
                del deferred[cid]
    for cid, event in deferred.items():
        log.warning("replay of %s: event %s: %s may no longer publish and the event is not "
                    "in the history the latest version records", first.cid, cid,
                    event.publisher)
    return list(found.values())


async def _verified(node: ReplaySource, first: TopicDescriptor, versions: TopicVersions, cid: CID,
                    block: bytes, deferred: dict[CID, EventDescriptor]
                    ) -> EventDescriptor | None:
    """The event if the block is a valid event of the topic, judged as a subscriber would
    (CID, signatures, the rights rule under the latest version), else None (logged)."""
    try:
        event = EventDescriptor.from_block(block, cid)
    except InvalidDescriptor as exc:
        log.warning("replay of %s: %s is not a valid event: %s", first.cid, cid, exc)
        return None
    if versions.get(event.topic) is None:
        await _learn_version(node, versions, event.topic)
        if versions.get(event.topic) is None:
            return None
    problem = versions.admit(first.cid, event)
    if problem is not None:
        if versions.needs_vouching(first.cid, event):
            deferred[cid] = event  # may be vouched for by a child judged later
        else:
            log.warning("replay of %s: %s", first.cid, problem)
        return None
    return event


async def _from_checkpoints(
    node: ReplaySource, first: TopicDescriptor, versions: TopicVersions, newest: CID,
    heads: list[CID], since: float, partial: bool,
) -> AsyncIterator[EventDescriptor]:
    """The history from the first event created at or after ``since``, streamed: the
    segment that holds it is found through the author's checkpoints (``log2`` fetches,
    and as many to reach each next segment), each segment's events come in its order (the
    author's delivery order: parents first), fetched :data:`CONCURRENCY` ahead; then the
    events after the newest checkpoint,
    walked back from the heads down to it. Memory holds one segment's index path, the
    fetches in flight and that tail, whatever the history's length.

    The author signed every CID its checkpoints cover, so they are vouched for as a
    version's recorded heads are (a revoked publisher's events among them are history).
    The tail walk stops at the newest checkpoint's heads and segment and at events created
    before that segment began: an event delivered to the author after the checkpoint but
    created earlier than that (a long partition healing) is found once the next
    checkpoint covers it."""
    async def get(cid: CID) -> bytes | None:
        return await _fetch(node, cid)

    author = first.author
    latest = await fetch_checkpoint(get, newest, author, first.cid)
    at_ms = max(0, math.ceil(since * 1000))
    start = await find_segment(get, latest, author, at_ms=at_ms)
    checkpoint = start
    offset = 0 if start is None else await seek_in_segment(get, start, at_ms=at_ms)
    while checkpoint is not None:
        async for event in _segment_events(node, first, versions, checkpoint, offset, get,
                                           partial):
            yield event
        if checkpoint.number == latest.number:
            break
        # The next segment: found from the newest checkpoint by position, log2 fetches.
        checkpoint = await find_segment(get, latest, author, position=checkpoint.count + 1)
        offset = 0
    tail_stop = set(latest.heads)
    async for _, cid in entries_from(get, latest):
        tail_stop.add(cid)
    missing: list[CID] = []
    tail = await _walk(node, first, versions, heads, float(latest.first_ms) / 1000, missing,
                       frozenset(tail_stop))
    if missing and not partial:
        raise ReplayIncomplete(
            f"{len(missing)} event(s) after the newest checkpoint could not be fetched "
            f"(first: {missing[0]})", missing, len(tail))
    for event in causal_order(tail):
        if event.cid not in tail_stop and event.created_at >= since:
            yield event


async def _segment_events(
    node: ReplaySource, first: TopicDescriptor, versions: TopicVersions,
    checkpoint: Checkpoint, offset: int, get: Callable[[CID], Awaitable[bytes | None]],
    partial: bool,
) -> AsyncIterator[EventDescriptor]:
    """One segment's events from ``offset``, in order, verified, up to CONCURRENCY ahead."""
    window: deque[tuple[CID, asyncio.Task[bytes | None]]] = deque()
    entries = entries_from(get, checkpoint, offset)
    done = False
    try:
        while True:
            while not done and len(window) < CONCURRENCY:
                try:
                    _, cid = await anext(entries)
                except StopAsyncIteration:
                    done = True
                    break
                window.append((cid, asyncio.ensure_future(get(cid))))
            if not window:
                return
            cid, task = window.popleft()
            block = await task
            if block is None:
                if not partial:
                    raise ReplayIncomplete(f"event {cid} of checkpoint {checkpoint.number} "
                                           "could not be fetched", [cid], 0)
                log.warning("replay of %s: event %s not found", first.cid, cid)
                continue
            deferred: dict[CID, EventDescriptor] = {}
            event = await _verified(node, first, versions, cid, block, deferred)
            if event is None and cid in deferred:
                # Refused only for want of vouching: the checkpoint vouches for it.
                versions.vouch(first.cid, cid)
                if versions.admit(first.cid, deferred[cid]) is None:
                    event = deferred[cid]
            if event is not None:
                yield event
    finally:
        for _, task in window:
            task.cancel()


async def _fetch(node: ReplaySource, cid: CID) -> bytes | None:
    """``cid``'s block from the local store, else the DHT (verified against the CID by
    both); None when nobody has it."""
    try:
        return await node.dht.get(cid)
    except (BlockNotFound, TimeoutError):
        return None
