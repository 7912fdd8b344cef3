"""``pulsar.Node``: an embedded pulsarcast node for asyncio applications.

The node owns the real I/O — the Kademlia DHT (UDP), the peer transport (TCP, same port
number), the SQLite store — and is the API in front of its runtime driver
(:class:`~pulsar.runtime.driver.Driver`), which feeds everything that happens into the
sans-I/O :class:`~pulsar.proto.core.PulsarCore` and carries out the outputs it returns:
all protocol decisions live in the core; the runtime only translates.

    async with await Node.start(NodeConfig(data_dir="data/a")) as node:
        topic = await node.create_topic("weather")
        sub = await node.subscribe(topic.cid)
        await node.publish(topic.cid, b"12C, clear")
        event = await sub.get()
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Self

from dag import (
    CID,
    BlockStore,
    EventDescriptor,
    EventLinking,
    Identity,
    InvalidDescriptor,
    PeerId,
    Retention,
    TopicDescriptor,
)
from dht import DhtNode

from .config import NodeConfig
from .net.transport import Transport
from .proto import events as ev
from .proto.core import TreeView
from .proto.driven import Core
from .runtime import topic_settings
from .runtime.bootstrap import listen_both, retry_bootstrap
from .runtime.consumers import Consumers
from .runtime.delivery_log import DeliveryLog, LogEntry
from .runtime.driver import Driver
from .runtime.errors import (
    BeforeRetention,
    EventNotFound,
    NotPersisted,
    NotRecorded,
    PayloadTooLarge,
    PublishError,
    StorageFull,
    TopicNotFound,
)
from .runtime.node_state import NodeState
from .runtime.replay import replay_history
from .runtime.routing import DhtRouting
from .runtime.subscription import Subscription
from .runtime.topics import Topics

__all__ = ["BeforeRetention", "EventNotFound", "LogEntry", "Node", "NotPersisted",
           "NotRecorded", "PayloadTooLarge", "PublishError", "StorageFull", "TopicNotFound"]


class Node:
    """A running pulsarcast node. Create with ``await Node.start(config)``."""

    def __init__(self, config: NodeConfig, identity: Identity, store: BlockStore, dht: DhtNode,
                 transport: Transport, routing: DhtRouting) -> None:
        self.config = config
        self.identity = identity
        self.store = store
        """The node's database file and its blocks (``dag.store``)."""
        self.state = NodeState(store)
        """This node's tables in that file (``pulsar.runtime.node_state``)."""
        self.dht = dht
        self.transport = transport
        self._routing = routing
        self._driver = Driver(config, identity, store, self.state, dht, transport, routing)
        self.core: Core = self._driver.core
        self._topics = Topics(self._driver, store, self.state)
        self._log = DeliveryLog(self.state, self._driver.writes)
        self.consumers = Consumers(store, self.state, self._log, self._topics.lineage, self._driver)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def start(cls, config: NodeConfig) -> Node:
        """Open the data directory, start the DHT and the transport on one port, join
        through ``config.bootstrap``; durable subscriptions are rejoined in the background."""
        config.data_dir.mkdir(parents=True, exist_ok=True)
        identity = Identity.load_or_create(config.data_dir / "identity.key")
        store = BlockStore(config.data_dir / "node.sqlite3")
        node: Node | None = None
        dht: DhtNode | None = None
        transport: Transport | None = None
        try:
            holder: dict[str, Driver] = {}
            transport = Transport(
                identity,
                config.transport,
                on_frame=lambda peer, frame: holder["driver"].on_frame(peer, frame),
                on_peer_up=lambda peer, addr: holder["driver"].on_peer_up(peer, addr),
                on_peer_down=lambda peer: holder["driver"].on_peer_down(peer),
                faults=config.faults,
            )
            dht = await listen_both(identity, config, store, transport)
            routing = DhtRouting(dht)
            node = cls(config, identity, store, dht, transport, routing)
            holder["driver"] = node._driver
            dht.set_prover(transport.probe)
            if config.bootstrap:
                contacts = await dht.bootstrap(config.bootstrap)
                await routing.prove_known(config.prove_timeout)
                if not contacts:
                    # The seeds may simply not be up yet: a node must not stay alone.
                    node._driver.spawn(retry_bootstrap(node._driver, dht, routing, config))
            # Enter the membership overlay (its tick retries while no contact is known).
            node._driver.handle(ev.Start())
            node._topics.resume([*node.state.subscriptions(), *node._driver.writes.outbox])
            node._driver.start_background(time.time)
            return node
        except BaseException:
            if node is not None:
                await node.stop()
            else:
                if transport is not None:
                    await transport.close()
                if dht is not None:
                    await dht.stop()
                store.close()
            raise

    async def stop(self) -> None:
        """Leave nothing running; flush and close the store. Trees are not left (a stop is
        not an unsubscribe): on restart the node rejoins."""
        if self.stopped:
            return
        await self._driver.stop()
        await self._routing.close()
        await self.transport.close()
        await self.dht.stop()
        self._driver.writes.flush()
        self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ identity, views

    @property
    def peer_id(self) -> PeerId:
        return self.identity.peer_id

    @property
    def address(self) -> tuple[str, int]:
        """Host and port: UDP for the DHT and TCP for the transport share the number."""
        return self.dht.address

    def tree(self, topic: CID) -> TreeView | None:
        """This node's place in ``topic``'s dissemination tree (parents, children)."""
        return self.core.tree(topic)

    def trees(self) -> list[TreeView]:
        return self.core.trees()

    def repair_links(self, topic: CID) -> tuple[frozenset[PeerId], frozenset[PeerId]]:
        """``(lazy, grafted)`` of ``topic``: the Plumtree links that only announce events,
        and those a GRAFT made eager on top of the tree's edges. Floodsub has neither."""
        return self.core.repair_links(topic)

    def rtts(self) -> dict[PeerId, tuple[float, float]]:
        """``peer -> (smoothed RTT, RTO)`` in seconds for every neighbour measured so far
        (PING/PONG with traffic); empty under floodsub, which does not measure."""
        return self.core.rtt_snapshot()

    @property
    def stopped(self) -> bool:
        return self._driver.stopped

    @property
    def metrics(self) -> dict[str, int]:
        """Counters of the core, the repair layers and this runtime (delivered, duplicates,
        grafts, backfilled, gaps_open, log_entries_pruned, ...), for the API and tests."""
        return self._driver.metrics()

    @property
    def storage_failures(self) -> int:
        """Flushes to SQLite that failed (and were retried): a full disk, an I/O error."""
        return self._driver.writes.failures

    @property
    def rejections(self) -> int:
        return self._driver.rejections

    @property
    def ignored_frames(self) -> int:
        return self._driver.ignored_frames

    # ------------------------------------------------------------------ topics

    async def create_topic(
        self,
        name: str,
        *,
        allowed_publishers: Iterable[PeerId | str] | None = None,
        request_to_publish: Iterable[PeerId | str] | bool | None = None,
        event_linking: EventLinking | str = EventLinking.LAST_SEEN,
        subtopics: dict[str, CID] | None = None,
        retention: Retention | Mapping[str, int] | None = None,
    ) -> TopicDescriptor:
        """Algorithm 1: make the meta topic (only the author may publish on it), then the
        topic linking it; store both in the DHT; join both trees as their root. ``retention``
        (``max_age`` seconds, ``max_events``) bounds the history each subscriber keeps.
        Raises :class:`PublishError` if the DHT did not acknowledge them (``min_acks``)."""
        self._driver.writes.check_disk(self.config.data_dir)
        request = self._driver.next_request()
        topic: TopicDescriptor = await self._driver.command(request, topic_settings.create_topic(
            request, name, allowed_publishers, request_to_publish, event_linking, subtopics,
            retention))
        self.state.add_subscription(topic.cid, time.time())
        return topic

    async def get_topic(self, cid: CID) -> TopicDescriptor:
        """A topic descriptor by CID: known versions, the local store, then the DHT."""
        return await self._topics.get(cid)

    async def get_event(self, cid: CID) -> EventDescriptor:
        """An event descriptor by CID, from the local store or the DHT, fully verified."""
        block = await self._driver.get_block(cid)
        if block is None:
            raise EventNotFound(f"event {cid} not found")
        try:
            return EventDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            raise EventNotFound(f"{cid} is not a valid event: {exc}") from None

    async def topic_versions(self, topic_cid: CID) -> list[TopicDescriptor]:
        """Every known version of the topic, newest first (following ``parent`` links)."""
        first, _ = await self._lineage(topic_cid)
        versions = [self.core.latest(first.cid) or first]
        while versions[-1].parent is not None and len(versions) < 10_000:
            versions.append(await self.get_topic(versions[-1].parent))
        return versions

    async def update_topic(self, topic_cid: CID, **changes: Any) -> TopicDescriptor:
        """A new version of the topic (linking the latest as parent, same meta topic,
        recording the topic's heads), stored and announced as an event on the meta topic.
        Only the author may update; it returns once the announcement is published."""
        topic_settings.check_settings(changes)
        first, _ = await self._lineage(topic_cid)
        if first.author != self.peer_id:
            raise PublishError("only the topic's author may update it")
        await self._topics.enter(first)
        request = self._driver.next_request()
        update = ev.UpdateTopic(request, first.cid, topic_settings.topic_changes(changes))
        return await self._driver.command(request, update)  # type: ignore[no-any-return]

    async def first_version(self, topic: TopicDescriptor) -> TopicDescriptor:
        """Trees are named by a topic's first version; walk back to it."""
        first, _ = await self._lineage(topic.cid)
        return first

    async def _lineage(self, topic_cid: CID) -> tuple[TopicDescriptor, tuple[TopicDescriptor, ...]]:
        """The topic's first version and the later versions back to it, oldest first."""
        return await self._topics.lineage(topic_cid)

    # ------------------------------------------------------------------ subscriptions

    async def subscribe(self, topic_cid: CID, *, replay: bool = False) -> Subscription:
        """Join the topic's tree (and its meta topic's) and return an async iterator of its
        events, each once, in causal order. With ``replay=True`` the whole history is
        backfilled and delivered first (from tree neighbours, and from the DHT through the
        publishers' heads records, so it works with every publisher offline).
        Subscriptions are durable: after a restart the node rejoins, backfills what it
        missed, and never delivers an event twice."""
        first, later = await self._lineage(topic_cid)
        sub = Subscription(first.cid)
        self._driver.subscriptions.setdefault(first.cid, []).append(sub)
        self.state.add_subscription(first.cid, time.time())
        await self._topics.join(first, deliver=True, since=0.0 if replay else None,
                                versions=later)
        return sub

    async def unsubscribe(self, topic_cid: CID) -> None:
        """Leave the tree cleanly (children route around us) and end the iterators."""
        self._topics.forget(topic_cid)
        for sub in self._driver.subscriptions.pop(topic_cid, []):
            sub.close()
        self._driver.writes.wake(topic_cid)  # live streams of this topic see the end
        self.state.remove_subscription(topic_cid)
        self._driver.handle(ev.Unsubscribe(topic_cid))

    def subscribed(self) -> list[CID]:
        """The topics this node is subscribed to (durably), oldest subscription first."""
        return self.state.subscriptions()

    # ------------------------------------------------------------------ the delivery log

    def history(self, topic_cid: CID, *, since: CID | int | float | None = None,
                until: CID | int | float | None = None, limit: int | None = None,
                ) -> AsyncIterator[EventDescriptor]:
        """Replay the events this node delivered for ``topic_cid``, in causal (delivery)
        order, from the durable delivery log. ``since``/``until`` take an event CID, a log
        sequence number (int) or a timestamp (float, seconds since the epoch). A CID or a
        sequence number as ``since`` is exclusive, as ``until`` inclusive; a time selects
        what was delivered at or after ``since`` and strictly before ``until`` (delivery
        times, not the events' ``created``). For a topic never followed here, subscribe with
        ``replay=True`` first: the node then backfills the whole DAG into the log."""
        return self._log.history(topic_cid, since=since, until=until, limit=limit)

    def log_entries(self, topic_cid: CID, *, after: int = 0, before: int | None = None,
                    limit: int = 1000, descending: bool = False) -> list[LogEntry]:
        """One page of the delivery log of ``topic_cid``: entries with ``after < seq <
        before``, oldest first (newest first with ``descending``). The sequence number is
        the cursor the REST API, stream resume and Spark offsets hand out."""
        return self._log.entries(
            topic_cid, after=after, before=before, limit=limit, descending=descending)

    def log_blocks(self, topic_cid: CID, *, after: int = 0, before: int | None = None,
                   limit: int = 1000, descending: bool = False,
                   ) -> list[tuple[int, CID, float, bytes | None]]:
        """:meth:`log_entries` without parsing: ``(seq, event CID, delivered_at, block)``
        as stored (the block None where the operator pruned it), for bulk readers that
        decode the blocks themselves (the REST API's ``format=blocks``). Parsing every
        block again was most of the cost of serving a history (profiled), and the reader
        has to check what it receives anyway."""
        return self._log.blocks(
            topic_cid, after=after, before=before, limit=limit, descending=descending)

    def log_position(self, topic_cid: CID, value: CID | int | float | None) -> int:
        """A cursor for ``value`` (an event CID in the log, a sequence number, or a
        timestamp: the last position delivered before it); 0 for None."""
        return self._log.position(topic_cid, value)

    def retained_from(self, topic_cid: CID) -> int:
        """The first position of ``topic_cid``'s log still held (1 unless its retention
        policy cut older ones; reading on from before it raises :class:`BeforeRetention`)."""
        return self.state.log_retained_from(topic_cid)

    def last_position(self, topic_cid: CID) -> int:
        """The newest position of the delivery log of ``topic_cid`` (0 if empty)."""
        return self._log.last_position(topic_cid)

    async def wait_for_log(self, topic_cid: CID, after: int, timeout: float) -> bool:
        """Wait until the log of ``topic_cid`` holds a position beyond ``after``; False on
        timeout, on unsubscribe and once the node stops. Live streams wait here rather
        than poll."""
        return await self._log.wait(topic_cid, after, timeout)

    # ------------------------------------------------------------------ publishing

    async def publish(self, topic_cid: CID, payload: bytes, *, parent: CID | None = None,
                      content_type: str | None = None,
                      key: str | None = None) -> EventDescriptor:
        """Publish ``payload``. The topic's latest rules decide: if this node may not
        publish but may request to, the request travels up the tree to the first allowed
        node (which becomes the event's publisher). A node that does not follow the topic
        first learns its latest version and heads (DHT heads records), so its event links
        to the topic's newest event. Large payloads go into a chunk tree in the DHT.
        ``content_type`` (e.g. ``application/json``) is signed into the event so every
        reader gets the payload back as it was meant; ``key`` too (on a topic whose
        retention compacts, only the newest event of each key is kept).
        Returns the event once at least ``min_acks`` DHT nodes stored it and it is on its
        way down the tree; raises :class:`PublishError` otherwise."""
        self._driver.payloads.check(payload, content_type, key)
        self._driver.writes.check_disk(self.config.data_dir)
        first, later = await self._lineage(topic_cid)
        await self._topics.enter(first, later)

        async def send(body: bytes | CID) -> EventDescriptor:
            request = self._driver.next_request()
            publish = ev.Publish(first.cid, body, parent, request, content_type, key)
            return await self._driver.command(request, publish)  # type: ignore[no-any-return]

        return await self._driver.payloads.publish(payload, send)

    def replay(self, topic_cid: CID, *, since: CID | float | None = None,
               until: CID | float | None = None, limit: int | None = None,
               partial: bool = False) -> AsyncIterator[EventDescriptor]:
        """The topic's history, oldest first in causal order, found from its CID alone:
        the publishers' heads records in the DHT name the latest version and the heads,
        and the walk follows parent links through the DHT (the local store first), so it
        works with every publisher and subscriber offline. ``since`` (exclusive) and
        ``until`` (inclusive) take an event CID or a time (seconds since the epoch,
        compared with the events' ``created``); the walk stops at ``since``. A one-shot
        read: nothing is subscribed or logged. Raises
        :class:`~pulsar.runtime.replay.ReplayIncomplete` when part of the history could
        not be fetched, unless ``partial`` asks for what was found."""
        return replay_history(self, topic_cid, since=since, until=until, limit=limit,
                              partial=partial)

    async def payload_of(self, event: EventDescriptor) -> bytes:
        """The event's payload, reassembling (and verifying) a chunk tree if needed: from
        the blocks held here (a large event's fragments, written as they arrived), the
        others from the DHT."""
        return await self._driver.payloads.payload_of(event)
