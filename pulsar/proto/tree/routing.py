"""Dissemination trees: join routing, parents and children (paper, algorithm 2).

A JOIN goes to the known peer closest to the topic author's Kademlia id, and only if that
peer is *strictly* closer than this node (DESIGN.md's progress rule). Parent edges
therefore always shrink the XOR distance to the author, so a tree has no cycles, and a node
that knows nobody closer acts as root — which is also how a tree survives its author being
offline (Scribe-style). A lost parent is retried ``parent_retries`` times with backoff;
then the node routes a new JOIN around it. A parent given up on because it did not answer
the JOIN in time (it is connected, only slow) is told so with LEAVE: it may have taken us
as a child after all, and would keep pushing events down an edge nobody uses.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, assert_never

from dag import CID, PeerId, TopicDescriptor
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .messages import Join, Leave, RequestToPublish
from .rtt import RttTable
from .timers import JoinTimeout, RetryParent, RootCheck

if TYPE_CHECKING:
    from pulsar.proto.config import CoreConfig

__all__ = ["Routing", "Tree", "TreeRouter", "TreeView"]


class Routing(Protocol):
    """What the core needs from the DHT: local k-bucket knowledge, no network traffic."""

    def closest_peers(self, key: bytes, count: int) -> Sequence[PeerId]:
        """Known peers (with proven peer ids) closest to the 20-byte Kademlia ``key``."""
        ...


@dataclass(frozen=True, slots=True)
class TreeView:
    """A read-only picture of one topic's tree at this node."""

    topic: CID
    parents: frozenset[PeerId]
    children: frozenset[PeerId]
    is_root: bool
    subscribed: bool
    attached: bool = True
    """A parent answered our JOIN (or we are the root): the node is in the tree."""


@dataclass(slots=True)
class Tree:
    """One topic's tree at this node, and what publishing on it needs to remember."""

    topic: TopicDescriptor
    """The first version: trees are named by it."""
    deliver: bool
    parents: set[PeerId] = field(default_factory=set)
    children: set[PeerId] = field(default_factory=set)
    acting_root: bool = False
    last_seen: CID | None = None
    """The newest event accepted or published here (LAST_SEEN links to it)."""
    hint: CID | None = None
    """A head a neighbour or a heads record named, for LAST_SEEN before we saw anything."""
    seen: dict[CID, None] = field(default_factory=dict)
    retries: dict[PeerId, int] = field(default_factory=dict)
    avoid: dict[PeerId, float] = field(default_factory=dict)  # peer -> until when
    requests: dict[bytes, int] = field(default_factory=dict)
    confirmed: set[PeerId] = field(default_factory=set)
    synced: bool = False
    """The latest version and heads were looked up (heads records) since this tree began:
    only then may this node publish on it (the author always may)."""
    sync_round: int = 0
    sync_asked: set[PeerId] = field(default_factory=set)
    sync_waiting: set[CID] = field(default_factory=set)
    """Topic versions named by records, still being fetched."""
    sync_heads: dict[CID, None] = field(default_factory=dict)
    """Heads named by records, backfilled only once ``sync_waiting`` is empty: an event
    is judged by the latest version, so the walk must not start before the versions the
    records name are known (an event naming a version not known yet is refused, and a
    revoked publisher's events are vouched for only by the version that revoked it)."""
    records_done: bool = False
    waiting: list[ev.Publish | tuple[PeerId, RequestToPublish]] = field(default_factory=list)
    record_due: float | None = None
    """When the armed heads-record timer fires (None: none armed)."""
    record_seq: int = 0
    record_waiters: list[ev.Published] = field(default_factory=list)
    """Our publishes forwarded but not acknowledged yet: they wait for a heads record
    that names them (or a later event) to be stored at the write quorum."""
    record_writing: tuple[int, list[ev.Published]] | None = None
    """The heads record being written (its sequence number) and the publishes it will
    acknowledge; one write at a time per tree, so later publishes share the next one."""
    record_failures: int = 0
    """Consecutive heads-record writes that missed the write quorum."""
    record_again: bool = False
    """A record write was due while one was in flight: write when it is answered."""
    publishers: OrderedDict[PeerId, None] = field(default_factory=OrderedDict)
    """Publishers seen lately (named in our heads record, for discovery)."""
    recorded_publishers: frozenset[PeerId] = frozenset()
    """The publishers our last heads record named."""
    relay_only: bool = False
    """The tree began with a JOIN through us, not a subscription of ours."""
    stale_told: dict[PeerId, float] = field(default_factory=dict)
    """Peers told LEAVE for pushing over an edge we do not hold, and when."""
    strays: dict[CID, PeerId] = field(default_factory=dict)
    """Recent events whose first copy came over no edge of ours, by sender."""
    stray_copies: dict[PeerId, int] = field(default_factory=dict)
    """Peers whose first copies our parent's copy followed, and how often."""

    def neighbours(self) -> set[PeerId]:
        return self.parents | self.children

    def in_tree(self) -> bool:
        return self.acting_root or bool(self.parents)

    def remember(self, cid: CID, limit: int) -> None:
        """Note ``cid`` as seen here (the ``limit`` most recent are kept)."""
        self.seen[cid] = None
        if len(self.seen) > limit:
            del self.seen[next(iter(self.seen))]


