"""The Pulsarcast protocol core: one typed machine for every decision a node makes.

``PulsarCore.handle(event, now) -> [output, ...]`` takes every input of
:data:`~pulsar.proto.events.InEvent` and returns outputs of
:data:`~pulsar.proto.events.OutEvent`; the asyncio node and the simulator only carry
them out. It composes the layers, each a module of its own:

* **trees** (:mod:`pulsar.proto.tree`): join routing toward the author with the progress
  rule, parents, children, relay joins, routing around failed parents;
* **versions and rights** (:mod:`pulsar.proto.versions`): every topic version, the latest
  one, and the rule that judges every event by the latest version (revocation holds);
* **topic commands** (:mod:`pulsar.proto.topics`): creation (algorithm 1) and updates,
  announced on the author-only meta topic, adopted by every subscriber from meta events;
* **publishing** (here): rights, LAST_SEEN / CUSTOM linking, persisted (a write quorum of
  DHT acknowledgements) before forwarded, requests to publish, heads records in the DHT,
  and learning the latest version and heads before a node publishes;
* **causal order, gap fetching, anti-entropy** (:mod:`pulsar.proto.backfill`) and **lazy
  repair** (:mod:`pulsar.proto.plumtree`).

A node that restarts is given its durable heads and versions in ``Subscribe`` and resumes
from them: it judges by the latest version it had, links its next event to the newest
event it had seen, and rejoins its trees.
"""

from __future__ import annotations

import random
from collections.abc import Callable
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
    cid_of,
)
from dag.records import MAX_RECORD_HEADS, MAX_RECORD_PEERS, HeadsRecord

from . import events as ev
from .backfill import Backfill, BackfillConfig, _links_of
from .events import Out
from .flood_messages import Subs
from .gossip_messages import Graft, IHave, Prune, Shuffle
from .messages import Event, Join, Leave, Ping, Pong, RequestToPublish
from .plumtree import Plumtree, PlumtreeConfig
from .repair_messages import MAX_HEADS, Blocks, Heads, Joined, Want
from .stores import OwnStores, Stored
from .timers import (
    DispatchTimer,
    GapTimeout,
    GraftTimer,
    Greet,
    HeadsTick,
    JoinTimeout,
    RecordTimer,
    RequestTimeout,
    RetryFetch,
    RetryParent,
    RootCheck,
    ShuffleTimer,
    WantTimeout,
)
from .topics import build_topic, build_version
from .tree import Routing, Tree, TreeRouter, TreeView
from .versions import TopicVersions

__all__ = ["LONE_NODE", "CoreConfig", "PulsarCore", "Routing", "TreeView"]

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
    """A JOIN is answered with JOINED; unanswered this long, it counts as a failed attempt
    (a lost JOIN must not leave a node silently detached)."""
    avoid_for: float = 30.0
    """How long a parent we gave up on is left out of join routing."""
    min_acks: int = 1
    """DHT nodes that must acknowledge an event (or topic) before it counts as persisted:
    the publish fails with a clear error below this and the event is not forwarded."""
    record_delay: float = 0.5
    """After a publish, how long to gather more before writing the heads record."""
    author_record_interval: float = 5.0
    """The author also rewrites its record when its heads change, at most this often."""
    waiting_publishes: int = 1000
    """Publishes (and requests to publish) queued per tree while it learns the latest
    version and heads; beyond this they fail at once."""
    sync_rounds: int = 2
    """Rounds of heads-record look-ups: the author and allowed publishers, then the
    publishers their records name."""
    sync_publishers: int = 16
    """Most publishers whose records one round asks for."""

    def __post_init__(self) -> None:
        if self.min_acks < 0:
            raise ValueError("min_acks must be >= 0")
        if self.sync_rounds < 1 or self.sync_publishers < 1:
            raise ValueError("sync_rounds and sync_publishers must be >= 1")


LONE_NODE = CoreConfig(min_acks=0)
"""For a node that runs without DHT peers on purpose (one-node benchmarks): a publish
counts as persisted once it is in the local store."""


