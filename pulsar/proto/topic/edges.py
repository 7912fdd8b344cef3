"""The edges of a node's trees: children that join, parents that answer, relays routed
around, and edges only the other side still holds.

* **JOIN / JOINED.** A node takes a peer that joins through it as a child and answers
  JOINED with its heads (the child backfills at once what it missed) and a sample of
  the topic's members (lazy links). A parent's JOINED confirms the edge.
* **Relays routed around.** A node in a tree only because a JOIN came through it (not
  subscribed, not the author, not publishing) names its own parent in JOINED; the child
  joins there instead when that peer is strictly closer to the author (the progress
  rule that keeps trees acyclic), so events stop making a detour (as in Scribe).
* **Stale edges.** A duplicate pushed over an edge we do not hold (a LEAVE lost, a child
  forgotten across a restart, a grafted link whose PRUNE was lost) is answered LEAVE, at
  most once per peer per ``stale_edge_quiet``; so is a stray sender whose copies keep
  coming before our parent's.

:class:`TreeEdges` keeps no state of its own beyond its counters: the edges are the
trees' (:class:`~pulsar.proto.tree.routing.Tree`, owned by the router).
"""

from __future__ import annotations

from typing import Final

from dag import CID, PeerId
from pulsar.proto.gossip.plumtree import Plumtree
from pulsar.proto.repair.backfill import Backfill
from pulsar.proto.repair.messages import MAX_HEADS, Joined
from pulsar.proto.tree.messages import Join, Leave
from pulsar.proto.tree.routing import Tree, TreeRouter

from .. import events as ev
from ..config import CoreConfig
from ..events import Out

__all__ = ["TreeEdges"]

_STALE_TOLD: Final = 64
"""Peers remembered per tree as told LEAVE for a stale edge (a bound on what duplicates
from many peers can make a node hold)."""
_STRAYS: Final = 64
"""Events (and senders) remembered per tree as first come over no edge of ours."""
_STRAY_COPIES: Final = 3