class TreeRouter:
    """Join routing and parent maintenance for every tree of one node."""

    def __init__(
        self, me: PeerId, routing: Routing, config: CoreConfig, rtt: RttTable | None = None
    ) -> None:
        self.me = me
        self.routing = routing
        self.config = config
        self.rtt = rtt or RttTable()
        self.trees: dict[CID, Tree] = {}
        self._kid_cache: dict[PeerId, int] = {}

    def new_tree(self, topic: TopicDescriptor, deliver: bool) -> Tree:
        tree = Tree(topic=topic, deliver=deliver)
        self.trees[topic.cid] = tree
        return tree

    def counts(self) -> dict[str, int]:
        """Gauges: the trees this node is in, and those attached (a parent answered the
        JOIN, or we are the root), counted without building a view of each."""
        attached = sum(1 for t in self.trees.values() if t.acting_root or t.confirmed & t.parents)
        return {"trees": len(self.trees), "trees_attached": attached}

    def view(self, topic: CID) -> TreeView | None:
        t = self.trees.get(topic)
        if t is None:
            return None
        return TreeView(
            topic, frozenset(t.parents), frozenset(t.children), t.acting_root, t.deliver,
            t.acting_root or bool(t.confirmed & t.parents),
        )

    def _kid(self, peer: PeerId) -> int:
        kid = self._kid_cache.get(peer)
        if kid is None:
            if len(self._kid_cache) > 100_000:
                self._kid_cache.clear()
            kid = self._kid_cache[peer] = int.from_bytes(peer.kademlia_id(), "big")
        return kid

    def closer(self, peer: PeerId, author: PeerId) -> bool:
        """``peer`` is strictly closer to ``author``'s Kademlia id than this node."""
        target = self._kid(author)
        return self._kid(peer) ^ target < self._kid(self.me) ^ target

    def next_hop(self, author: PeerId, avoid: set[PeerId]) -> PeerId | None:
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

    def join(self, tree: Tree, now: float) -> Out:
        """Attach ``tree`` upwards (algorithm 2, the sending half)."""
        author = tree.topic.author
        if author == self.me:
            tree.acting_root = True
            return []
        for avoided, until in list(tree.avoid.items()):
            if until <= now:
                del tree.avoid[avoided]
        peer = self.next_hop(author, set(tree.avoid) | tree.children)
        if peer is None and author not in tree.avoid and author not in tree.children:
            # Nobody we know is closer to the author than we are: ask the author itself
            # (the runtime finds its address in the DHT). Waiting for it to appear in our
            # k-buckets left an acting root, in the churn scenario, running half of a tree
            # for the rest of the run after the author came back: nothing made the two
            # meet. An author that is down fails the send and is avoided for
            # ``avoid_for``; we act as root meanwhile and ask again after that.
            peer = author
        if peer is None:
            tree.acting_root = True
            return [ev.SetTimer(self.config.root_check_interval, RootCheck(tree.topic.cid))]
        tree.acting_root = False
        tree.parents = {peer}
        return self.send_join(tree, peer)

    def join_wait(self, peer: PeerId) -> float:
        """How long a JOIN to ``peer`` may go unanswered: JOINED comes straight back, so
        ``join_rtts`` retransmission waits of the path to that peer (or to the farthest
        neighbour measured, if that one was not yet), never less than ``join_timeout``."""
        rto = self.rtt.worst_rto({peer})
        if rto is None:
            return self.config.join_timeout
        return max(self.config.join_timeout, self.config.join_rtts * rto)

    def send_join(self, tree: Tree, peer: PeerId) -> Out:
        tree.confirmed.discard(peer)
        return [
            ev.Send(peer, Join(tree.topic.cid, tree.topic.block)),
            ev.SetTimer(self.join_wait(peer), JoinTimeout(tree.topic.cid, peer)),
        ]

    def parent_failed(self, tree: Tree, peer: PeerId, now: float, *, give_up: bool = False,
                      alive: bool = False) -> Out:
        """Retry a parent with backoff; after ``parent_retries`` route around it. A parent
        that is ``alive`` (it only failed to answer our JOIN in time) is told with LEAVE."""
        attempt = tree.retries.get(peer, 0) + 1
        tree.retries[peer] = attempt
        if attempt <= self.config.parent_retries and not give_up:
            delay = self.config.parent_retry_delay * 2 ** (attempt - 1)
            return [ev.SetTimer(delay, RetryParent(tree.topic.cid, peer))]
        tree.parents.discard(peer)
        tree.retries.pop(peer, None)
        tree.avoid[peer] = now + self.config.avoid_for
        if not alive:  # unreachable: a LEAVE would only cost another round of dials
            return self.join(tree, now)
        # Only slow: it may have taken us as a child after all, and must stop pushing.
        return [ev.Send(peer, Leave(tree.topic.cid)), *self.join(tree, now)]

    def on_timer(self, timer: RetryParent | JoinTimeout | RootCheck, now: float) -> Out:
        tree = self.trees.get(timer.topic)
        if tree is None:
            return []
        match timer:
            case RetryParent():
                if timer.peer not in tree.parents:
                    return []
                # Re-sending the JOIN both probes the parent and restores our place with it
                # if it restarted; a failure comes back as SendFailed, another attempt.
                return self.send_join(tree, timer.peer)
            case JoinTimeout():
                if timer.peer not in tree.parents or timer.peer in tree.confirmed:
                    return []
                return self.parent_failed(tree, timer.peer, now, alive=True)
            case RootCheck():
                if not tree.acting_root or tree.topic.author == self.me:
                    return []
                return self.join(tree, now)
            case _:
                assert_never(timer)
