"""Topics by CID, and the trees this node joins for them — resumed after a restart.

Trees are named by a topic's first version, so every API call that names a topic walks
its version chain back first (:meth:`Topics.lineage`). Joining a tree is one ``Subscribe``
command to the core, which also joins the meta topic's tree.

Subscriptions are durable: after a restart the node rejoins every topic it was subscribed
to, and every tree whose outbox holds our own events not delivered yet, with what the store
remembers (when the subscription began, the heads, the latest topic version, the outbox),
so it backfills only what it missed and never delivers an event twice. 10,000 topics must
not hold the event loop, and with it the API, for seconds: they are resumed in the
background, :data:`RESUME_BATCH` at a time, and a call that names one not resumed yet
resumes it first, so nothing overtakes what the store remembers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from dag import CID, BlockStore, InvalidDescriptor, TopicDescriptor

from ..proto import events as ev
from ..proto.versions.lineage import MAX_VERSION_CHAIN, lineage_problem
from .driver import Driver
from .errors import TopicNotFound
from .node_state import NodeState

__all__ = ["RESUME_BATCH", "Topics"]

# The node's logger: these lines are the node's, and operators filter them by that name.
log = logging.getLogger("pulsar.node")

RESUME_BATCH = 25
"""Durable subscriptions rejoined per turn of the event loop after a restart."""


class Topics:
    """Finds topics (the core's known versions, the local store, the DHT through the
    driver) and joins their trees, resuming durable subscriptions first."""

    __slots__ = ("_driver", "_state", "_store", "_to_resume")

    def __init__(self, driver: Driver, store: BlockStore, state: NodeState) -> None:
        self._driver = driver
        self._store = store
        self._state = state
        self._to_resume: dict[CID, None] = {}
        """Durable subscriptions (and trees with events in the outbox) not rejoined yet."""

    async def get(self, cid: CID) -> TopicDescriptor:
        """A topic descriptor by CID: known versions, the local store, then the DHT."""
        known = self._driver.core.topic(cid)
        if known is not None:
            return known
        block = await self._driver.get_block(cid)
        if block is None:
            raise TopicNotFound(f"topic {cid} not found")
        try:
            topic = TopicDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            raise TopicNotFound(f"{cid} is not a valid topic: {exc}") from None
        return topic

    async def lineage(self, topic_cid: CID) -> tuple[TopicDescriptor, tuple[TopicDescriptor, ...]]:
        """The topic's first version (trees are named by it) and the later versions on the
        way from ``topic_cid`` back to it, oldest first."""
        chain = [await self.get(topic_cid)]
        while (parent := chain[-1].parent) is not None:
            if len(chain) >= MAX_VERSION_CHAIN:
                raise TopicNotFound(f"topic version chain longer than {MAX_VERSION_CHAIN}")
            chain.append(await self.get(parent))
        chain.reverse()
        problem = lineage_problem(chain)  # the core's rule, not a second copy of it
        if problem is not None:
            raise TopicNotFound(problem)
        return chain[0], tuple(chain[1:])

    async def join(
        self,
        topic: TopicDescriptor,
        *,
        deliver: bool,
        since: float | None = None,
        versions: tuple[TopicDescriptor, ...] = (),
        heads: tuple[CID, ...] = (),
        unannounced: tuple[CID, ...] = (),
    ) -> None:
        """Hand the core a ``Subscribe``: it joins the tree, and the meta topic's, itself.
        A durable subscription not resumed yet is resumed first (with its heads and
        versions), so nothing overtakes what the store remembers."""
        await self.resume_pending(topic.cid)
        self._store.put_many([(topic.cid, topic.block)], pinned=True)
        self._driver.handle(ev.Subscribe(topic, deliver, since, heads, versions, unannounced))

    async def enter(
        self, first: TopicDescriptor, versions: tuple[TopicDescriptor, ...] = ()
    ) -> None:
        """Be in the tree of ``first`` (a first version) before a command on it: resumed
        if it is a durable subscription not resumed yet, else joined as a relay unless
        this node is in it already."""
        await self.resume_pending(first.cid)
        if self._driver.core.tree(first.cid) is None:
            await self.join(first, deliver=False, versions=versions)

    def resume(self, topics: Iterable[CID]) -> None:
        """Rejoin ``topics`` (after a restart) in the background, in batches."""
        self._to_resume = dict.fromkeys(topics)
        self._count()
        if self._to_resume:
            self._driver.spawn(self._resume_all())

    def _count(self) -> None:
        """``topics_to_resume`` in the node's metrics: 0 once every one was rejoined (a
        process that holds back its garbage collector meanwhile waits for it)."""
        self._driver.counters["topics_to_resume"] = len(self._to_resume)

    def forget(self, topic_cid: CID) -> None:
        """``topic_cid`` is left: it is not to be resumed any more."""
        self._to_resume.pop(topic_cid, None)
        self._count()

    async def _resume_all(self) -> None:
        """Rejoin every durable subscription, ``RESUME_BATCH`` at a time with the loop free
        in between: 10,000 topics must not hold the event loop (and the API) for seconds."""
        while self._to_resume and not self._driver.stopped:
            for topic in list(self._to_resume)[:RESUME_BATCH]:
                await self.resume_pending(topic)
            await asyncio.sleep(0)  # yield to the loop between batches

    async def resume_pending(self, topic_cid: CID) -> None:
        """Resume ``topic_cid`` now if it is a durable subscription not resumed yet."""
        if topic_cid in self._to_resume:
            del self._to_resume[topic_cid]
            self._count()
            await self._resume(topic_cid)

    async def _resume(self, topic_cid: CID) -> None:
        """Rejoin a durable subscription with what the store remembers: when it began, the
        heads, the latest topic version (so rights and LAST_SEEN survive a restart) and our
        own events that may not have reached anyone (the outbox). A tree we only published
        in is rejoined as a relay, for the outbox alone."""
        try:
            topic = await self.get(topic_cid)
        except TopicNotFound:
            log.warning("subscribed topic %s is no longer available", topic_cid)
            return
        versions: list[TopicDescriptor] = []
        cursor = self._state.latest_version(topic_cid)
        while (cursor is not None and cursor != topic_cid
               and len(versions) < MAX_VERSION_CHAIN):
            block = self._store.get(cursor)
            if block is None:
                break
            try:
                version = TopicDescriptor.from_block(block, cursor)
            except InvalidDescriptor:
                break
            versions.append(version)
            cursor = version.parent
        since = self._state.subscription_since(topic_cid)
        heads = tuple(self._state.heads(topic_cid))
        await self.join(
            topic,
            deliver=since is not None,
            since=since,
            versions=tuple(reversed(versions)),
            heads=heads,
            unannounced=tuple(self._driver.writes.outbox.get(topic_cid, ())),
        )
