"""The Pulsarcast protocol core: one typed machine for every decision a node makes.

``PulsarCore.handle(event, now) -> [output, ...]`` takes every input of
:data:`~pulsar.proto.events.InEvent` and returns outputs of
:data:`~pulsar.proto.events.OutEvent`; the asyncio node and the simulator only carry
them out. It composes the layers, each a module of its own:

* **trees** (:mod:`pulsar.proto.tree.routing`): join routing toward the author with the progress
  rule, parents, children, relay joins, routing around failed parents;
* **versions and rights** (:mod:`pulsar.proto.versions.lineage`): every topic version, the latest
  one, and the rule that judges every event by the latest version (revocation holds);
* **topic commands and version adoption** — a room of their own that owns its state and
  reports back in values the core maps where they stand (:mod:`pulsar.proto.versions.adoption`,
  :mod:`pulsar.proto.versions.commands`, building descriptors in
  :mod:`pulsar.proto.versions.descriptors`): creation (algorithm 1) and updates, announced
  on the author-only meta topic, adopted by every subscriber from meta events;
* **publishing** (:mod:`pulsar.proto.publishing`, :mod:`pulsar.proto.stores`): rights,
  LAST_SEEN / CUSTOM linking, persisted (a write quorum of DHT acknowledgements) before
  forwarded, requests to publish, heads records in the DHT, and learning the latest
  version and heads before a node publishes;
* **causal order, gap fetching, anti-entropy** (:mod:`pulsar.proto.repair.backfill`) and **lazy
  repair** (:mod:`pulsar.proto.gossip.plumtree`).

A node that restarts is given its durable heads and versions in ``Subscribe`` and resumes
from them: it judges by the latest version it had, links its next event to the newest
event it had seen, and rejoins its trees.

This module holds the entry point, subscriptions, the messages of the tree and the events
that travel it, failures and timers, and maps what the rooms report (``_adopt``,
``_command``). Publishing is still a part of the same object (:mod:`pulsar.proto.parts`
names what it shares with this module); the other layers are objects the core holds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final, assert_never

from dag import (
    CID,
    EventDescriptor,
    Identity,
    InvalidDescriptor,
    PeerId,
    TopicDescriptor,
    cid_of,
)
from pulsar.proto.batch.messages import Batch
from pulsar.proto.batch.packing import coalesce
from pulsar.proto.flood.messages import Subs
from pulsar.proto.fragments.chunks import large_blocks
from pulsar.proto.fragments.layer import Fragments
from pulsar.proto.fragments.messages import Fragment, FWant, IDontWant
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.gossip.plumtree import Plumtree, PlumtreeConfig
from pulsar.proto.membership.messages import (
    MAX_INTERESTS,
    Disconnect,
    ForwardJoin,
    HvJoin,
    Interests,
    Neighbor,
    NeighborReply,
    ViewShuffle,
    ViewShuffleReply,
)
from pulsar.proto.membership.overlay import Membership, MembershipConfig
from pulsar.proto.repair.backfill import UNVOUCHED, Backfill, BackfillConfig, Unvouched
from pulsar.proto.repair.messages import MAX_HEADS, Blocks, Heads, HeadsDigest, Joined, Want
from pulsar.proto.tree.messages import Event, Join, Leave, Ping, Pong, RequestToPublish
from pulsar.proto.tree.routing import Routing, Tree, TreeRouter, TreeView
from pulsar.proto.tree.rtt import RttConfig, RttTable
from pulsar.proto.versions.adoption import (
    Adopted,
    Adoption,
    AdoptionOut,
    Backfilled,
    Refused,
    Rejudge,
    Resolved,
    Unparked,
)
from pulsar.proto.versions.commands import (
    CommandItem,
    Created,
    TopicCommands,
    Unpersisted,
    VersionStored,
)

from . import events as ev
from .config import LONE_NODE, CoreConfig
from .events import Out
from .publishing import Forward, Publisher, PublishItem, WantVersion
from .timers import (
    DispatchTimer,
    FragmentStall,
    FragmentTick,
    GapTimeout,
    GraftTimer,
    Greet,
    HeadsTick,
    JoinTimeout,
    MembershipTick,
    RecordTimer,
    RequestTimeout,
    RetryFetch,
    RetryLost,
    RetryParent,
    RootCheck,
    ShuffleTimer,
    WantTimeout,
)

__all__ = ["LONE_NODE", "CoreConfig", "PulsarCore", "Routing", "TreeView"]

_SHARED_NAMES: Final = frozenset({"duplicates", "rejected"})
"""Counters of the core whose names the ordering layer uses too (see ``counters``)."""

_STALE_TOLD = 64
"""Peers remembered per tree as told LEAVE for a stale edge (a bound on what duplicates
from many peers can make a node hold)."""
_STRAYS = 64
"""Events (and senders) remembered per tree as first come over no edge of ours."""
_STRAY_COPIES = 3

_NOT_PROBED: frozenset[type] = frozenset({Ping, Pong, Leave, Prune, Disconnect})
"""Messages that do not make a peer one we depend on (answers and good-byes)."""


class PulsarCore:
    """All of a node's protocol state; feed it with :meth:`handle`."""

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
        rtt: RttConfig | None = None,
        membership: MembershipConfig | None = None,
    ) -> None:
        self.identity = identity
        self.me = identity.peer_id
        self.config = config or CoreConfig()
        self.rng = rng or random.Random(0)
        self._lookup = lookup or (lambda cid: None)
        self.rtt = RttTable(rtt)
        """Smoothed round-trip times per neighbour: the graft and JOIN waits follow them."""
        self.router = TreeRouter(self.me, routing, self.config, self.rtt)
        self.routing = routing
        self._trees = self.router.trees
        self.adoption = Adoption(self._lookup, parked_limit=self.config.parked_limit)
        """Every known topic version and what waits for one (a room of its own)."""
        self.versions = self.adoption.versions
        self.commands = TopicCommands(identity, self.versions, self.config.min_acks)
        self.lazy = Plumtree(
            self.me, self._tree_edges, self._lookup, plumtree, self.rng, rtt=self.rtt
        )
        self.members = Membership(
            self.me,
            self._contacts,
            membership,
            random.Random(self.me.raw),
            distance=self._srtt,
        )
        """The node-wide overlay (HyParView): its neighbours are told which topics we are
        in, and a topic's lazy links are drawn from those that share it."""
        self._new_interests: list[CID] = []
        """Trees joined in this step, to tell the overlay neighbours about."""
        self.backfill = Backfill(
            self._lookup,
            self._verify_backfilled,
            is_delivered=is_delivered,
            neighbours=lambda topic: self._tree_edges(topic) | self.lazy.lazy(topic),
            config=backfill,
            rtt=self.rtt,
        )
        self.frags = Fragments(self.config.fragments)
        """Large events along the tree: fragments received, relayed and paced."""
        self.backfill.coming = self.frags.receiving
        self.publisher = Publisher(
            identity, self.config, self._trees, self.adoption, self.backfill, self._lookup
        )
        """Publishing on every tree: rights, linking, the write quorum, heads records."""
        self._meta_wanted: set[CID] = set()
        """Meta topics to join once their descriptor is fetched."""
        self.metrics: dict[str, int] = {
            "events_received": 0,
            "duplicates": 0,
            "forwarded": 0,
            "rejected": 0,
            "max_hop": 0,
            "repair_pushed": 0,
            "store_quorum_failed": 0,
            "stale_edges": 0,
            "relays_bypassed": 0,
        }

    def handle(self, event: ev.InEvent, now: float) -> Out:
        """Apply one input; return the outputs the driver must carry out, in order."""
        match event:
            case ev.Received():
                out = self._on_received(event.peer, event.message, now)
            case ev.PeerDown() | ev.SendFailed():
                out = self._on_peer_down(event, now)
            case ev.TimerFired():
                out = self._on_timer(event, now)
            case ev.BlockFetched():
                out = self._on_block_fetched(event, now)
            case ev.DhtStored():
                if self.commands.is_job(event.cid):
                    out = self._command(self.commands.stored(event), now)
                else:
                    out = self._pub(self.publisher.on_dht_stored(event, now), now)
            case ev.RecordStored():
                out = self._pub(self.publisher.on_record_stored(event, now), now)
            case ev.RecordsFetched():
                if self.commands.waits_for_records(event.request):
                    tree = self._trees.get(event.topic)
                    out = self._command(self.commands.records_fetched(
                        event, tree is not None, self.backfill.heads(event.topic),
                        None if tree is None else tree.last_seen, now), now)
                else:
                    out = self._pub(self.publisher.on_records(event, now), now)
            case ev.Subscribe():
                out = self._on_subscribe(event, now)
            case ev.Unsubscribe():
                out = self._on_unsubscribe(event, now)
            case ev.Publish():
                out = self._pub(self.publisher.on_publish(event, now), now)
            case ev.CreateTopic():
                out = self._command(self.commands.create(event, now), now)
            case ev.UpdateTopic():
                tree = self._trees.get(event.topic)
                out = self._command(self.commands.update(
                    event, tree is not None, self.backfill.heads(event.topic),
                    None if tree is None else tree.last_seen, now), now)
            case ev.Flush():
                out = self._pub(self.publisher.flush_records(now), now)
            case ev.Start():
                out = self.members.start(now)
            case ev.HistoryCut():
                self.backfill.raise_horizon(event.topic, event.before)
                out = []
            case _:
                assert_never(event)
        return self._after(out, now)

    def tree(self, topic: CID) -> TreeView | None:
        return self.router.view(topic)

    def trees(self) -> list[TreeView]:
        return [v for v in (self.router.view(c) for c in self._trees) if v is not None]

    def topic(self, cid: CID) -> TopicDescriptor | None:
        """A known topic version (its lineage checked)."""
        return self.versions.get(cid)

    def latest(self, topic: CID) -> TopicDescriptor | None:
        """The latest known version of the tree ``topic`` (its first version's CID)."""
        return self.versions.latest(topic)

    def is_subscribed(self, topic: CID) -> bool:
        t = self._trees.get(topic)
        return t is not None and t.deliver

    def heads(self, topic: CID) -> list[CID]:
        """The topic's DAG tips here (what a restarted node asks its neighbours after)."""
        return list(self.backfill.heads(topic))

    def last_seen(self, topic: CID) -> CID | None:
        """What this node's next LAST_SEEN event would link as parent."""
        t = self._trees.get(topic)
        return None if t is None else self.publisher.parent_for(t)

    def counters(self) -> dict[str, int]:
        """The counters of the tree core and its repair layers, in one dict. The layers'
        names are their own; the core's that a layer also uses are renamed here, so that
        neither hides the other: ``tree_duplicates`` (copies that came down the tree
        again), ``inputs_rejected`` (inputs the core refused), while ``duplicates``,
        ``rejected`` and ``delivered`` are the ordering layer's (what reached
        applications)."""
        own = {k: v for k, v in self.metrics.items() if k not in _SHARED_NAMES}
        publishing = dict(self.publisher.metrics)
        publishing["store_quorum_failed"] += own.pop("store_quorum_failed")
        return {
            **own, **publishing, "tree_duplicates": self.metrics["duplicates"],
            "inputs_rejected": self.metrics["rejected"],
            **self.lazy.metrics, **self.backfill.metrics, **self.frags.metrics,
            **self.members.metrics,
        }

    @property
    def min_acks(self) -> int:
        return self.config.min_acks

    @property
    def keeps_outbox(self) -> bool:
        return True

    def repair_links(self, topic: CID) -> tuple[frozenset[PeerId], frozenset[PeerId]]:
        """``(lazy, grafted)``: the Plumtree links of ``topic`` that only announce events,
        and those a GRAFT made eager on top of the tree's edges."""
        return frozenset(self.lazy.lazy(topic)), frozenset(self.lazy.eager_extra(topic))

    def rtt_snapshot(self) -> dict[PeerId, tuple[float, float]]:
        return self.rtt.snapshot()

    def overlay(self) -> dict[PeerId, bool]:
        return dict(self.members.active)

    def _contacts(self) -> list[PeerId]:
        """Where to enter the overlay: a few proven contacts from the k-buckets."""
        return list(self.routing.closest_peers(self.members.rng.randbytes(20), 8))

    def _srtt(self, peer: PeerId) -> float | None:
        estimate = self.rtt.get(peer)
        return None if estimate is None else estimate.srtt

    def _tree_edges(self, topic: CID) -> set[PeerId]:
        tree = self._trees.get(topic)
        return set() if tree is None else tree.neighbours()

    def _known_in(self, topic: CID) -> Callable[[CID], bool]:
        tree = self._trees.get(topic)
        seen: dict[CID, None] = {} if tree is None else tree.seen
        backfill = self.backfill
        return lambda cid: cid in seen or backfill.known(topic, cid)

    def _eager(self, tree: Tree) -> list[PeerId]:
        """Where an event goes eagerly: the tree edges plus links grafted by repair."""
        return sorted(tree.neighbours() | self.lazy.eager_extra(tree.topic.cid), key=bytes)

    def _after(self, out: Out, now: float) -> Out:
        """What follows from any input: recent events taken in by repair go down the tree
        (children missed them too), announced topic versions are adopted, and the author
        keeps its heads record fresh. Large events whose payload completed (or was given
        up) are delivered here, and the fragment pacer releases what may go now."""
        out += self._large_completed(now)
        for topic, event in self.backfill.take_repaired():
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
        extra: Out = self._pub(self.publisher.settle(now), now)
        for item in out:
            if type(item) is not ev.Deliver:
                continue
            tree = self._trees.get(item.topic)
            if tree is None:
                continue
            if tree.topic.is_meta:
                extra += self._adopt(self.adoption.announced(item.event), now)
            elif (tree.topic.author == self.me and item.event.publisher != self.me
                  and item.event.publisher not in tree.recorded_publishers):
                # A publisher our record does not name yet: readers find its own record
                # (fresh after each of its publishes) through ours. Heads alone changing
                # needs no rewrite of ours — that was two record writes per event.
                extra += self._pub(
                    self.publisher.arm_record(tree, self.config.author_record_interval, now), now)
        out += extra
        out += self._interests(now)
        out += self.backfill.arm_tick()
        out += self.frags.pump(now)
        out += self._probes(out, now)
        return coalesce(out)

    def _interests(self, now: float) -> Out:
        """Tell overlay neighbours the topics we are in: all of them to a new neighbour,
        the trees joined in this step to the others (a few messages per link, never per
        period: an idle node sends none)."""
        new, self._new_interests = self._new_interests, []
        changes = self.members.take_changes()
        if not changes and not new:
            return []
        out: Out = []
        fresh = {peer for peer, up in changes if up and peer in self.members.active}
        if fresh:
            everything = sorted(self._trees, key=bytes)
            for peer in sorted(fresh, key=bytes):
                out += _chunked(peer, everything)
        joined = [t for t in new if t in self._trees]
        if joined:
            for peer in self.members.neighbours():
                if peer not in fresh:
                    out += _chunked(peer, joined)
        return out

    def _on_interests(self, peer: PeerId, msg: Interests, now: float) -> Out:
        """A neighbour is in these topics: those we are in too may draw lazy links from
        it (only our own trees are looked at, so what a peer says cannot grow our state)."""
        for topic in msg.topics:
            if topic in self._trees:
                self.lazy.learn(topic, (peer,), now)
        return []

    def _large_completed(self, now: float) -> Out:
        """Large events received in full (or given up: their payload is then read from the
        DHT) go to causal delivery; without cut-through they are announced only now."""
        out: Out = []
        for done in self.frags.take_completed():
            tree = self._trees.get(done.topic)
            if tree is None:
                continue
            if done.gave_up:
                out.append(ev.Rejected(None, f"large event {done.event.cid} given up "
                                             f"({done.reason}); its payload is read from the DHT"))
            out += self.backfill.accepted(done.topic, done.event, done.hop, done.sender, now)
            if not self.frags.config.cut_through:
                eager = self._eager(tree)
                out += self.lazy.accepted(done.topic, done.event.cid, done.hop, done.sender, now)
                self._cover(tree, done.event.cid, eager, done.sender)
        return out

    def _probes(self, out: Out, now: float) -> Out:
        """PINGs to the peers this step talks to whose round-trip time is unknown or
        stale: measurement follows traffic, so an idle node sends none."""
        probes: Out = []
        asked: set[PeerId] = set()
        wanted = self.rtt.wanted
        for item in out:
            if type(item) is not ev.Send or type(item.message) in _NOT_PROBED:
                continue
            peer = item.peer
            if peer in asked:
                continue
            asked.add(peer)
            nonce = wanted(peer, now)
            if nonce is not None:
                probes.append(ev.Send(peer, Ping(nonce)))
        return probes

    def _adopt(self, items: AdoptionOut, now: float) -> Out:
        """Carry out what the adoption room reports, each item where it stands."""
        out: Out = []
        for item in items:
            match item:
                case Unparked():
                    out += self._on_event(item.peer, item.message, now)
                case Adopted():
                    tree = self._trees.get(item.first)
                    if tree is not None:
                        version = item.version
                        out.append(ev.StoreLocal(version.cid, version.block))
                        out.append(ev.VersionAdopted(item.first, version))
                        if version.heads:
                            # The history the version records is reached from its heads,
                            # not only back from today's: an event that raced the
                            # revocation is refused here, and what lies below it would
                            # never come through it.
                            out += self.backfill.learn_heads(item.first, version.heads, None, now)
                case Resolved():
                    out += self._pub(self.publisher.version_resolved(item.version, now), now)
                case Refused():
                    out += self._reject(item.peer, item.reason)
                case Rejudge():
                    if item.known and isinstance(item.item, ev.Received):
                        out += self._backfill_blocks(item.item, now)
                    else:
                        out += self._pass_backfill(item.item, now)
                case _:
                    out.append(item)
        return out

    def _command(self, items: list[CommandItem], now: float) -> Out:
        """Carry out what the topic-command room reports."""
        out: Out = []
        for item in items:
            match item:
                case Created():  # root of both trees
                    out += self._on_subscribe(ev.Subscribe(item.meta, True, now), now)
                    out += self._on_subscribe(ev.Subscribe(item.topic, True, now), now)
                    out.append(ev.TopicReady(item.request, item.topic))
                case VersionStored():
                    out += self._adopt(self.adoption.add(item.version), now)
                    out += self._pub(self.publisher.announce(item.request, item.version, now), now)
                case Unpersisted():
                    self.metrics["store_quorum_failed"] += 1
                    out.append(item.failure)
                case _:
                    out.append(item)
        return out

    def _pub(self, items: list[PublishItem], now: float) -> Out:
        """Carry out what the publishing room reports, each item where it stands."""
        out: Out = []
        for item in items:
            match item:
                case Forward():
                    out += self._forward(item.topic, item.event, now)
                case WantVersion():
                    out += self._adopt(self.adoption.fetch(item.version), now)
                case Refused():
                    out += self._reject(item.peer, item.reason)
                case _:
                    out.append(item)
        return out

    def _forward(self, topic: CID, event: EventDescriptor, now: float) -> Out:
        """Our own event is in the DHT: deliver it here and send it down the tree."""
        tree = self._trees[topic]
        out = self.backfill.accepted(topic, event, 0, None, now)
        out += self.publisher.match_request(tree, event)
        eager = self._eager(tree)
        blocks = large_blocks(self.config.fragments, event, self._lookup)
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
        self._cover(tree, event.cid, eager, None)
        return out

    def _backfill_fetched(self, fetched: ev.BlockFetched, now: float) -> Out:
        """A block backfill asked the DHT for. An event naming a topic version not known
        yet waits for it; anything else goes to the backfill layer at once."""
        version = self.adoption.waiting_version(fetched)
        if version is not None:
            return self._adopt(self.adoption.park_backfill(version, fetched), now)
        return self.backfill.on_fetched(fetched.cid, fetched.block, now)

    def _backfill_blocks(self, received: ev.Received, now: float) -> Out:
        """A neighbour's BLOCKS answer: it waits, whole, for the first topic version not
        known yet that an event it would give backfill names (then for the next, if any)."""
        msg = received.message
        assert isinstance(msg, Blocks)
        version = self.adoption.first_unknown(msg, set(self.backfill.missing(msg.topic)))
        if version is not None:
            return self._adopt(self.adoption.park_backfill(version, received), now)
        return self.backfill.on_blocks(received.peer, msg, now)

    def _pass_backfill(self, item: Backfilled, now: float) -> Out:
        if isinstance(item, ev.BlockFetched):
            return self.backfill.on_fetched(item.cid, item.block, now)
        assert isinstance(item.message, Blocks)
        return self.backfill.on_blocks(item.peer, item.message, now)

    def _on_subscribe(self, cmd: ev.Subscribe, now: float) -> Out:
        topic = cmd.topic
        if topic.parent is not None:
            return self._reject(None, f"subscribe names {topic.cid}, not a first version")
        since = now if cmd.since is None else cmd.since
        out = self._adopt(self.adoption.add(topic), now)
        for version in cmd.versions:
            out += self._adopt(self.adoption.add(version), now)
        tree = self._trees.get(topic.cid)
        if tree is not None:
            tree.deliver = tree.deliver or cmd.deliver
            tree.relay_only = False  # ours now: it stays, and is nobody's detour
            out += self.backfill.open(
                topic.cid, now, deliver=cmd.deliver, since=since, heads=cmd.heads
            )
        else:
            tree = self.router.new_tree(topic, cmd.deliver)
            self._new_interests.append(topic.cid)
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
                armed = self.publisher.arm_record(tree, self.config.record_delay, now)
                out += self._pub(armed, now)
        known = cmd.heads + cmd.unannounced
        if known and tree.last_seen is None:
            tree.last_seen = self.publisher.newest(known)
        if topic.author == self.me or topic.is_meta:
            tree.synced = True  # the author is where versions come from
        elif cmd.deliver and (cmd.since == 0.0 or not cmd.heads):
            # A new subscriber reads the heads records: the latest version to judge by,
            # and (replaying) heads to backfill even when nobody is online. A resumed one
            # already has both; what it missed comes through its neighbours and the meta
            # topic, whose whole (short) history every member follows.
            out += self._pub(self.publisher.start_sync(tree), now)
        if topic.meta is not None:
            out += self._join_meta(topic.meta, now)
        return out

    def _join_meta(self, meta_cid: CID, now: float) -> Out:
        """Every member of a topic follows its meta topic, where new versions appear — its
        whole history (one event per version), so versions made while this node was away
        or before it subscribed are adopted too."""
        tree = self._trees.get(meta_cid)
        if tree is not None:
            return []
        meta = self.versions.get(meta_cid)
        if meta is not None:
            return self._on_subscribe(ev.Subscribe(meta, True, 0.0), now)
        block = self._lookup(meta_cid)
        if block is not None:
            return self._join_meta_block(meta_cid, block, now)
        if meta_cid in self._meta_wanted:
            return []
        self._meta_wanted.add(meta_cid)
        return [ev.Fetch(meta_cid)]

    def _on_unsubscribe(self, cmd: ev.Unsubscribe, now: float) -> Out:
        tree = self._trees.pop(cmd.topic, None)
        if tree is None:
            return []
        out0: Out = [
            ev.CommandFailed(w.request, "unsubscribed before the heads record naming the "
                             "event was stored: it may still be delivered", kind="unrecorded")
            for w in [*tree.record_waiters,
                      *(tree.record_writing[1] if tree.record_writing else [])]
        ]
        self.lazy.stop(cmd.topic)
        self.backfill.close(cmd.topic)
        self.frags.close(cmd.topic)
        leave = Leave(cmd.topic)
        # Children are told too: they route a new JOIN around us, so the subtree never
        # hangs off a node that no longer forwards.
        out: Out = [*out0,
                    *(ev.Send(peer, leave) for peer in sorted(tree.neighbours(), key=bytes))]
        for request in tree.requests.values():
            out.append(ev.CommandFailed(request, "unsubscribed before the event arrived"))
        for waiting in tree.waiting:
            if isinstance(waiting, ev.Publish):
                out.append(ev.CommandFailed(waiting.request, "unsubscribed before publishing"))
        return out + self._leave_meta(tree.topic, now)

    def _leave_meta(self, topic: TopicDescriptor, now: float) -> Out:
        """Leave ``topic``'s meta topic too, once no tree this node is in still names it:
        it was joined for ``topic`` alone (``_join_meta``). The author stays: it is the
        meta topic's root, where the versions come from."""
        meta = topic.meta
        if meta is None or topic.author == self.me or meta not in self._trees:
            return []
        if any(t.topic.meta == meta for t in self._trees.values()):
            return []
        return self._on_unsubscribe(ev.Unsubscribe(meta), now)

    def _on_received(self, peer: PeerId, message: ev.Message, now: float) -> Out:
        match message:
            case Join():
                return self._on_join(peer, message, now)
            case Leave():
                return self._on_leave(peer, message, now)
            case Event():
                return self._on_event(peer, message, now)
            case RequestToPublish():
                return self._pub(self.publisher.on_request(peer, message, now), now)
            case Ping():
                return [ev.Send(peer, Pong(message.nonce))]
            case Pong():
                self.rtt.answered(peer, message.nonce, now)
                return []
            case IHave():
                return self.lazy.on_ihave(peer, message, self._known_in(message.topic), now)
            case Graft():
                return self._graft_large(self.lazy.on_graft(peer, message, now), now)
            case Prune():
                return self.lazy.on_prune(peer, message, now)
            case Shuffle():
                return self.lazy.on_shuffle(peer, message, now)
            case Want():
                return self.backfill.on_want(peer, message, now)
            case Blocks():
                return self._backfill_blocks(ev.Received(peer, message), now)
            case Joined():
                return self._on_joined(peer, message, now)
            case Heads():
                return self.backfill.on_heads(peer, message, now)
            case HeadsDigest():
                return self.backfill.on_digest(peer, message, now)
            case Subs():
                return self._reject(peer, "a floodsub message on a pulsarcast node")
            case Fragment():
                return self.frags.on_fragment(peer, message, now)
            case IDontWant():
                return self.frags.on_idontwant(peer, message)
            case FWant():
                return self.frags.on_fwant(peer, message, self._lookup)
            case (HvJoin() | ForwardJoin() | Neighbor() | NeighborReply() | Disconnect()
                  | ViewShuffle() | ViewShuffleReply()):
                return self.members.on_message(peer, message, now)
            case Interests():
                return self._on_interests(peer, message, now)
            case Batch():
                out: Out = []
                for item in message.messages:
                    out += self._on_received(peer, item, now)
                return out
            case _:
                assert_never(message)

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
            out = self._adopt(self.adoption.add(topic), now)
            tree = self.router.new_tree(topic, deliver=False)
            tree.relay_only = True
            self._new_interests.append(topic.cid)
            out += self.lazy.start(topic.cid, now)
            out += self.backfill.open(topic.cid, now, deliver=False, since=now)
        if peer in tree.parents:
            return self._reject(peer, "join from our own parent")
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

    def _on_joined(self, peer: PeerId, msg: Joined, now: float) -> Out:
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
            elif first and self._relays_only(tree):
                # Children that joined while we were not attached yet: send them up too.
                heads = tuple(self.backfill.heads(msg.topic)[:MAX_HEADS])
                for child in sorted(tree.children, key=bytes):
                    sample = self.lazy.sample(msg.topic, child)
                    out.append(ev.Send(child, Joined(msg.topic, heads, sample, peer)))
        return out + self.backfill.on_heads(peer, msg, now)

    def _relays_only(self, tree: Tree) -> bool:
        """In the tree only because a JOIN came through us (not subscribed, not the
        author, not publishing on it): children are better off with our parent."""
        return (tree.relay_only and not tree.deliver and not tree.acting_root
                and tree.topic.author != self.me)

    def _relay_up(self, tree: Tree) -> PeerId | None:
        if not self._relays_only(tree):
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

    def _on_leave(self, peer: PeerId, msg: Leave, now: float) -> Out:
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

    def _prune_idle(self, tree: Tree) -> Out:
        """A pure relay (not subscribed, not the author) with no children left has no
        reason to stay in the tree: leave it, as Scribe does."""
        if tree.deliver or tree.children or tree.topic.author == self.me or tree.waiting:
            return []
        if tree.requests or self.publisher.busy(tree.topic.cid):
            return []
        if tree.record_waiters or tree.record_writing is not None:
            return []  # publishes of ours wait for this tree's heads record
        del self._trees[tree.topic.cid]
        self.lazy.stop(tree.topic.cid)
        self.backfill.close(tree.topic.cid)
        self.frags.close(tree.topic.cid)
        leave = Leave(tree.topic.cid)
        return [ev.Send(peer, leave) for peer in sorted(tree.parents, key=bytes)]

    def _on_event(self, peer: PeerId | None, msg: Event, now: float) -> Out:
        self.metrics["events_received"] += 1
        tree = self._trees.get(msg.topic)
        if tree is None:
            return self._reject(peer, f"event for {msg.topic}, a tree we are not in")
        cid = cid_of(msg.block)
        if cid in tree.seen or self.backfill.known(tree.topic.cid, cid):
            if msg.also and peer is not None and self.frags.config.enabled:
                return self._delegated(tree, cid, msg, peer, now)
            self.metrics["duplicates"] += 1
            out = self.lazy.duplicate(msg.topic, peer, cid)
            if out:
                return out
            stray = tree.strays.pop(cid, None)
            if stray is not None and peer in tree.parents:
                return self._stray_copy(tree, stray, now)
            return self._stale_edge(tree, peer, now)
        try:
            event = EventDescriptor.from_block(msg.block, cid)
        except InvalidDescriptor as exc:
            return self._reject(peer, f"event {cid}: {exc}")
        if self.versions.get(event.topic) is None:
            return self._adopt(self.adoption.park(event.topic, peer, msg), now)
        problem = self.adoption.judge(tree.topic, event)
        if problem is not None:
            return self._reject(peer, problem)
        if peer is not None:
            tree.retries.pop(peer, None)
        return self._accept(tree, event, msg.hop, peer, now, fragments=msg.fragments,
                            also=msg.also)

    def _stale_edge(self, tree: Tree, peer: PeerId | None, now: float) -> Out:
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

    def _accept(
        self, tree: Tree, event: EventDescriptor, hop: int, sender: PeerId | None, now: float,
        *, fragments: bool = False, also: tuple[PeerId, ...] = (),
    ) -> Out:
        tree.remember(event.cid, self.config.seen_limit)
        tree.last_seen = event.cid
        self.publisher.saw_publisher(tree, event.publisher)
        out: Out = [ev.StoreLocal(event.cid, event.block)]
        if tree.deliver and hop > self.metrics["max_hop"]:
            self.metrics["max_hop"] = hop
        if (
            fragments and sender is not None and isinstance(event.payload, CID)
            and self.frags.config.enabled
        ):
            return out + self._accept_large(tree, event, hop, sender, now, also)
        out += self.backfill.accepted(tree.topic.cid, event, hop, sender, now)
        out += self.publisher.match_request(tree, event)
        if sender is not None and sender not in tree.parents and sender not in tree.children:
            self._stray(tree, event.cid, sender)
        forward = Event(tree.topic.cid, event.block, hop + 1)
        eager = self._eager(tree)
        for peer in eager:
            # Its publisher made it: a copy back (up the tree, to an author) is a duplicate.
            if peer != sender and peer != event.publisher:
                out.append(ev.Send(peer, forward))
                self.metrics["forwarded"] += 1
        out += self.lazy.accepted(tree.topic.cid, event.cid, hop, sender, now)
        self._cover(tree, event.cid, eager, sender)
        return out

    def _accept_large(
        self, tree: Tree, event: EventDescriptor, hop: int, sender: PeerId, now: float,
        also: tuple[PeerId, ...] = (),
    ) -> Out:
        """A large event's EVENT: its fragments follow. The fragment layer relays them (the
        EVENT first) to the eager links, and tells every other neighbour IDONTWANT; it is
        delivered once its payload is complete (``_large_completed``)."""
        topic = tree.topic.cid
        out: Out = []
        out += self.publisher.match_request(tree, event)
        eager = self._eager(tree)
        targets = [p for p in eager if p != sender]
        tell = sorted((set(eager) | self.lazy.lazy(topic)) - {sender}, key=bytes)
        head = Event(topic, event.block, hop + 1, True)
        helped = tuple(p for p in also if p != self.me and p != sender)
        out += self.frags.receive(topic, event, hop, sender, head, targets, tell, now, helped)
        self.metrics["forwarded"] += len(targets)
        if self.frags.config.cut_through:
            out += self.lazy.accepted(topic, event.cid, hop, sender, now)
            self._cover(tree, event.cid, eager, sender)
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
        blocks = large_blocks(self.config.fragments, event, self._lookup)
        if blocks is not None:
            head = Event(msg.topic, msg.block, msg.hop, True)
            self.frags.publish(tree.topic.cid, head, blocks, peers, now, fresh=set())
        return []

    def _graft_large(self, out: Out, now: float) -> Out:
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
                          else large_blocks(self.config.fragments, event, self._lookup))
                if blocks is not None:
                    head = Event(message.topic, message.block, message.hop, True)
                    self.frags.add_target(message.topic, head, blocks, item.peer, now)
                    continue
            kept.append(item)
        return kept

    def _cover(self, tree: Tree, cid: CID, eager: list[PeerId], sender: PeerId | None) -> None:
        """Who has ``cid`` now or was told of it: HEADS need not name it to them."""
        told = set(eager) | self.lazy.lazy(tree.topic.cid)
        if sender is not None:
            told.add(sender)
        self.backfill.cover(tree.topic.cid, cid, told)

    def _on_peer_down(self, down: ev.PeerDown | ev.SendFailed, now: float) -> Out:
        peer = down.peer
        self.rtt.forget(peer)
        out: Out = self.backfill.peer_down(peer, now)
        out += self.lazy.peer_down(peer)
        out += self.members.peer_down(peer, now)
        self.frags.peer_down(peer)
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

    def _on_timer(self, fired: ev.TimerFired, now: float) -> Out:
        timer = fired.timer
        match timer:
            case GapTimeout() | WantTimeout() | RetryFetch() | RetryLost() | HeadsTick():
                return self.backfill.on_timer(timer, now)
            case GraftTimer():
                return self.lazy.on_timer(timer, self._known_in(timer.topic), now)
            case DispatchTimer() | ShuffleTimer():
                return self.lazy.on_timer(timer, _nothing_known, now)
            case RetryParent() | JoinTimeout() | RootCheck():
                return self.router.on_timer(timer, now)
            case RequestTimeout():
                return self._pub(self.publisher.on_request_timeout(timer), now)
            case RecordTimer():
                tree = self._trees.get(timer.topic)
                if tree is None:
                    return []
                return self._pub(self.publisher.write_record(tree, timer, now), now)
            case FragmentTick():
                return self.frags.on_tick(now)
            case FragmentStall():
                return self.frags.on_stall(timer, now)
            case MembershipTick():
                return self.members.on_timer(timer, now)
            case Greet():
                return []  # a floodsub timer: never set by this core
            case _:
                assert_never(timer)

    def _on_block_fetched(self, fetched: ev.BlockFetched, now: float) -> Out:
        cid, block = fetched.cid, fetched.block
        out: Out = []
        if self.frags.fetching(cid):
            out += self.frags.on_fetched(cid, block, now)
        if self.backfill.fetching(cid):
            out += self._backfill_fetched(fetched, now)
        if block is not None and not cid.verifies(block):
            block = None
        if self.adoption.fetching(cid):
            out += self._adopt(self.adoption.fetched(cid, block), now)
        if self.publisher.checking_parent(cid):
            out += self._pub(self.publisher.parent_fetched(cid, block, now), now)
        if cid in self._meta_wanted:
            self._meta_wanted.discard(cid)
            if block is None:
                out += self._reject(None, f"meta topic {cid} not found")
            else:
                out.append(ev.StoreLocal(cid, block))
                out += self._join_meta_block(cid, block, now)
        return out

    def _join_meta_block(self, cid: CID, block: bytes, now: float) -> Out:
        try:
            meta = TopicDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            return self._reject(None, f"meta topic {cid}: {exc}")
        if not meta.is_meta or meta.parent is not None:
            return self._reject(None, f"{cid} is not a meta topic")
        return self._on_subscribe(ev.Subscribe(meta, True, 0.0), now)

    def _verify_backfilled(
        self, topic: CID, block: bytes
    ) -> EventDescriptor | Unvouched | None:
        """The backfill layer's check of a fetched block: everything ``_on_event`` checks.
        An event refused only because nothing vouches for it yet is :data:`UNVOUCHED`:
        the walk from a recorded head may still reach it."""
        tree = self._trees.get(topic)
        if tree is None:
            return None
        verdict = self.adoption.verify(tree.topic, block)
        if verdict == "unvouched":
            return UNVOUCHED
        if verdict is not None:
            self.publisher.saw_publisher(tree, verdict.publisher)
        return verdict

    def _stray(self, tree: Tree, cid: CID, sender: PeerId) -> None:
        """Note an event whose first copy came over no tree edge, unless over a grafted
        link (the lazy layer prunes those)."""
        if sender in self.lazy.eager_extra(tree.topic.cid):
            return
        tree.strays[cid] = sender
        if len(tree.strays) > _STRAYS:
            del tree.strays[next(iter(tree.strays))]

    def _stray_copy(self, tree: Tree, stray: PeerId, now: float) -> Out:
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
        return self._stale_edge(tree, stray, now)

    def _reject(self, peer: PeerId | None, reason: str) -> Out:
        self.metrics["rejected"] += 1
        return [ev.Rejected(peer, reason)]


def _nothing_known(cid: CID) -> bool:
    """For the layer timers that ask nothing about events."""
    return False


def _chunked(peer: PeerId, topics: list[CID]) -> Out:
    return [
        ev.Send(peer, Interests(tuple(topics[i : i + MAX_INTERESTS])))
        for i in range(0, len(topics), MAX_INTERESTS)
    ]
