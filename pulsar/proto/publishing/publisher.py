"""Publishing: who may publish, what an event links to, and when it counts as published.

* **Rights** under the latest version this node knows (:mod:`pulsar.proto.versions.lineage`): a
  node that may publish signs the event; one that may only request sends a
  REQUEST_TO_PUBLISH up its parents to the first node allowed to publish it.
* **Learning first.** A node that is not the author reads the heads records of the author
  and the allowed publishers (then of the publishers those name), fetches the versions
  they name, and waits for its JOIN to be answered, before it publishes or turns a request
  into an event: so it publishes under the latest rules and links to the latest events.
  Publishes wait (bounded) meanwhile.
* **Linking.** LAST_SEEN links the newest event known here (:meth:`Publisher.parent_for`)
  as parent and up to eight other heads as merges (``_merges_for``), so forks join again;
  a CUSTOM parent must be an event of the topic, verified locally or fetched first.
* **Persisted before forwarded** (:mod:`pulsar.proto.stores`): an event goes down the tree
  only once ``min_acks`` DHT nodes stored it, in chain order; otherwise the publish fails.
* **Heads records**: after publishing, the node writes its signed heads record of the
  topic to the DHT; the author also when its heads change (debounced).
* **Acknowledged = recorded.** A publish is acknowledged only once its event is stored at
  the write quorum *and* a heads record naming it (or a later event of ours) is too: a
  reader of the topic's CID finds it even if this node never runs again. One record
  write is in flight per tree; publishes meanwhile share the next (group commit).

:class:`Publisher` owns what publishing keeps between steps (our events on their way
into the DHT, CUSTOM parents being checked, trees waiting to be synced) and the
publishing fields of each :class:`~pulsar.proto.tree.routing.Tree`. It never calls the
core: an event of ours that is persisted comes back as :class:`Forward` (the core
delivers it here and sends it down the tree), a version a heads record names as
:class:`WantVersion`, a refused input as
:class:`~pulsar.proto.reports.Refused`, each among its outputs where it
happens (:data:`PublishItem`).
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dag import (
    CID,
    EventDescriptor,
    EventLinking,
    Identity,
    InvalidDescriptor,
    PeerId,
    TopicDescriptor,
)
from dag.descriptors import MAX_MERGES
from dag.event_links import newest
from dag.records import MAX_RECORD_PEERS, HeadsRecord
from pulsar.proto.repair.backfill import Backfill
from pulsar.proto.tree.messages import RequestToPublish
from pulsar.proto.tree.routing import Tree
from pulsar.proto.versions.adoption import Adoption

from .. import events as ev
from ..config import CoreConfig, quorum_reason
from ..events import OutEvent
from ..reports import Refused
from ..timers import RequestTimeout
from .records import RecordWriter
from .stores import OwnStores, Stored

__all__ = ["Forward", "PublishItem", "Publisher", "WantVersion"]


@dataclass(frozen=True, slots=True)
class Forward:
    """Our event ``event`` of the tree ``topic`` is persisted: deliver it here and send
    it down the tree."""

    topic: CID
    event: EventDescriptor


@dataclass(frozen=True, slots=True)
class WantVersion:
    """A heads record names a topic version not known here: fetch it."""

    version: CID


PublishItem = OutEvent | Forward | WantVersion | Refused
Out = list[PublishItem]


class Publisher:
    """Publishing on every tree of one node (see the module docstring)."""

    def __init__(
        self,
        identity: Identity,
        config: CoreConfig,
        trees: dict[CID, Tree],
        adoption: Adoption,
        backfill: Backfill,
        lookup: Callable[[CID], bytes | None],
    ) -> None:
        self.identity = identity
        self.me = identity.peer_id
        self.config = config
        self._trees = trees
        self._adoption = adoption
        self.versions = adoption.versions
        self.backfill = backfill
        self._lookup = lookup
        self.stores = OwnStores()
        self._parent_checks: dict[CID, list[tuple[ev.Publish, CID]]] = {}
        """CUSTOM parents being fetched to verify before publishing, with what waits."""
        self._syncing: set[CID] = set()
        """Trees whose sync waits only for their JOIN to be answered (or to act as root)."""
        self._version_waiters: dict[CID, set[CID]] = {}
        """Topic version -> the trees whose publishing waits for it (an index, so adopting a
        version costs the trees that wait, not every tree the node knows)."""
        self.records = RecordWriter(identity, config, adoption.versions, backfill, self.stores)
        """Our heads records: when they are written, and which publishes they acknowledge."""
        self.metrics: dict[str, int] = {"published": 0, "store_quorum_failed": 0}

    def checking_parent(self, cid: CID) -> bool:
        return cid in self._parent_checks

    def busy(self, topic: CID) -> bool:
        """Whether an event of ours on ``topic`` is still on its way (stay in the tree)."""
        return self.stores.busy(topic)

    def on_publish(self, cmd: ev.Publish, now: float) -> Out:
        tree = self._trees.get(cmd.topic)
        if tree is None:
            return [ev.CommandFailed(cmd.request, "not in this topic's tree; subscribe first")]
        if tree.topic.is_meta:
            return [ev.CommandFailed(cmd.request, "meta topics carry only topic versions")]
        limit = self.config.fragments.max_event_size
        if isinstance(cmd.payload, bytes) and len(cmd.payload) > limit:
            return [ev.CommandFailed(
                cmd.request, f"payload of {len(cmd.payload)} bytes is over the limit of "
                f"{limit} bytes (max_event_size)", kind="invalid")]
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
        last_seen = topic.event_linking is EventLinking.LAST_SEEN
        parent = self.parent_for(tree) if last_seen else cmd.parent
        if topic.may_publish(self.me):
            event = EventDescriptor.create(
                self.identity, topic.cid, cmd.payload, parent=parent,
                content_type=cmd.content_type, key=cmd.key,
                merges=self._merges_for(tree, parent) if last_seen else (), now=now,
            )
            return self._publish(tree, event, cmd.request)
        if not topic.may_request(self.me):
            return [ev.CommandFailed(cmd.request, "not allowed to publish or to request it")]
        if not tree.parents:
            return [ev.CommandFailed(cmd.request, "no parent to carry a request to publish")]
        created, signature = EventDescriptor.sign_content(
            self.identity, topic.cid, cmd.payload, content_type=cmd.content_type, key=cmd.key,
            now=now,
        )
        request = RequestToPublish(
            tree.topic.cid, topic.cid, self.me, cmd.payload, created, signature, cmd.parent,
            cmd.content_type, cmd.key,
        )
        tree.requests[signature] = cmd.request
        out: Out = [ev.Send(p, request) for p in sorted(tree.parents, key=bytes)]
        out.append(
            ev.SetTimer(self.config.request_timeout, RequestTimeout(tree.topic.cid, signature))
        )
        return out

    def _merges_for(self, tree: Tree, parent: CID | None) -> tuple[CID, ...]:
        """LAST_SEEN: the newest other heads this node delivered (at most
        :data:`MAX_MERGES`), linked beside ``parent`` so that concurrent publishers' forks
        join again and every event stays reachable from the latest heads. Leaves out the
        head our own events still being stored descend from (``parent`` reaches it)."""
        below = self.stores.last_persisted(parent)
        merges: list[CID] = []
        for head in reversed(self.backfill.heads(tree.topic.cid)):
            if head != parent and head != below:
                merges.append(head)
                if len(merges) == MAX_MERGES:
                    break
        return tuple(merges)

    def _check_parent(self, tree: Tree, parent: CID) -> str | None:
        """A CUSTOM parent must be a valid event of this topic: None if it is, "fetch" if it
        must be fetched first, else why not."""
        if parent in tree.seen or self.backfill.known(tree.topic.cid, parent):
            return None
        block = self._lookup(parent)
        if block is None:
            return "fetch"
        if not self._verified(tree, block):
            return f"parent {parent} is not a valid event of this topic"
        return None

    def _verified(self, tree: Tree, block: bytes) -> bool:
        """Whether ``block`` is an event the tree would take now."""
        return isinstance(self.judge_block(tree, block), EventDescriptor)

    def judge_block(
        self, tree: Tree, block: bytes | EventDescriptor
    ) -> EventDescriptor | Literal["unvouched"] | None:
        """``block`` checked as an event of ``tree`` (see
        :meth:`~pulsar.proto.versions.adoption.Adoption.verify`); its publisher is noted
        when it passes (the heads records name every publisher seen)."""
        event = self._adoption.verify(tree.topic, block)
        if isinstance(event, EventDescriptor):
            self.saw_publisher(tree, event.publisher)
        return event

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

    def parent_fetched(self, cid: CID, block: bytes | None, now: float) -> Out:
        out: Out = []
        for cmd, topic in self._parent_checks.pop(cid, []):
            tree = self._trees.get(topic)
            latest = self.versions.latest(topic)
            if tree is None or latest is None:
                out.append(ev.CommandFailed(cmd.request, "left the topic before publishing"))
            elif block is None:
                out.append(ev.CommandFailed(cmd.request, f"parent {cid} not found"))
            elif not self._verified(tree, block):
                reason = f"parent {cid} is not a valid event of this topic"
                out.append(ev.CommandFailed(cmd.request, reason))
            else:
                out.append(ev.StoreLocal(cid, block))
                out += self._publish_now(tree, latest, cmd, now)
        return out

    def _wait_for_sync(self, tree: Tree, item: ev.Publish | tuple[PeerId, RequestToPublish]) -> Out:
        if len(tree.waiting) >= self.config.waiting_publishes:
            if isinstance(item, ev.Publish):
                return [ev.CommandFailed(item.request, "too many publishes waiting for the topic")]
            return [Refused(item[0], "too many requests to publish waiting")]
        tree.waiting.append(item)
        return self.start_sync(tree)

    def start_sync(self, tree: Tree) -> Out:
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

    def on_records(self, msg: ev.RecordsFetched, now: float) -> Out:
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
                self._version_waiters.setdefault(record.version, set()).add(tree.topic.cid)
                out.append(WantVersion(record.version))
            heads += record.heads
            if newest is None or record.created > newest.created:
                newest = record
            found += [p for p in record.peers if p not in tree.sync_asked and p != self.me]
        if tree.deliver:
            tree.sync_heads.update(dict.fromkeys(heads))
        out += self.learn_record_heads(tree, now)
        if newest is not None and newest.heads and tree.hint is None:
            tree.hint = newest.heads[-1]
        more = tuple(dict.fromkeys(found))[: self.config.sync_publishers]
        if more and tree.sync_round < self.config.sync_rounds:
            tree.sync_round += 1
            tree.sync_asked.update(more)
            out.append(ev.FetchRecords(tree.topic.cid, more))
            return out
        tree.records_done = True
        return out + self.maybe_synced(tree, now)

    def learn_record_heads(self, tree: Tree, now: float) -> Out:
        """Backfill the heads the records named, once the versions they name are known
        (fetched, or given up on). Events are judged by the latest version known when
        they arrive: walking back from the heads before that would refuse, for good, an
        event naming a version still being fetched — the author's events after a topic
        update — and a revoked publisher's events, which only the version that revoked
        it vouches for, would be judged without it."""
        if tree.sync_waiting or not tree.sync_heads:
            return []
        heads, tree.sync_heads = tree.sync_heads, {}
        return [*self.backfill.learn_heads(tree.topic.cid, heads, None, now)]

    def version_resolved(self, cid: CID, now: float) -> Out:
        """A version trees waited for before publishing was registered or given up on."""
        out: Out = []
        for topic in self._version_waiters.pop(cid, ()):
            tree = self._trees.get(topic)
            if tree is not None and cid in tree.sync_waiting:
                tree.sync_waiting.discard(cid)
                out += self.learn_record_heads(tree, now)
                out += self.maybe_synced(tree, now)
        return out

    def maybe_synced(self, tree: Tree, now: float) -> Out:
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
                out += self.on_publish(item, now)
            else:
                out += self.on_request(item[0], item[1], now)
        return out

    def announce(self, request: int, version: TopicDescriptor, now: float) -> Out:
        """A new version of ours is persisted and adopted: name it in our heads record at
        once and announce it on the meta topic; the update is ready once announced."""
        assert version.parent is not None
        out: Out = []
        first = self.versions.first_of(version.cid)
        tree = None if first is None else self._trees.get(first)
        meta_tree = None if version.meta is None else self._trees.get(version.meta)
        if tree is not None:
            out += self.records.arm(tree, 0.0, now)
        ready = ev.TopicReady(request, version)
        if meta_tree is None:
            out.append(ready)
            return out
        announcement = EventDescriptor.create(
            self.identity, meta_tree.topic.cid, version.cid.raw,
            parent=self.parent_for(meta_tree), now=now,
        )
        return out + self._publish(meta_tree, announcement, None, then=ready)

    def _publish(
        self,
        tree: Tree,
        event: EventDescriptor,
        request: int | None,
        *,
        then: ev.TopicReady | None = None,
    ) -> Out:
        tree.remember(event.cid, self.config.seen_limit)
        tree.last_seen = event.cid
        self.stores.add(Stored(tree.topic.cid, event, request, then))
        return [ev.StoreDht(event.cid, event.block)]

    def on_dht_stored(self, result: ev.DhtStored, now: float) -> Out:
        """An event of ours was stored (or not) by the DHT: forward what is ready."""
        ready, failed = self.stores.complete(result.cid, result.acks, self.config.min_acks)
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
                tree.last_seen = self.stores.last_persisted(item.event.parent)
        reason = quorum_reason(acks, self.config.min_acks, "event")
        out: Out = []
        if item.request is not None:
            out.append(ev.CommandFailed(item.request, reason, kind="unpersisted"))
        if item.then is not None:
            out.append(ev.CommandFailed(item.then.request, f"announcement: {reason}",
                                        kind="unpersisted"))
        return out

    def _forward_published(self, pending: Stored, now: float) -> Out:
        """Our own event is in the DHT: deliver it here and send it down the tree."""
        topic_cid, event = pending.tree, pending.event
        self.metrics["published"] += 1
        out: Out = []
        tree = self._trees.get(topic_cid)
        if pending.request is not None:
            published = ev.Published(pending.request, event)
            if tree is not None and self.records.acks_wait(tree):
                tree.record_waiters.append(published)
            else:
                out.append(published)
        if pending.then is not None:
            out.append(pending.then)
        if tree is None:
            return out
        self.saw_publisher(tree, event.publisher)
        out.append(Forward(topic_cid, event))
        if not tree.topic.is_meta:
            # A publish waiting for its acknowledgement has the record written at once
            # (one write in flight per tree: publishes meanwhile share the next one).
            delay = 0.0 if tree.record_waiters else self.config.record_delay
            out += self.records.arm(tree, delay, now)
        out.append(ev.KeepPublished(topic_cid, event.cid))
        return out

    def saw_publisher(self, tree: Tree, publisher: PeerId) -> None:
        tree.publishers[publisher] = None
        tree.publishers.move_to_end(publisher)
        if len(tree.publishers) > MAX_RECORD_PEERS + 1:
            tree.publishers.popitem(last=False)

    def match_request(self, tree: Tree, event: EventDescriptor) -> list[OutEvent]:
        """``event`` answers a request to publish of ours: the request is published."""
        if event.author == self.me and tree.requests:
            request = tree.requests.pop(event.author_signature, None)
            if request is not None:
                return [ev.Published(request, event)]
        return []

    def on_request_timeout(self, timer: RequestTimeout) -> Out:
        tree = self._trees.get(timer.topic)
        if tree is None:
            return []
        request = tree.requests.pop(timer.signature, None)
        if request is None:
            return []
        return [ev.CommandFailed(request, "no event came back for the request to publish")]

    def settle(self, now: float) -> Out:
        """After any input: trees whose sync waited for their JOIN may be synced now."""
        out: Out = []
        for cid in list(self._syncing):
            tree = self._trees.get(cid)
            if tree is None:
                self._syncing.discard(cid)
            else:
                out += self.maybe_synced(tree, now)
        return out

    def parent_for(self, tree: Tree) -> CID | None:
        """LAST_SEEN: the newest event this node knows of the topic — what it accepted or
        published last, else the newest head its durable store or a neighbour named."""
        if tree.last_seen is not None:
            return tree.last_seen
        heads = self.backfill.heads(tree.topic.cid)
        if heads:
            return newest(heads, self._lookup)
        return tree.hint

    def _refuse(self, peer: PeerId | None, reason: str) -> Out:
        return [Refused(peer, reason)]

    def on_request(self, peer: PeerId, msg: RequestToPublish, now: float) -> Out:
        tree = self._trees.get(msg.topic)
        if tree is None:
            return self._refuse(peer, f"request to publish on {msg.topic}, not our tree")
        if self.versions.first_of(msg.version) != tree.topic.cid:
            return self._refuse(peer, f"request names unknown version {msg.version}")
        latest = self.versions.latest(tree.topic.cid)
        assert latest is not None
        if not latest.may_publish(self.me):
            if not tree.parents:
                return self._refuse(peer, "request reached the root; nobody may publish it")
            return [ev.Send(p, msg) for p in sorted(tree.parents, key=bytes)]
        if not tree.synced:
            return self._wait_for_sync(tree, (peer, msg))
        if not latest.may_request(msg.author):
            return self._refuse(peer, f"{msg.author} may not request to publish")
        merges: tuple[CID, ...] = ()
        if latest.event_linking is EventLinking.LAST_SEEN:
            parent = self.parent_for(tree)
            merges = self._merges_for(tree, parent)
        else:
            parent = msg.parent
            if parent is not None and self._check_parent(tree, parent) is not None:
                return self._refuse(peer, f"request names parent {parent}, not known here")
        try:
            event = EventDescriptor.create(
                self.identity,
                msg.version,
                msg.payload,
                parent=parent,
                author=msg.author,
                created=msg.created,
                author_signature=msg.signature,
                content_type=msg.content_type,
                key=msg.key,
                merges=merges,
            )
        except InvalidDescriptor as exc:
            return self._refuse(peer, f"request to publish: {exc}")
        return self._publish(tree, event, None)
