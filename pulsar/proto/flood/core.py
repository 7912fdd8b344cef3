"""Floodsub, the baseline Pulsarcast is measured against, as a sans-I/O core.

Floodsub is libp2p's first pub-sub router and what IPFS shipped when the Pulsarcast thesis
was written: every node tells the peers it knows which topics it subscribes to, and an event
is sent to *every* known peer subscribed to its topic; each receiver delivers it once and
sends it on to all of its own subscribed peers except the sender. No tree, no repair, no
persistence: what is lost is lost, and the redundancy is the price of its robustness.

It runs in the same runtime as :class:`~pulsar.proto.core.PulsarCore` (same transport,
framing, DHT, descriptors and fault injection — see :class:`pulsar.Node` with
``NodeConfig(protocol="floodsub")``) so that a testbed run compares the routing, not two
implementations. To that end it exposes the same surface the node uses (``handle``,
``tree``, ``topic``, ``heads``, ...) and carries events in the same EVENT message; its one
message of its own is SUBS:

=========  =======================================================  ===========================
``t``      keys                                                     meaning
=========  =======================================================  ===========================
``subs``   ``topics`` [link] (<= 1024, no duplicates), ``on`` bool  I (un)subscribe to these
=========  =======================================================  ===========================

A node greets each peer it knows (its proven DHT contacts, checked on a timer, as libp2p
announces on every new connection) with all its subscriptions, and announces every later
change to all peers it has greeted. Events are validated (CID, signatures, the topic's
publishing rules) before they are delivered or forwarded, as libp2p's strict signing does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import assert_never

from dag import (
    CID,
    EventDescriptor,
    EventLinking,
    Identity,
    InvalidDescriptor,
    PeerId,
    TopicDescriptor,
    check_rights,
)
from dag.cid import cid_of
from pulsar.proto import events as ev
from pulsar.proto.events import Out
from pulsar.proto.tree.messages import Event
from pulsar.proto.tree.routing import Routing, TreeView
from pulsar.proto.versions.descriptors import build_topic, build_version

from .messages import MAX_SUBS, Subs
from .timers import Greet

__all__ = ["FloodConfig", "FloodCore", "Greet", "Subs"]




@dataclass(frozen=True, slots=True)
class FloodConfig:
    greet_interval: float = 1.0
    """How often newly known peers are greeted with our subscriptions."""
    seen_limit: int = 200_000
    """Event CIDs remembered for de-duplication (oldest forgotten first)."""
    max_peers: int = 10_000
    """Known peers considered (the whole routing table of any realistic node)."""


@dataclass(slots=True)
class _Topic:
    topic: TopicDescriptor
    """The first version: topics are named by it, as Pulsarcast's trees are."""
    latest: TopicDescriptor
    deliver: bool
    last_seen: CID | None = None
    members: set[PeerId] = field(default_factory=set)


