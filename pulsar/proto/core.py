"""The Pulsarcast protocol core: one typed machine for every decision a node makes.

``PulsarCore.handle(event, now) -> [output, ...]`` takes every input of
:data:`~pulsar.proto.events.InEvent` and returns outputs of
:data:`~pulsar.proto.events.OutEvent`; the asyncio node and the simulator only carry
them out. The core owns no protocol state itself: it holds one object per room and
routes each input to the room whose state it concerns.

Rooms: topics (:mod:`.topic`: a tree's life, its edges, events along it, over :mod:`.tree`
routing and RTTs), versions (:mod:`.versions`), publishing (:mod:`.publishing`), repair
(:mod:`.repair`), lazy links (:mod:`.gossip`), the overlay (:mod:`.membership`) and
large events (:mod:`.fragments`).

A room never calls the core. What it cannot decide alone comes back among its outputs
as a value of its own (a version adopted, our event persisted, an event to park ...),
and the core maps each one where it stands (``_adopt``, ``_command``, ``_pub``,
``_flow``, ``_life``), so the order of outputs is that of the work. ``_after`` runs
what follows from any input: repaired events pushed down, versions announced on meta
topics adopted, INTERESTS, the fragment pacer and RTT probes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import assert_never

from dag import (
    CID,
    EventDescriptor,
    Identity,
    InvalidDescriptor,
    PeerId,
    TopicDescriptor,
)
from pulsar.proto.batch.messages import Batch
from pulsar.proto.batch.packing import coalesce
from pulsar.proto.flood.messages import Subs
from pulsar.proto.fragments.layer import Completed, Fragments
from pulsar.proto.fragments.messages import Fragment, FWant, IDontWant
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.gossip.plumtree import Plumtree, PlumtreeConfig
from pulsar.proto.membership import messages as hv
from pulsar.proto.membership.overlay import Membership, MembershipConfig
from pulsar.proto.repair.backfill import UNVOUCHED, Backfill, BackfillConfig, Repaired, Verdict
from pulsar.proto.repair.messages import Blocks, Heads, HeadsDigest, Joined, Want
from pulsar.proto.topic.dissemination import Accepted, Dissemination, FlowOut, Park
from pulsar.proto.topic.edges import TreeEdges
from pulsar.proto.topic.lifecycle import ArmRecord, FollowMeta, LifeOut, StartSync, TreeLifecycle
from pulsar.proto.tree.messages import Event, Join, Leave, Ping, Pong, RequestToPublish
from pulsar.proto.tree.routing import Routing, Tree, TreeRouter, TreeView
from pulsar.proto.tree.rtt import RttConfig, RttTable
from pulsar.proto.versions.adoption import (
    Adopted,
    Adoption,
    AdoptionOut,
    Backfilled,
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
from . import timers as tm
from .config import LONE_NODE, CoreConfig
from .events import Out, OutEvent
from .publishing.publisher import Forward, Publisher, PublishItem, WantVersion
from .reports import Refused

__all__ = ["LONE_NODE", "CoreConfig", "PulsarCore", "Routing", "TreeView"]

Step = OutEvent | Repaired | Completed
"""What the core gathers from one input: outputs, events repair brought in, large events
whose payload is complete (or given up). ``_after`` maps the last two; only outputs leave."""
Steps = Sequence[Step]
_NOT_PROBED: frozenset[type] = frozenset({Ping, Pong, Leave, Prune, hv.Disconnect})
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
        """The node-wide overlay (HyParView): a topic's lazy links are drawn from it."""
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
        self.edges = TreeEdges(self.me, self.config, self.router, self.lazy, self.backfill)
        """JOINs taken, JOINED answered, relays routed around, stale edges ended."""
        self.flow = Dissemination(
            self.me, self.config, self._trees, self.lazy, self.backfill, self.frags,
            self.edges, self.adoption, self._lookup,
        )
        """Events down the trees: checked, stored, forwarded eagerly and announced lazily."""
        self.publisher = Publisher(
            identity, self.config, self._trees, self.adoption, self.backfill, self._lookup
        )
        """Publishing on every tree: rights, linking, the write quorum, heads records."""
        self.life = TreeLifecycle(
            self.me, self.router, self.versions, self.lazy, self.backfill, self.frags,
            self.publisher.stores, self._lookup,
        )
        """Trees opened by subscriptions and JOINs, and left."""
        self.metrics: dict[str, int] = {"rejected": 0, "store_quorum_failed": 0}
        """The core's own counters (each room counts its own; ``counters`` gathers them)."""

    def handle(self, event: ev.InEvent, now: float) -> Out:
        """Apply one input; return the outputs the driver must carry out, in order."""
        out: Steps
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
                tree = self._trees.get(event.topic)
                out = self.publisher.records.on_stored(tree, event, now)
            case ev.RecordsFetched():
                if self.commands.waits_for_records(event.request):
                    tree = self._trees.get(event.topic)
                    out = self._command(self.commands.records_fetched(
                        event, tree is not None, self.backfill.heads(event.topic),
                        self._persisted_tip(tree), now), now)
                else:
                    out = self._pub(self.publisher.on_records(event, now), now)
            case ev.Subscribe():
                out = self._on_subscribe(event, now)
            case ev.Unsubscribe():
                out = self.life.unsubscribe(event.topic)
            case ev.Publish():
                out = self._pub(self.publisher.on_publish(event, now), now)
            case ev.CreateTopic():
                out = self._command(self.commands.create(event, now), now)
            case ev.UpdateTopic():
                tree = self._trees.get(event.topic)
                out = self._command(self.commands.update(
                    event, tree is not None, self.backfill.heads(event.topic),
                    self._persisted_tip(tree), now), now)
            case ev.Flush():
                out = self.publisher.records.flush(self._trees.values(), now)
            case ev.Start():
                out = self.members.start(now)
            case ev.HistoryCut():
                self.backfill.raise_horizon(event.topic, event.before)
                out = []
            case ev.CheckpointMade():
                out = self.publisher.records.checkpoint(
                    event.topic, self._trees.get(event.topic), event.checkpoint, now)
            case ev.Reconciled():
                out = self.backfill.on_reconciled(event, now)
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

    def _persisted_tip(self, tree: Tree | None) -> CID | None:
        """Our newest event already in the DHT, the head a topic version may record: one
        that then failed its write quorum would be delivered by every adopter."""
        return None if tree is None else self.publisher.stores.last_persisted(tree.last_seen)

    def last_seen(self, topic: CID) -> CID | None:
        """What this node's next LAST_SEEN event would link as parent."""
        t = self._trees.get(topic)
        return None if t is None else self.publisher.parent_for(t)

    def counters(self) -> dict[str, int]:
        """Every room's counters in one dict, by their own names but two: copies that came
        down the tree again are ``tree_duplicates`` and inputs refused ``inputs_rejected``
        (``duplicates``, ``rejected`` are the ordering layer's: what reached applications)."""
        flow = {k: v for k, v in self.flow.metrics.items() if k != "duplicates"}
        publishing = {**self.publisher.metrics, **self.publisher.records.metrics}
        publishing["store_quorum_failed"] += self.metrics["store_quorum_failed"]
        return {
            **flow, **publishing, "tree_duplicates": self.flow.metrics["duplicates"],
            "inputs_rejected": self.metrics["rejected"],
            **self.lazy.metrics, **self.backfill.metrics, **self.frags.metrics,
            **self.members.metrics, **self.edges.metrics, **self.router.counts(),
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

    def _after(self, out: Steps, now: float) -> Out:
        """What follows from any input: recent events taken in by repair go down the tree
        (children missed them too), announced topic versions are adopted, and the author
        keeps its heads record fresh. Large events whose payload completed (or was given
        up) are delivered here, and the fragment pacer releases what may go now."""
        done = self._large_and_repaired(out, now)
        extra = [*self._pub(self.publisher.settle(now), now)]
        for item in done:
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
                # (fresh after each of its publishes) through ours; heads alone do not.
                extra += self.publisher.records.arm(tree, self.config.author_record_interval, now)
        done += self._large_and_repaired(extra, now)
        done += self._interests()
        done += self.backfill.arm_tick()
        done += self.frags.pump(now)
        done += self._probes(done, now)
        return coalesce(done)

    def _large_and_repaired(self, steps: Steps, now: float) -> Out:
        """Outputs, then large events complete delivered, then repaired events pushed."""
        out = [item for item in steps if not isinstance(item, Repaired | Completed)]
        out += self.flow.large_completed([i for i in steps if isinstance(i, Completed)], now)
        return out + self.flow.push_repaired([i for i in steps if isinstance(i, Repaired)], now)

    def _interests(self) -> Out:
        """Tell overlay neighbours the topics we are in (see ``Membership.tell_interests``)."""
        new, self.life.opened = self.life.opened, []
        joined = [t for t in new if t in self._trees]
        return self.members.tell_interests(self._trees.keys(), joined)

    def _probes(self, out: Out, now: float) -> Out:
        """PINGs to the peers this step talks to whose round-trip time is unknown or
        stale: measurement follows traffic, so an idle node sends none."""
        peers = (item.peer for item in out
                 if type(item) is ev.Send and type(item.message) not in _NOT_PROBED)
        return [ev.Send(peer, Ping(nonce)) for peer, nonce in self.rtt.probes(peers, now)]

    def _adopt(self, items: AdoptionOut, now: float) -> Steps:
        """Carry out what the adoption room reports, each item where it stands."""
        out: list[Step] = []
        for item in items:
            match item:
                case Unparked():
                    out += self._flow(self.flow.on_event(item.peer, item.message, now), now)
                case Adopted():
                    out += self.life.adopted(item.first, item.version, now)
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

    def _command(self, items: list[CommandItem], now: float) -> Steps:
        """Carry out what the topic-command room reports."""
        out: list[Step] = []
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

    def _pub(self, items: list[PublishItem], now: float) -> Steps:
        """Carry out what the publishing room reports, each item where it stands."""
        out: list[Step] = []
        for item in items:
            match item:
                case Forward():
                    out += self._flow(self.flow.forward_own(item.topic, item.event, now), now)
                case WantVersion():
                    out += self._adopt(self.adoption.fetch(item.version), now)
                case Refused():
                    out += self._reject(item.peer, item.reason)
                case _:
                    out.append(item)
        return out

    def _flow(self, items: FlowOut, now: float) -> Steps:
        """Carry out what the dissemination room reports, each item where it stands."""
        out: list[Step] = []
        for item in items:
            match item:
                case Park():
                    out += self._adopt(self.adoption.park(item.version, item.peer, item.message),
                                       now)
                case Accepted():
                    tree = self._trees[item.topic]
                    self.publisher.saw_publisher(tree, item.event.publisher)
                    out += self.publisher.match_request(tree, item.event)
                case Refused():
                    out += self._reject(item.peer, item.reason)
                case _:
                    out.append(item)
        return out

    def _life(self, items: LifeOut, now: float) -> Steps:
        """Carry out what the tree-lifecycle room reports, each item where it stands."""
        out: list[Step] = []
        for item in items:
            match item:
                case ArmRecord():
                    tree = self._trees[item.topic]
                    out += self.publisher.records.arm(tree, self.config.record_delay, now)
                case StartSync():
                    out += self._pub(self.publisher.start_sync(self._trees[item.topic]), now)
                case FollowMeta():
                    out += self._on_subscribe(ev.Subscribe(item.meta, True, 0.0), now)
                case Refused():
                    out += self._reject(item.peer, item.reason)
                case _:
                    out.append(item)
        return out

    def _backfill_blocks(self, received: ev.Received, now: float) -> Steps:
        """A neighbour's BLOCKS answer, judged against the topic's gap frontier."""
        msg = received.message
        assert isinstance(msg, Blocks)
        frontier = set(self.backfill.missing(msg.topic))
        return self._adopt(self.adoption.backfilled_blocks(received, frontier), now)

    def _pass_backfill(self, item: Backfilled, now: float) -> Steps:
        if isinstance(item, ev.BlockFetched):
            return self.backfill.on_fetched(item.cid, item.block, now)
        assert isinstance(item.message, Blocks)
        return self.backfill.on_blocks(item.peer, item.message, now)

    def _on_subscribe(self, cmd: ev.Subscribe, now: float) -> Steps:
        topic = cmd.topic
        if topic.parent is not None:
            return self._reject(None, f"subscribe names {topic.cid}, not a first version")
        out = [*self._adopt(self.adoption.add(topic), now)]
        for version in cmd.versions:
            out += self._adopt(self.adoption.add(version), now)
        return [*out, *self._life(self.life.subscribe(cmd, now), now)]

    def _on_received(self, peer: PeerId, message: ev.Message, now: float) -> Steps:
        match message:
            case Join():
                return self._on_join(peer, message, now)
            case Leave():
                return self.life.on_leave(peer, message, now)
            case Event():
                return self._flow(self.flow.on_event(peer, message, now), now)
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
                return self.flow.graft_large(self.lazy.on_graft(peer, message, now), now)
            case Prune():
                return self.lazy.on_prune(peer, message, now)
            case Shuffle():
                return self.lazy.on_shuffle(peer, message, now)
            case Want():
                return self.backfill.on_want(peer, message, now)
            case Blocks():
                return self._backfill_blocks(ev.Received(peer, message), now)
            case Joined():
                return self.edges.on_joined(peer, message, now)
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
            case (hv.HvJoin() | hv.ForwardJoin() | hv.Neighbor() | hv.NeighborReply()
                  | hv.Disconnect() | hv.ViewShuffle() | hv.ViewShuffleReply()):
                return self.members.on_message(peer, message, now)
            case hv.Interests():
                return self.life.on_interests(peer, message, now)
            case Batch():
                out: list[Step] = []
                for item in message.messages:
                    out += self._on_received(peer, item, now)
                return out
            case _:
                assert_never(message)

    def _on_join(self, peer: PeerId, msg: Join, now: float) -> Steps:
        tree = self._trees.get(msg.topic)
        out: list[Step] = []
        if tree is None:
            try:
                topic = TopicDescriptor.from_block(msg.topic_block, msg.topic)
            except InvalidDescriptor as exc:
                return self._reject(peer, f"join for {msg.topic}: {exc}")
            if topic.parent is not None:
                return self._reject(peer, "join must name a topic's first version")
            out = [*self._adopt(self.adoption.add(topic), now)]
            tree, opened = self.life.relay(topic, now)
            out += opened
        if peer in tree.parents:
            return self._reject(peer, "join from our own parent")
        return out + self.edges.attach_child(tree, peer, msg, now)

    def _on_peer_down(self, down: ev.PeerDown | ev.SendFailed, now: float) -> Out:
        peer = down.peer
        self.rtt.forget(peer)
        out: Out = self.backfill.peer_down(peer, now)
        out += self.lazy.peer_down(peer)
        out += self.members.peer_down(peer, now)
        self.frags.peer_down(peer)
        return out + self.life.peer_down(down, now)

    def _on_timer(self, fired: ev.TimerFired, now: float) -> Steps:
        timer = fired.timer
        match timer:
            case (tm.GapTimeout() | tm.WantTimeout() | tm.RetryFetch() | tm.RetryLost()
                  | tm.HeadsTick() | tm.ReconcileTimeout()):
                return self.backfill.on_timer(timer, now)
            case tm.GraftTimer():
                return self.lazy.on_timer(timer, self._known_in(timer.topic), now)
            case tm.DispatchTimer() | tm.ShuffleTimer():
                return self.lazy.on_timer(timer, _nothing_known, now)
            case tm.RetryParent() | tm.JoinTimeout() | tm.RootCheck():
                return self.router.on_timer(timer, now)
            case tm.RequestTimeout():
                return self._pub(self.publisher.on_request_timeout(timer), now)
            case tm.RecordTimer():
                tree = self._trees.get(timer.topic)
                if tree is None:
                    return []
                return self.publisher.records.write(tree, timer, now)
            case tm.FragmentTick():
                return self.frags.on_tick(now)
            case tm.FragmentStall():
                return self.frags.on_stall(timer, now)
            case tm.MembershipTick():
                return self.members.on_timer(timer, now)
            case tm.Greet():
                return []  # a floodsub timer: never set by this core
            case _:
                assert_never(timer)

    def _on_block_fetched(self, fetched: ev.BlockFetched, now: float) -> Steps:
        cid, block = fetched.cid, fetched.block
        out: list[Step] = []
        if self.frags.fetching(cid):
            out += self.frags.on_fetched(cid, block, now)
        if self.backfill.fetching(cid):
            out += self._adopt(self.adoption.backfilled(fetched), now)
        if block is not None and not cid.verifies(block):
            block = None
        if self.adoption.fetching(cid):
            out += self._adopt(self.adoption.fetched(cid, block), now)
        if self.publisher.checking_parent(cid):
            out += self._pub(self.publisher.parent_fetched(cid, block, now), now)
        if self.life.wants_meta(cid):
            out += self._life(self.life.meta_fetched(cid, block), now)
        return out

    def _verify_backfilled(self, topic: CID, block: bytes | EventDescriptor) -> Verdict:
        """The repair room's check of a fetched block (or parsed event): what ``_on_event``
        checks (:data:`UNVOUCHED`: refused until a walk from a recorded head vouches)."""
        tree = self._trees.get(topic)
        verdict = None if tree is None else self.publisher.judge_block(tree, block)
        return UNVOUCHED if verdict == "unvouched" else verdict

    def _reject(self, peer: PeerId | None, reason: str) -> Out:
        self.metrics["rejected"] += 1
        return [ev.Rejected(peer, reason)]


def _nothing_known(cid: CID) -> bool:
    """For the layer timers that ask nothing about events."""
    return False
