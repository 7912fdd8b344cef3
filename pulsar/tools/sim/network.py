"""A simulated network of protocol cores: a heap of ``(time, seq, node, input)``.

The simulator owns what the asyncio runtime owns in real life — message delivery with
latency and loss, timers, the DHT, each node's block store and delivery log — and nothing
else: every decision is made by the protocol core under test (:class:`PulsarCore`, or
:class:`FloodCore` for the baseline), the very objects ``pulsar.Node`` drives. A seeded
random source makes every run reproducible, and each core gets its own seeded source so
their timers do not run in lock-step.

Modelled: a latency per link (fixed for the link, drawn uniformly from a range, plus an
optional jitter per message), loss, silent partitions, crashes (peers that talk to or know
the node see it go; routing tables replace it from the same bucket) and restarts from the
node's durable state, Kademlia routing tables (:mod:`pulsar.tools.sim.routing`) and a DHT whose
values live on the k closest live nodes (:mod:`pulsar.tools.sim.dht`). Every message is
encoded and decoded with the wire codec, so its size is the real one.

Bandwidth (``bandwidth``, bytes per second per node, None for unlimited) is the same model
as the transport's fault injector: each node's uplink is a token bucket that sends one
message after the other, so a message leaves once everything the node queued before it (to
any peer) is out, and arrives the link latency later. Downlinks are taken as wide.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, assert_never

from dag import CID, EventDescriptor, Identity, PeerId, TopicDescriptor
from dag.chunks import split
from dag.records import HeadsRecord, heads_record_key
from dht.config import DhtConfig
from pulsar.proto import events as ev
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.core import CoreConfig, PulsarCore
from pulsar.proto.driven import Core
from pulsar.proto.flood.core import FloodCore
from pulsar.proto.repair.messages import Blocks

from .dht import SimDht
from .routing import IdSpace, KnownPeers, node_id

DHT_RPC_TIMEOUT: Final = DhtConfig().rpc_timeout
"""What a DHT request whose datagram was lost costs its caller (the runtime's timeout)."""

__all__ = ["SimNetwork", "SimNode"]

Protocol = Literal["pulsarcast", "floodsub"]
INLINE_LIMIT = 4096
"""Payloads above this are split into a chunk tree (``NodeConfig.inline_limit``)."""
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


@dataclass
class SimNode:
    identity: Identity
    core: Core
    store: dict[CID, bytes] = field(default_factory=dict)
    delivered: dict[CID, list[EventDescriptor]] = field(default_factory=dict)
    hops: list[int] = field(default_factory=list)
    published: dict[int, EventDescriptor] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    gaps: list[Any] = field(default_factory=list)
    topics: dict[int, TopicDescriptor] = field(default_factory=dict)
    latest: dict[CID, CID] = field(default_factory=dict)
    subscriptions: dict[CID, tuple[TopicDescriptor, float]] = field(default_factory=dict)
    """What the node's durable store would remember: topic -> (first version, since)."""
    log: set[tuple[CID, CID]] = field(default_factory=set)
    """(topic, event) delivered: the durable delivery log a restarted core asks."""
    outbox: dict[CID, dict[CID, None]] = field(default_factory=dict)
    """Own published events not delivered here yet, per tree (``KeepPublished``)."""
    relays: dict[CID, TopicDescriptor] = field(default_factory=dict)
    """Trees the node is in without subscribing (it published there): a restart rejoins
    those with an outbox, as ``Node`` does."""
    alive: bool = True
    lives: int = 1

    def in_log(self, topic: CID, cid: CID) -> bool:
        return (topic, cid) in self.log

    @property
    def peer_id(self) -> PeerId:
        return self.identity.peer_id


@dataclass
class SimStats:
    """What the network saw, for :mod:`pulsar.tools.sim.metrics`."""

    messages: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    copies: int = 0
    """Payload copies that reached a node: events down a link, blocks of a backfill
    answer, blocks fetched from the DHT (as the testbed's RMR counts them)."""
    published_at: dict[CID, float] = field(default_factory=dict)
    delivered_pairs: int = 0
    latencies: list[float] = field(default_factory=list)
    max_hop: int = 0
    measure: bool = True
    """Record delivery latencies (off while late subscribers replay old events)."""


class SimNetwork:
    """``n`` nodes. With ``bucket_size=None`` every node knows every other (small test
    networks); otherwise each knows at most ``bucket_size`` random peers per Kademlia
    bucket, as a Kademlia routing table would: enough for greedy routing to reach the node
    closest to any key, and trees deeper than a star."""

    def __init__(
        self,
        n: int,
        *,
        seed: int = 1,
        latency: float = 0.01,
        jitter: float = 0.0,
        loss: float = 0.0,
        bucket_size: int | None = None,
        config: CoreConfig | None = None,
        protocol: Protocol = "pulsarcast",
        latency_range: tuple[float, float] | None = None,
        replicas: int = 8,
        bandwidth: float | None = None,
    ) -> None:
        if bandwidth is not None and not bandwidth > 0:
            raise ValueError("bandwidth must be positive bytes/s")
        self.bandwidth = bandwidth
        self._uplink_free: dict[PeerId, float] = {}
        """Per node: when its uplink will have sent everything queued on it so far."""
        self.rng = random.Random(seed)
        self.latency, self.jitter, self.loss = latency, jitter, loss
        self.latency_range = latency_range
        self._salt = self.rng.getrandbits(64)
        self.protocol: Protocol = protocol
        self.now = 0.0
        self._queue: list[tuple[float, int, PeerId, Any]] = []
        self._seq = 0
        self.messages_sent = 0
        self.bytes_sent = 0
        self.stats = SimStats()
        self._last_sent: Any = None
        self._last_frame = b""
        self._last_decoded: Any = None
        self.drop: Callable[[PeerId, PeerId, Any], bool] | None = None
        """A fault to inject: ``drop(sender, receiver, message)`` true loses the message."""
        self.group: dict[PeerId, int] = {}
        """Partition groups: nodes in different groups cannot reach each other."""
        self._config = config
        self._request = 0
        identities = [Identity.from_seed(self.rng.randbytes(32)) for _ in range(n)]
        ids = [i.peer_id for i in identities]
        self.space = IdSpace(ids)
        self.dht = SimDht(self.space, replicas)
        self._events: dict[CID, EventDescriptor] = {}
        self._blocks: dict[CID, bytes] = {}
        self.known_by: dict[PeerId, set[PeerId]] = {p: set() for p in ids}
        """Whose routing table holds each node: who replaces it when it goes."""
        self.contacts: dict[PeerId, set[PeerId]] = {p: set() for p in ids}
        """Whom each node has exchanged messages with: who notices when it goes."""
        self.nodes: dict[PeerId, SimNode] = {}
        self._order: list[SimNode] = []
        for identity in identities:
            me = identity.peer_id
            if bucket_size is None:
                known = [p for p in ids if p != me]
            else:
                known = self.space.table(me, bucket_size, self.rng)
            for peer in known:
                self.known_by[peer].add(me)
            node = SimNode(identity, None)  # type: ignore[arg-type]
            node.core = self._core(node, KnownPeers(known))
            self.nodes[me] = node
            self._order.append(node)
            self.input(me, ev.Start())  # as Node.start does once its DHT has contacts

    def _core(self, node: SimNode, routing: KnownPeers) -> Core:
        if self.protocol == "floodsub":
            return FloodCore(node.identity, routing, lookup=node.store.get)
        return PulsarCore(
            node.identity,
            routing,
            self._config,
            random.Random(self.rng.getrandbits(64)),
            lookup=node.store.get,
            is_delivered=node.in_log,
        )

    # ------------------------------------------------------------------ links

    def link_latency(self, a: PeerId, b: PeerId) -> float:
        """One way, fixed per link (symmetric), drawn from ``latency_range``."""
        if self.latency_range is None:
            return self.latency
        lo, hi = self.latency_range
        mixed = ((node_id(a) ^ node_id(b) ^ self._salt) * _GOLDEN) & _MASK64
        return lo + (hi - lo) * (mixed / _MASK64)

    def reachable(self, a: PeerId, b: PeerId) -> bool:
        return self.group.get(a, 0) == self.group.get(b, 0)

    def partition(self, groups: Iterable[Iterable[PeerId]]) -> None:
        """Cut the network: a node reaches only its own group (unlisted: group 0).
        Messages across are dropped silently, as the testbed's fault injector does."""
        self.group = {}
        for index, members in enumerate(groups, start=1):
            for peer in members:
                self.group[peer] = index

    def heal(self) -> None:
        self.group = {}

    def _usable_from(self, node: SimNode) -> Callable[[PeerId], bool]:
        me = node.peer_id
        nodes = self.nodes
        if not self.group:
            return lambda p: nodes[p].alive
        return lambda p: nodes[p].alive and self.reachable(me, p)

    # ------------------------------------------------------------------ driving

    def overlay(self) -> dict[PeerId, set[PeerId]]:
        """The membership layer's active view of every live node (none under Floodsub,
        which has no overlay)."""
        if self.protocol != "pulsarcast":
            return {}
        return {
            peer: set(node.core.overlay())
            for peer, node in self.nodes.items()
            if node.alive
        }

    def node(self, index: int) -> SimNode:
        return self._order[index]

    def input(self, peer: PeerId, event: Any, delay: float = 0.0) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay, self._seq, peer, event))

    def settle(self, seconds: float = 30.0) -> None:
        """Run for ``seconds`` of simulated time (periodic timers never empty the queue)."""
        self.run(until=self.now + seconds)

    def run(self, until: float | None = None, max_steps: int = 100_000_000) -> None:
        """Process inputs in time order until the queue is empty (or ``until``)."""
        queue, nodes = self._queue, self.nodes
        for _ in range(max_steps):
            if not queue or (until is not None and queue[0][0] > until):
                break
            when, _, peer, event = heapq.heappop(queue)
            if when > self.now:
                self.now = when
            node = nodes[peer]
            if not node.alive:
                continue
            self._apply(node, node.core.handle(event, self.now))
        if until is not None:
            self.now = max(self.now, until)

    def publish(self, node: SimNode, topic: CID, payload: bytes, parent: CID | None = None,
                content_type: str | None = None) -> int:
        """As ``Node.publish``: a payload over ``INLINE_LIMIT`` is split into a chunk tree,
        stored here and in the DHT, and the event links its root (the core then pushes the
        tree's blocks down the tree when the payload is over the fragment threshold)."""
        self._request += 1
        body: bytes | CID = payload
        if len(payload) > INLINE_LIMIT:
            root, blocks = split(payload)
            usable = self._usable_from(node)
            for cid, block in blocks:
                node.store[cid] = self._blocks.setdefault(cid, block)
                self.dht.put_block(cid, block, usable, self._dht_lost)
            body = root
        self.input(node.peer_id, ev.Publish(topic, body, parent, self._request,
                                            content_type))
        return self._request

    def relay(self, node: SimNode, topic: TopicDescriptor) -> None:
        """Join ``topic``'s tree without subscribing, as ``Node.publish`` does for a topic
        the node does not follow."""
        node.relays[topic.cid] = topic
        self.input(node.peer_id, ev.Subscribe(topic, False))

    def subscribe(self, node: SimNode, topic: TopicDescriptor, since: float | None = None) -> None:
        """Subscribe durably (a restart resumes it, as the node's store would)."""
        node.subscriptions[topic.cid] = (topic, self.now if since is None else since)
        self.input(node.peer_id, ev.Subscribe(topic, True, since))

    def command(self, node: SimNode, make: Any) -> int:
        """Hand ``node`` a command built by ``make(request)``; returns the request."""
        self._request += 1
        self.input(node.peer_id, make(self._request))
        return self._request

    def restart(self, node: SimNode) -> None:
        """Bring a crashed node back as a new process would: a fresh core that knows only
        the node's durable state — its blocks, its routing table, and per subscription when
        it began, its heads and the latest topic version (as ``Node._resume`` passes them).
        The nodes that dropped it from their tables learn it again."""
        heads = {t: tuple(node.core.heads(t)) for t in node.subscriptions}
        routing = node.core.routing
        assert isinstance(routing, KnownPeers)
        node.core = self._core(node, routing)
        node.alive = True
        node.lives += 1
        self.input(node.peer_id, ev.Start())
        for other in sorted(self.known_by[node.peer_id], key=bytes):
            other_routing = self.nodes[other].core.routing
            if isinstance(other_routing, KnownPeers):
                other_routing.add(node.peer_id)
        for cid, topic in node.relays.items():
            if cid in node.outbox and cid not in node.subscriptions:
                self.input(node.peer_id, ev.Subscribe(topic, False, None, (), (),
                                                      tuple(node.outbox[cid])))
        for cid, (topic, since) in node.subscriptions.items():
            versions: list[TopicDescriptor] = []
            cursor = node.latest.get(cid)
            while cursor is not None and cursor != cid:
                version = TopicDescriptor.from_block(node.store[cursor], cursor)
                versions.append(version)
                cursor = version.parent
            self.input(
                node.peer_id,
                ev.Subscribe(topic, True, since, heads[cid], tuple(reversed(versions)),
                             tuple(node.outbox.get(cid, ()))),
            )

    def crash(self, node: SimNode) -> None:
        """Stop ``node`` (a process crash). The peers it talked to or that hold it in
        their tables are told ``PeerDown`` five link latencies later, and the routing
        tables that held it replace it from the same bucket, as Kademlia's replacement
        cache and bucket refreshes do.

        For the peers it talked to this is what the runtime sees (the dead process's
        kernel closes its connections: end-of-file one link latency later). For the others
        it is an oracle: the runtime learns of a dead peer it never talked to only when a
        send to it fails (``SendFailed``, which the simulator also gives). Telling only the
        peers it talked to made a live subscriber deliver out of order
        (``tests/proto/test_eventual.py``, seed 11: a gap timed out), which is open."""
        node.alive = False
        me = node.peer_id
        for other in sorted(self.known_by[me], key=bytes):  # sets: no hash-seed order
            peer = self.nodes[other]
            routing = peer.core.routing
            if peer.alive and isinstance(routing, KnownPeers) and me in routing:
                routing.remove(me)
                self._replace(peer, routing, me)
        for other in sorted(self.contacts[me] | self.known_by[me], key=bytes):
            if self.nodes[other].alive:
                self.input(other, ev.PeerDown(me), self.link_latency(me, other) * 5)

    def _replace(self, peer: SimNode, routing: KnownPeers, dead: PeerId) -> None:
        start, end = self.space.bucket_of(peer.peer_id, dead)
        candidates = [
            self.space.peers[i] for i in range(start, end)
            if self.space.peers[i] not in routing and self.nodes[self.space.peers[i]].alive
        ]
        if candidates:
            chosen = self.rng.choice(candidates)
            routing.add(chosen)
            self.known_by[chosen].add(peer.peer_id)

    # ------------------------------------------------------------------ outputs

    def _apply(self, node: SimNode, outputs: ev.Out) -> None:
        for out in outputs:
            match out:
                case ev.Send():
                    self._send(node, out)
                case ev.SetTimer():
                    self.input(node.peer_id, ev.TimerFired(out.timer), out.delay)
                case ev.Deliver():
                    self._delivered(node, out)
                case ev.StoreLocal():
                    node.store[out.cid] = self._blocks.setdefault(out.cid, out.block)
                case ev.StoreDht():
                    block = self._blocks.setdefault(out.cid, out.block)
                    node.store[out.cid] = block
                    holders, lost = self.dht.put_block(out.cid, block, self._usable_from(node),
                                                       self._dht_lost)
                    self.input(node.peer_id, ev.DhtStored(out.cid, len(holders)),
                               self._store_time(node, holders, lost))
                case ev.Fetch():
                    found = node.store.get(out.cid)
                    stalls = 0
                    if found is None:
                        found, stalls = self.dht.get_block(out.cid, self._usable_from(node),
                                                           self._dht_lost)
                        if found is not None:
                            self.stats.copies += 1
                    self.input(node.peer_id, ev.BlockFetched(out.cid, found),
                               2 * self.latency + stalls * DHT_RPC_TIMEOUT)
                case ev.StoreRecord():
                    took, lost = self.dht.put_record(out.record, self._usable_from(node),
                                                     self._dht_lost)
                    self.input(node.peer_id,
                               ev.RecordStored(out.record.topic, out.record.seq, len(took)),
                               self._store_time(node, took, lost))
                case ev.FetchRecords():
                    usable = self._usable_from(node)
                    found_records: list[HeadsRecord] = []
                    stalls = 0
                    for publisher in out.publishers:  # looked up concurrently, as the node does
                        record, stalled = self.dht.get_record(
                            heads_record_key(out.topic, publisher), usable, self._dht_lost)
                        stalls = max(stalls, stalled)
                        if record is not None:
                            found_records.append(record)
                    self.input(node.peer_id,
                               ev.RecordsFetched(out.topic, tuple(found_records), out.request),
                               2 * self.latency + stalls * DHT_RPC_TIMEOUT)
                case ev.VersionAdopted():
                    node.store[out.version.cid] = out.version.block
                    node.latest[out.topic] = out.version.cid
                case ev.KeepPublished():
                    if (out.topic, out.event) not in node.log:
                        node.outbox.setdefault(out.topic, {})[out.event] = None
                case ev.Published():
                    node.published[out.request] = out.event
                    self.stats.published_at.setdefault(out.event.cid, self.now)
                case ev.TopicReady():
                    node.topics[out.request] = out.topic
                    if out.topic.parent is None:  # created: the node follows it durably
                        node.subscriptions[out.topic.cid] = (out.topic, self.now)
                case ev.CommandFailed():
                    node.failed[out.request] = out.reason
                case ev.Rejected():
                    node.rejected.append(out.reason)
                case ev.GapReported():
                    node.gaps.append(out)
                case ev.Reconcile():  # not simulated: the gaps walk on at once
                    self.input(node.peer_id, ev.Reconciled(out.peer, out.topic, (), True), 0.0)
                case _:
                    assert_never(out)

    def _delivered(self, node: SimNode, out: ev.Deliver) -> None:
        event = self._events.setdefault(out.event.cid, out.event)
        node.delivered.setdefault(out.topic, []).append(event)
        node.log.add((out.topic, event.cid))
        node.hops.append(out.hop)
        node.outbox.get(out.topic, {}).pop(event.cid, None)
        if event.publisher == node.peer_id:
            # Latency counts from when the event went out (its publisher delivers it then),
            # not from the acknowledgement, which waits for the heads record as well.
            self.stats.published_at.setdefault(event.cid, self.now)
        published = self.stats.published_at.get(event.cid)
        if event.publisher != node.peer_id:
            stats = self.stats
            stats.delivered_pairs += 1
            if published is not None and stats.measure:
                stats.latencies.append(self.now - published)
            if out.hop > stats.max_hop:
                stats.max_hop = out.hop

    def _round_trip(self, node: SimNode, peers: list[PeerId]) -> float:
        if not peers:
            return 2 * self.latency
        return 2 * max(self.link_latency(node.peer_id, p) for p in peers)

    def _store_time(self, node: SimNode, acked: list[PeerId], lost: bool) -> float:
        """When a DHT store is answered. The runtime's put returns once ``min_acks``
        replicas acknowledged (a round trip); short of that, only when the lost STOREs'
        RPC timeout has passed."""
        rtt = self._round_trip(node, acked)
        if lost and len(acked) < node.core.min_acks:
            return max(rtt, DHT_RPC_TIMEOUT)
        return rtt

    def _dht_lost(self) -> bool:
        """One DHT datagram's fate: lost at the network's loss rate, like pub-sub frames
        (no draw at all without loss, so loss-free runs are unchanged)."""
        return bool(self.loss) and self.rng.random() < self.loss

    def _send(self, node: SimNode, out: ev.Send) -> None:
        target = self.nodes.get(out.peer)
        # Real encoding and decoding, so sizes are honest and what arrives is what the
        # codec lets through. A core sends one message object to each of its eager links
        # in a row: it is encoded and decoded once (a third of the run's time otherwise).
        if out.message is self._last_sent:
            frame, message = self._last_frame, self._last_decoded
        else:
            frame = encode_message(out.message)
            message = decode_message(frame)
            self._last_sent, self._last_frame, self._last_decoded = out.message, frame, message
        kind: str = getattr(out.message, "T", type(out.message).__name__.lower())
        self.messages_sent += 1
        self.bytes_sent += len(frame)
        self.stats.messages[kind] += 1
        self.stats.bytes[kind] += len(frame)
        me = node.peer_id
        if target is None or not target.alive:
            self.input(me, ev.SendFailed(out.peer), self.link_latency(me, out.peer) * 2)
            return
        if self.loss and self.rng.random() < self.loss:
            return
        if self.drop is not None and self.drop(me, out.peer, out.message):
            return
        if self.group and not self.reachable(me, out.peer):
            return
        self.contacts[me].add(out.peer)
        self.contacts[out.peer].add(me)
        delay = self.link_latency(me, out.peer)
        if self.bandwidth is not None:
            done = max(self._uplink_free.get(me, self.now), self.now) + len(frame) / self.bandwidth
            self._uplink_free[me] = done
            delay += done - self.now
        if self.jitter:
            delay += self.rng.uniform(-self.jitter, self.jitter)
        if kind == "event":
            self.stats.copies += 1
        elif isinstance(message, Blocks):
            self.stats.copies += len(message.blocks)
        self.input(out.peer, ev.Received(me, message), max(0.0, delay))
