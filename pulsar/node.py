"""``pulsar.Node``: an embedded pulsarcast node for asyncio applications.

The node owns the real I/O — the Kademlia DHT (UDP), the peer transport (TCP, same port
number), the SQLite store, timers — and feeds everything that happens into the sans-I/O
:class:`~pulsar.proto.core.PulsarCore`, carrying out the outputs it returns. All protocol
decisions live in the core; this module only translates.

    async with await Node.start(NodeConfig(data_dir="data/a")) as node:
        topic = await node.create_topic("weather")
        sub = await node.subscribe(topic.cid)
        await node.publish(topic.cid, b"12C, clear")
        event = await sub.get()
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Self, assert_never

from dag import (
    CID,
    BlockStore,
    EventDescriptor,
    EventLinking,
    Identity,
    InvalidDescriptor,
    PeerId,
    PublishRule,
    TopicDescriptor,
    check_content_type,
)
from dag.chunks import assemble, split
from dag.records import HeadsRecord
from dht import BlockNotFound, DhtNode

from .config import NodeConfig
from .net.errors import PeerUnreachable
from .net.transport import Transport
from .proto import events as ev
from .proto.core import PulsarCore, TreeView
from .proto.floodsub import FloodCore
from .proto.messages import MessageError
from .proto.timers import Timer
from .proto.wire import Message, decode_message, encode_message
from .runtime.node_state import NodeState
from .runtime.peer_faults import PeerFaults
from .runtime.replay import replay_history
from .runtime.routing import DhtRouting
from .runtime.subscription import Subscription

__all__ = [
    "EventNotFound", "LogEntry", "Node", "NotPersisted", "NotRecorded", "PayloadTooLarge",
    "PublishError", "StorageFull", "TopicNotFound",
]

log = logging.getLogger("pulsar.node")

STOP_FLUSH_TIMEOUT = 3.0
"""How long ``stop()`` waits for the heads records it writes on the way out (each put
returns at its write quorum)."""
RESUME_BATCH = 25
"""Durable subscriptions rejoined per turn of the event loop after a restart."""
OUTBOX_PER_TOPIC = 64
"""Own published events kept per tree until delivered here. A tree this node only relays
never delivers, so its outbox is a window of the newest: by the time 64 later publishes
went out, HEADS ticks have long told the neighbours of the older ones."""
MIN_FREE_BYTES = 8 * 1024 * 1024
"""A publish or topic creation is refused while the data directory has less free."""
FLUSH_RETRY = 1.0
"""Seconds before writes that failed (a full disk) are tried again."""
LOCATE_MISS_FOR = 60.0
"""Seconds a peer the DHT could not locate is not looked for again."""


class PublishError(RuntimeError):
    """A publish the topic's rules refused, or that could not reach a publisher."""


class NotPersisted(PublishError):
    """Fewer DHT nodes than ``min_acks`` stored the event (or topic): it was not published.
    The network, not the caller, is at fault; trying again later may succeed."""


class NotRecorded(NotPersisted):
    """The event was stored and sent on, but no heads record naming it reached
    ``min_acks`` DHT nodes: it may still be delivered (an indeterminate outcome), yet a
    reader of the topic's CID alone might not find it, so the publish is not
    acknowledged."""


class StorageFull(PublishError):
    """The node's disk cannot take the write (full, or writes are failing): refused
    before anything was stored or sent. Retry once space is freed."""


class PayloadTooLarge(PublishError, ValueError):
    """The payload is over the node's limit (``core.fragments.max_event_size``): refused at
    once, before anything is stored or sent."""


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One delivered event at its position in this node's delivery log of a topic."""

    seq: int
    event: EventDescriptor
    delivered_at: float


class TopicNotFound(LookupError):
    """No valid topic descriptor could be found for a CID (locally or in the DHT)."""


class EventNotFound(LookupError):
    """No valid event descriptor could be found for a CID (locally or in the DHT)."""