@dataclass(slots=True)
class _TopicJob:
    """A create or update waiting for its descriptors to be persisted."""

    request: int
    topic: TopicDescriptor
    meta: TopicDescriptor | None
    left: set[CID] = field(default_factory=set)
    failed: bool = False


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
    ) -> None:
        self.identity = identity
        self.me = identity.peer_id
        self.config = config or CoreConfig()
        self.rng = rng or random.Random(0)
        self._lookup = lookup or (lambda cid: None)
        self.router = TreeRouter(self.me, routing, self.config)
        self.routing = routing
        self._trees = self.router.trees
        self.versions = TopicVersions()
        self.lazy = Plumtree(self.me, self._tree_edges, self._lookup, plumtree, self.rng)
        self.backfill = Backfill(
            self._lookup,
            self._verify_backfilled,
            is_delivered=is_delivered,
            neighbours=lambda topic: self._tree_edges(topic) | self.lazy.lazy(topic),
            config=backfill,
        )
        self._parked: dict[CID, list[tuple[PeerId | None, Event]]] = {}
        """Events waiting for the topic version they name, by that version's CID."""
        self._parked_count = 0
        self._version_fetches: set[CID] = set()
        self._stores = OwnStores()
        self._topic_jobs: dict[CID, _TopicJob] = {}
        self._parent_checks: dict[CID, list[tuple[ev.Publish, CID]]] = {}
        """CUSTOM parents being fetched to verify before publishing, with what waits."""
        self._meta_wanted: set[CID] = set()
        """Meta topics to join once their descriptor is fetched."""
        self._syncing: set[CID] = set()
        """Trees whose sync waits only for their JOIN to be answered (or to act as root)."""
        self.metrics: dict[str, int] = {
            "events_received": 0,
            "delivered": 0,
            "duplicates": 0,
            "forwarded": 0,
            "rejected": 0,
            "published": 0,
            "max_hop": 0,
            "repair_pushed": 0,
            "records_written": 0,
            "store_quorum_failed": 0,
        }

    # ------------------------------------------------------------------ public surface

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
                out = self._on_dht_stored(event, now)
            case ev.RecordsFetched():
                out = self._on_records(event, now)
            case ev.Subscribe():
                out = self._on_subscribe(event, now)
            case ev.Unsubscribe():
                out = self._on_unsubscribe(event, now)
            case ev.Publish():
                out = self._on_publish(event, now)
            case ev.CreateTopic():
                out = self._on_create(event, now)
            case ev.UpdateTopic():
                out = self._on_update(event, now)
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
        return None if t is None else self._parent_for(t)

    def counters(self) -> dict[str, int]:
        """The counters of the tree core and its repair layers, in one dict."""
        return {**self.metrics, **self.lazy.metrics, **self.backfill.metrics}

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

    # ------------------------------------------------------------------ after every input

    def _after(self, out: Out, now: float) -> Out:
        """What follows from any input: recent events taken in by repair go down the tree
        (children missed them too), announced topic versions are adopted, and the author
        keeps its heads record fresh."""
        for topic, event in self.backfill.take_repaired():
            tree = self._trees.get(topic)
            if tree is None:
                continue
            self._remember(tree, event.cid)
            if event.created_at < now - self.backfill.config.horizon_slack:
                continue  # history: children that want it backfill it themselves
            message = Event(topic, event.block, 1)
            for peer in sorted(tree.children | self.lazy.eager_extra(topic), key=bytes):
                out.append(ev.Send(peer, message))
                self.metrics["repair_pushed"] += 1
        extra: Out = []
        for cid in list(self._syncing):
            tree = self._trees.get(cid)
            if tree is None:
                self._syncing.discard(cid)
            else:
                extra += self._maybe_synced(tree, now)
        for item in out:
            if type(item) is not ev.Deliver:
                continue
            tree = self._trees.get(item.topic)
            if tree is None:
                continue
            if tree.topic.is_meta:
                extra += self._announced(item.event, now)
            elif tree.topic.author == self.me:
                extra += self._arm_record(tree, self.config.author_record_interval)
        out += extra
        return out

    # ------------------------------------------------------------------ commands

    def _on_subscribe(self, cmd: ev.Subscribe, now: float) -> Out:
        topic = cmd.topic
        if topic.parent is not None:
            return self._reject(None, f"subscribe names {topic.cid}, not a first version")
        since = now if cmd.since is None else cmd.since
        out = self._add_version(topic, now)
        for version in cmd.versions:
            out += self._add_version(version, now)
        tree = self._trees.get(topic.cid)
        if tree is not None:
            tree.deliver = tree.deliver or cmd.deliver
            out += self.backfill.open(
                topic.cid, now, deliver=cmd.deliver, since=since, heads=cmd.heads
            )
        else:
            tree = self.router.new_tree(topic, cmd.deliver)
            out += self.backfill.open(
                topic.cid, now, deliver=cmd.deliver, since=since, heads=cmd.heads
            )
            out += self.lazy.start(topic.cid)
            out += self.router.join(tree, now)
        if cmd.heads and tree.last_seen is None:
            tree.last_seen = self._newest(cmd.heads)
        if topic.author == self.me or topic.is_meta:
            tree.synced = True  # the author is where versions come from
        elif cmd.deliver and (cmd.since == 0.0 or not cmd.heads):
            # A new subscriber reads the heads records: the latest version to judge by,
            # and (replaying) heads to backfill even when nobody is online. A resumed one
            # already has both; what it missed comes through its neighbours and the meta
            # topic, whose whole (short) history every member follows.
            out += self._start_sync(tree)
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
        self.lazy.stop(cmd.topic)
        self.backfill.close(cmd.topic)
        leave = Leave(cmd.topic)
        # Children are told too: they route a new JOIN around us, so the subtree never
        # hangs off a node that no longer forwards.
        out: Out = [ev.Send(peer, leave) for peer in sorted(tree.neighbours(), key=bytes)]
        for request in tree.requests.values():
            out.append(ev.CommandFailed(request, "unsubscribed before the event arrived"))
        for waiting in tree.waiting:
            if isinstance(waiting, ev.Publish):
                out.append(ev.CommandFailed(waiting.request, "unsubscribed before publishing"))
        return out

    def _on_create(self, cmd: ev.CreateTopic, now: float) -> Out:
        try:
            meta, topic = build_topic(self.identity, cmd, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic: {exc}")]
        job = _TopicJob(cmd.request, topic, meta, {meta.cid, topic.cid})
        self._topic_jobs[meta.cid] = self._topic_jobs[topic.cid] = job
        return [ev.StoreDht(meta.cid, meta.block), ev.StoreDht(topic.cid, topic.block)]

    def _on_update(self, cmd: ev.UpdateTopic, now: float) -> Out:
        tree = self._trees.get(cmd.topic)
        current = self.versions.latest(cmd.topic)
        if tree is None or current is None:
            return [ev.CommandFailed(cmd.request, "not in this topic's tree; subscribe first")]
        if current.author != self.me:
            return [ev.CommandFailed(cmd.request, "only the topic's author may update it")]
        if current.is_meta:
            return [ev.CommandFailed(cmd.request, "a meta topic has no versions")]
        heads = self.backfill.heads(cmd.topic)
        if tree.last_seen is not None and tree.last_seen not in heads:
            heads.append(tree.last_seen)  # our own event still on its way into the DHT
        try:
            version = build_version(self.identity, current, cmd.changes, heads, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic version: {exc}")]
        self._topic_jobs[version.cid] = _TopicJob(cmd.request, version, None, {version.cid})
        return [ev.StoreDht(version.cid, version.block)]

    def _topic_stored(self, job: _TopicJob, result: ev.DhtStored, now: float) -> Out:
        job.left.discard(result.cid)
        if job.failed:
            return []
        if result.acks < self.config.min_acks:
            job.failed = True
            self.metrics["store_quorum_failed"] += 1
            return [ev.CommandFailed(job.request, self._quorum_reason(result.acks, "topic"))]
        if job.left:
            return []
        topic = job.topic
        if job.meta is not None:  # created: root of both trees
            out = self._on_subscribe(ev.Subscribe(job.meta, True, now), now)
            out += self._on_subscribe(ev.Subscribe(topic, True, now), now)
            out.append(ev.TopicReady(job.request, topic))
            return out
        out = self._add_version(topic, now)
        assert topic.parent is not None
        first = self.versions.first_of(topic.cid)
        tree = None if first is None else self._trees.get(first)
        meta_tree = None if topic.meta is None else self._trees.get(topic.meta)
        if tree is not None:
            out += self._arm_record(tree, 0.0)  # the record names the new version
        if meta_tree is None:
            out.append(ev.TopicReady(job.request, topic))
            return out
        announcement = EventDescriptor.create(
            self.identity,
            meta_tree.topic.cid,
            topic.cid.raw,
            parent=self._parent_for(meta_tree),
            now=now,
        )
        return out + self._publish(
            meta_tree, announcement, None, then=ev.TopicReady(job.request, topic)
        )

    def _on_publish(self, cmd: ev.Publish, now: float) -> Out:
        tree = self._trees.get(cmd.topic)
        if tree is None:
            return [ev.CommandFailed(cmd.request, "not in this topic's tree; subscribe first")]
        if tree.topic.is_meta:
            return [ev.CommandFailed(cmd.request, "meta topics carry only topic versions")]
        if not tree.synced:
            return self._wait_for_sync(tree, cmd)
        topic = self.versions.latest(tree.topic.cid)
        assert topic is not None
        if topic.event_linking is EventLinking.LAST_SEEN and cmd.parent is not None:
            return [ev.CommandFailed(cmd.request, "topic links events LAST_SEEN; no parent")]
        if topic.event_linking is EventLinking.CUSTOM and cmd.parent is not None:
            problem = self._check_parent(tree, cmd.parent)
            if problem == "fetch":
                return self._fetch_parent(cmd, tree.topic.cid)
            if problem is not None:
                return [ev.CommandFailed(cmd.request, problem)]
        return self._publish_now(tree, topic, cmd, now)

    def _publish_now(
        self, tree: Tree, topic: TopicDescriptor, cmd: ev.Publish, now: float
    ) -> Out:
        parent = (
            self._parent_for(tree) if topic.event_linking is EventLinking.LAST_SEEN else cmd.parent
        )
        if topic.may_publish(self.me):
            event = EventDescriptor.create(
                self.identity, topic.cid, cmd.payload, parent=parent, now=now
            )
            return self._publish(tree, event, cmd.request)
        if not topic.may_request(self.me):
            return [ev.CommandFailed(cmd.request, "not allowed to publish or to request it")]
        if not tree.parents:
            return [ev.CommandFailed(cmd.request, "no parent to carry a request to publish")]
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

    def _check_parent(self, tree: Tree, parent: CID) -> str | None:
        """A CUSTOM parent must be a valid event of this topic: None if it is, "fetch" if it
        must be fetched first, else why not."""
        if parent in tree.seen or self.backfill.known(tree.topic.cid, parent):
            return None
        block = self._lookup(parent)
        if block is None:
            return "fetch"
        if self._verify_backfilled(tree.topic.cid, block) is None:
            return f"parent {parent} is not a valid event of this topic"
        return None

    def _fetch_parent(self, cmd: ev.Publish, topic: CID) -> Out:
        waiting = self._parent_checks.get(cmd.parent)  # type: ignore[arg-type]
        assert cmd.parent is not None
        if waiting is not None:
            waiting.append((cmd, topic))
            return []
        if len(self._parent_checks) >= self.config.waiting_publishes:
            return [ev.CommandFailed(cmd.request, "too many parents being checked")]
        self._parent_checks[cmd.parent] = [(cmd, topic)]
        return [ev.Fetch(cmd.parent)]

    def _parent_fetched(self, cid: CID, block: bytes | None, now: float) -> Out:
        out: Out = []
        for cmd, topic in self._parent_checks.pop(cid, []):
            tree = self._trees.get(topic)
            latest = self.versions.latest(topic)
            if tree is None or latest is None:
                out.append(ev.CommandFailed(cmd.request, "left the topic before publishing"))
            elif block is None:
                out.append(ev.CommandFailed(cmd.request, f"parent {cid} not found"))
            elif self._verify_backfilled(topic, block) is None:
                reason = f"parent {cid} is not a valid event of this topic"
                out.append(ev.CommandFailed(cmd.request, reason))
            else:
                out.append(ev.StoreLocal(cid, block))
                out += self._publish_now(tree, latest, cmd, now)
        return out

    # ------------------------------------------------------------------ learning before publishing

    def _wait_for_sync(self, tree: Tree, item: ev.Publish | tuple[PeerId, RequestToPublish]) -> Out:
        if len(tree.waiting) >= self.config.waiting_publishes:
            if isinstance(item, ev.Publish):
                return [ev.CommandFailed(item.request, "too many publishes waiting for the topic")]
            return self._reject(item[0], "too many requests to publish waiting")
        tree.waiting.append(item)
        return self._start_sync(tree)

    def _start_sync(self, tree: Tree) -> Out:
        """Look up the topic's heads records before publishing, so the node judges and
        publishes under the latest version and links to the latest events."""
        if tree.synced or tree.sync_round > 0:
            return []
        tree.sync_round = 1
        latest = self.versions.latest(tree.topic.cid) or tree.topic
        publishers = [tree.topic.author]
        if latest.allowed_publishers.enabled:
            publishers += [p for p in latest.allowed_publishers.peers if p != self.me]
        chosen = tuple(dict.fromkeys(publishers))[: self.config.sync_publishers]
        tree.sync_asked.update(chosen)
        return [ev.FetchRecords(tree.topic.cid, chosen)]

    def _on_records(self, msg: ev.RecordsFetched, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        if tree is None or tree.synced:
            return []
        out: Out = []
        heads: list[CID] = []
        newest: HeadsRecord | None = None
        found: list[PeerId] = []
        for record in msg.records:
            if record.topic != tree.topic.cid or record.publisher not in tree.sync_asked:
                continue
            if self.versions.get(record.version) is None:
                tree.sync_waiting.add(record.version)
                out += self._fetch_version(record.version)
            heads += record.heads
            if newest is None or record.created > newest.created:
                newest = record
            found += [p for p in record.peers if p not in tree.sync_asked and p != self.me]
        if heads and tree.deliver:
            out += self.backfill.learn_heads(tree.topic.cid, dict.fromkeys(heads), None, now)
        if newest is not None and newest.heads and tree.hint is None:
            tree.hint = newest.heads[-1]
        more = tuple(dict.fromkeys(found))[: self.config.sync_publishers]
        if more and tree.sync_round < self.config.sync_rounds:
            tree.sync_round += 1
            tree.sync_asked.update(more)
            out.append(ev.FetchRecords(tree.topic.cid, more))
            return out
        tree.records_done = True
        return out + self._maybe_synced(tree, now)

    def _maybe_synced(self, tree: Tree, now: float) -> Out:
        """Synced once the records were read, the versions they name fetched, and the
        tree is attached (our parent's JOINED carries its current heads, fresher than any
        record) or we act as its root."""
        if tree.synced or not tree.records_done or tree.sync_waiting:
            return []
        if not (tree.acting_root or tree.confirmed & tree.parents):
            self._syncing.add(tree.topic.cid)
            return []
        self._syncing.discard(tree.topic.cid)
        tree.synced = True
        out: Out = []
        waiting, tree.waiting = tree.waiting, []
        for item in waiting:
            if isinstance(item, ev.Publish):
                out += self._on_publish(item, now)
            else:
                out += self._on_request(item[0], item[1], now)
        return out

    # ------------------------------------------------------------------ publishing

    def _publish(
        self,
        tree: Tree,
        event: EventDescriptor,
        request: int | None,
        *,
        then: ev.TopicReady | None = None,
    ) -> Out:
        self._remember(tree, event.cid)
        tree.last_seen = event.cid
        self._stores.add(Stored(tree.topic.cid, event, request, then))
        return [ev.StoreDht(event.cid, event.block)]

    def _on_dht_stored(self, result: ev.DhtStored, now: float) -> Out:
        job = self._topic_jobs.pop(result.cid, None)
        if job is not None:
            return self._topic_stored(job, result, now)
        ready, failed = self._stores.complete(result.cid, result.acks, self.config.min_acks)
        out: Out = []
        for item in ready:
            out += self._forward_published(item, now)
        for item in reversed(failed):  # newest first: LAST_SEEN walks back past them all
            out += self._store_failed(item, result.acks)
        return out

    def _store_failed(self, item: Stored, acks: int) -> Out:
        """Not persisted: the event is not forwarded and its publish fails; the tree's
        next LAST_SEEN event links to what came before it."""
        self.metrics["store_quorum_failed"] += 1
        tree = self._trees.get(item.tree)
        if tree is not None:
            tree.seen.pop(item.event.cid, None)
            if tree.last_seen == item.event.cid:
                tree.last_seen = item.event.parent
        reason = self._quorum_reason(acks, "event")
        out: Out = []
        if item.request is not None:
            out.append(ev.CommandFailed(item.request, reason))
        if item.then is not None:
            out.append(ev.CommandFailed(item.then.request, f"announcement: {reason}"))
        return out

    def _quorum_reason(self, acks: int, what: str) -> str:
        return (
            f"{what} stored on {acks} DHT node(s), fewer than the {self.config.min_acks} "
            "required (min_acks); not published — is the node connected to its network?"
        )

    def _forward_published(self, pending: Stored, now: float) -> Out:
        """Our own event is in the DHT: deliver it here and send it down the tree."""
        topic_cid, event = pending.tree, pending.event
        self.metrics["published"] += 1
        out: Out = []
        if pending.request is not None:
            out.append(ev.Published(pending.request, event))
        if pending.then is not None:
            out.append(pending.then)
        tree = self._trees.get(topic_cid)
        if tree is None:
            return out
        self._saw_publisher(tree, event.publisher)
        out += self.backfill.accepted(topic_cid, event, 0, None, now)
        self._match_request(tree, event, out)
        message = Event(topic_cid, event.block, 1)
        for peer in self._eager(tree):
            out.append(ev.Send(peer, message))
            self.metrics["forwarded"] += 1
        out += self.lazy.accepted(topic_cid, event.cid, 0, None, now)
        if not tree.topic.is_meta:
            out += self._arm_record(tree, self.config.record_delay)
        return out

    # ------------------------------------------------------------------ heads records

    def _arm_record(self, tree: Tree, delay: float) -> Out:
        if tree.record_armed:
            return []
        tree.record_armed = True
        return [ev.SetTimer(delay, RecordTimer(tree.topic.cid))]

    def _write_record(self, tree: Tree, now: float) -> Out:
        tree.record_armed = False
        latest = self.versions.latest(tree.topic.cid)
        if latest is None:
            return []
        heads = self.backfill.heads(tree.topic.cid)
        if tree.last_seen is not None and tree.last_seen not in heads:
            heads.append(tree.last_seen)
        tree.record_seq = max(tree.record_seq + 1, int(now * 1000))
        peers = tuple(p for p in tree.publishers if p != self.me)[-MAX_RECORD_PEERS:]
        record = HeadsRecord.create(
            self.identity,
            tree.topic.cid,
            tree.record_seq,
            latest.cid,
            tuple(heads[-MAX_RECORD_HEADS:]),
            peers,
            now=now,
        )
        self.metrics["records_written"] += 1
        return [ev.StoreRecord(record)]

    def _saw_publisher(self, tree: Tree, publisher: PeerId) -> None:
        tree.publishers[publisher] = None
        tree.publishers.move_to_end(publisher)
        if len(tree.publishers) > MAX_RECORD_PEERS + 1:
            tree.publishers.popitem(last=False)

    # ------------------------------------------------------------------ messages

    def _on_received(self, peer: PeerId, message: ev.Message, now: float) -> Out:
        match message:
            case Join():
                return self._on_join(peer, message, now)
            case Leave():
                return self._on_leave(peer, message, now)
            case Event():
                return self._on_event(peer, message, now)
            case RequestToPublish():
                return self._on_request(peer, message, now)
            case Ping():
                return [ev.Send(peer, Pong(message.nonce))]
            case Pong():
                return []
            case IHave():
                return self.lazy.on_ihave(peer, message, self._known_in(message.topic), now)
            case Graft():
                return self.lazy.on_graft(peer, message, now)
            case Prune():
                return self.lazy.on_prune(peer, message, now)
            case Shuffle():
                return self.lazy.on_shuffle(peer, message, now)
            case Want():
                return self.backfill.on_want(peer, message, now)
            case Blocks():
                return self.backfill.on_blocks(peer, message, now)
            case Joined():
                tree = self._trees.get(message.topic)
                if tree is not None and peer in tree.parents:
                    tree.confirmed.add(peer)  # the parent took us as a child
                    tree.retries.pop(peer, None)
                    if message.heads:
                        tree.hint = message.heads[-1]  # the freshest word on the heads
                return self.backfill.on_heads(peer, message, now)
            case Heads():
                return self.backfill.on_heads(peer, message, now)
            case Subs():
                return self._reject(peer, "a floodsub message on a pulsarcast node")
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
            out = self._add_version(topic, now)
            tree = self.router.new_tree(topic, deliver=False)
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
        return out + self.router.join(tree, now)

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
            return self._prune_idle(tree) or self.router.join(tree, now)
        return self._prune_idle(tree)

    def _prune_idle(self, tree: Tree) -> Out:
        """A pure relay (not subscribed, not the author) with no children left has no
        reason to stay in the tree: leave it, as Scribe does."""
        if tree.deliver or tree.children or tree.topic.author == self.me or tree.waiting:
            return []
        if tree.requests or self._stores.busy(tree.topic.cid):
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
        if self.versions.get(event.topic) is None:
            return self._park(event.topic, peer, msg)
        problem = self._judge(tree, event)
        if problem is not None:
            return self._reject(peer, problem)
        if peer is not None:
            tree.retries.pop(peer, None)
        return self._accept(tree, event, msg.hop, peer, now)

    def _judge(self, tree: Tree, event: EventDescriptor) -> str | None:
        """Why ``event`` may not enter ``tree`` (None: it may). The meta topic takes
        events from its author only; every other topic follows the rights rule."""
        if tree.topic.is_meta:
            if self.versions.first_of(event.topic) != tree.topic.cid:
                return f"event {event.cid} belongs to another topic"
            if event.publisher != tree.topic.author or event.author != tree.topic.author:
                return f"event {event.cid}: only the author publishes on a meta topic"
            return None
        return self.versions.admit(tree.topic.cid, event)

    def _accept(
        self, tree: Tree, event: EventDescriptor, hop: int, sender: PeerId | None, now: float
    ) -> Out:
        self._remember(tree, event.cid)
        tree.last_seen = event.cid
        self._saw_publisher(tree, event.publisher)
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

    def _match_request(self, tree: Tree, event: EventDescriptor, out: Out) -> None:
        if event.author == self.me and tree.requests:
            request = tree.requests.pop(event.author_signature, None)
            if request is not None:
                out.append(ev.Published(request, event))

    def _on_request(self, peer: PeerId, msg: RequestToPublish, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        if tree is None:
            return self._reject(peer, f"request to publish on {msg.topic}, not our tree")
        if self.versions.first_of(msg.version) != tree.topic.cid:
            return self._reject(peer, f"request names unknown version {msg.version}")
        latest = self.versions.latest(tree.topic.cid)
        assert latest is not None
        if not latest.may_publish(self.me):
            if not tree.parents:
                return self._reject(peer, "request reached the root; nobody may publish it")
            return [ev.Send(p, msg) for p in sorted(tree.parents, key=bytes)]
        if not tree.synced:
            return self._wait_for_sync(tree, (peer, msg))
        if not latest.may_request(msg.author):
            return self._reject(peer, f"{msg.author} may not request to publish")
        if latest.event_linking is EventLinking.LAST_SEEN:
            parent = self._parent_for(tree)
        else:
            parent = msg.parent
            if parent is not None and self._check_parent(tree, parent) is not None:
                return self._reject(peer, f"request names parent {parent}, not known here")
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
                out += self.router.parent_failed(tree, peer, now, give_up=never_reached)
        return out

    def _on_timer(self, fired: ev.TimerFired, now: float) -> Out:
        timer = fired.timer
        match timer:
            case GapTimeout() | WantTimeout() | RetryFetch() | HeadsTick():
                return self.backfill.on_timer(timer, now)
            case DispatchTimer() | GraftTimer() | ShuffleTimer():
                return self.lazy.on_timer(timer, self._known_in(timer.topic), now)
            case RetryParent() | JoinTimeout() | RootCheck():
                return self.router.on_timer(timer, now)
            case RequestTimeout():
                tree = self._trees.get(timer.topic)
                if tree is None:
                    return []
                request = tree.requests.pop(timer.signature, None)
                if request is None:
                    return []
                return [ev.CommandFailed(request, "no event came back for the request to publish")]
            case RecordTimer():
                tree = self._trees.get(timer.topic)
                return [] if tree is None else self._write_record(tree, now)
            case Greet():
                return []  # a floodsub timer: never set by this core
            case _:
                assert_never(timer)

    # ------------------------------------------------------------------ topic versions

    def _add_version(self, topic: TopicDescriptor, now: float) -> Out:
        """Register a validated topic version; fetch its parent if the lineage is not known
        yet; adopt it where it is the newest; release what waited for it."""
        added = self.versions.add(topic)
        out: Out = []
        if added.refused is not None:
            out += self._version_gone(topic.cid, added.refused)
            return out
        if added.missing is not None:
            return self._fetch_version(added.missing)
        for version in added.registered:
            first = self.versions.first_of(version.cid)
            assert first is not None
            tree = self._trees.get(first)
            adopted = version.parent is not None and self.versions.latest(first) is version
            if tree is not None and adopted:
                out.append(ev.StoreLocal(version.cid, version.block))
                out.append(ev.VersionAdopted(first, version))
            out += self._release(version.cid, now)
            out += self._version_resolved(version.cid, now)
        return out

    def _fetch_version(self, cid: CID) -> Out:
        if cid in self._version_fetches or self.versions.get(cid) is not None:
            return []
        if len(self._version_fetches) >= self.config.parked_limit:
            return self._version_gone(cid, "too many topic versions being fetched")
        self._version_fetches.add(cid)
        return [ev.Fetch(cid)]

    def _version_fetched(self, cid: CID, block: bytes | None, now: float) -> Out:
        self._version_fetches.discard(cid)
        if block is None:
            return self._version_gone(cid, "topic version not found")
        try:
            topic = TopicDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            return self._version_gone(cid, f"invalid topic version: {exc}")
        return [ev.StoreLocal(cid, block), *self._add_version(topic, now)]

    def _version_gone(self, cid: CID, reason: str) -> Out:
        """``cid`` (a version or a parent some versions wait for) will not register: drop
        what waited on it, and stop waiting for it before publishing."""
        out: Out = []
        gone = [cid, *self.versions.drop_orphan(cid)]
        for waiting in list(self.versions.waiting_on(cid)):
            gone += self.versions.drop_orphan(waiting)
        for version in dict.fromkeys(gone):
            out += self._drop_parked(version, reason)
            out += self._version_resolved(version, 0.0)
        return out

    def _version_resolved(self, cid: CID, now: float) -> Out:
        out: Out = []
        for tree in list(self._trees.values()):
            if cid in tree.sync_waiting:
                tree.sync_waiting.discard(cid)
                out += self._maybe_synced(tree, now)
        return out

    def _announced(self, event: EventDescriptor, now: float) -> Out:
        """A meta-topic event (author-only, already judged) names a new topic version by
        its CID: fetch it and adopt it (its lineage and author are checked on the way)."""
        if not isinstance(event.payload, bytes):
            return self._reject(None, f"meta event {event.cid} does not carry a version CID")
        try:
            cid = CID.parse(event.payload)
        except ValueError:
            return self._reject(None, f"meta event {event.cid} does not carry a version CID")
        if self.versions.get(cid) is not None:
            return []
        block = self._lookup(cid)
        if block is not None:
            return self._version_fetched(cid, block, now)
        return self._fetch_version(cid)

    def _park(self, version: CID, peer: PeerId | None, msg: Event) -> Out:
        if self._parked_count >= self.config.parked_limit:
            return self._reject(peer, "too many events waiting for topic versions")
        self._parked_count += 1
        self._parked.setdefault(version, []).append((peer, msg))
        return self._fetch_version(version)

    def _release(self, version: CID, now: float) -> Out:
        waiting = self._parked.pop(version, [])
        self._parked_count -= len(waiting)
        out: Out = []
        for peer, msg in waiting:
            out += self._on_event(peer, msg, now)
        return out

    def _drop_parked(self, version: CID, reason: str) -> Out:
        waiting = self._parked.pop(version, [])
        self._parked_count -= len(waiting)
        out: Out = []
        for peer, _ in waiting:
            out += self._reject(peer, f"{reason} ({version})")
        return out

    def _on_block_fetched(self, fetched: ev.BlockFetched, now: float) -> Out:
        cid, block = fetched.cid, fetched.block
        out: Out = []
        if self.backfill.fetching(cid):
            out += self.backfill.on_fetched(cid, block, now)
        if block is not None and not cid.verifies(block):
            block = None
        if cid in self._version_fetches:
            out += self._version_fetched(cid, block, now)
        if cid in self._parent_checks:
            out += self._parent_fetched(cid, block, now)
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

    # ------------------------------------------------------------------ helpers

    def _verify_backfilled(self, topic: CID, block: bytes) -> EventDescriptor | None:
        """The backfill layer's check of a fetched block: everything ``_on_event`` checks."""
        try:
            event = EventDescriptor.from_block(block)
        except InvalidDescriptor:
            return None
        tree = self._trees.get(topic)
        if tree is None or self.versions.get(event.topic) is None:
            return None
        if self._judge(tree, event) is not None:
            return None
        self._saw_publisher(tree, event.publisher)
        return event

    def _parent_for(self, tree: Tree) -> CID | None:
        """LAST_SEEN: the newest event this node knows of the topic — what it accepted or
        published last, else the newest head its durable store or a neighbour named."""
        if tree.last_seen is not None:
            return tree.last_seen
        heads = self.backfill.heads(tree.topic.cid)
        if heads:
            return self._newest(heads)
        return tree.hint

    def _newest(self, cids: tuple[CID, ...] | list[CID]) -> CID:
        """The CID among ``cids`` whose block (if held) was created last."""

        def key(cid: CID) -> tuple[str, bytes]:
            block = self._lookup(cid)
            links = None if block is None else _links_of(block)
            return ("" if links is None else links[1], cid.raw)

        return max(cids, key=key)

    def _remember(self, tree: Tree, cid: CID) -> None:
        tree.seen[cid] = None
        if len(tree.seen) > self.config.seen_limit:
            del tree.seen[next(iter(tree.seen))]

    def _reject(self, peer: PeerId | None, reason: str) -> Out:
        self.metrics["rejected"] += 1
        return [ev.Rejected(peer, reason)]

