"""The Pulsarcast protocol core: dissemination trees, events and publishing rules.

One object holds a node's state for every topic it takes part in and implements the
paper's algorithms 2-4 as transitions ``handle(input, now) -> [output, ...]``:

* **Join routing** (algorithm 2, with DESIGN.md's progress rule): a JOIN goes to the known
  peer closest to the topic author's Kademlia id, and only if that peer is *strictly*
  closer than this node. Parent edges therefore always shrink the XOR distance to the
  author, so the tree has no cycles, and a node that knows nobody closer acts as root —
  which is also how a tree survives its author being offline (Scribe-style).
* **Events** (algorithms 3-4): every hop checks the block's CID, signatures and the
  publishing rights under the topic version the event names, delivers once, and forwards to
  every tree neighbour but the sender. A forged or unauthorised event stops at the first
  honest node.
* **Publishing**: an allowed node signs and stores the event in the DHT *before*
  forwarding it (``StoreDht`` then ``DhtStored``); a node that may only request sends a
  REQUEST_TO_PUBLISH up its parents to the first node allowed to publish.
* **Failures**: a lost parent is retried ``parent_retries`` times with backoff, then the
  node routes a new JOIN around it; a lost child is dropped.

Topic versions: a tree is named by its topic's *first* version; later versions link it as
``parent`` (through the meta topic). An event names the version whose rules it was
published under, and is accepted only if that version's parent chain reaches the tree's
topic and has the same author.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from dag import (
    CID,
    EventDescriptor,
    EventLinking,
    Identity,
    InvalidDescriptor,
    PeerId,
    TopicDescriptor,
    check_rights,
    cid_of,
)

from . import events as ev
from .backfill import Backfill, BackfillConfig, BackfillTimer
from .gossip_messages import Graft, IHave, Prune, Shuffle
from .messages import Event, Join, Leave, Ping, Pong, RequestToPublish
from .plumtree import Plumtree, PlumtreeConfig
from .repair_messages import MAX_HEADS, Blocks, Heads, Joined, Want

__all__ = ["CoreConfig", "PulsarCore", "RetryParent", "RootCheck", "Routing", "TreeView"]

MAX_VERSION_CHAIN: Final = 64


class Routing(Protocol):
    """What the core needs from the DHT: local k-bucket knowledge, no network traffic."""

    def closest_peers(self, key: bytes, count: int) -> Sequence[PeerId]:
        """Known peers (with proven peer ids) closest to the 20-byte Kademlia ``key``."""
        ...


@dataclass(frozen=True, slots=True)
class CoreConfig:
    parent_retries: int = 3
    """Attempts to re-reach a lost parent before routing a new JOIN around it."""
    parent_retry_delay: float = 0.25
    """First retry delay; doubles on each attempt."""
    root_check_interval: float = 5.0
    """How often a node acting as root (author offline or unknown) looks for a way in."""
    request_timeout: float = 10.0
    """How long a request to publish may wait for its event to come back."""
    seen_limit: int = 200_000
    """Event CIDs remembered per tree for de-duplication (oldest forgotten first)."""
    parked_limit: int = 10_000
    """Events held while their topic version is fetched."""
    routing_candidates: int = 20
    join_timeout: float = 2.0
    """A JOIN is answered with the parent's HEADS; unanswered this long, it counts as a
    failed attempt (a lost JOIN must not leave a node silently detached)."""
    avoid_for: float = 30.0
    """How long a parent we gave up on is left out of join routing."""


@dataclass(frozen=True, slots=True)
class RetryParent:
    topic: CID
    peer: PeerId


@dataclass(frozen=True, slots=True)
class JoinTimeout:
    topic: CID
    peer: PeerId


@dataclass(frozen=True, slots=True)
class RootCheck:
    topic: CID


@dataclass(frozen=True, slots=True)
class RequestTimeout:
    topic: CID
    signature: bytes


@dataclass(frozen=True, slots=True)
class TreeView:
    """A read-only picture of one topic's tree at this node."""

    topic: CID
    parents: frozenset[PeerId]
    children: frozenset[PeerId]
    is_root: bool
    subscribed: bool


