"""Dissemination: events down a topic's tree, eagerly over its edges and lazily to the
rest, and large events as fragments.

* **An EVENT that arrives** is checked (its block against its CID, its topic version,
  the rights rule through the versions room), stored, handed to causal delivery and
  forwarded to every eager link (tree edges and links grafted by repair) but the one it
  came from and its publisher; the lazy links are told of it (IHAVE, Plumtree).
  A copy seen before is a duplicate: it may prune a grafted link, or end an edge only
  the other side still holds (:class:`~pulsar.proto.topic.edges.TreeEdges`).
* **Our own event**, once persisted, is delivered here and sent the same way.
* **A large event** (its payload a chunk tree over the threshold) travels as its EVENT
  then its blocks as fragments (:mod:`pulsar.proto.fragments`), relayed as they come
  (cut-through) and delivered once whole.
* **Events taken in by repair** that are recent go down the tree too: children missed
  them as well.

:class:`Dissemination` keeps only its counters (what it forwards is the trees', the
gossip's and the fragment layer's state). What is not its to decide comes back among
its outputs (:data:`FlowItem`): an event naming an unknown version (:class:`Park`), a
refused input (:class:`~pulsar.proto.reports.Refused`), an accepted event that
publishing keeps track of (:class:`Accepted`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dag import CID, EventDescriptor, InvalidDescriptor, PeerId, cid_of
from pulsar.proto.fragments.chunks import large_blocks
from pulsar.proto.fragments.layer import Completed, Fragments
from pulsar.proto.gossip.plumtree import Plumtree
from pulsar.proto.repair.backfill import Backfill, Repaired
from pulsar.proto.tree.messages import Event
from pulsar.proto.tree.routing import Tree
from pulsar.proto.versions.adoption import Adoption

from .. import events as ev
from ..config import CoreConfig
from ..events import Out, OutEvent
from ..reports import Refused
from .edges import TreeEdges

__all__ = ["Accepted", "Dissemination", "FlowItem", "FlowOut", "Park"]


@dataclass(frozen=True, slots=True)
class Park:
    """An event names topic version ``version``, not known yet: it waits for it."""

    version: CID
    peer: PeerId | None
    message: Event


@dataclass(frozen=True, slots=True)
class Accepted:
    """``event`` entered the tree ``topic`` here: publishing notes its publisher, and a
    request to publish of ours it answers."""

    topic: CID
    event: EventDescriptor


FlowItem = OutEvent | Park | Accepted | Refused | Completed
FlowOut = list[FlowItem]


class Dissemination:
    """Events along every tree of one node (see the module docstring)."""

    def __init__(
        self,
        me: PeerId,
        config: CoreConfig,
        trees: dict[CID, Tree],
        lazy: Plumtree,
        backfill: Backfill,
        frags: Fragments,
        edges: TreeEdges,
        adoption: Adoption,
        lookup: Callable[[CID], bytes | None],
    ) -> None:
        self.me = me
        self.config = config
        self._trees = trees
        self.lazy = lazy
        self.backfill = backfill
        self.frags = frags
        self.edges = edges
        self.adoption = adoption
        self._lookup = lookup
        self.metrics: dict[str, int] = {
            "events_received": 0,
            "duplicates": 0,
            "forwarded": 0,
            "max_hop": 0,
            "repair_pushed": 0,
        }

    def eager(self, tree: Tree) -> list[PeerId]:
        """Where an event goes eagerly: the tree edges plus links grafted by repair."""
        return sorted(tree.neighbours() | self.lazy.eager_extra(tree.topic.cid), key=bytes)

    def on_event(self, peer: PeerId | None, msg: Event, now: float) -> FlowOut:
        self.metrics["events_received"] += 1
        tree = self._trees.get(msg.topic)
        if tree is None:
            return [Refused(peer, f"event for {msg.topic}, a tree we are not in")]
        cid = cid_of(msg.block)
        if cid in tree.seen or self.backfill.known(tree.topic.cid, cid):
            if msg.also and peer is not None and self.frags.config.enabled:
                return [*self._delegated(tree, cid, msg, peer, now)]
            self.metrics["duplicates"] += 1
            out = self.lazy.duplicate(msg.topic, peer, cid)
            if out:
                return [*out]
            stray = tree.strays.pop(cid, None)
            if stray is not None and peer in tree.parents:
                return [*self.edges.stray_copy(tree, stray, now)]
            return [*self.edges.stale_edge(tree, peer, now)]
        try:
            event = EventDescriptor.from_block(msg.block, cid)
        except InvalidDescriptor as exc:
            return [Refused(peer, f"event {cid}: {exc}")]
        if self.adoption.versions.get(event.topic) is None:
            return [Park(event.topic, peer, msg)]
        problem = self.adoption.judge(tree.topic, event)
        if problem is not None:
            return [Refused(peer, problem)]
        if peer is not None:
            tree.retries.pop(peer, None)
        return self._accept(tree, event, msg.hop, peer, now, fragments=msg.fragments,
                            also=msg.also)

    def _accept(
        self, tree: Tree, event: EventDescriptor, hop: int, sender: PeerId | None, now: float,
        *, fragments: bool = False, also: tuple[PeerId, ...] = (),
    ) -> FlowOut:
        tree.remember(event.cid, self.config.seen_limit)
        tree.last_seen = event.cid
        out: FlowOut = [ev.StoreLocal(event.cid, event.block)]
        if tree.deliver and hop > self.metrics["max_hop"]:
            self.metrics["max_hop"] = hop
        if (
            fragments and sender is not None and isinstance(event.payload, CID)
            and self.frags.config.enabled
        ):
            return out + self._accept_large(tree, event, hop, sender, now, also)
        out += self.backfill.accepted(tree.topic.cid, event, hop, sender, now)
        out.append(Accepted(tree.topic.cid, event))
        if sender is not None and sender not in tree.parents and sender not in tree.children:
            self.edges.stray(tree, event.cid, sender)
        forward = Event(tree.topic.cid, event.block, hop + 1)
        eager = self.eager(tree)
        for peer in eager:
            # Its publisher made it: a copy back (up the tree, to an author) is a duplicate.
            if peer != sender and peer != event.publisher:
                out.append(ev.Send(peer, forward))
                self.metrics["forwarded"] += 1
        out += self.lazy.accepted(tree.topic.cid, event.cid, hop, sender, now)
        self.cover(tree, event.cid, eager, sender)
        return out

    def _accept_large(
        self, tree: Tree, event: EventDescriptor, hop: int, sender: PeerId, now: float,
        also: tuple[PeerId, ...] = (),
    ) -> FlowOut:
        """A large event's EVENT: its fragments follow. The fragment layer relays them (the
        EVENT first) to the eager links, and tells every other neighbour IDONTWANT; it is
        delivered once its payload is complete (``_large_completed``)."""
        topic = tree.topic.cid
        out: FlowOut = []
        out.append(Accepted(tree.topic.cid, event))
        eager = self.eager(tree)
        targets = [p for p in eager if p != sender]
        tell = sorted((set(eager) | self.lazy.lazy(topic)) - {sender}, key=bytes)
        head = Event(topic, event.block, hop + 1, True)
        helped = tuple(p for p in also if p != self.me and p != sender)
        out += self.frags.receive(topic, event, hop, sender, head, targets, tell, now, helped)
        self.metrics["forwarded"] += len(targets)
        if self.frags.config.cut_through:
            out += self.lazy.accepted(topic, event.cid, hop, sender, now)
            self.cover(tree, event.cid, eager, sender)
        return out

    def _delegated(self, tree: Tree, cid: CID, msg: Event, peer: PeerId, now: float) -> Out:
        """The EVENT again, from a node whose payload fan-out is limited, naming peers
        (``also``) we are to push the chunk tree to: they have the EVENT from it. From what
        we are sending (or, if the payload is whole here, from the store)."""
        peers = [p for p in msg.also if p != self.me and p != peer]
        if not peers or self.frags.delegate(cid, peers):
            return []
        try:
            event = EventDescriptor.from_block(msg.block, cid)
        except InvalidDescriptor:
            return []
        blocks = large_blocks(self.frags.config, event, self._lookup)
        if blocks is not None:
            head = Event(msg.topic, msg.block, msg.hop, True)
            self.frags.publish(tree.topic.cid, head, blocks, peers, now, fresh=set())
        return []

    def graft_large(self, out: Out, now: float) -> Out:
        """A GRAFT answered with a large event we hold whole: its chunk tree follows as
        fragments (the EVENT flagged), so the grafting peer is not left to the DHT."""
        if not self.frags.config.enabled:
            return out
        kept: Out = []
        for item in out:
            if type(item) is ev.Send and type(item.message) is Event:
                message = item.message
                try:
                    event = EventDescriptor.from_block(message.block)
                except InvalidDescriptor:
                    event = None
                blocks = (None if event is None
                          else large_blocks(self.frags.config, event, self._lookup))
                if blocks is not None:
                    head = Event(message.topic, message.block, message.hop, True)
                    self.frags.add_target(message.topic, head, blocks, item.peer, now)
                    continue
            kept.append(item)
        return kept

    def cover(self, tree: Tree, cid: CID, eager: list[PeerId], sender: PeerId | None) -> None:
        """Who has ``cid`` now or was told of it: HEADS need not name it to them."""
        told = set(eager) | self.lazy.lazy(tree.topic.cid)
        if sender is not None:
            told.add(sender)
        self.backfill.cover(tree.topic.cid, cid, told)

    def forward_own(self, topic: CID, event: EventDescriptor, now: float) -> FlowOut:
        """Our own event is in the DHT: deliver it here and send it down the tree."""
        tree = self._trees[topic]
        out: FlowOut = [*self.backfill.accepted(topic, event, 0, None, now)]
        out.append(Accepted(topic, event))
        eager = self.eager(tree)
        blocks = large_blocks(self.frags.config, event, self._lookup)
        if blocks is not None and eager:
            # A large event: the fragment layer sends the EVENT, then its chunk tree, to
            # each eager link in staggered groups, paced (pulsar.proto.fragments.layer).
            head = Event(topic, event.block, 1, True)
            out += self.frags.publish(topic, head, blocks, eager, now)
            self.metrics["forwarded"] += len(eager)
        else:
            message = Event(topic, event.block, 1)
            for peer in eager:
                out.append(ev.Send(peer, message))
                self.metrics["forwarded"] += 1
        out += self.lazy.accepted(topic, event.cid, 0, None, now)
        self.cover(tree, event.cid, eager, None)
        return out

    def large_completed(self, completed: list[Completed], now: float) -> Out:
        """Large events received in full (or given up: their payload is then read from the
        DHT) go to causal delivery; without cut-through they are announced only now."""
        out: Out = []
        for done in completed:
            tree = self._trees.get(done.topic)
            if tree is None:
                continue
            if done.gave_up:
                out.append(ev.Rejected(None, f"large event {done.event.cid} given up "
                                             f"({done.reason}); its payload is read from the DHT"))
            out += self.backfill.accepted(done.topic, done.event, done.hop, done.sender, now)
            if not self.frags.config.cut_through:
                eager = self.eager(tree)
                out += self.lazy.accepted(done.topic, done.event.cid, done.hop, done.sender, now)
                self.cover(tree, done.event.cid, eager, done.sender)
        return out

    def push_repaired(self, repaired: list[Repaired], now: float) -> Out:
        """Recent events taken in by repair go down the tree: children missed them too.
        History (older than the horizon slack) is left to children that want it."""
        out: Out = []
        for topic, event in ((r.topic, r.event) for r in repaired):
            tree = self._trees.get(topic)
            if tree is None:
                continue
            tree.remember(event.cid, self.config.seen_limit)
            if event.created_at < now - self.backfill.config.horizon_slack:
                continue  # history: children that want it backfill it themselves
            message = Event(topic, event.block, 1)
            for peer in sorted(tree.children | self.lazy.eager_extra(topic), key=bytes):
                if peer == event.publisher:
                    continue
                out.append(ev.Send(peer, message))
                self.metrics["repair_pushed"] += 1
        return out
