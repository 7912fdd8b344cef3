"""A tree's life at one node: opened by a subscription or by a JOIN through us, left
when we unsubscribe or when a pure relay has nobody left to relay for.

* **Subscribe.** The tree is opened (or a relay tree becomes ours), causal delivery
  starts from the durable heads, the lazy layer starts, and the node joins toward the
  author. A node that restarts resumes: its own events a crash kept from everyone are
  delivered again and recorded, and LAST_SEEN links to the newest event it had. A new
  subscriber that is not the author syncs (reads the heads records) before it publishes.
  Every member follows the topic's meta topic too, where new versions appear.
* **Relay.** A JOIN for a tree we are not in makes us a relay for it (as in Scribe).
* **Leave.** Unsubscribing tells parents and children (children route a new JOIN around
  us) and fails what still waited on the tree; the meta topic is left with the last tree
  that named it. A pure relay with no children left leaves the tree; a parent that
  leaves or fails is routed around.

:class:`TreeLifecycle` owns the meta topics it is fetching and the trees opened since the
last step (for INTERESTS); the trees are the router's. What is publishing's to do comes
back among its outputs (:data:`LifeItem`): arm a heads record (:class:`ArmRecord`), sync
before publishing (:class:`StartSync`), and follow a meta topic, which is a subscription
the core makes (:class:`FollowMeta`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dag import CID, InvalidDescriptor, PeerId, TopicDescriptor
from dag.event_links import newest
from pulsar.proto.fragments.layer import Fragments
from pulsar.proto.gossip.plumtree import Plumtree
from pulsar.proto.membership.messages import Interests
from pulsar.proto.publishing.stores import OwnStores
from pulsar.proto.repair.backfill import Backfill
from pulsar.proto.tree.messages import Leave
from pulsar.proto.tree.routing import Tree, TreeRouter
from pulsar.proto.versions.lineage import TopicVersions

from .. import events as ev
from ..events import Out, OutEvent
from ..reports import Refused

__all__ = ["ArmRecord", "FollowMeta", "LifeItem", "LifeOut", "StartSync", "TreeLifecycle"]


@dataclass(frozen=True, slots=True)
class ArmRecord:
    """Write our heads record of ``topic`` (our own events were resumed)."""

    topic: CID


@dataclass(frozen=True, slots=True)
class StartSync:
    """Read the heads records of ``topic`` before publishing on it."""

    topic: CID


@dataclass(frozen=True, slots=True)
class FollowMeta:
    """Subscribe to the meta topic ``meta`` (its whole history)."""

    meta: TopicDescriptor


LifeItem = OutEvent | ArmRecord | StartSync | FollowMeta | Refused
LifeOut = list[LifeItem]


class TreeLifecycle:
    """Opening and leaving the trees of one node (see the module docstring)."""

    def __init__(
        self,
        me: PeerId,
        router: TreeRouter,
        versions: TopicVersions,
        lazy: Plumtree,
        backfill: Backfill,
        frags: Fragments,
        stores: OwnStores,
        lookup: Callable[[CID], bytes | None],
    ) -> None:
        self.me = me
        self.router = router
        self._trees = router.trees
        self.versions = versions
        self.lazy = lazy
        self.backfill = backfill
        self.frags = frags
        self._stores = stores
        self._lookup = lookup
        self._meta_wanted: set[CID] = set()
        """Meta topics to join once their descriptor is fetched."""
        self.opened: list[CID] = []
        """Trees opened since the core last told the overlay neighbours (INTERESTS)."""

    def subscribe(self, cmd: ev.Subscribe, now: float) -> LifeOut:
        """Open (or take over) the tree of ``cmd.topic``, whose versions the core has
        registered already."""
        topic = cmd.topic
        since = now if cmd.since is None else cmd.since
        out: LifeOut = []
        tree = self._trees.get(topic.cid)
        if tree is not None:
            tree.deliver = tree.deliver or cmd.deliver
            tree.relay_only = False  # ours now: it stays, and is nobody's detour
            out += self.backfill.open(
                topic.cid, now, deliver=cmd.deliver, since=since, heads=cmd.heads
            )
        else:
            tree = self.router.new_tree(topic, cmd.deliver)
            self.opened.append(topic.cid)
            out += self.backfill.open(
                topic.cid, now, deliver=cmd.deliver, since=since, heads=cmd.heads
            )
            out += self.lazy.start(topic.cid, now)
            out += self.router.join(tree, now)
        if cmd.unannounced:
            # Our own events a crash may have kept from everyone: the store has their
            # blocks, so they are delivered (after what they link to), become heads that
            # HEADS tells the neighbours, and go into a fresh heads record.
            out += self.backfill.learn_heads(topic.cid, cmd.unannounced, None, now)
            if not topic.is_meta:
                out.append(ArmRecord(topic.cid))
        known = cmd.heads + cmd.unannounced
        if known and tree.last_seen is None:
            tree.last_seen = newest(known, self._lookup)
        if topic.author == self.me or topic.is_meta:
            tree.synced = True  # the author is where versions come from
        elif cmd.deliver and (cmd.since == 0.0 or not cmd.heads):
            # A new subscriber reads the heads records: the latest version to judge by,
            # and (replaying) heads to backfill even when nobody is online. A resumed one
            # already has both; what it missed comes through its neighbours and the meta
            # topic, whose whole (short) history every member follows.
            out.append(StartSync(topic.cid))
        if topic.meta is not None:
            out += self._join_meta(topic.meta)
        return out

    def _join_meta(self, meta_cid: CID) -> LifeOut:
        """Every member of a topic follows its meta topic, where new versions appear — its
        whole history (one event per version), so versions made while this node was away
        or before it subscribed are adopted too."""
        if meta_cid in self._trees:
            return []
        meta = self.versions.get(meta_cid)
        if meta is not None:
            return [FollowMeta(meta)]
        block = self._lookup(meta_cid)
        if block is not None:
            return self._meta_block(meta_cid, block)
        if meta_cid in self._meta_wanted:
            return []
        self._meta_wanted.add(meta_cid)
        return [ev.Fetch(meta_cid)]

    def wants_meta(self, cid: CID) -> bool:
        return cid in self._meta_wanted

    def meta_fetched(self, cid: CID, block: bytes | None) -> LifeOut:
        """The answer to a meta topic's fetch (``block`` None: not found or not ``cid``'s)."""
        self._meta_wanted.discard(cid)
        if block is None:
            return [Refused(None, f"meta topic {cid} not found")]
        return [ev.StoreLocal(cid, block), *self._meta_block(cid, block)]

    def _meta_block(self, cid: CID, block: bytes) -> LifeOut:
        try:
            meta = TopicDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            return [Refused(None, f"meta topic {cid}: {exc}")]
        if not meta.is_meta or meta.parent is not None:
            return [Refused(None, f"{cid} is not a meta topic")]
        return [FollowMeta(meta)]

    def adopted(self, first: CID, version: TopicDescriptor, now: float) -> Out:
        """``version`` became the latest of the topic ``first``: a tree of it stores and
        reports it, and backfills from the heads it records — an event that raced the
        revocation is refused here, and what lies below it would never come through it."""
        if first not in self._trees:
            return []
        out: Out = [ev.StoreLocal(version.cid, version.block), ev.VersionAdopted(first, version)]
        if version.heads:
            out += self.backfill.learn_heads(first, version.heads, None, now)
        return out

    def on_interests(self, peer: PeerId, msg: Interests, now: float) -> Out:
        """A neighbour is in these topics: those we are in too may draw lazy links from
        it (only our own trees are looked at, so what a peer says cannot grow our state)."""
        for topic in msg.topics:
            if topic in self._trees:
                self.lazy.learn(topic, (peer,), now)
        return []

    def relay(self, topic: TopicDescriptor, now: float) -> tuple[Tree, Out]:
        """A JOIN came through us for ``topic``, a tree we are not in: relay for it."""
        tree = self.router.new_tree(topic, deliver=False)
        tree.relay_only = True
        self.opened.append(topic.cid)
        out = self.lazy.start(topic.cid, now)
        out += self.backfill.open(topic.cid, now, deliver=False, since=now)
        return tree, out

    def unsubscribe(self, topic: CID) -> Out:
        tree = self._trees.pop(topic, None)
        if tree is None:
            return []
        out: Out = [
            ev.CommandFailed(w.request, "unsubscribed before the heads record naming the "
                             "event was stored: it may still be delivered", kind="unrecorded")
            for w in [*tree.record_waiters,
                      *(tree.record_writing[1] if tree.record_writing else [])]
        ]
        self._close(topic)
        leave = Leave(topic)
        # Children are told too: they route a new JOIN around us, so the subtree never
        # hangs off a node that no longer forwards.
        out += [ev.Send(peer, leave) for peer in sorted(tree.neighbours(), key=bytes)]
        for request in tree.requests.values():
            out.append(ev.CommandFailed(request, "unsubscribed before the event arrived"))
        for waiting in tree.waiting:
            if isinstance(waiting, ev.Publish):
                out.append(ev.CommandFailed(waiting.request, "unsubscribed before publishing"))
        return out + self._leave_meta(tree.topic)

    def _leave_meta(self, topic: TopicDescriptor) -> Out:
        """Leave ``topic``'s meta topic too, once no tree this node is in still names it:
        it was joined for ``topic`` alone. The author stays: it is the meta topic's root,
        where the versions come from."""
        meta = topic.meta
        if meta is None or topic.author == self.me or meta not in self._trees:
            return []
        if any(t.topic.meta == meta for t in self._trees.values()):
            return []
        return self.unsubscribe(meta)

    def on_leave(self, peer: PeerId, msg: Leave, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        if tree is None:
            return []
        tree.children.discard(peer)
        self.lazy.demote(msg.topic, peer)
        if peer in tree.parents:
            # A parent that leaves is alive and may still be the way in: routing may pick it
            # again, and it then serves as a pure relay (as in Scribe). Only peers that fail
            # are avoided.
            tree.parents.discard(peer)
            tree.retries.pop(peer, None)
            return self._prune_idle(tree) or self.router.join(tree, now)
        return self._prune_idle(tree)

    def peer_down(self, down: ev.PeerDown | ev.SendFailed, now: float) -> Out:
        """``down.peer`` is gone: off every tree as a child, routed around as a parent."""
        peer = down.peer
        out: Out = []
        for tree in list(self._trees.values()):
            if peer in tree.children:
                tree.children.discard(peer)
                out += self._prune_idle(tree)
            if peer in tree.parents and tree.topic.cid in self._trees:
                # The transport reports SendFailed after its own dials failed: a parent that
                # never answered our JOIN and cannot even be dialled is routed around at
                # once (e.g. an offline author), not retried with backoff.
                never_reached = isinstance(down, ev.SendFailed) and peer not in tree.confirmed
                out += self.router.parent_failed(tree, peer, now, give_up=never_reached)
        return out

    def _prune_idle(self, tree: Tree) -> Out:
        """A pure relay (not subscribed, not the author) with no children left has no
        reason to stay in the tree: leave it, as Scribe does."""
        if tree.deliver or tree.children or tree.topic.author == self.me or tree.waiting:
            return []
        if tree.requests or self._stores.busy(tree.topic.cid):
            return []
        if tree.record_waiters or tree.record_writing is not None:
            return []  # publishes of ours wait for this tree's heads record
        del self._trees[tree.topic.cid]
        self._close(tree.topic.cid)
        leave = Leave(tree.topic.cid)
        return [ev.Send(peer, leave) for peer in sorted(tree.parents, key=bytes)]

    def _close(self, topic: CID) -> None:
        self.lazy.stop(topic)
        self.backfill.close(topic)
        self.frags.close(topic)