_Stored = tuple[CID, EventDescriptor, int | None]
"""An own event on its way into the DHT: (tree, event, publish request or None)."""


@dataclass(slots=True)
class _Tree:
    topic: TopicDescriptor
    latest: TopicDescriptor
    deliver: bool
    parents: set[PeerId] = field(default_factory=set)
    children: set[PeerId] = field(default_factory=set)
    acting_root: bool = False
    last_seen: CID | None = None
    seen: dict[CID, None] = field(default_factory=dict)
    retries: dict[PeerId, int] = field(default_factory=dict)
    avoid: dict[PeerId, float] = field(default_factory=dict)  # peer -> until when
    requests: dict[bytes, int] = field(default_factory=dict)
    confirmed: set[PeerId] = field(default_factory=set)

    def neighbours(self) -> set[PeerId]:
        return self.parents | self.children

    def in_tree(self) -> bool:
        return self.acting_root or bool(self.parents)


Out = list[Any]


class PulsarCore:
    """All of a node's tree state; feed it with :meth:`handle`."""

    def __init__(
        self,
        identity: Identity,
        routing: Routing,
        config: CoreConfig | None = None,
        rng: random.Random | None = None,
        *,
        lookup: Callable[[CID], bytes | None] | None = None,
        plumtree: PlumtreeConfig | None = None,
        is_delivered: Callable[[CID, CID], bool] | None = None,
        backfill: BackfillConfig | None = None,
    ) -> None:
        self.identity = identity
        self.me = identity.peer_id
        self.routing = routing
        self.config = config or CoreConfig()
        self.rng = rng or random.Random(0)
        self._trees: dict[CID, _Tree] = {}
        self.lazy = Plumtree(
            self.me, self._tree_edges, lookup or (lambda cid: None), plumtree, self.rng
        )
        self._topics: dict[CID, TopicDescriptor] = {}
        self._lineage: dict[CID, CID] = {}  # topic version -> first version
        self._fetching: dict[CID, list[tuple[PeerId | None, Any]]] = {}
        self._parked = 0
        self._pending_store: dict[CID, _Stored] = {}
        # Our own events stored before their (own) parent was: forwarded right after it, so
        # a publisher with many stores in flight still sends its chain in order.
        self._stored_early: dict[CID, _Stored] = {}
        self._after_parent: dict[CID, list[CID]] = {}
        self._kid_cache: dict[PeerId, int] = {}
        self.backfill = Backfill(
            lookup or (lambda cid: None),
            self._verify_backfilled,
            is_delivered=is_delivered,
            neighbours=lambda topic: self._tree_edges(topic) | self.lazy.lazy(topic),
            config=backfill,
        )
        self.metrics: dict[str, int] = {
            "events_received": 0,
            "delivered": 0,
            "duplicates": 0,
            "forwarded": 0,
            "rejected": 0,
            "published": 0,
            "max_hop": 0,
        }
        self._dispatch: dict[type, Callable[[Any, float], Out]] = {
            ev.Received: self._on_received,
            ev.PeerDown: self._on_peer_down,
            ev.SendFailed: self._on_peer_down,
            ev.TimerFired: self._on_timer,
            ev.BlockFetched: self._on_block_fetched,
            ev.DhtStored: self._on_dht_stored,
            ev.Subscribe: self._on_subscribe,
            ev.Unsubscribe: self._on_unsubscribe,
            ev.Publish: self._on_publish,
        }
        self._receive: dict[type, Callable[[PeerId, Any, float], Out]] = {
            Join: self._on_join,
            Leave: self._on_leave,
            Event: self._on_event,
            RequestToPublish: self._on_request,
            Ping: self._on_ping,
            Pong: lambda peer, msg, now: [],
            IHave: lambda peer, msg, now: self.lazy.on_ihave(
                peer, msg, self._known_in(msg.topic), now
            ),
            Graft: self.lazy.on_graft,
            Prune: self.lazy.on_prune,
            Shuffle: self.lazy.on_shuffle,
            Want: self.backfill.on_want,
            Blocks: self.backfill.on_blocks,
            Heads: self.backfill.on_heads,
            Joined: self.backfill.on_heads,
        }

    # ------------------------------------------------------------------ public surface

    def handle(self, event: Any, now: float) -> Out:
        """Apply one input; return the outputs the driver must carry out, in order."""
        return self._dispatch[type(event)](event, now)

    def tree(self, topic: CID) -> TreeView | None:
        t = self._trees.get(topic)
        if t is None:
            return None
        return TreeView(
            topic, frozenset(t.parents), frozenset(t.children), t.acting_root, t.deliver
        )

    def trees(self) -> list[TreeView]:
        return [v for v in (self.tree(c) for c in self._trees) if v is not None]

    def topic(self, cid: CID) -> TopicDescriptor | None:
        return self._topics.get(cid)

    def latest(self, topic: CID) -> TopicDescriptor | None:
        t = self._trees.get(topic)
        return None if t is None else t.latest

    def learn_topic(self, descriptor: TopicDescriptor) -> Out:
        """Register a topic version known to be valid (built here, or fetched and parsed by
        the driver, e.g. from a meta-topic event). Returns outputs for parked events."""
        return self._register_version(descriptor, 0.0)

    def is_subscribed(self, topic: CID) -> bool:
        t = self._trees.get(topic)
        return t is not None and t.deliver

    def heads(self, topic: CID) -> list[CID]:
        """The topic's DAG tips here (what a restarted node asks its neighbours after)."""
        return list(self.backfill.heads(topic))

    def counters(self) -> dict[str, int]:
        """The counters of the tree core and its repair layers, in one dict."""
        return {**self.metrics, **self.lazy.metrics, **self.backfill.metrics}

    def _tree_edges(self, topic: CID) -> set[PeerId]:
        tree = self._trees.get(topic)
        return set() if tree is None else tree.neighbours()

    def _known_in(self, topic: CID) -> Callable[[CID], bool]:
        tree = self._trees.get(topic)
        seen = {} if tree is None else tree.seen
        backfill = self.backfill
        return lambda cid: cid in seen or backfill.known(topic, cid)

    def _eager(self, tree: _Tree) -> list[PeerId]:
        """Where an event goes eagerly: the tree edges plus links grafted by repair."""
        return sorted(tree.neighbours() | self.lazy.eager_extra(tree.topic.cid), key=bytes)

    # ------------------------------------------------------------------ routing

    def _kid(self, peer: PeerId) -> int:
        kid = self._kid_cache.get(peer)
        if kid is None:
            if len(self._kid_cache) > 100_000:
                self._kid_cache.clear()
            kid = self._kid_cache[peer] = int.from_bytes(peer.kademlia_id(), "big")
        return kid

    def _next_hop(self, author: PeerId, avoid: set[PeerId]) -> PeerId | None:
        """The known peer closest to ``author``, if strictly closer than this node."""
        key = author.kademlia_id()
        target = int.from_bytes(key, "big")
        best: PeerId | None = None
        best_distance = self._kid(self.me) ^ target
        for peer in self.routing.closest_peers(key, self.config.routing_candidates):
            if peer == self.me or peer in avoid:
                continue
            distance = self._kid(peer) ^ target
            if distance < best_distance:
                best, best_distance = peer, distance
        return best

    def _join(self, tree: _Tree, now: float) -> Out:
        """Attach ``tree`` upwards (algorithm 2, the sending half)."""
        author = tree.topic.author
        if author == self.me:
            tree.acting_root = True
            return []
        for avoided, until in list(tree.avoid.items()):
            if until <= now:
                del tree.avoid[avoided]
        peer = self._next_hop(author, set(tree.avoid) | tree.children)
        if peer is None:
            tree.acting_root = True
            return [ev.SetTimer(self.config.root_check_interval, RootCheck(tree.topic.cid))]
        tree.acting_root = False
        tree.parents = {peer}
        return self._send_join(tree, peer)

    def _send_join(self, tree: _Tree, peer: PeerId) -> Out:
        tree.confirmed.discard(peer)
        return [
            ev.Send(peer, Join(tree.topic.cid, tree.topic.block)),
            ev.SetTimer(self.config.join_timeout, JoinTimeout(tree.topic.cid, peer)),
        ]

    # ------------------------------------------------------------------ commands

    def _on_subscribe(self, cmd: ev.Subscribe, now: float) -> Out:
        topic = cmd.topic
        since = now if cmd.since is None else cmd.since
        out = self._register_version(topic, now)
        tree = self._trees.get(self._lineage.get(topic.cid, topic.cid))
        if tree is not None:
            tree.deliver = tree.deliver or cmd.deliver
            return out + self.backfill.open(
                tree.topic.cid, now, deliver=cmd.deliver, since=since, heads=cmd.heads
            )
        tree = self._new_tree(topic, cmd.deliver)
        out += self.backfill.open(
            topic.cid, now, deliver=cmd.deliver, since=since, heads=cmd.heads
        )
        return out + self.lazy.start(topic.cid) + self._join(tree, now)

    def _new_tree(self, topic: TopicDescriptor, deliver: bool) -> _Tree:
        tree = _Tree(topic=topic, latest=topic, deliver=deliver)
        self._trees[topic.cid] = tree
        for version in self._topics.values():
            if self._lineage.get(version.cid) == topic.cid and _newer(version, tree.latest):
                tree.latest = version
        return tree

    def _on_unsubscribe(self, cmd: ev.Unsubscribe, now: float) -> Out:
        tree = self._trees.pop(cmd.topic, None)
        if tree is None:
            return []
        self.lazy.stop(cmd.topic)
        self.backfill.close(cmd.topic)
        leave = Leave(cmd.topic)
        # Children are told too: they route a new JOIN around us, so the subtree never
        # hangs off a node that no longer forwards.
        out: Out = [ev.Send(peer, leave) for peer in sorted(tree.neighbours(), key=bytes)]
        for request in tree.requests.values():
            out.append(ev.PublishFailed(request, "unsubscribed before the event arrived"))
        return out

    def _on_publish(self, cmd: ev.Publish, now: float) -> Out:
        tree = self._trees.get(cmd.topic)
        if tree is None:
            return [ev.PublishFailed(cmd.request, "not in this topic's tree; subscribe first")]
        topic = tree.latest
        if topic.event_linking is EventLinking.LAST_SEEN and cmd.parent is not None:
            return [ev.PublishFailed(cmd.request, "topic links events LAST_SEEN; no parent")]
        parent = tree.last_seen if topic.event_linking is EventLinking.LAST_SEEN else cmd.parent
        if topic.may_publish(self.me):
            event = EventDescriptor.create(
                self.identity, topic.cid, cmd.payload, parent=parent, now=now
            )
            return self._publish(tree, event, cmd.request)
        if not topic.may_request(self.me):
            return [ev.PublishFailed(cmd.request, "not allowed to publish or to request it")]
        if not tree.parents:
            return [ev.PublishFailed(cmd.request, "no parent to carry a request to publish")]
        created, signature = EventDescriptor.sign_content(
            self.identity, topic.cid, cmd.payload, now=now
        )
        request = RequestToPublish(
            tree.topic.cid, topic.cid, self.me, cmd.payload, created, signature, cmd.parent
        )
        tree.requests[signature] = cmd.request
        out: Out = [ev.Send(p, request) for p in sorted(tree.parents, key=bytes)]
        out.append(
            ev.SetTimer(self.config.request_timeout, RequestTimeout(tree.topic.cid, signature))
        )
        return out

    def _publish(self, tree: _Tree, event: EventDescriptor, request: int | None) -> Out:
        self._remember(tree, event.cid)
        tree.last_seen = event.cid
        self._pending_store[event.cid] = (tree.topic.cid, event, request)
        return [ev.StoreDht(event.cid, event.block)]

    def _on_dht_stored(self, result: ev.DhtStored, now: float) -> Out:
        pending = self._pending_store.pop(result.cid, None)
        if pending is None:
            return []
        parent = pending[1].parent
        if parent is not None and (parent in self._pending_store or parent in self._stored_early):
            # DHT stores finish out of order; sending this first would open a gap (and a
            # WANT) at every subscriber for an event that is a moment behind.
            self._stored_early[result.cid] = pending
            self._after_parent.setdefault(parent, []).append(result.cid)
            return []
        out: Out = []
        ready = [pending]
        while ready:
            item = ready.pop()
            out += self._forward_published(item, now)
            for child in self._after_parent.pop(item[1].cid, ()):
                ready.append(self._stored_early.pop(child))
        return out

    def _forward_published(self, pending: _Stored, now: float) -> Out:
        """Our own event is in the DHT: deliver it here and send it down the tree."""
        topic_cid, event, request = pending
        self.metrics["published"] += 1
        out: Out = []
        if request is not None:
            out.append(ev.Published(request, event))
        tree = self._trees.get(topic_cid)
        if tree is None:
            return out
        out += self.backfill.accepted(topic_cid, event, 0, None, now)
        self._match_request(tree, event, out)
        message = Event(topic_cid, event.block, 1)
        for peer in self._eager(tree):
            out.append(ev.Send(peer, message))
            self.metrics["forwarded"] += 1
        out += self.lazy.accepted(topic_cid, event.cid, 0, None, now)
        return out

    # ------------------------------------------------------------------ messages

    def _on_received(self, msg: ev.Received, now: float) -> Out:
        handler = self._receive.get(type(msg.message))
        if handler is None:
            return [ev.Rejected(msg.peer, f"unexpected message {type(msg.message).__name__}")]
        topic = getattr(msg.message, "topic", None)
        tree = self._trees.get(topic) if isinstance(topic, CID) else None
        if tree is not None and msg.peer in tree.parents and type(msg.message) is Joined:
            tree.confirmed.add(msg.peer)  # the parent took us as a child
            tree.retries.pop(msg.peer, None)
        return handler(msg.peer, msg.message, now)

    def _on_ping(self, peer: PeerId, msg: Ping, now: float) -> Out:
        return [ev.Send(peer, Pong(msg.nonce))]

    def _on_join(self, peer: PeerId, msg: Join, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        out: Out = []
        if tree is None:
            try:
                topic = TopicDescriptor.from_block(msg.topic_block, msg.topic)
            except InvalidDescriptor as exc:
                return self._reject(peer, f"join for {msg.topic}: {exc}")
            if topic.parent is not None:
                return self._reject(peer, "join must name a topic's first version")
            out = self._register_version(topic, now)
            tree = self._new_tree(topic, deliver=False)
            out += self.lazy.start(topic.cid)
            out += self.backfill.open(topic.cid, now, deliver=False, since=now)
        if peer in tree.parents:
            return self._reject(peer, "join from our own parent")
        tree.children.add(peer)
        tree.retries.pop(peer, None)
        self.lazy.learn(msg.topic, [peer], now)
        # The answer to a JOIN confirms the edge to the child and carries our heads, so it
        # backfills at once whatever it missed while it was not attached.
        heads = tuple(self.backfill.heads(msg.topic)[:MAX_HEADS])
        out.append(ev.Send(peer, Joined(msg.topic, heads)))
        if tree.in_tree():
            return out
        return out + self._join(tree, now)

    def _on_leave(self, peer: PeerId, msg: Leave, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        if tree is None:
            return []
        tree.children.discard(peer)
        if peer in tree.parents:
            # A parent that leaves is alive and may still be the way in: routing may pick it
            # again, and it then serves as a pure relay (as in Scribe). Only peers that fail
            # are avoided.
            tree.parents.discard(peer)
            tree.retries.pop(peer, None)
            return self._prune_idle(tree) or self._join(tree, now)
        return self._prune_idle(tree)

    def _prune_idle(self, tree: _Tree) -> Out:
        """A pure relay (not subscribed, not the author) with no children left has no
        reason to stay in the tree: leave it, as Scribe does."""
        if tree.deliver or tree.children or tree.topic.author == self.me:
            return []
        if tree.requests or any(
            p[0] == tree.topic.cid
            for p in itertools.chain(self._pending_store.values(), self._stored_early.values())
        ):
            return []
        del self._trees[tree.topic.cid]
        self.lazy.stop(tree.topic.cid)
        self.backfill.close(tree.topic.cid)
        leave = Leave(tree.topic.cid)
        return [ev.Send(peer, leave) for peer in sorted(tree.parents, key=bytes)]

    def _on_event(self, peer: PeerId | None, msg: Event, now: float) -> Out:
        self.metrics["events_received"] += 1
        tree = self._trees.get(msg.topic)
        if tree is None:
            return self._reject(peer, f"event for {msg.topic}, a tree we are not in")
        cid = cid_of(msg.block)
        if cid in tree.seen or self.backfill.known(tree.topic.cid, cid):
            self.metrics["duplicates"] += 1
            return self.lazy.duplicate(msg.topic, peer)
        try:
            event = EventDescriptor.from_block(msg.block, cid)
        except InvalidDescriptor as exc:
            return self._reject(peer, f"event {cid}: {exc}")
        version = self._topics.get(event.topic)
        if version is None or event.topic not in self._lineage:
            return self._park(event.topic, peer, msg)
        if self._lineage[event.topic] != tree.topic.cid:
            return self._reject(peer, f"event {cid} belongs to another topic")
        try:
            check_rights(event, version)
        except InvalidDescriptor as exc:
            return self._reject(peer, str(exc))
        if peer is not None:
            tree.retries.pop(peer, None)
        return self._accept(tree, event, msg.hop, peer, now)

    def _accept(
        self, tree: _Tree, event: EventDescriptor, hop: int, sender: PeerId | None, now: float
    ) -> Out:
        self._remember(tree, event.cid)
        tree.last_seen = event.cid
        out: Out = [ev.StoreLocal(event.cid, event.block)]
        if tree.deliver and hop > self.metrics["max_hop"]:
            self.metrics["max_hop"] = hop
        out += self.backfill.accepted(tree.topic.cid, event, hop, sender, now)
        self._match_request(tree, event, out)
        forward = Event(tree.topic.cid, event.block, hop + 1)
        for peer in self._eager(tree):
            if peer != sender:
                out.append(ev.Send(peer, forward))
                self.metrics["forwarded"] += 1
        out += self.lazy.accepted(tree.topic.cid, event.cid, hop, sender, now)
        return out

    def _match_request(self, tree: _Tree, event: EventDescriptor, out: Out) -> None:
        if event.author == self.me and tree.requests:
            request = tree.requests.pop(event.author_signature, None)
            if request is not None:
                out.append(ev.Published(request, event))

    def _on_request(self, peer: PeerId, msg: RequestToPublish, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        if tree is None:
            return self._reject(peer, f"request to publish on {msg.topic}, not our tree")
        version = self._topics.get(msg.version)
        if version is None or self._lineage.get(msg.version) != tree.topic.cid:
            return self._reject(peer, f"request names unknown version {msg.version}")
        if not version.may_request(msg.author):
            return self._reject(peer, f"{msg.author} may not request to publish")
        latest = tree.latest
        if not latest.may_publish(self.me):
            if not tree.parents:
                return self._reject(peer, "request reached the root; nobody may publish it")
            return [ev.Send(p, msg) for p in sorted(tree.parents, key=bytes)]
        parent = tree.last_seen if latest.event_linking is EventLinking.LAST_SEEN else msg.parent
        try:
            event = EventDescriptor.create(
                self.identity,
                msg.version,
                msg.payload,
                parent=parent,
                author=msg.author,
                created=msg.created,
                author_signature=msg.signature,
            )
        except InvalidDescriptor as exc:
            return self._reject(peer, f"request to publish: {exc}")
        return self._publish(tree, event, None)

    # ------------------------------------------------------------------ failures, timers

    def _on_peer_down(self, down: ev.PeerDown | ev.SendFailed, now: float) -> Out:
        peer = down.peer
        out: Out = self.backfill.peer_down(peer, now)
        self.lazy.peer_down(peer)
        for tree in list(self._trees.values()):
            if peer in tree.children:
                tree.children.discard(peer)
                out += self._prune_idle(tree)
            if peer in tree.parents and tree.topic.cid in self._trees:
                # The transport reports SendFailed after its own dials failed: a parent that
                # never answered our JOIN and cannot even be dialled is routed around at
                # once (e.g. an offline author), not retried with backoff.
                never_reached = isinstance(down, ev.SendFailed) and peer not in tree.confirmed
                out += self._parent_failed(tree, peer, now, give_up=never_reached)
        return out

    def _parent_failed(self, tree: _Tree, peer: PeerId, now: float, *,
                       give_up: bool = False) -> Out:
        """Retry a parent with backoff; after ``parent_retries`` route around it."""
        attempt = tree.retries.get(peer, 0) + 1
        tree.retries[peer] = attempt
        if attempt <= self.config.parent_retries and not give_up:
            delay = self.config.parent_retry_delay * 2 ** (attempt - 1)
            return [ev.SetTimer(delay, RetryParent(tree.topic.cid, peer))]
        tree.parents.discard(peer)
        tree.retries.pop(peer, None)
        tree.avoid[peer] = now + self.config.avoid_for
        return self._join(tree, now)

    def _on_timer(self, fired: ev.TimerFired, now: float) -> Out:
        timer = fired.timer
        if isinstance(timer, BackfillTimer):
            return self.backfill.on_timer(timer, now)
        if isinstance(timer, RetryParent):
            tree = self._trees.get(timer.topic)
            if tree is None or timer.peer not in tree.parents:
                return []
            # Re-sending the JOIN both probes the parent and restores our place with it if
            # it restarted; a failure comes back as SendFailed and counts another attempt.
            return self._send_join(tree, timer.peer)
        if isinstance(timer, JoinTimeout):
            tree = self._trees.get(timer.topic)
            if tree is None or timer.peer not in tree.parents or timer.peer in tree.confirmed:
                return []
            return self._parent_failed(tree, timer.peer, now)
        if isinstance(timer, RootCheck):
            tree = self._trees.get(timer.topic)
            if tree is None or not tree.acting_root or tree.topic.author == self.me:
                return []
            return self._join(tree, now)
        if isinstance(timer, RequestTimeout):
            tree = self._trees.get(timer.topic)
            if tree is None:
                return []
            request = tree.requests.pop(timer.signature, None)
            if request is None:
                return []
            return [ev.PublishFailed(request, "no event came back for the request to publish")]
        topic = getattr(timer, "topic", None)
        if isinstance(topic, CID):
            return self.lazy.on_timer(timer, self._known_in(topic), now)
        return []

    # ------------------------------------------------------------------ topic versions

    def _register_version(self, topic: TopicDescriptor, now: float) -> Out:
        """Record a validated topic version and, if its lineage is known, release events
        that waited for it."""
        self._topics[topic.cid] = topic
        if topic.parent is None:
            self._lineage[topic.cid] = topic.cid
        elif topic.parent in self._lineage:
            root = self._topics[self._lineage[topic.parent]]
            if root.author != topic.author:
                self._topics.pop(topic.cid)
                return self._drop_parked(topic.cid, "topic version by another author")
            self._lineage[topic.cid] = root.cid
        else:
            self._fetching.setdefault(topic.cid, [])
            return self._fetch(topic.parent)
        root_cid = self._lineage[topic.cid]
        tree = self._trees.get(root_cid)
        if tree is not None and _newer(topic, tree.latest):
            tree.latest = topic
        out: Out = []
        for waiting, _ in list(self._fetching.items()):
            known = self._topics.get(waiting)
            if known is not None and known.parent == topic.cid and waiting not in self._lineage:
                out += self._register_version(known, now)
        return out + self._release(topic.cid, now)

    def _park(self, version: CID, peer: PeerId | None, msg: Any) -> Out:
        if self._parked >= self.config.parked_limit:
            return self._reject(peer, "too many events waiting for topic versions")
        waiting = self._fetching.get(version)
        self._parked += 1
        if waiting is not None:
            waiting.append((peer, msg))
            return []
        self._fetching[version] = [(peer, msg)]
        return [ev.Fetch(version)]

    def _fetch(self, cid: CID) -> Out:
        if self._fetching.get(cid):
            return []
        if len(self._fetching) > self.config.parked_limit:
            return []
        self._fetching.setdefault(cid, [])
        return [ev.Fetch(cid)]

    def _release(self, version: CID, now: float) -> Out:
        waiting = self._fetching.pop(version, [])
        self._parked -= len(waiting)
        out: Out = []
        for peer, msg in waiting:
            out += self._on_event(peer, msg, now)
        return out

    def _drop_parked(self, version: CID, reason: str) -> Out:
        waiting = self._fetching.pop(version, [])
        self._parked -= len(waiting)
        out: Out = []
        for peer, _ in waiting:
            out += self._reject(peer, f"{reason} ({version})")
        return out

    def _on_block_fetched(self, fetched: ev.BlockFetched, now: float) -> Out:
        if self.backfill.fetching(fetched.cid):
            return self.backfill.on_fetched(fetched.cid, fetched.block, now)
        if fetched.cid not in self._fetching:
            return []
        if fetched.block is None:
            return self._drop_parked(fetched.cid, "topic version not found")
        try:
            topic = TopicDescriptor.from_block(fetched.block, fetched.cid)
        except InvalidDescriptor as exc:
            return self._drop_parked(fetched.cid, f"invalid topic version: {exc}")
        if len(self._topics) > 100_000:
            return self._drop_parked(fetched.cid, "too many topic versions")
        depth = 0
        cursor: TopicDescriptor | None = topic
        while cursor is not None and cursor.parent is not None and depth < MAX_VERSION_CHAIN:
            cursor = self._topics.get(cursor.parent)
            depth += 1
        if depth >= MAX_VERSION_CHAIN:
            return self._drop_parked(fetched.cid, "topic version chain too long")
        return self._register_version(topic, now)

    # ------------------------------------------------------------------ helpers

    def _verify_backfilled(self, topic: CID, block: bytes) -> EventDescriptor | None:
        """The backfill layer's check of a fetched block: everything ``_on_event`` checks."""
        try:
            event = EventDescriptor.from_block(block)
        except InvalidDescriptor:
            return None
        version = self._topics.get(event.topic)
        if version is None or self._lineage.get(event.topic) != topic:
            return None
        try:
            check_rights(event, version)
        except InvalidDescriptor:
            return None
        return event

    def _remember(self, tree: _Tree, cid: CID) -> None:
        tree.seen[cid] = None
        if len(tree.seen) > self.config.seen_limit:
            del tree.seen[next(iter(tree.seen))]

    def _reject(self, peer: PeerId | None, reason: str) -> Out:
        self.metrics["rejected"] += 1
        return [ev.Rejected(peer, reason)]


def _newer(candidate: TopicDescriptor, current: TopicDescriptor) -> bool:
    """Whether ``candidate`` is a later version than ``current`` (a descendant of it)."""
    return candidate.parent == current.cid or (
        candidate.cid != current.cid and candidate.created > current.created
    )