class TreeEdges:
    """Child and parent edges of every tree of one node (see the module docstring)."""

    def __init__(
        self, me: PeerId, config: CoreConfig, router: TreeRouter, lazy: Plumtree,
        backfill: Backfill,
    ) -> None:
        self.me = me
        self.config = config
        self.router = router
        self._trees = router.trees
        self.lazy = lazy
        self.backfill = backfill
        self.metrics: dict[str, int] = {"stale_edges": 0, "relays_bypassed": 0}

    def attach_child(self, tree: Tree, peer: PeerId, msg: Join, now: float) -> Out:
        """``peer`` joins through us (it is not our parent): take it as a child, answer
        JOINED, and join the tree ourselves if we are not attached yet."""
        out: Out = []
        tree.children.add(peer)
        tree.retries.pop(peer, None)
        self.lazy.learn(msg.topic, [peer], now)
        # The answer to a JOIN confirms the edge to the child and carries our heads, so it
        # backfills at once whatever it missed while it was not attached.
        heads = tuple(self.backfill.heads(msg.topic)[:MAX_HEADS])
        sample = self.lazy.sample(msg.topic, peer)
        out.append(ev.Send(peer, Joined(msg.topic, heads, sample, self._relay_up(tree))))
        if tree.in_tree():
            return out
        return out + self.router.join(tree, now)

    def on_joined(self, peer: PeerId, msg: Joined, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        out: Out = []
        if tree is not None and peer not in tree.parents:
            # It took us as a child, and we hold another parent: it answers a JOIN we gave
            # up on (and routed around), or our LEAVE to it crossed its JOINED. End the
            # edge on its side, or it pushes us every event as a duplicate while our new
            # parent does too — and a child edge it held the other way round made a cycle
            # that did so for the rest of the order scenario.
            out.append(ev.Send(peer, Leave(msg.topic)))
        if tree is not None and peer in tree.parents:
            first = peer not in tree.confirmed
            tree.confirmed.add(peer)  # the parent took us as a child
            tree.retries.pop(peer, None)
            if msg.heads:
                tree.hint = msg.heads[-1]  # the freshest word on the heads
            self.lazy.learn(msg.topic, msg.peers, now)
            if msg.up is not None:
                out += self._bypass(tree, peer, msg.up)
            elif first and self.relays_only(tree):
                # Children that joined while we were not attached yet: send them up too.
                heads = tuple(self.backfill.heads(msg.topic)[:MAX_HEADS])
                for child in sorted(tree.children, key=bytes):
                    sample = self.lazy.sample(msg.topic, child)
                    out.append(ev.Send(child, Joined(msg.topic, heads, sample, peer)))
        return out + self.backfill.on_heads(peer, msg, now)

    def relays_only(self, tree: Tree) -> bool:
        """In the tree only because a JOIN came through us (not subscribed, not the
        author, not publishing on it): children are better off with our parent."""
        return (tree.relay_only and not tree.deliver and not tree.acting_root
                and tree.topic.author != self.me)

    def _relay_up(self, tree: Tree) -> PeerId | None:
        if not self.relays_only(tree):
            return None
        confirmed = sorted(tree.parents & tree.confirmed, key=bytes)
        return confirmed[0] if confirmed else None

    def _bypass(self, tree: Tree, relay: PeerId, up: PeerId) -> Out:
        """Our parent only relays and named its own parent: join there and leave the
        relay (which then leaves the tree if nobody else hangs off it), so events stop
        making a detour through a node that does not want them. ``up`` must be strictly
        closer to the author than we are — the progress rule that keeps trees acyclic —
        and not a peer we avoid; otherwise we stay where we are."""
        if (up in (self.me, relay) or up in tree.children or up in tree.avoid
                or not self.router.closer(up, tree.topic.author)):
            return []
        tree.parents = {up}
        tree.confirmed.discard(relay)
        tree.retries.pop(relay, None)
        self.metrics["relays_bypassed"] += 1
        return [ev.Send(relay, Leave(tree.topic.cid)), *self.router.send_join(tree, up)]

    def stale_edge(self, tree: Tree, peer: PeerId | None, now: float) -> Out:
        """A duplicate pushed over an edge we do not hold: a parent we left whose LEAVE was
        lost, a child we forgot (a restart), or a grafted link whose PRUNE was lost. LEAVE
        ends it on the other side (a child then joins again; a grafted link turns lazy),
        at most once per peer per ``stale_edge_quiet``."""
        if peer is None or peer in tree.parents or peer in tree.children:
            return []
        if peer in self.lazy.eager_extra(tree.topic.cid):
            return []
        told = tree.stale_told
        last = told.get(peer)
        if last is not None and now - last < self.config.stale_edge_quiet:
            return []
        if len(told) >= _STALE_TOLD:
            for old in [p for p, t in told.items() if now - t >= self.config.stale_edge_quiet]:
                del told[old]
            if len(told) >= _STALE_TOLD:
                return []  # that many stale edges at once: tell them when some quiet ends
        told[peer] = now
        self.metrics["stale_edges"] += 1
        return [ev.Send(peer, Leave(tree.topic.cid))]

    def stray(self, tree: Tree, cid: CID, sender: PeerId) -> None:
        """Note an event whose first copy came over no tree edge, unless over a grafted
        link (the lazy layer prunes those)."""
        if sender in self.lazy.eager_extra(tree.topic.cid):
            return
        tree.strays[cid] = sender
        if len(tree.strays) > _STRAYS:
            del tree.strays[next(iter(tree.strays))]

    def stray_copy(self, tree: Tree, stray: PeerId, now: float) -> Out:
        """Our parent's copy came second, after one from ``stray``, which is no edge of
        ours: it holds an edge to us we do not (a LEAVE of ours lost, a child it never
        learnt left). Its copies always come first, so the duplicates are never its own
        and it would never be told otherwise. Told LEAVE once that happened
        ``_STRAY_COPIES`` times, not at the first: a copy that was in flight while edges
        changed is a coincidence, not a stale edge."""
        counts = tree.stray_copies
        counts[stray] = counts.get(stray, 0) + 1
        if counts[stray] < _STRAY_COPIES:
            if len(counts) > _STRAYS:
                del counts[next(iter(counts))]
            return []
        del counts[stray]
        return self.stale_edge(tree, stray, now)
