"""Topic commands and version adoption.

* **Create** (paper, algorithm 1): the meta topic (author-only) and the topic, both
  persisted in the DHT (``min_acks``) before the node becomes the root of both trees.
* **Update**: a new version on top of the latest, recording the topic's heads now (what
  it vouches for, see :mod:`pulsar.proto.versions.lineage`), persisted, adopted, then announced
  on the meta topic; the update is ready once the announcement is published.
* **Adoption**: versions named by meta events, heads records, restarts and events are
  fetched when unknown, registered only if their lineage holds, and adopted when they are
  the latest; events that named an unknown version wait for it (bounded) and are judged
  once it is known — those that came down the tree and those that backfill fetched (a
  DHT block, a BLOCKS answer): judged at once, a backfilled one would be refused for
  good and the walk back would end there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from dag import CID, EventDescriptor, InvalidDescriptor, PeerId, TopicDescriptor, cid_of
from dag.codec import decode_fast
from dag.errors import CodecError
from dag.records import HeadsRecord
from pulsar.proto.repair.backfill import event_links
from pulsar.proto.repair.messages import Blocks
from pulsar.proto.tree.messages import Event
from pulsar.proto.versions.descriptors import build_topic, build_version

from . import events as ev
from .events import Out
from .parts import CoreParts

__all__ = ["VOUCH_WALK_LIMIT", "VersionAdoption"]

VOUCH_WALK_LIMIT: Final = 4096
"""Local blocks one vouching is passed down through (one store read each)."""


@dataclass(slots=True)
class TopicJob:
    """A create or update waiting for its descriptors to be persisted."""

    request: int
    topic: TopicDescriptor
    meta: TopicDescriptor | None
    left: set[CID] = field(default_factory=set)
    failed: bool = False


Backfilled = ev.BlockFetched | ev.Received
"""What backfill fetched, waiting for the topic version an event in it names: a DHT
block (``BlockFetched``) or a neighbour's ``BLOCKS`` answer (``Received``)."""


def event_version(block: bytes) -> tuple[CID, CID | None] | None:
    """``(topic version, parent)`` of an event block, read without checking anything else
    (the backfill layer verifies the block in full); None when it is not shaped like an
    event."""
    try:
        wire = decode_fast(block)
        if not isinstance(wire, dict) or "publisher" not in wire or "payload" not in wire:
            return None
        topic, parent = wire["topic"], wire["parent"]
        if not isinstance(topic, bytes) or not (parent is None or isinstance(parent, bytes)):
            return None
        return CID(topic), None if parent is None else CID(parent)
    except (CodecError, KeyError, TypeError, ValueError):
        return None