class FloodCore:
    """The Floodsub router for one node. Inputs and outputs are those of
    :mod:`pulsar.proto.events`; no sockets, clocks or loops inside."""

    def __init__(
        self,
        identity: Identity,
        routing: Routing,
        config: FloodConfig | None = None,
        *,
        lookup: Callable[[CID], bytes | None] | None = None,
    ) -> None:
        self.identity = identity
        self.me = identity.peer_id
        self.routing = routing
        self.config = config or FloodConfig()
        self._topics: dict[CID, _Topic] = {}
        self._versions: dict[CID, TopicDescriptor] = {}
        self._members: dict[CID, set[PeerId]] = {}  # topic -> peers announced as members
        self._greeted: set[PeerId] = set()
        self._seen: OrderedDict[CID, None] = OrderedDict()
        self._greeting = False
        self.metrics: dict[str, int] = {
            "events_received": 0,
            "delivered": 0,
            "duplicates": 0,
            "forwarded": 0,
            "rejected": 0,
            "published": 0,
            "max_hop": 0,
        }
        self._jobs: dict[CID, tuple[int, TopicDescriptor, TopicDescriptor | None, set[CID]]] = {}
        self._announced: dict[CID, CID] = {}  # version being fetched -> its tree

    # ------------------------------------------------------------------ public surface

    def handle(self, event: ev.InEvent, now: float) -> Out:
        match event:
            case ev.Received():
                return self._on_received(event, now)
            case ev.PeerDown() | ev.SendFailed():
                return self._on_peer_down(event, now)
            case ev.TimerFired():
                return self._on_timer(event, now)
            case ev.BlockFetched():
                return self._on_fetched(event, now)
            case ev.DhtStored():
                return self._on_stored(event, now)
            case (ev.RecordsFetched() | ev.RecordStored() | ev.Flush() | ev.Start()
                  | ev.HistoryCut() | ev.CheckpointMade() | ev.Reconciled()):
                return []  # floodsub keeps no heads records, overlay or backfill
            case ev.Subscribe():
                return self._on_subscribe(event, now)
            case ev.Unsubscribe():
                return self._on_unsubscribe(event, now)
            case ev.Publish():
                return self._on_publish(event, now)
            case ev.CreateTopic():
                return self._on_create(event, now)
            case ev.UpdateTopic():
                return self._on_update(event, now)
            case _:
                assert_never(event)

    def tree(self, topic: CID) -> TreeView | None:
        """Floodsub has no tree: its 'children' are all the peers it floods the topic to."""
        t = self._topics.get(topic)
        if t is None:
            return None
        members = frozenset(self._members.get(topic, ()))
        return TreeView(topic, frozenset(), members, t.topic.author == self.me, t.deliver)

    def trees(self) -> list[TreeView]:
        return [v for v in (self.tree(c) for c in self._topics) if v is not None]

    def topic(self, cid: CID) -> TopicDescriptor | None:
        return self._versions.get(cid)

    def latest(self, topic: CID) -> TopicDescriptor | None:
        t = self._topics.get(topic)
        return None if t is None else t.latest

    def is_subscribed(self, topic: CID) -> bool:
        t = self._topics.get(topic)
        return t is not None and t.deliver

    def heads(self, topic: CID) -> list[CID]:
        t = self._topics.get(topic)
        return [t.last_seen] if t is not None and t.last_seen is not None else []

    def counters(self) -> dict[str, int]:
        # Floodsub has no tree to attach to: every topic is in as soon as it is known.
        return {**self.metrics, "trees": len(self._topics), "trees_attached": len(self._topics)}

    @property
    def min_acks(self) -> int:
        return 0  # a topic is ready once its stores are answered, whatever the acks

    @property
    def keeps_outbox(self) -> bool:
        return False  # it sends at once: nothing of its own waits to be announced

    def repair_links(self, topic: CID) -> tuple[frozenset[PeerId], frozenset[PeerId]]:
        return frozenset(), frozenset()  # no lazy repair

    def rtt_snapshot(self) -> dict[PeerId, tuple[float, float]]:
        return {}  # it does not measure

    def overlay(self) -> dict[PeerId, bool]:
        return {}  # no membership overlay: it greets its DHT contacts

    # ------------------------------------------------------------------ membership

    def _on_subscribe(self, cmd: ev.Subscribe, now: float) -> Out:
        topic = cmd.topic
        self._versions[topic.cid] = topic
        for version in cmd.versions:
            self._versions[version.cid] = version
        existing = self._topics.get(topic.cid)
        if existing is not None:
            if cmd.deliver and not existing.deliver:
                existing.deliver = True
                return self._announce((topic.cid,), True)
            return []
        self._topics[topic.cid] = _Topic(topic, topic, cmd.deliver)
        for version in cmd.versions:
            self._adopt(version)
        out = self._announce((topic.cid,), True) if cmd.deliver else []
        if not self._greeting:
            self._greeting = True
            out += self._greet_new()
            out.append(ev.SetTimer(self.config.greet_interval, Greet()))
        return out

    def _on_unsubscribe(self, cmd: ev.Unsubscribe, now: float) -> Out:
        t = self._topics.pop(cmd.topic, None)
        if t is None or not t.deliver:
            return []
        return self._announce((cmd.topic,), False)

    def _announce(self, topics: tuple[CID, ...], on: bool) -> Out:
        message = Subs(topics, on)
        return [ev.Send(p, message) for p in sorted(self._greeted, key=bytes)]

    def _subscribed(self) -> tuple[CID, ...]:
        return tuple(c for c, t in self._topics.items() if t.deliver)

    def _greet_new(self) -> Out:
        peers = self.routing.closest_peers(_key(self.me), self.config.max_peers)
        out: Out = []
        mine = self._subscribed()
        for peer in _sorted(peers):
            if peer != self.me and peer not in self._greeted:
                self._greeted.add(peer)
                for i in range(0, len(mine), MAX_SUBS):
                    out.append(ev.Send(peer, Subs(mine[i : i + MAX_SUBS], True)))
                if not mine:
                    out.append(ev.Send(peer, Subs((), True)))
        return out

    def _on_timer(self, fired: ev.TimerFired, now: float) -> Out:
        if not isinstance(fired.timer, Greet):
            return []  # the other timers belong to the Pulsarcast core
        if not self._topics:
            self._greeting = False
            return []
        return [*self._greet_new(), ev.SetTimer(self.config.greet_interval, Greet())]

    def _on_peer_down(self, down: ev.PeerDown | ev.SendFailed, now: float) -> Out:
        # Forget it; if it comes back it is greeted again and re-announces itself.
        self._greeted.discard(down.peer)
        for members in self._members.values():
            members.discard(down.peer)
        return []

    # ------------------------------------------------------------------ messages

    def _on_received(self, msg: ev.Received, now: float) -> Out:
        message = msg.message
        if isinstance(message, Event):
            return self._on_event(msg.peer, message, now)
        if isinstance(message, Subs):
            return self._on_subs(msg.peer, message)
        return []  # a Pulsarcast message: not ours to answer

    def _on_subs(self, peer: PeerId, msg: Subs) -> Out:
        for topic in msg.topics:
            members = self._members.setdefault(topic, set())
            if msg.on:
                members.add(peer)
            else:
                members.discard(peer)
        if peer not in self._greeted:  # it found us first: tell it ours
            self._greeted.add(peer)
            mine = self._subscribed()
            if mine:
                return [ev.Send(peer, Subs(mine[:MAX_SUBS], True))]
        return []

    def _on_event(self, peer: PeerId, msg: Event, now: float) -> Out:
        self.metrics["events_received"] += 1
        cid = cid_of(msg.block)
        if cid in self._seen:
            self.metrics["duplicates"] += 1
            return []
        t = self._topics.get(msg.topic)
        version = self._versions.get(msg.topic)
        try:
            event = EventDescriptor.from_block(msg.block, cid)
            if version is None:
                raise InvalidDescriptor(f"event for unknown topic {msg.topic}")
            if event.topic != msg.topic and event.topic not in self._versions:
                raise InvalidDescriptor(f"event {cid} names topic {event.topic}")
            check_rights(event, self._versions.get(event.topic, version))
        except InvalidDescriptor as exc:
            self.metrics["rejected"] += 1
            return [ev.Rejected(peer, str(exc))]
        self._remember(cid)
        out: Out = [ev.StoreLocal(cid, msg.block)]
        if t is not None:
            t.last_seen = cid
            if t.deliver:
                self.metrics["delivered"] += 1
                self.metrics["max_hop"] = max(self.metrics["max_hop"], msg.hop)
                out.append(ev.Deliver(msg.topic, event, msg.hop))
            if t.topic.is_meta and event.publisher == t.topic.author:
                out += self._announcement(event, msg.topic)
        out += self._flood(msg.topic, msg.block, msg.hop + 1, exclude=peer)
        return out

    def _flood(self, topic: CID, block: bytes, hop: int, exclude: PeerId | None) -> Out:
        forward = Event(topic, block, hop)
        out: Out = []
        for member in _sorted(self._members.get(topic, ())):
            if member != exclude and member != self.me:
                out.append(ev.Send(member, forward))
                self.metrics["forwarded"] += 1
        return out

    def _on_publish(self, cmd: ev.Publish, now: float) -> Out:
        t = self._topics.get(cmd.topic)
        if t is None:
            return [ev.CommandFailed(cmd.request, "not a member of this topic; subscribe first")]
        topic = t.latest
        if topic.event_linking is EventLinking.LAST_SEEN and cmd.parent is not None:
            return [ev.CommandFailed(cmd.request, "topic links events LAST_SEEN; no parent")]
        if not topic.may_publish(self.me):
            # Floodsub has no request-to-publish: only allowed publishers can publish.
            return [ev.CommandFailed(cmd.request, "not allowed to publish on this topic")]
        parent = t.last_seen if topic.event_linking is EventLinking.LAST_SEEN else cmd.parent
        event, out = self._emit(t, topic, cmd.payload, parent, now, cmd.content_type, cmd.key)
        out.append(ev.Published(cmd.request, event))
        return out

    def _emit(self, t: _Topic, version: TopicDescriptor, payload: bytes | CID,
              parent: CID | None, now: float,
              content_type: str | None = None,
              key: str | None = None) -> tuple[EventDescriptor, Out]:
        """Sign an event of ours, deliver it here and flood it."""
        event = EventDescriptor.create(self.identity, version.cid, payload, parent=parent,
                                       content_type=content_type, key=key, now=now)
        self._remember(event.cid)
        t.last_seen = event.cid
        self.metrics["published"] += 1
        out: Out = [ev.StoreLocal(event.cid, event.block)]
        if t.deliver:
            out.append(ev.Deliver(t.topic.cid, event, 0))
        out += self._flood(t.topic.cid, event.block, 1, exclude=None)
        return event, out

    # ------------------------------------------------------------------ topics

    def _on_create(self, cmd: ev.CreateTopic, now: float) -> Out:
        try:
            meta, topic = build_topic(self.identity, cmd, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic: {exc}", kind="invalid")]
        job = (cmd.request, topic, meta, {meta.cid, topic.cid})
        self._jobs[meta.cid] = self._jobs[topic.cid] = job
        return [ev.StoreDht(meta.cid, meta.block), ev.StoreDht(topic.cid, topic.block)]

    def _on_update(self, cmd: ev.UpdateTopic, now: float) -> Out:
        t = self._topics.get(cmd.topic)
        if t is None:
            return [ev.CommandFailed(cmd.request, "not a member of this topic; subscribe first")]
        if t.latest.author != self.me:
            return [ev.CommandFailed(cmd.request, "only the topic's author may update it")]
        heads = [t.last_seen] if t.last_seen is not None else []
        try:
            version = build_version(self.identity, t.latest, cmd.changes, heads, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic version: {exc}", kind="invalid")]
        self._jobs[version.cid] = (cmd.request, version, None, {version.cid})
        return [ev.StoreDht(version.cid, version.block)]

    def _on_stored(self, stored: ev.DhtStored, now: float) -> Out:
        """Floodsub keeps no persistence promise: a topic is ready once its stores are
        answered, whatever the acknowledgements."""
        job = self._jobs.pop(stored.cid, None)
        if job is None:
            return []
        request, topic, meta, left = job
        left.discard(stored.cid)
        if left:
            return []
        if meta is not None:
            out = self._on_subscribe(ev.Subscribe(meta, True, now), now)
            out += self._on_subscribe(ev.Subscribe(topic, True, now), now)
            return [*out, ev.TopicReady(request, topic)]
        self._versions[topic.cid] = topic
        self._adopt(topic)
        out = [ev.StoreLocal(topic.cid, topic.block)]
        meta_topic = None if topic.meta is None else self._topics.get(topic.meta)
        if meta_topic is not None:  # announce it, as Pulsarcast does
            announce = self._emit(meta_topic, meta_topic.latest, topic.cid.raw,
                                  meta_topic.last_seen, now)
            out += announce[1]
        return [*out, ev.TopicReady(request, topic)]

    def _adopt(self, version: TopicDescriptor) -> None:
        for t in self._topics.values():
            if version.parent == t.latest.cid and version.author == t.topic.author:
                t.latest = version

    def _announcement(self, event: EventDescriptor, meta: CID) -> Out:
        if not isinstance(event.payload, bytes):
            return []
        try:
            cid = CID.parse(event.payload)
        except ValueError:
            return []
        if cid in self._versions or len(self._announced) > 1000:
            return []
        self._announced[cid] = meta
        return [ev.Fetch(cid)]

    def _on_fetched(self, fetched: ev.BlockFetched, now: float) -> Out:
        if self._announced.pop(fetched.cid, None) is None or fetched.block is None:
            return []
        try:
            version = TopicDescriptor.from_block(fetched.block, fetched.cid)
        except InvalidDescriptor as exc:
            return [ev.Rejected(None, f"announced version {fetched.cid}: {exc}")]
        self._versions[version.cid] = version
        self._adopt(version)
        return [ev.StoreLocal(version.cid, fetched.block)]

    def _remember(self, cid: CID) -> None:
        self._seen[cid] = None
        if len(self._seen) > self.config.seen_limit:
            self._seen.popitem(last=False)


def _key(peer: PeerId) -> bytes:
    return peer.kademlia_id()


def _sorted(peers: Sequence[PeerId] | set[PeerId]) -> list[PeerId]:
    return sorted(peers, key=bytes)
