"""A simulated network of protocol cores: a heap of ``(time, seq, node, input)``.

The simulator owns what the asyncio runtime owns in real life — message delivery with
latency and loss, timers, the DHT (one shared dictionary), each node's block store — and
nothing else: every decision is made by the protocol core under test. A seeded random
source makes every run reproducible.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

from dag import CID, EventDescriptor, Identity, PeerId, TopicDescriptor
from dag.records import HeadsRecord, heads_record_key

from ..proto import events as ev
from ..proto.core import CoreConfig, PulsarCore
from ..proto.messages import decode_message, encode_message

__all__ = ["SimNetwork", "SimNode"]


@dataclass
class SimNode:
    identity: Identity
    core: PulsarCore
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

    def in_log(self, topic: CID, cid: CID) -> bool:
        return (topic, cid) in self.log

    @property
    def peer_id(self) -> PeerId:
        return self.identity.peer_id


class _KnownPeers:
    """A routing table: the peers this node knows, sorted by XOR distance on demand."""

    def __init__(self, peers: Iterable[PeerId]) -> None:
        self.peers = list(peers)
        self._ids = {p: int.from_bytes(p.kademlia_id(), "big") for p in self.peers}

    def closest_peers(self, key: bytes, count: int) -> Sequence[PeerId]:
        target = int.from_bytes(key, "big")
        return sorted(self.peers, key=lambda p: self._ids[p] ^ target)[:count]

    def add(self, peer: PeerId) -> None:
        """A node (back) online is learned again, as a bucket refresh would."""
        if peer not in self._ids:
            self.peers.append(peer)
            self._ids[peer] = int.from_bytes(peer.kademlia_id(), "big")

    def replace(self, dead: PeerId, me: PeerId, alive: list[PeerId], rng: random.Random) -> None:
        if dead not in self._ids:
            return
        self.peers.remove(dead)
        mine = int.from_bytes(me.kademlia_id(), "big")
        bucket = (mine ^ self._ids.pop(dead)).bit_length()
        spare = [
            p
            for p in alive
            if p != me
            and p not in self._ids
            and (mine ^ int.from_bytes(p.kademlia_id(), "big")).bit_length() == bucket
        ]
        if spare:
            chosen = rng.choice(spare)
            self.peers.append(chosen)
            self._ids[chosen] = int.from_bytes(chosen.kademlia_id(), "big")


class SimNetwork:
    """``n`` nodes. With ``bucket_size=None`` every node knows every other; otherwise each
    node knows at most ``bucket_size`` random peers per Kademlia bucket (per length of the
    prefix shared with its own id), as a Kademlia routing table would: enough for greedy
    routing to reach the node closest to any key, and trees deeper than a star."""

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
    ) -> None:
        self.rng = random.Random(seed)
        self.latency, self.jitter, self.loss = latency, jitter, loss
        self.now = 0.0
        self._queue: list[tuple[float, int, PeerId, Any]] = []
        self._seq = 0
        self.dht: dict[CID, bytes] = {}
        self.records: dict[bytes, HeadsRecord] = {}
        self.messages_sent = 0
        self.bytes_sent = 0
        self.drop: Callable[[PeerId, PeerId, Any], bool] | None = None
        """A fault to inject: ``drop(sender, receiver, message)`` true loses the message."""
        identities = [Identity.from_seed(self.rng.randbytes(32)) for _ in range(n)]
        ids = [i.peer_id for i in identities]
        self.nodes: dict[PeerId, SimNode] = {}
        for identity in identities:
            others = [p for p in ids if p != identity.peer_id]
            if bucket_size is not None:
                others = self._buckets(identity.peer_id, others, bucket_size)
            store: dict[CID, bytes] = {}
            core = PulsarCore(
                identity,
                _KnownPeers(others),
                config,
                random.Random(self.rng.getrandbits(64)),
                lookup=store.get,
                is_delivered=self._delivered_check(store),
            )
            self.nodes[identity.peer_id] = SimNode(identity, core, store)
        self._config = config
        self._request = 0

    @staticmethod
    def _delivered_check(store: dict[CID, bytes]) -> Any:
        """The sim has no durable log: nothing is delivered before the node started."""
        return lambda topic, cid: False

    def _buckets(self, me: PeerId, others: list[PeerId], size: int) -> list[PeerId]:
        mine = int.from_bytes(me.kademlia_id(), "big")
        buckets: dict[int, list[PeerId]] = {}
        for peer in others:
            distance = mine ^ int.from_bytes(peer.kademlia_id(), "big")
            buckets.setdefault(distance.bit_length(), []).append(peer)
        known: list[PeerId] = []
        for members in buckets.values():
            known += self.rng.sample(members, min(size, len(members)))
        return known

    # ------------------------------------------------------------------ driving

    def node(self, index: int) -> SimNode:
        return list(self.nodes.values())[index]

    def input(self, peer: PeerId, event: Any, delay: float = 0.0) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay, self._seq, peer, event))

    def settle(self, seconds: float = 30.0) -> None:
        """Run for ``seconds`` of simulated time (periodic timers never empty the queue)."""
        self.run(until=self.now + seconds)

    def run(self, until: float | None = None, max_steps: int = 10_000_000) -> None:
        """Process inputs in time order until the queue is empty (or ``until``)."""
        for _ in range(max_steps):
            if not self._queue or (until is not None and self._queue[0][0] > until):
                break
            when, _, peer, event = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            node = self.nodes[peer]
            if not node.alive:
                continue
            self._apply(node, node.core.handle(event, self.now))
        if until is not None:
            self.now = max(self.now, until)

    def publish(self, node: SimNode, topic: CID, payload: bytes, parent: CID | None = None) -> int:
        self._request += 1
        self.input(node.peer_id, ev.Publish(topic, payload, parent, self._request))
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
        the node's durable state — its blocks, and per subscription when it began, its
        heads and the latest topic version (as ``Node._resume`` passes them)."""
        heads = {t: tuple(node.core.heads(t)) for t in node.subscriptions}
        node.core = PulsarCore(
            node.identity,
            node.core.routing,
            self._config,
            random.Random(self.rng.getrandbits(64)),
            lookup=node.store.get,
            is_delivered=node.in_log,
        )
        node.alive = True
        for other in self.nodes.values():
            if other is not node and isinstance(other.core.routing, _KnownPeers):
                other.core.routing.add(node.peer_id)
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
        """Stop ``node``. Others notice (as the transport's keepalive would) and their
        routing tables replace it from the same bucket, as Kademlia's replacement cache
        and bucket refreshes do."""
        node.alive = False
        alive = [n.peer_id for n in self.nodes.values() if n.alive]
        for other in self.nodes.values():
            if other.alive:
                routing = other.core.routing
                if isinstance(routing, _KnownPeers):
                    routing.replace(node.peer_id, other.peer_id, alive, self.rng)
                self.input(other.peer_id, ev.PeerDown(node.peer_id), self.latency * 5)

    # ------------------------------------------------------------------ outputs

    def _apply(self, node: SimNode, outputs: ev.Out) -> None:
        for out in outputs:
            match out:
                case ev.Send():
                    self._send(node, out)
                case ev.SetTimer():
                    self.input(node.peer_id, ev.TimerFired(out.timer), out.delay)
                case ev.Deliver():
                    node.delivered.setdefault(out.topic, []).append(out.event)
                    node.log.add((out.topic, out.event.cid))
                    node.hops.append(out.hop)
                    node.outbox.get(out.topic, {}).pop(out.event.cid, None)
                case ev.StoreLocal():
                    node.store[out.cid] = out.block
                case ev.StoreDht():
                    node.store[out.cid] = out.block
                    self.dht[out.cid] = out.block
                    self.input(node.peer_id, ev.DhtStored(out.cid, 3), self.latency)
                case ev.Fetch():
                    block = node.store.get(out.cid) or self.dht.get(out.cid)
                    self.input(node.peer_id, ev.BlockFetched(out.cid, block), self.latency)
                case ev.StoreRecord():
                    record = out.record
                    held = self.records.get(record.key)
                    if held is None or held.seq < record.seq:
                        self.records[record.key] = record
                case ev.FetchRecords():
                    found = tuple(
                        r
                        for r in (
                            self.records.get(heads_record_key(out.topic, p))
                            for p in out.publishers
                        )
                        if r is not None
                    )
                    self.input(node.peer_id, ev.RecordsFetched(out.topic, found), self.latency)
                case ev.VersionAdopted():
                    node.store[out.version.cid] = out.version.block
                    node.latest[out.topic] = out.version.cid
                case ev.KeepPublished():
                    if (out.topic, out.event) not in node.log:
                        node.outbox.setdefault(out.topic, {})[out.event] = None
                case ev.Published():
                    node.published[out.request] = out.event
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
                case _:
                    assert_never(out)

    def _send(self, node: SimNode, out: ev.Send) -> None:
        target = self.nodes.get(out.peer)
        frame = encode_message(out.message)  # real encoding: the sizes are honest
        self.messages_sent += 1
        self.bytes_sent += len(frame)
        if target is None or not target.alive:
            self.input(node.peer_id, ev.SendFailed(out.peer), self.latency * 2)
            return
        if self.loss and self.rng.random() < self.loss:
            return
        if self.drop is not None and self.drop(node.peer_id, out.peer, out.message):
            return
        delay = self.latency + (self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0)
        message = decode_message(frame)
        self.input(out.peer, ev.Received(node.peer_id, message), max(0.0, delay))