class Node:
    """A running pulsarcast node. Create with ``await Node.start(config)``."""

    def __init__(
        self,
        config: NodeConfig,
        identity: Identity,
        store: BlockStore,
        dht: DhtNode,
        transport: Transport,
        routing: DhtRouting,
    ) -> None:
        self.config = config
        self.identity = identity
        self.store = store
        """The node's database file and its blocks (``dag.store``)."""
        self.state = NodeState(store)
        """This node's tables in that file: subscriptions, heads, topic versions, outbox
        and delivery log (``pulsar.runtime.node_state``)."""
        self.dht = dht
        self.transport = transport
        self._routing = routing
        self.core: PulsarCore | FloodCore
        if config.protocol == "floodsub":
            self.core = FloodCore(identity, routing, lookup=self._local_block)
        else:
            self.core = PulsarCore(
                identity,
                routing,
                config.core,
                lookup=self._local_block,
                is_delivered=self.state.log_contains,
            )
        self._trace = config.tracer
        self._loop = asyncio.get_running_loop()
        self._requests = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._subscriptions: dict[CID, list[Subscription]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._record_writes: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._pending_blocks: dict[CID, bytes] = {}
        self._pending_log: dict[CID, list[CID]] = {}
        self._pending_kept: list[tuple[CID, CID]] = []
        self._pending_acks: list[tuple[int, object]] = []
        """Publishes (and new topics) done in the core but not acknowledged yet: their
        futures are resolved by ``_flush`` once what they wrote is committed."""
        self._outbox: dict[CID, dict[CID, None]] = {
            topic: dict.fromkeys(events) for topic, events in self.state.outbox().items()
        }
        """This node's published events not delivered here yet, per tree, as in the store's
        outbox (newest last, at most ``OUTBOX_PER_TOPIC`` per tree)."""
        self._flush_scheduled = False
        self._retry_armed = False
        self.storage_failures = 0
        """Flushes to SQLite that failed (and were retried): a full disk, an I/O error."""
        self._stopped = False
        self._to_resume: dict[CID, None] = {}
        self._locating: dict[PeerId, asyncio.Task[tuple[str, int] | None]] = {}
        self._locate_missed: dict[PeerId, float] = {}
        """Durable subscriptions (and trees with events in the outbox) not rejoined yet: a
        restart resumes them in batches in the background (the API answers at once); a call
        that names one resumes it first."""
        self._log_grew: dict[CID, asyncio.Event] = {}
        self.rejections = 0
        self.ignored_frames = 0
        self._faults = PeerFaults(config.peer_faults)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def start(cls, config: NodeConfig) -> Node:
        """Open the data directory, start the DHT and the transport on one port number,
        join through ``config.bootstrap`` and prove the peer ids of known contacts. Durable
        subscriptions are rejoined in the background, in batches."""
        config.data_dir.mkdir(parents=True, exist_ok=True)
        identity = Identity.load_or_create(config.data_dir / "identity.key")
        store = BlockStore(config.data_dir / "node.sqlite3")
        node: Node | None = None
        dht: DhtNode | None = None
        transport: Transport | None = None
        try:
            holder: dict[str, Node] = {}
            transport = Transport(
                identity,
                config.transport,
                on_frame=lambda peer, frame: holder["node"]._on_frame(peer, frame),
                on_peer_up=lambda peer, addr: holder["node"]._on_peer_up(peer, addr),
                on_peer_down=lambda peer: holder["node"]._on_peer_down(peer),
                faults=config.faults,
            )
            dht = await _listen_both(identity, config, store, transport)
            routing = DhtRouting(dht)
            node = cls(config, identity, store, dht, transport, routing)
            holder["node"] = node
            dht.set_prover(transport.probe)
            if config.bootstrap:
                contacts = await dht.bootstrap(config.bootstrap)
                await routing.prove_known(config.prove_timeout)
                if not contacts:
                    # The seeds may simply not be up yet: a node must not stay alone.
                    node._spawn(node._retry_bootstrap())
            # Enter the membership overlay (its tick retries while no contact is known).
            node._apply(node.core.handle(ev.Start(), time.time()))
            node._to_resume = dict.fromkeys([*node.state.subscriptions(), *node._outbox])
            if node._to_resume:
                node._spawn(node._resume_all())
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

    async def _retry_bootstrap(self) -> None:
        """Bootstrap again with exponential backoff (1 s doubling to 60 s) while the routing
        table is empty; once contacts exist, rejoin every tree through them."""
        delay = 1.0
        while not self._stopped:
            await asyncio.sleep(delay)
            try:
                contacts = await self.dht.bootstrap(self.config.bootstrap)
            except Exception as exc:  # a resolver error, a socket error: try again later
                log.info("bootstrap retry failed: %s", exc)
                contacts = 0
            if contacts:
                await self._routing.prove_known(self.config.prove_timeout)
                log.info("bootstrapped on retry: %d contacts", contacts)
                return
            delay = min(delay * 2, 60.0)

    async def stop(self) -> None:
        """Leave nothing running: timers, tasks, transport, DHT; flush and close the store.
        Trees are not left (a stop is not an unsubscribe): on restart the node rejoins."""
        if self._stopped:
            return
        # Heads records armed after the last publishes are written now, not lost with the
        # timers: a stopped publisher's record names its last events.
        self._apply(self.core.handle(ev.Flush(), time.time()))
        if self._record_writes:
            await asyncio.wait(self._record_writes, timeout=STOP_FLUSH_TIMEOUT)
        self._stopped = True
        for handle in self._timers:
            handle.cancel()
        for subs in self._subscriptions.values():
            for sub in subs:
                sub.close()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(PublishError("node stopped"))
        for grew in self._log_grew.values():
            grew.set()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._routing.close()
        await self.transport.close()
        await self.dht.stop()
        self._flush()
        self.store.close()

    def _check_disk(self) -> None:
        """Refuse new work before anything is stored or sent when the data directory
        cannot take it: earlier writes are still failing, or less than
        ``MIN_FREE_BYTES`` is free. A refused publish is a clean failure; one that
        started and then could not be committed would be indeterminate."""
        free: int | None
        try:
            free = shutil.disk_usage(self.config.data_dir).free
        except OSError:
            free = None
        if self._retry_armed or (free is not None and free < MIN_FREE_BYTES):
            raise StorageFull(
                f"the node's data directory {self.config.data_dir} cannot take more "
                f"({'writes are failing' if self._retry_armed else f'{free} bytes free'}); "
                "nothing was published: free disk space, then try again")

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
        if isinstance(self.core, FloodCore):
            return frozenset(), frozenset()
        lazy = self.core.lazy
        return frozenset(lazy.lazy(topic)), frozenset(lazy.eager_extra(topic))

    def rtts(self) -> dict[PeerId, tuple[float, float]]:
        """``peer -> (smoothed RTT, RTO)`` in seconds for every neighbour measured so far
        (PING/PONG with traffic); empty under floodsub, which does not measure."""
        if isinstance(self.core, FloodCore):
            return {}
        return self.core.rtt.snapshot()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def metrics(self) -> dict[str, int]:
        """Counters of the core, the repair layers and this runtime (for the API and tests):
        delivered, duplicates, grafts, prunes, backfilled, gaps_open, gaps_reported, ..."""
        return {**self.core.counters(), "rejected_frames": self.rejections,
                "storage_failures": self.storage_failures,
                "peer_bans": self._faults.bans, "ignored_frames": self.ignored_frames}

    # ------------------------------------------------------------------ topics

    async def create_topic(
        self,
        name: str,
        *,
        allowed_publishers: Iterable[PeerId | str] | None = None,
        request_to_publish: Iterable[PeerId | str] | bool | None = None,
        event_linking: EventLinking | str = EventLinking.LAST_SEEN,
        subtopics: dict[str, CID] | None = None,
    ) -> TopicDescriptor:
        """Algorithm 1: make the meta topic (only the author may publish on it), then the
        topic linking it; store both in the DHT; join both trees as their root. Raises
        :class:`PublishError` if the DHT did not acknowledge them (``min_acks``) and
        ``ValueError`` for settings the schema refuses."""
        self._check_disk()
        peers = _peers(allowed_publishers)
        request = next(self._requests)
        topic: TopicDescriptor = await self._command(
            request,
            ev.CreateTopic(
                request,
                name,
                None if peers is None else tuple(peers),
                _rule_arg(request_to_publish),
                EventLinking(event_linking),
                tuple((subtopics or {}).items()),
            ),
        )
        self.state.add_subscription(topic.cid, time.time())
        return topic

    async def get_topic(self, cid: CID) -> TopicDescriptor:
        """A topic descriptor by CID: known versions, the local store, then the DHT."""
        known = self.core.topic(cid)
        if known is not None:
            return known
        block = await self._get_block(cid)
        if block is None:
            raise TopicNotFound(f"topic {cid} not found")
        try:
            topic = TopicDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            raise TopicNotFound(f"{cid} is not a valid topic: {exc}") from None
        return topic

    async def get_event(self, cid: CID) -> EventDescriptor:
        """An event descriptor by CID, from the local store or the DHT, fully verified."""
        block = await self._get_block(cid)
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
        unknown = set(changes) - {
            "name",
            "allowed_publishers",
            "request_to_publish",
            "event_linking",
            "subtopics",
        }
        if unknown:
            raise TypeError(f"unknown topic settings: {sorted(unknown)}")
        first, _ = await self._lineage(topic_cid)
        if first.author != self.peer_id:
            raise PublishError("only the topic's author may update it")
        await self._resume_pending(first.cid)
        if self.core.tree(first.cid) is None:
            await self._join(first, deliver=False)
        linking = changes.get("event_linking")
        subtopics = changes.get("subtopics")
        request = next(self._requests)
        return await self._command(  # type: ignore[no-any-return]
            request,
            ev.UpdateTopic(
                request,
                first.cid,
                ev.TopicChanges(
                    name=changes.get("name"),
                    allowed_publishers=(
                        _rule(changes["allowed_publishers"], False)
                        if "allowed_publishers" in changes
                        else None
                    ),
                    request_to_publish=(
                        _rule(changes["request_to_publish"], True)
                        if "request_to_publish" in changes
                        else None
                    ),
                    event_linking=None if linking is None else EventLinking(linking),
                    subtopics=None if subtopics is None else tuple(dict(subtopics).items()),
                ),
            ),
        )

    async def _command(self, request: int, command: ev.InEvent) -> Any:
        """Hand ``command`` (carrying ``request``) to the core and wait for its outcome."""
        if self._stopped:  # a publish that was storing its chunks while the node stopped
            raise PublishError("node stopped")
        future: asyncio.Future[Any] = self._loop.create_future()
        self._waiting[request] = future
        self._apply(self.core.handle(command, time.time()))
        try:
            return await future
        finally:
            self._waiting.pop(request, None)

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
        self._subscriptions.setdefault(first.cid, []).append(sub)
        self.state.add_subscription(first.cid, time.time())
        await self._join(first, deliver=True, since=0.0 if replay else None, versions=later)
        return sub

    async def history(
        self,
        topic_cid: CID,
        *,
        since: CID | int | float | None = None,
        until: CID | int | float | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[EventDescriptor]:
        """Replay the events this node delivered for ``topic_cid``, in causal (delivery)
        order, from the durable delivery log. ``since``/``until`` take an event CID, a log
        sequence number (int) or a timestamp (float, seconds since the epoch). A CID or a
        sequence number as ``since`` is exclusive, as ``until`` inclusive; a time selects
        what was delivered at or after ``since`` and strictly before ``until`` (delivery
        times, not the events' ``created``). For a topic never followed here, subscribe with
        ``replay=True`` first: the node then backfills the whole DAG into the log."""
        after = self._log_position(topic_cid, since, 0) or 0
        last = self._log_position(topic_cid, until, None)
        remaining = limit
        while remaining is None or remaining > 0:
            size = 1000 if remaining is None else min(1000, remaining)
            entries = self.log_entries(topic_cid, after=after, limit=size)
            if not entries:
                return
            for entry in entries:
                if last is not None and entry.seq > last:
                    return
                yield entry.event
                after = entry.seq
                if remaining is not None:
                    remaining -= 1
                    if remaining == 0:
                        return

    def log_entries(
        self,
        topic_cid: CID,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int = 1000,
        descending: bool = False,
    ) -> list[LogEntry]:
        """One page of the delivery log of ``topic_cid``: entries with ``after < seq <
        before``, oldest first (newest first with ``descending``). The sequence number is
        the cursor the REST API, stream resume and Spark offsets hand out."""
        rows = self.log_blocks(
            topic_cid, after=after, before=before, limit=limit, descending=descending
        )
        entries = []
        for seq, cid, delivered_at, block in rows:
            if block is None:  # pruned by the operator: the position stays, the event went
                continue
            # Verified (signatures, rights) when it was delivered; parsed again for its
            # fields, which re-checks its CID and encoding but not the signatures.
            event = EventDescriptor.from_block(block, cid, verify_signature=False)
            entries.append(LogEntry(seq, event, delivered_at))
        return entries

    def log_blocks(
        self,
        topic_cid: CID,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int = 1000,
        descending: bool = False,
    ) -> list[tuple[int, CID, float, bytes | None]]:
        """:meth:`log_entries` without parsing: ``(seq, event CID, delivered_at, block)``
        as stored (the block None where the operator pruned it), for bulk readers that
        decode the blocks themselves (the REST API's ``format=blocks``). Parsing every
        block again was most of the cost of serving a history (profiled), and the reader
        has to check what it receives anyway."""
        self._flush()
        return self.state.log_blocks(
            topic_cid, after_seq=after, limit=limit, descending=descending, before_seq=before
        )

    def log_position(self, topic_cid: CID, value: CID | int | float | None) -> int:
        """A cursor for ``value`` (an event CID in the log, a sequence number, or a
        timestamp: the last position delivered before it); 0 for None."""
        return self._log_position(topic_cid, value, 0) or 0

    def last_position(self, topic_cid: CID) -> int:
        """The newest position of the delivery log of ``topic_cid`` (0 if empty)."""
        self._flush()
        return self.state.log_last_seq(topic_cid)

    async def wait_for_log(self, topic_cid: CID, after: int, timeout: float) -> bool:
        """Wait until the log of ``topic_cid`` holds a position beyond ``after``; False on
        timeout, on unsubscribe and once the node stops. Live streams wait here rather
        than poll."""
        if self._stopped:
            return False
        if self.last_position(topic_cid) > after:
            return True
        grew = self._log_grew.setdefault(topic_cid, asyncio.Event())
        grew.clear()
        try:
            async with asyncio.timeout(timeout):
                await grew.wait()
        except TimeoutError:
            pass
        return not self._stopped and self.last_position(topic_cid) > after

    def subscribed(self) -> list[CID]:
        """The topics this node is subscribed to (durably), oldest subscription first."""
        return self.state.subscriptions()

    def _log_position(
        self, topic: CID, value: CID | int | float | None, default: int | None
    ) -> int | None:
        if value is None:
            return default
        if isinstance(value, CID):
            seq = self.state.log_seq_of(topic, value)
            if seq is None:
                raise KeyError(f"event {value} is not in this node's log of {topic}")
            return seq
        if isinstance(value, bool):
            raise TypeError("since/until must be a CID, a sequence number or a timestamp")
        if isinstance(value, int):
            return value
        return self.state.log_seq_at_time(topic, float(value))

    async def unsubscribe(self, topic_cid: CID) -> None:
        """Leave the tree cleanly (children route around us) and end the iterators."""
        self._to_resume.pop(topic_cid, None)
        for sub in self._subscriptions.pop(topic_cid, []):
            sub.close()
        grew = self._log_grew.get(topic_cid)
        if grew is not None:
            grew.set()  # live streams of this topic see the end
        self.state.remove_subscription(topic_cid)
        self._apply(self.core.handle(ev.Unsubscribe(topic_cid), time.time()))

    async def _join(
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
        await self._resume_pending(topic.cid)
        self.store.put_many([(topic.cid, topic.block)], pinned=True)
        self._apply(
            self.core.handle(
                ev.Subscribe(topic, deliver, since, heads, versions, unannounced), time.time()
            )
        )

    async def _resume_all(self) -> None:
        """Rejoin every durable subscription, ``RESUME_BATCH`` at a time with the loop free
        in between: 10,000 topics must not hold the event loop (and the API) for seconds."""
        while self._to_resume and not self._stopped:
            for topic in list(self._to_resume)[:RESUME_BATCH]:
                await self._resume_pending(topic)
            await asyncio.sleep(0)  # yield to the loop between batches

    async def _resume_pending(self, topic_cid: CID) -> None:
        if topic_cid in self._to_resume:
            del self._to_resume[topic_cid]
            await self._resume(topic_cid)

    async def _resume(self, topic_cid: CID) -> None:
        """Rejoin a durable subscription with what the store remembers: when it began, the
        heads, the latest topic version (so rights and LAST_SEEN survive a restart) and our
        own events that may not have reached anyone (the outbox). A tree we only published
        in is rejoined as a relay, for the outbox alone."""
        try:
            topic = await self.get_topic(topic_cid)
        except TopicNotFound:
            log.warning("subscribed topic %s is no longer available", topic_cid)
            return
        versions: list[TopicDescriptor] = []
        cursor = self.state.latest_version(topic_cid)
        while cursor is not None and cursor != topic_cid and len(versions) < 64:
            block = self.store.get(cursor)
            if block is None:
                break
            try:
                version = TopicDescriptor.from_block(block, cursor)
            except InvalidDescriptor:
                break
            versions.append(version)
            cursor = version.parent
        since = self.state.subscription_since(topic_cid)
        heads = tuple(self.state.heads(topic_cid))
        await self._join(
            topic,
            deliver=since is not None,
            since=since,
            versions=tuple(reversed(versions)),
            heads=heads,
            unannounced=tuple(self._outbox.get(topic_cid, ())),
        )

    async def _lineage(self, topic_cid: CID) -> tuple[TopicDescriptor, tuple[TopicDescriptor, ...]]:
        """The topic's first version (trees are named by it) and the later versions on the
        way from ``topic_cid`` back to it, oldest first."""
        topic = await self.get_topic(topic_cid)
        later: list[TopicDescriptor] = []
        while topic.parent is not None:
            if len(later) >= 64:
                raise TopicNotFound("topic version chain longer than 64")
            later.append(topic)
            parent = await self.get_topic(topic.parent)
            if parent.author != topic.author:
                raise TopicNotFound(f"version {topic.cid} has another author than its parent")
            topic = parent
        return topic, tuple(reversed(later))

    async def first_version(self, topic: TopicDescriptor) -> TopicDescriptor:
        """Trees are named by a topic's first version; walk back to it."""
        first, _ = await self._lineage(topic.cid)
        return first

    # ------------------------------------------------------------------ publishing

    async def publish(
        self,
        topic_cid: CID,
        payload: bytes,
        *,
        parent: CID | None = None,
        content_type: str | None = None,
    ) -> EventDescriptor:
        """Publish ``payload``. The topic's latest rules decide: if this node may not
        publish but may request to, the request travels up the tree to the first allowed
        node (which becomes the event's publisher). A node that does not follow the topic
        first learns its latest version and heads (DHT heads records), so its event links
        to the topic's newest event. Large payloads go into a chunk tree in the DHT.
        ``content_type`` (e.g. ``application/json``) is signed into the event so every
        reader gets the payload back as it was meant.
        Returns the event once at least ``min_acks`` DHT nodes stored it and it is on its
        way down the tree; raises :class:`PublishError` otherwise."""
        if not isinstance(payload, bytes):
            raise TypeError("payload must be bytes")
        limit = self.config.core.fragments.max_event_size
        if len(payload) > limit:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes is over this node's limit of {limit} bytes "
                "(core.fragments.max_event_size)"
            )
        check_content_type(content_type)
        self._check_disk()
        first, later = await self._lineage(topic_cid)
        await self._resume_pending(first.cid)
        if self.core.tree(first.cid) is None:
            await self._join(first, deliver=False, versions=later)
        body: bytes | CID = payload
        chunks: asyncio.Task[Any] | None = None
        fragments = self.config.core.fragments
        if len(payload) > self.config.inline_limit:
            if (fragments.enabled and len(payload) > fragments.threshold
                    and self.config.protocol == "pulsarcast"):
                # Travels the tree as fragments: the core reads the chunk tree from the local
                # store (written now, before the command), and the DHT copy (for history and
                # repair) is written alongside, not before, the tree push.
                body, blocks = split(payload)
                self.store.put_many(blocks, pinned=True)
                quorum = max(1, self.config.core.min_acks)
                chunks = self._spawn(self.dht.put_chunks(blocks, quorum=quorum))
            else:
                # Pulled from the DHT by readers: stored at the write quorum before the
                # event exists, so a refusal here is a clean failure (nothing went out).
                body, blocks = split(payload)
                self.store.put_many(blocks, pinned=True)
                quorum = max(1, self.config.core.min_acks)
                results = await self.dht.put_chunks(blocks, quorum=quorum)
                if self.config.core.min_acks and any(r.acks < quorum for r in results):
                    raise NotPersisted(
                        f"the payload's chunk tree was stored on fewer than {quorum} DHT "
                        "node(s) (min_acks); not published — is the node connected to its "
                        "network?")
        request = next(self._requests)
        try:
            event: EventDescriptor = await self._command(
                request, ev.Publish(first.cid, body, parent, request, content_type)
            )
        finally:
            stored = None if chunks is None else await asyncio.gather(
                chunks, return_exceptions=True)
        if stored is not None:
            # The payload is part of what an acknowledgement promises: a reader of the
            # event must be able to fetch its chunk tree after this node is gone.
            quorum = max(1, self.config.core.min_acks) if self.config.core.min_acks else 0
            result = stored[0]
            short = (str(result) if isinstance(result, BaseException) else
                     f"{sum(r.acks < quorum for r in result)} of its {len(result)} blocks "
                     f"on fewer than {quorum} DHT node(s)")
            if isinstance(result, BaseException) or any(r.acks < quorum for r in result):
                log.warning("chunk tree %s not stored in the DHT: %s", body, short)
                raise NotRecorded(
                    f"event {event.cid} went out, but its payload's chunk tree was not stored "
                    f"at the write quorum ({short}): it may still be delivered, but this "
                    "publish is not acknowledged")
        return event

    def replay(
        self,
        topic_cid: CID,
        *,
        since: CID | float | None = None,
        until: CID | float | None = None,
        limit: int | None = None,
        partial: bool = False,
    ) -> AsyncIterator[EventDescriptor]:
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
        if isinstance(event.payload, bytes):
            return event.payload

        async def fetch(cid: CID) -> bytes:
            local = self._local_block(cid)
            if local is not None:
                return local
            block = await self.dht.get(cid)
            self._store_block(cid, block)  # kept: this node now serves it as a replica
            return block

        return await assemble(event.payload, fetch)

    async def _keep_payload(self, event: EventDescriptor) -> None:
        """Fetch and keep the chunk tree of a delivered event that arrived without it
        (backfill, or fragments given up): every subscriber holds what it delivered, so
        the payload outlives its publisher as the event does."""
        try:
            await self.payload_of(event)
        except Exception as exc:  # the DHT may have it later; readers fetch it then
            log.info("payload of %s not kept: %s", event.cid, exc)

    # ------------------------------------------------------------------ I/O callbacks

    def _on_frame(self, peer: PeerId, frame: bytes) -> None:
        if self._faults.banned(peer, time.monotonic()):
            self.ignored_frames += 1
            return
        try:
            message = decode_message(frame)
        except MessageError as exc:
            self.rejections += 1
            self._fault(peer, "malformed", str(exc))
            return
        if self._trace is not None:
            self._trace.received(peer, message, len(frame))
        self._apply(self.core.handle(ev.Received(peer, message), time.time()))

    def _fault(self, peer: PeerId, kind: str, detail: str) -> None:
        """A peer's fault: a summary line at most every ``log_interval``, and past the ban
        score a disconnect, its frames ignored until the ban ends."""
        verdict = self._faults.fault(peer, kind, detail, time.monotonic())
        if verdict.log is not None:
            log.warning("%s", verdict.log)
        if verdict.ban and not self._stopped:
            self._spawn(self.transport.disconnect(peer))

    def _on_peer_up(self, peer: PeerId, address: tuple[str, int]) -> None:
        host, port = address
        if port:
            try:
                self.dht.record_proof(peer, host, port)
            except ValueError as exc:
                log.warning("peer %s at %s:%d: %s", peer, host, port, exc)
            # The DHT remembers where transport peers listen: if its routing table runs
            # thin (a lossy link, a partition), it pings them again, with backoff.
            try:
                self.dht.offer_contact((host, port))
            except ValueError as exc:  # not a literal IP and port
                log.debug("peer %s at %s:%d not offered to the DHT: %s", peer, host, port, exc)

    def _on_peer_down(self, peer: PeerId) -> None:
        if not self._stopped:
            self._apply(self.core.handle(ev.PeerDown(peer), time.time()))

    # ------------------------------------------------------------------ outputs

    def _apply(self, outputs: ev.Out) -> None:
        for out in outputs:
            match out:
                case ev.Send():
                    self._send(out.peer, out.message)
                case ev.Deliver():
                    self._deliver(out.topic, out.event)
                    if self._trace is not None:
                        self._trace.delivered(out.topic, out.event, out.hop)
                case ev.StoreLocal():
                    self._store_block(out.cid, out.block)
                case ev.SetTimer():
                    self._set_timer(out.delay, out.timer)
                case ev.StoreDht():
                    self._store_block(out.cid, out.block)
                    self._spawn(self._store_in_dht(out.cid, out.block))
                case ev.Fetch():
                    self._spawn(self._fetch(out.cid))
                case ev.StoreRecord():
                    task = self._spawn(self._store_record(out.record))
                    self._record_writes.add(task)
                    task.add_done_callback(self._record_writes.discard)
                case ev.FetchRecords():
                    self._spawn(self._fetch_records(out.topic, out.publishers, out.request))
                case ev.VersionAdopted():
                    self._store_block(out.version.cid, out.version.block)
                    self._flush()
                    self.state.set_latest_version(out.topic, out.version.cid)
                case ev.KeepPublished():
                    self._pending_kept.append((out.topic, out.event))
                    self._schedule_flush()
                    if self._trace is not None:
                        # Traced when it goes out (the testbed's latency starts here),
                        # not at the acknowledgement, which also waits for the record.
                        block = self._local_block(out.event)
                        if block is not None:
                            self._trace.published(EventDescriptor.from_block(block, out.event))
                case ev.Published():
                    if self._trace is not None and isinstance(self.core, FloodCore):
                        # Floodsub keeps no outbox (no KeepPublished): it sends at once.
                        self._trace.published(out.event)
                    self._acknowledge(out.request, out.event)
                case ev.TopicReady():
                    self._acknowledge(out.request, out.topic)
                case ev.CommandFailed():
                    future = self._waiting.get(out.request)
                    if future is not None and not future.done():
                        error = {"invalid": ValueError, "unpersisted": NotPersisted,
                                 "unrecorded": NotRecorded}.get(out.kind, PublishError)
                        future.set_exception(error(out.reason))
                case ev.Rejected():
                    self.rejections += 1
                    if out.peer is None:
                        log.warning("rejected input: %s", out.reason)
                    else:
                        self._fault(out.peer, "rejected", out.reason)
                case ev.GapReported():
                    log.warning(
                        "topic %s: delivery went on without %s (%s, %d events released)",
                        out.topic,
                        out.missing,
                        out.reason,
                        out.released,
                    )
                case _:
                    assert_never(out)

    def _acknowledge(self, request: int, value: object) -> None:
        """Resolve ``request`` once this loop iteration's writes are committed (``_flush``):
        a caller that saw its publish acknowledged can count on it after a crash."""
        self._pending_acks.append((request, value))
        self._schedule_flush()

    def _resolve(self, request: int, value: object) -> None:
        future = self._waiting.get(request)
        if future is not None and not future.done():
            future.set_result(value)

    def _send(self, peer: PeerId, message: Message) -> None:
        if self._stopped:
            return
        frame = encode_message(message)
        if self._trace is not None:
            self._trace.sent(peer, message, len(frame))
        address = self.transport.address_of(peer)
        if address is not None and self.transport.send_nowait(peer, address, frame):
            return
        # Not connected (or its queue is full): a task that waits, so a peer that cannot be
        # reached is reported to the core as SendFailed instead of vanishing.
        self._spawn(self._send_slow(peer, address or self._address_of(peer), frame))

    async def _send_slow(self, peer: PeerId, address: tuple[str, int] | None, frame: bytes) -> None:
        try:
            if address is None:
                address = await self._locate(peer)
            await self.transport.send(peer, address, frame)
        except (PeerUnreachable, ConnectionError, OSError) as exc:
            log.info("could not reach %s: %s", peer, exc)
            if not self._stopped:
                self._apply(self.core.handle(ev.SendFailed(peer), time.time()))

    async def _locate(self, peer: PeerId) -> tuple[str, int] | None:
        """A peer our k-buckets do not hold: one DHT crawl for it, shared by the sends that
        wait for it; a miss is remembered for ``LOCATE_MISS_FOR`` seconds, so a peer
        nobody can find costs one crawl a minute, not one per message."""
        now = time.monotonic()
        missed = self._locate_missed.get(peer)
        if missed is not None and now - missed < LOCATE_MISS_FOR:
            return None
        pending = self._locating.get(peer)
        if pending is None:
            pending = self._locating[peer] = self._spawn(self.dht.locate(peer))
            pending.add_done_callback(lambda _: self._locating.pop(peer, None))
        try:
            address = await asyncio.shield(pending)
        except Exception as exc:  # a crawl that failed is a miss like any other
            log.debug("could not locate %s: %s", peer, exc)
            address = None
        if address is None:
            if len(self._locate_missed) > 4096:
                self._locate_missed.clear()
            self._locate_missed[peer] = now
        return address

    def _address_of(self, peer: PeerId) -> tuple[str, int] | None:
        for contact in self.dht.closest_known_peers(peer, 1):
            if contact.node_id == peer.kademlia_id():
                return contact.address
        return None

    def _deliver(self, topic: CID, event: EventDescriptor) -> None:
        self._pending_log.setdefault(topic, []).append(event.cid)
        self._schedule_flush()
        if isinstance(event.payload, CID) and self._local_block(event.payload) is None:
            self._spawn(self._keep_payload(event))
        for sub in self._subscriptions.get(topic, ()):
            sub._push(event)

    def _store_block(self, cid: CID, block: bytes) -> None:
        """Blocks are written in one transaction per loop iteration, not one per event."""
        self._pending_blocks[cid] = block
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write the blocks, delivery-log entries and outbox rows of this loop iteration:
        one transaction each instead of one per event (measured: ~165 us per single-event
        log append). Then acknowledge the publishes whose writes these were.

        A write that fails (a full disk, an I/O error) loses nothing: what it held is kept
        and written again ``FLUSH_RETRY`` later, and the publishes waiting on it are not
        acknowledged meanwhile (they fail if the node stops first)."""
        self._flush_scheduled = False
        logged: dict[CID, list[CID]] = {}
        failure: Exception | None = None
        if self._pending_blocks:
            items = list(self._pending_blocks.items())
            try:
                self.store.put_many(items, pinned=True)
            except Exception as exc:
                log.error("could not store %d blocks (kept, retried): %s", len(items), exc)
                failure = exc
            else:
                for cid, _ in items:
                    self._pending_blocks.pop(cid, None)
        if self._pending_log and failure is None:
            pending = self._pending_log
            self._pending_log = {}
            now = time.time()
            for topic, cids in pending.items():
                try:
                    self.state.log_append(topic, cids, now)
                    # The heads let a restarted node ask only for what it missed.
                    self.state.set_heads(topic, self.core.heads(topic))
                except Exception as exc:
                    log.error("could not log %d deliveries (kept, retried): %s", len(cids), exc)
                    failure = exc
                    self._pending_log.setdefault(topic, [])[:0] = cids
                    continue
                logged[topic] = cids
                grew = self._log_grew.get(topic)
                if grew is not None:
                    grew.set()
                self._outbox_delivered(topic, cids)
        if self._pending_kept and failure is None:
            kept, self._pending_kept = self._pending_kept, []
            try:
                self._keep_published(kept, logged)
            except Exception as exc:
                log.error("could not keep %d published events (kept, retried): %s",
                          len(kept), exc)
                failure = exc
                self._pending_kept[:0] = kept
        if failure is not None:
            self.storage_failures += 1
            if not self._retry_armed and not self._stopped:
                self._retry_armed = True
                self._loop.call_later(FLUSH_RETRY, self._retry_flush)
            return  # nothing is acknowledged on writes that did not happen
        if self._pending_acks:
            acks, self._pending_acks = self._pending_acks, []
            for request, value in acks:
                self._resolve(request, value)

    def _retry_flush(self) -> None:
        self._retry_armed = False
        if not self._stopped:
            self._flush()

    def _keep_published(
        self, kept: list[tuple[CID, CID]], logged: dict[CID, list[CID]]
    ) -> None:
        """Put our new published events in the outbox, except those this very flush logged
        (delivered here: the log and heads name them now); at most ``OUTBOX_PER_TOPIC``
        per tree, the oldest giving way."""
        rows: list[tuple[CID, CID]] = []
        dropped: dict[CID, list[CID]] = {}
        for topic, event in kept:
            if event in logged.get(topic, ()):
                continue
            box = self._outbox.setdefault(topic, {})
            box[event] = None
            rows.append((topic, event))
            while len(box) > OUTBOX_PER_TOPIC:
                oldest = next(iter(box))
                del box[oldest]
                dropped.setdefault(topic, []).append(oldest)
        self.state.outbox_add(rows, time.time())
        for topic, events in dropped.items():
            self.state.outbox_remove(topic, events)

    def _outbox_delivered(self, topic: CID, cids: list[CID]) -> None:
        box = self._outbox.get(topic)
        if not box:
            return
        done = [c for c in cids if c in box]
        if done:
            for cid in done:
                del box[cid]
            if not box:
                del self._outbox[topic]
            self.state.outbox_remove(topic, done)

    def _set_timer(self, delay: float, timer: Timer) -> None:
        def fire() -> None:
            self._timers.discard(handle)
            if not self._stopped:
                self._apply(self.core.handle(ev.TimerFired(timer), time.time()))

        handle = self._loop.call_later(delay, fire)
        self._timers.add(handle)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _store_in_dht(self, cid: CID, block: bytes) -> None:
        acks = 0
        # The write quorum (Kafka's acks): the core needs min_acks to count the block as
        # persisted, so the put returns then and the other replicas are written behind.
        quorum = None if self.config.wait_all_replicas else max(1, self.config.core.min_acks)
        try:
            results = await self.dht.put_many([block], quorum=quorum)
            acks = results[0].acks if results else 0
        except Exception as exc:  # the block is stored locally; peers can still fetch it
            log.warning("DHT store of %s failed: %s", cid, exc)
        if not self._stopped:
            self._apply(self.core.handle(ev.DhtStored(cid, acks), time.time()))

    async def _store_record(self, record: HeadsRecord) -> None:
        # The write quorum, as for events: ``stop()`` waits for these, and waiting for
        # every replica made it wait its whole STOP_FLUSH_TIMEOUT whenever one replica was
        # itself stopping (three teardowns in the suite took 3 s instead of 1). The other
        # replicas' STOREs are on the wire by the first acknowledgement.
        quorum = None if self.config.wait_all_replicas else max(1, self.config.core.min_acks)
        acks = 0
        try:
            acks = await self.dht.put_record(record, quorum=quorum)
        except Exception as exc:  # the core writes it again (or fails the publishes)
            log.info("heads record of %s not stored: %s", record.topic, exc)
        if not self._stopped:
            self._apply(self.core.handle(ev.RecordStored(record.topic, record.seq, acks),
                                         time.time()))

    async def _fetch_records(self, topic: CID, publishers: tuple[PeerId, ...],
                             request: int = 0) -> None:
        """The heads records of ``topic`` by ``publishers``, looked up concurrently; the
        core always gets an answer, empty when nothing was found."""

        async def one(publisher: PeerId) -> HeadsRecord | None:
            try:
                return await self.dht.get_record(topic, publisher)
            except Exception as exc:
                log.info("heads record of %s by %s: %s", topic, publisher, exc)
                return None

        found = await asyncio.gather(*(one(p) for p in publishers))
        records = tuple(r for r in found if r is not None)
        if not self._stopped:
            self._apply(self.core.handle(ev.RecordsFetched(topic, records, request),
                                         time.time()))

    async def _fetch(self, cid: CID) -> None:
        local = self._local_block(cid)
        block = local if local is not None else await self._get_block(cid)
        if local is None and block is not None and self._trace is not None:
            self._trace.fetched(cid, block)
        if not self._stopped:
            self._apply(self.core.handle(ev.BlockFetched(cid, block), time.time()))

    def _local_block(self, cid: CID) -> bytes | None:
        """A block this node holds (for answering GRAFT), pending writes included."""
        return self._pending_blocks.get(cid) or self.store.get(cid)

    async def _get_block(self, cid: CID) -> bytes | None:
        pending = self._pending_blocks.get(cid)
        if pending is not None:
            return pending
        local = self.store.get(cid)
        if local is not None:
            return local
        try:
            return await self.dht.get(cid)
        except (TimeoutError, BlockNotFound):
            return None
        except Exception as exc:
            log.warning("DHT get of %s failed: %s", cid, exc)
            return None


async def _listen_both(
    identity: Identity, config: NodeConfig, store: BlockStore, transport: Transport
) -> DhtNode:
    """Bind UDP (DHT) and TCP (transport) on one port number. With port 0 the number the
    OS gives the UDP socket may be taken for TCP; then both are retried on a new one."""
    attempts = 1 if config.port else 20
    for attempt in range(attempts):
        dht = await DhtNode.start(
            identity, config.host, config.port, (), store=store, config=config.dht
        )
        try:
            await transport.listen(config.host, dht.address[1])
            return dht
        except OSError as exc:
            await dht.stop()
            if attempt == attempts - 1:
                raise
            log.debug("TCP port %d busy (%s); trying another", dht.address[1], exc)
    raise AssertionError("unreachable")


def _peers(value: Iterable[PeerId | str] | None) -> list[PeerId] | None:
    if value is None:
        return None
    return [PeerId.parse(p) for p in value]


def _rule_arg(
    value: Iterable[PeerId | str] | bool | None,
) -> tuple[PeerId, ...] | bool | None:
    if value is None or isinstance(value, bool):
        return value
    return tuple(PeerId.parse(p) for p in value)


def _rule(
    value: PublishRule | Iterable[PeerId | str] | bool | None, request: bool
) -> PublishRule:
    """A rule from what ``update_topic`` accepts: a rule, a list of peers (enabled, these),
    None (disabled: anyone may publish; nobody may request), or for
    ``request_to_publish`` a bool (enabled for anyone / disabled)."""
    if value is None:
        return PublishRule()
    if isinstance(value, PublishRule):
        return value
    if isinstance(value, bool):
        if not request:
            raise TypeError("allowed_publishers takes peers or a PublishRule, not a bool")
        return PublishRule(value, ())
    return PublishRule(True, tuple(PeerId.parse(p) for p in value))
