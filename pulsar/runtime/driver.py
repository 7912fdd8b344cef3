"""The runtime driver: feeds the sans-I/O core what happens and carries out what it decides.

All protocol decisions live in the core (:class:`~pulsar.proto.core.PulsarCore`, or the
Floodsub baseline); :class:`Driver` only translates, in both directions. Transport frames
become ``Received``, lost connections ``PeerDown``, failed sends ``SendFailed``, timers
``TimerFired``; the core's outputs become frames on the transport, ``loop.call_later``
timers, DHT puts and look-ups (answered with ``DhtStored``, ``RecordStored``,
``RecordsFetched``, ``BlockFetched``), deliveries to the application, and durable writes
handed to the :class:`~pulsar.runtime.writes.WriteBehind`. Commands (publish, topic
creation and updates) wait here for the output that names them.

The driver owns everything that runs on the node's behalf: the background tasks, the
timers, the DHT look-ups of peers in flight; :meth:`Driver.stop` ends them all. The node
(:class:`pulsar.Node`) holds one driver and is the API in front of it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, assert_never

from dag import (
    CID,
    BlockStore,
    EventDescriptor,
    Identity,
    InvalidDescriptor,
    PeerId,
    Retention,
    TopicDescriptor,
)
from dag.records import HeadsRecord
from dht import BlockNotFound, DhtNode
from dht.keys import dht_key
from pulsar.proto.codec import RUNTIME_TYPES, Frame, decode_frame, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.flood.core import FloodCore
from pulsar.proto.groups.messages import GroupBeat
from pulsar.proto.reconcile.messages import RBlocks, Recon, RWant
from pulsar.proto.repair.state import BackfillConfig

from ..net.errors import PeerUnreachable
from ..net.transport import Transport
from ..proto import events as ev
from ..proto.core import PulsarCore
from ..proto.driven import Core
from ..proto.timers import Timer
from .checkpoint_cut import HeldCheckpoints
from .checkpoints import CheckpointMaker
from .compaction import LogCompaction
from .consumer_groups import ConsumerGroups
from .errors import NotPersisted, NotRecorded, PublishError
from .loop import LagMeter
from .node_config import NodeConfig
from .node_state import NodeState
from .payloads import Payloads
from .peer_faults import PeerFaults
from .reconciler import Reconciler
from .retention import LogRetention, sweep_forever
from .routing import DhtRouting
from .subscription import Subscription
from .writes import WriteBehind

__all__ = ["LOCATE_MISS_FOR", "STOP_FLUSH_TIMEOUT", "Driver"]

# The node's logger: these lines are the node's, and operators filter them by that name.
log = logging.getLogger("pulsar.node")

STOP_FLUSH_TIMEOUT = 3.0
"""How long ``stop()`` waits for the heads records it writes on the way out (each put
returns at its write quorum)."""
LOCATE_MISS_FOR = 60.0
"""Seconds a peer the DHT could not locate is not looked for again."""



_FAILURES: Final[dict[ev.FailureKind, type[Exception]]] = {
    "refused": PublishError,
    "invalid": ValueError,
    "unpersisted": NotPersisted,
    "unrecorded": NotRecorded,
}
"""The exception a caller gets for each kind of failed command."""

class Driver:
    """One node's core and the effects of its outputs. ``subscriptions`` are the
    application's iterators per topic (delivered events are pushed to them); ``writes``
    the durable state written behind; ``payloads`` the chunk trees of large events;
    ``tasks`` what runs in the background, cancelled by :meth:`stop`."""

    def __init__(
        self,
        config: NodeConfig,
        identity: Identity,
        store: BlockStore,
        state: NodeState,
        dht: DhtNode,
        transport: Transport,
        routing: DhtRouting,
    ) -> None:
        self._config = config
        self._me = identity.peer_id
        self._authored_by_me: dict[CID, bool] = {}
        self._state = state
        self._dht = dht
        self._transport = transport
        self._trace = config.tracer
        self._loop = asyncio.get_running_loop()
        # The heads stored with each log append are the core's, read when the flush runs;
        # so is the retention policy the log is cut to (its latest version's).
        # A cut is told to the core on the next loop turn: the write-behind that makes cuts
        # also runs while the core's outputs are being carried out.
        self.held_checkpoints = HeldCheckpoints(store, dht.records, self._author_if_followed)
        dht.records.on_written = self.held_checkpoints.noticed
        self.compaction = LogCompaction(state, store)
        self.lag = LagMeter()
        self.retention = LogRetention(
            state, store, self._retention_of, on_cut=self._history_cut,
            forget_held=lambda cids: dht.records.forget(dht_key(cid) for cid in cids),
            drop_checkpoints=self.held_checkpoints.cut, compaction=self.compaction)
        self.writes = WriteBehind(store, state, heads=lambda topic: self.core.heads(topic),
                                  retention=self.retention)
        self.core: Core
        if config.protocol == "floodsub":
            self.core = FloodCore(identity, routing, lookup=self.writes.local_block)
        else:
            self.core = PulsarCore(
                identity,
                routing,
                config.core,
                lookup=self.writes.local_block,
                is_delivered=state.log_contains,
                backfill=BackfillConfig(reconcile=config.reconcile),
            )
        self.payloads = Payloads(config, store, dht, self.writes, self.spawn)
        self.checkpoints = CheckpointMaker(
            identity, state, store, dht, self._authored, self._is_authored,
            self._checkpoint_made,
            every=config.checkpoint_every, interval=config.checkpoint_interval,
            quorum=config.core.min_acks)
        self.writes.on_append.append(self.checkpoints.appended)
        self.subscriptions: dict[CID, list[Subscription]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._record_writes: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._requests = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._locating: dict[PeerId, asyncio.Task[tuple[str, int] | None]] = {}
        self._locate_missed: dict[PeerId, float] = {}
        self._faults = PeerFaults(config.peer_faults)
        self.rejections = 0
        """Inputs the core refused and frames that did not decode."""
        self.counters: dict[str, int] = {}
        """Counters of the runtime's other rooms (the durable consumers), in :meth:`metrics`."""
        self.groups = ConsumerGroups(identity, self._send, self._topic_links,
                                     counters=self.counters)
        """The consumer groups this node's consumers belong to (their beats)."""
        backfill = self.core.backfill if isinstance(self.core, PulsarCore) else None
        self.reconciler = Reconciler(
            state, self.writes.local_block, self.writes.flush, self._send,
            self._handle_unless_stopped, self.spawn,
            (lambda t, c: False) if backfill is None else backfill.known,
            (lambda t: None) if backfill is None else backfill.horizon, self._topic_links,
            self.counters)
        """Catch-up by range reconciliation (RECON, RWANT, RBLOCKS): asked and answered."""
        self.writes.on_append.append(self.reconciler.appended)
        self.ignored_frames = 0
        """Frames from banned peers, dropped unread."""
        self.stopped = False

    # ------------------------------------------------------------------ commands, lifecycle

    def handle(self, event: ev.InEvent) -> None:
        """Hand ``event`` to the core now and carry out what it returns."""
        self.apply(self.core.handle(event, time.time()))

    def next_request(self) -> int:
        """A new request number, which the core's outcome for a command names."""
        return next(self._requests)

    async def command(self, request: int, command: ev.InEvent) -> Any:
        """Hand ``command`` (carrying ``request``) to the core and wait for its outcome."""
        if self.stopped:  # a publish that was storing its chunks while the node stopped
            raise PublishError("node stopped")
        future: asyncio.Future[Any] = self._loop.create_future()
        self._waiting[request] = future
        self.handle(command)
        try:
            return await future
        finally:
            self._waiting.pop(request, None)

    def start_background(self, clock: Callable[[], float]) -> None:
        """The node's own upkeep: retention sweeps, checkpoints of the topics it authored
        (told to the core first, so its heads records name them again), and the measure of
        how late its event loop runs."""
        self.spawn(sweep_forever(self.retention, self._state.subscriptions, clock))
        self.spawn(self.lag.run())
        self.spawn(self.groups.run(lambda: self.stopped))
        self.spawn(self.reconciler.run(lambda: self.stopped))
        if self._config.protocol == "pulsarcast":
            self.checkpoints.announce()
            self.spawn(self.checkpoints.run_forever(clock))

    def _authored(self) -> list[CID]:
        """The topics this node follows and authored."""
        return [t for t in self._state.subscriptions() if self._is_authored(t)]

    def _is_authored(self, topic: CID) -> bool:
        """Whether ``topic`` is one this node authored (read from the store at start-up,
        before the core has it back). A topic's first version never changes, so each is
        judged once: a node following 10,000 topics must not parse them every second."""
        mine = self._authored_by_me.get(topic)
        if mine is None:
            first = self.core.topic(topic)
            if first is None:
                block = self.writes.local_block(topic)
                try:
                    first = None if block is None else TopicDescriptor.from_block(block, topic)
                except InvalidDescriptor:
                    first = None
            if first is None:
                return False  # not known yet: judged again when asked again
            mine = first.author == self._me and not first.is_meta
            self._authored_by_me[topic] = mine
        return mine

    def _checkpoint_made(self, topic: CID, checkpoint: CID) -> None:
        self._handle_unless_stopped(ev.CheckpointMade(topic, checkpoint))

    def _history_cut(self, topic: CID, before: float) -> None:
        self._loop.call_soon(self._handle_unless_stopped, ev.HistoryCut(topic, before))

    def _handle_unless_stopped(self, event: ev.InEvent) -> None:
        if not self.stopped:
            self.handle(event)

    def _author_if_followed(self, topic: CID) -> PeerId | None:
        """The author of ``topic`` if this node follows it (its checkpoints are noted)."""
        if not self.core.is_subscribed(topic):
            return None
        first = self.core.topic(topic)
        return None if first is None else first.author

    def _compacts(self, topic: CID) -> bool:
        policy = self._retention_of(topic)
        return policy is not None and policy.compact

    def _retention_of(self, topic: CID) -> Retention | None:
        latest = self.core.latest(topic)
        return None if latest is None else latest.retention

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, in the task set :meth:`stop` cancels."""
        task = self._loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def stop(self) -> None:
        """Write the heads records armed after the last publishes (not lost with the
        timers: a stopped publisher's record names its last events), then end everything:
        timers, the application's iterators, waiting commands (failed), log readers,
        tasks. The caller closes the transport, the DHT and the store after."""
        self.handle(ev.Flush())
        self.groups.stop()  # the others take this node's group shares over at once
        self.reconciler.stop()
        if self._record_writes:
            await asyncio.wait(self._record_writes, timeout=STOP_FLUSH_TIMEOUT)
        self.halt()
        for handle in self._timers:
            handle.cancel()
        for subs in self.subscriptions.values():
            for sub in subs:
                sub.close()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(PublishError("node stopped"))
        self.writes.wake_all()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def halt(self) -> None:
        """From now on nothing is handed to the core and failed writes are not retried
        (what :meth:`stop` begins with; a test simulating a crash calls it alone)."""
        self.stopped = True
        self.writes.stopped = True

    def metrics(self) -> dict[str, int]:
        """The core's counters and this runtime's."""
        return {**self.core.counters(), "rejected_frames": self.rejections,
                "storage_failures": self.writes.failures,
                "peer_bans": self._faults.bans, "ignored_frames": self.ignored_frames,
                "log_entries_pruned": self.retention.pruned,
                "checkpoint_blocks_cut": self.held_checkpoints.dropped,
                "log_entries_compacted": self.compaction.compacted,
                "events_compacted_on_arrival": self.compaction.stale_dropped,
                "checkpoints_made": self.checkpoints.made,
                "loop_lag_max_ms": self.lag.max_ms,
                "checkpoint_stores_failed": self.checkpoints.failed, **self.counters}

    # ------------------------------------------------------------------ inputs

    def on_frame(self, peer: PeerId, frame: bytes) -> None:
        """A frame from the transport: decoded and handed to the core, unless its sender
        is banned (dropped unread) or it does not decode (a fault of the sender's)."""
        if self._faults.banned(peer, time.monotonic()):
            self.ignored_frames += 1
            return
        try:
            message = decode_frame(frame)
        except MessageError as exc:
            self.rejections += 1
            self._fault(peer, "malformed", str(exc))
            return
        if isinstance(message, GroupBeat):
            self.groups.on_beat(peer, message)
            return
        if isinstance(message, Recon | RWant | RBlocks):
            self.reconciler.on_frame(peer, message)
            return
        if self._trace is not None:
            self._trace.received(peer, message, len(frame))
        self.handle(ev.Received(peer, message))

    def _fault(self, peer: PeerId, kind: str, detail: str) -> None:
        """A peer's fault: a summary line at most every ``log_interval``, and past the ban
        score a disconnect, its frames ignored until the ban ends."""
        verdict = self._faults.fault(peer, kind, detail, time.monotonic())
        if verdict.log is not None:
            log.warning("%s", verdict.log)
        if verdict.ban and not self.stopped:
            self.spawn(self._transport.disconnect(peer))

    def on_peer_up(self, peer: PeerId, address: tuple[str, int]) -> None:
        """A transport handshake proved that ``peer`` listens at ``address``: the DHT
        records the proof and keeps the address as a contact."""
        host, port = address
        if port:
            try:
                self._dht.record_proof(peer, host, port)
            except ValueError as exc:
                log.warning("peer %s at %s:%d: %s", peer, host, port, exc)
            # The DHT remembers where transport peers listen: if its routing table runs
            # thin (a lossy link, a partition), it pings them again, with backoff.
            try:
                self._dht.offer_contact((host, port))
            except ValueError as exc:  # not a literal IP and port
                log.debug("peer %s at %s:%d not offered to the DHT: %s", peer, host, port, exc)

    def on_peer_down(self, peer: PeerId) -> None:
        """The connection to ``peer`` was lost: the core routes around it."""
        if not self.stopped:
            self.handle(ev.PeerDown(peer))
            self.reconciler.peer_down(peer)

    # ------------------------------------------------------------------ outputs

    def apply(self, outputs: ev.Out) -> None:
        """Carry out the core's outputs, in order."""
        for out in outputs:
            match out:
                case ev.Send():
                    self._send(out.peer, out.message)
                case ev.Deliver():
                    self._deliver(out.topic, out.event)
                    if self._trace is not None:
                        self._trace.delivered(out.topic, out.event, out.hop)
                case ev.StoreLocal():
                    self.writes.store_block(out.cid, out.block)
                case ev.SetTimer():
                    self._set_timer(out.delay, out.timer)
                case ev.StoreDht():
                    self.writes.store_block(out.cid, out.block)
                    self.spawn(self._store_in_dht(out.cid, out.block))
                case ev.Fetch():
                    self.spawn(self._fetch(out.cid))
                case ev.StoreRecord():
                    task = self.spawn(self._store_record(out.record))
                    self._record_writes.add(task)
                    task.add_done_callback(self._record_writes.discard)
                case ev.FetchRecords():
                    self.spawn(self._fetch_records(out.topic, out.publishers, out.request))
                case ev.VersionAdopted():
                    self.writes.store_block(out.version.cid, out.version.block)
                    self.writes.flush()
                    self._state.set_latest_version(out.topic, out.version.cid)
                case ev.KeepPublished():
                    self.writes.keep_published(out.topic, out.event)
                    if self._trace is not None:
                        # Traced when it goes out (the testbed's latency starts here),
                        # not at the acknowledgement, which also waits for the record.
                        block = self.writes.local_block(out.event)
                        if block is not None:
                            self._trace.published(EventDescriptor.from_block(block, out.event))
                case ev.Published():
                    if self._trace is not None and not self.core.keeps_outbox:
                        # A core with no outbox (Floodsub) sends at once: traced here.
                        self._trace.published(out.event)
                    self._acknowledge(out.request, out.event)
                case ev.TopicReady():
                    self._acknowledge(out.request, out.topic)
                case ev.CommandFailed():
                    future = self._waiting.get(out.request)
                    if future is not None and not future.done():
                        future.set_exception(_FAILURES[out.kind](out.reason))
                case ev.Rejected():
                    self.rejections += 1
                    if out.peer is None:
                        log.warning("rejected input: %s", out.reason)
                    else:
                        self._fault(out.peer, "rejected", out.reason)
                case ev.Reconcile():
                    self.reconciler.start(out.topic, out.peer)
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
        """Resolve ``request`` once this loop iteration's writes are committed: a caller
        that saw its publish acknowledged can count on it after a crash."""
        self.writes.acknowledge(self._waiting.get(request), value)

    def _deliver(self, topic: CID, event: EventDescriptor) -> None:
        if event.key is not None and self._compacts(topic) and self.compaction.stale(topic,
                                                                                    event):
            return  # a newer event of its key is in the log: compacted, not delivered
        self.writes.deliver(topic, event.cid, round(event.created_at * 1000))
        if isinstance(event.payload, CID) and self.writes.local_block(event.payload) is None:
            self.spawn(self.payloads.keep(event))
        for sub in self.subscriptions.get(topic, ()):
            sub._push(event)

    def _set_timer(self, delay: float, timer: Timer) -> None:
        def fire() -> None:
            self._timers.discard(handle)
            if not self.stopped:
                self.handle(ev.TimerFired(timer))

        handle = self._loop.call_later(delay, fire)
        self._timers.add(handle)

    # ------------------------------------------------------------------ sends

    def _topic_links(self, topic: CID) -> set[PeerId]:
        """The peers ``topic``'s events travel to and from here: its tree's edges and its
        lazy and grafted links (where a consumer group's announces go)."""
        links: set[PeerId] = set()
        tree = self.core.tree(topic)
        if tree is not None:
            links.update(tree.parents, tree.children)
        lazy, grafted = self.core.repair_links(topic)
        links.update(lazy, grafted)
        links.discard(self._me)
        return links

    def _send(self, peer: PeerId, message: Frame) -> None:
        if self.stopped:
            return
        frame = encode_message(message)
        if self._trace is not None and not isinstance(message, RUNTIME_TYPES):
            self._trace.sent(peer, message, len(frame))
        address = self._transport.address_of(peer)
        if address is not None and self._transport.send_nowait(peer, address, frame):
            return
        # Not connected (or its queue is full): a task that waits, so a peer that cannot be
        # reached is reported to the core as SendFailed instead of vanishing.
        self.spawn(self._send_slow(peer, address or self._address_of(peer), frame))

    async def _send_slow(self, peer: PeerId, address: tuple[str, int] | None, frame: bytes) -> None:
        try:
            if address is None:
                address = await self._locate(peer)
            await self._transport.send(peer, address, frame)
        except (PeerUnreachable, ConnectionError, OSError) as exc:
            log.info("could not reach %s: %s", peer, exc)
            if not self.stopped:
                self.handle(ev.SendFailed(peer))

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
            pending = self._locating[peer] = self.spawn(self._dht.locate(peer))
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
        for contact in self._dht.closest_known_peers(peer, 1):
            if contact.node_id == peer.kademlia_id():
                return contact.address
        return None

    # ------------------------------------------------------------------ the DHT

    async def _store_in_dht(self, cid: CID, block: bytes) -> None:
        acks = 0
        # The write quorum (Kafka's acks): the core needs min_acks to count the block as
        # persisted, so the put returns then and the other replicas are written behind.
        quorum = None if self._config.wait_all_replicas else max(1, self._config.core.min_acks)
        try:
            results = await self._dht.put_many([block], quorum=quorum)
            acks = results[0].acks if results else 0
        except Exception as exc:  # the block is stored locally; peers can still fetch it
            log.warning("DHT store of %s failed: %s", cid, exc)
        if not self.stopped:
            self.handle(ev.DhtStored(cid, acks))

    async def _store_record(self, record: HeadsRecord) -> None:
        # The write quorum, as for events: ``stop()`` waits for these, and waiting for
        # every replica made it wait its whole STOP_FLUSH_TIMEOUT whenever one replica was
        # itself stopping (three teardowns in the suite took 3 s instead of 1). The other
        # replicas' STOREs are on the wire by the first acknowledgement.
        quorum = None if self._config.wait_all_replicas else max(1, self._config.core.min_acks)
        acks = 0
        try:
            acks = await self._dht.put_record(record, quorum=quorum)
        except Exception as exc:  # the core writes it again (or fails the publishes)
            log.info("heads record of %s not stored: %s", record.topic, exc)
        if not self.stopped:
            self.handle(ev.RecordStored(record.topic, record.seq, acks))

    async def _fetch_records(self, topic: CID, publishers: tuple[PeerId, ...],
                             request: int = 0) -> None:
        """The heads records of ``topic`` by ``publishers``, looked up concurrently; the
        core always gets an answer, empty when nothing was found."""

        async def one(publisher: PeerId) -> HeadsRecord | None:
            try:
                return await self._dht.get_record(topic, publisher)
            except Exception as exc:
                log.info("heads record of %s by %s: %s", topic, publisher, exc)
                return None

        found = await asyncio.gather(*(one(p) for p in publishers))
        records = tuple(r for r in found if r is not None)
        if not self.stopped:
            self.handle(ev.RecordsFetched(topic, records, request))

    async def _fetch(self, cid: CID) -> None:
        local = self.writes.local_block(cid)
        block = local if local is not None else await self.get_block(cid)
        if local is None and block is not None and self._trace is not None:
            self._trace.fetched(cid, block)
        if not self.stopped:
            self.handle(ev.BlockFetched(cid, block))

    async def get_block(self, cid: CID) -> bytes | None:
        """A block from the pending writes, the local store, or else the DHT; None when
        nobody has it."""
        local = self.writes.local_block(cid)
        if local is not None:
            return local
        try:
            return await self._dht.get(cid)
        except (TimeoutError, BlockNotFound):
            return None
        except Exception as exc:
            log.warning("DHT get of %s failed: %s", cid, exc)
            return None