class VersionAdoption(CoreParts):
    """The topic-command and version-adoption part of the core."""

    _topic_jobs: dict[CID, TopicJob]
    _rights_updates: dict[int, ev.UpdateTopic]
    _parked_backfill: dict[CID, list[Backfilled]]

    def _on_create(self, cmd: ev.CreateTopic, now: float) -> Out:
        try:
            meta, topic = build_topic(self.identity, cmd, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic: {exc}", kind="invalid")]
        job = TopicJob(cmd.request, topic, meta, {meta.cid, topic.cid})
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
        rights = cmd.changes.allowed_publishers is not None or (
            cmd.changes.request_to_publish is not None)
        if rights and current.allowed_publishers.enabled:
            # A publisher losing its rights keeps the events it was acknowledged for only if
            # the new version records them (versions.py): every acknowledged event is named
            # by its publisher's heads record (written before the acknowledgement), so read
            # those records first and record their heads too, not only the heads this node
            # happens to know.
            publishers = tuple(dict.fromkeys((current.author, *current.allowed_publishers.peers)))
            self._rights_updates[cmd.request] = cmd
            return [ev.FetchRecords(cmd.topic, publishers, cmd.request)]
        return self._build_update(cmd, (), now)

    def _build_update(
        self, cmd: ev.UpdateTopic, records: tuple[HeadsRecord, ...], now: float
    ) -> Out:
        """The new version, recording this node's heads and those of ``records``."""
        current = self.versions.latest(cmd.topic)
        tree = self._trees.get(cmd.topic)
        if tree is None or current is None:
            return [ev.CommandFailed(cmd.request, "not in this topic's tree; subscribe first")]
        heads = self.backfill.heads(cmd.topic)
        for record in records:
            if record.topic == cmd.topic:
                heads += [h for h in record.heads if h not in heads]
        if tree.last_seen is not None and tree.last_seen not in heads:
            heads.append(tree.last_seen)  # our own event still on its way into the DHT
        try:
            version = build_version(self.identity, current, cmd.changes, heads, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic version: {exc}", kind="invalid")]
        self._topic_jobs[version.cid] = TopicJob(cmd.request, version, None, {version.cid})
        return [ev.StoreDht(version.cid, version.block)]

    def _topic_stored(self, job: TopicJob, result: ev.DhtStored, now: float) -> Out:
        job.left.discard(result.cid)
        if job.failed:
            return []
        if result.acks < self.config.min_acks:
            job.failed = True
            self.metrics["store_quorum_failed"] += 1
            reason = self._quorum_reason(result.acks, "topic")
            return [ev.CommandFailed(job.request, reason, kind="unpersisted")]
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
            out += self._arm_record(tree, 0.0, now)  # the record names the new version
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

    def _add_version(self, topic: TopicDescriptor, now: float) -> Out:
        """Register a validated topic version; fetch its parent if the lineage is not known
        yet; adopt it where it is the newest; release what waited for it."""
        added = self.versions.add(topic)
        out: Out = []
        if added.refused is not None:
            out += self._version_gone(topic.cid, added.refused, now)
            return out
        if added.missing is not None:
            return self._fetch_version(added.missing, now)
        for version in added.registered:
            first = self.versions.first_of(version.cid)
            assert first is not None
            if version.heads:
                self._vouch_below(first, version.heads)
            tree = self._trees.get(first)
            adopted = version.parent is not None and self.versions.latest(first) is version
            if tree is not None and adopted:
                out.append(ev.StoreLocal(version.cid, version.block))
                out.append(ev.VersionAdopted(first, version))
                if version.heads:
                    # The history the version records is reached from its heads, not
                    # only back from today's: an event that raced the revocation is
                    # refused here, and what lies below it would never come through it.
                    out += self.backfill.learn_heads(first, version.heads, None, now)
            out += self._release(version.cid, now)
            out += self._version_resolved(version.cid, now)
        return out

    def _vouch_below(self, first: CID, vouched: Iterable[CID]) -> None:
        """Pass vouching down from ``vouched`` (a new version's recorded heads; an admitted
        vouched event) through the blocks this node already holds. Admitting a vouched
        event vouches for its parent and merges, but an event admitted before anything
        vouched for it — before the version was known, or on its own publisher's rights —
        passed nothing down: its missing ancestors by a now-revoked publisher would be
        refused when backfill brings them. The walk reads the local store and stops at
        what it lacks or was vouched for already, at most :data:`VOUCH_WALK_LIMIT` blocks."""
        stack = list(vouched)
        steps = 0
        while stack and steps < VOUCH_WALK_LIMIT:
            block = self._lookup(stack.pop())
            links = None if block is None else event_links(block)
            if links is None:
                continue
            steps += 1
            for link in (links.parent, *links.merges):
                if link is not None and not self.versions.is_sanctioned(first, link):
                    self.versions.vouch(first, link)
                    stack.append(link)

    def _fetch_version(self, cid: CID, now: float) -> Out:
        if cid in self._version_fetches or self.versions.get(cid) is not None:
            return []
        if len(self._version_fetches) >= self.config.parked_limit:
            return self._version_gone(cid, "too many topic versions being fetched", now)
        self._version_fetches.add(cid)
        return [ev.Fetch(cid)]

    def _version_fetched(self, cid: CID, block: bytes | None, now: float) -> Out:
        self._version_fetches.discard(cid)
        if block is None:
            return self._version_gone(cid, "topic version not found", now)
        try:
            topic = TopicDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            return self._version_gone(cid, f"invalid topic version: {exc}", now)
        return [ev.StoreLocal(cid, block), *self._add_version(topic, now)]

    def _version_gone(self, cid: CID, reason: str, now: float) -> Out:
        """``cid`` (a version or a parent some versions wait for) will not register: drop
        what waited on it, and stop waiting for it before publishing."""
        out: Out = []
        gone = [cid, *self.versions.drop_orphan(cid)]
        for waiting in list(self.versions.waiting_on(cid)):
            gone += self.versions.drop_orphan(waiting)
        for version in dict.fromkeys(gone):
            out += self._drop_parked(version, reason, now)
            out += self._version_resolved(version, now)
        return out

    def _version_resolved(self, cid: CID, now: float) -> Out:
        out: Out = []
        for topic in self._version_waiters.pop(cid, ()):
            tree = self._trees.get(topic)
            if tree is not None and cid in tree.sync_waiting:
                tree.sync_waiting.discard(cid)
                out += self._learn_record_heads(tree, now)
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
        return self._fetch_version(cid, now)

    def _park(self, version: CID, peer: PeerId | None, msg: Event, now: float) -> Out:
        if self._parked_count >= self.config.parked_limit:
            return self._reject(peer, "too many events waiting for topic versions")
        self._parked_count += 1
        self._parked.setdefault(version, []).append((peer, msg))
        return self._fetch_version(version, now)

    def _release(self, version: CID, now: float) -> Out:
        waiting = self._parked.pop(version, [])
        self._parked_count -= len(waiting)
        out: Out = []
        for peer, msg in waiting:
            out += self._on_event(peer, msg, now)
        return out + self._release_backfill(version, True, now)

    def _drop_parked(self, version: CID, reason: str, now: float) -> Out:
        waiting = self._parked.pop(version, [])
        self._parked_count -= len(waiting)
        out: Out = []
        for peer, _ in waiting:
            out += self._reject(peer, f"{reason} ({version})")
        return out + self._release_backfill(version, False, now)

    # -- backfilled events naming a version not known yet

    def _backfill_fetched(self, fetched: ev.BlockFetched, now: float) -> Out:
        """A block backfill asked the DHT for. An event naming a topic version not known
        yet waits for it; anything else goes to the backfill layer at once."""
        block = fetched.block
        if block is not None and fetched.cid.verifies(block):
            fields = event_version(block)
            if fields is not None and self.versions.get(fields[0]) is None:
                return self._park_backfill(fields[0], fetched, now)
        return self.backfill.on_fetched(fetched.cid, block, now)

    def _backfill_blocks(self, received: ev.Received, now: float) -> Out:
        """A neighbour's BLOCKS answer: it waits, whole, for the first topic version not
        known yet that an event it would give backfill names (then for the next, if any).
        Only the blocks backfill may take are looked at — a chain of parents from one of
        the topic's gap frontiers — so an answer nobody asked for fetches nothing."""
        msg = received.message
        assert isinstance(msg, Blocks)
        frontier = set(self.backfill.missing(msg.topic))
        for block in msg.blocks:
            cid = cid_of(block)
            fields = event_version(block) if cid in frontier else None
            if fields is None:
                break
            version, parent = fields
            if self.versions.get(version) is None:
                return self._park_backfill(version, received, now)
            frontier = set() if parent is None else {parent}
        return self.backfill.on_blocks(received.peer, msg, now)

    def _park_backfill(self, version: CID, item: Backfilled, now: float) -> Out:
        """Hold ``item`` until ``version`` is registered or given up on. Its gap stays
        open meanwhile (it times out and asks again as usual); over ``parked_limit`` the
        item is judged at once."""
        if self._parked_count >= self.config.parked_limit:
            return self._pass_backfill(item, now)
        self._parked_count += 1
        self._parked_backfill.setdefault(version, []).append(item)
        return self._fetch_version(version, now)

    def _release_backfill(self, version: CID, known: bool, now: float) -> Out:
        """``version`` is registered (``known``: judge what waited, a BLOCKS answer
        possibly waiting again for another version) or will not be (judge it now: the
        events naming it are refused)."""
        waiting = self._parked_backfill.pop(version, [])
        self._parked_count -= len(waiting)
        out: Out = []
        for item in waiting:
            if known and isinstance(item, ev.Received):
                out += self._backfill_blocks(item, now)
            else:
                out += self._pass_backfill(item, now)
        return out

    def _pass_backfill(self, item: Backfilled, now: float) -> Out:
        if isinstance(item, ev.BlockFetched):
            return self.backfill.on_fetched(item.cid, item.block, now)
        assert isinstance(item.message, Blocks)
        return self.backfill.on_blocks(item.peer, item.message, now)
