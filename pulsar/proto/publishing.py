"""Publishing: who may publish, what an event links to, and when it counts as published.

* **Rights** under the latest version this node knows (:mod:`pulsar.proto.versions.lineage`): a
  node that may publish signs the event; one that may only request sends a
  REQUEST_TO_PUBLISH up its parents to the first node allowed to publish it.
* **Learning first.** A node that is not the author reads the heads records of the author
  and the allowed publishers (then of the publishers those name), fetches the versions
  they name, and waits for its JOIN to be answered, before it publishes or turns a request
  into an event: so it publishes under the latest rules and links to the latest events.
  Publishes wait (bounded) meanwhile.
* **Linking.** LAST_SEEN links the newest event known here (``_parent_for`` in the core)
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
"""

from __future__ import annotations

from dag import CID, EventDescriptor, EventLinking, InvalidDescriptor, PeerId, TopicDescriptor
from dag.chunks import local_blocks, parse_node
from dag.cid import DAG_CBOR
from dag.descriptors import MAX_MERGES
from dag.errors import ChunkError
from dag.records import MAX_RECORD_HEADS, MAX_RECORD_PEERS, HeadsRecord
from pulsar.proto.tree.messages import Event, RequestToPublish
from pulsar.proto.tree.routing import Tree

from . import events as ev
from .events import Out
from .parts import CoreParts
from .stores import Stored, quorum_reason
from .timers import RecordTimer, RequestTimeout

__all__ = ["Publishing"]


class Publishing(CoreParts):
    """The publishing part of the core (see the module docstring)."""

    def _on_publish(self, cmd: ev.Publish, now: float) -> Out:
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
        parent = self._parent_for(tree) if last_seen else cmd.parent
        if topic.may_publish(self.me):
            event = EventDescriptor.create(
                self.identity, topic.cid, cmd.payload, parent=parent,
                content_type=cmd.content_type,
                merges=self._merges_for(tree, parent) if last_seen else (), now=now,
            )
            return self._publish(tree, event, cmd.request)
        if not topic.may_request(self.me):
            return [ev.CommandFailed(cmd.request, "not allowed to publish or to request it")]
        if not tree.parents:
            return [ev.CommandFailed(cmd.request, "no parent to carry a request to publish")]
        created, signature = EventDescriptor.sign_content(
            self.identity, topic.cid, cmd.payload, content_type=cmd.content_type, now=now
        )
        request = RequestToPublish(
            tree.topic.cid, topic.cid, self.me, cmd.payload, created, signature, cmd.parent,
            cmd.content_type,
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
        below = self._stores.last_persisted(parent)
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
        if not isinstance(self._verify_backfilled(tree.topic.cid, block), EventDescriptor):
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
            elif not isinstance(self._verify_backfilled(topic, block), EventDescriptor):
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
                self._version_waiters.setdefault(record.version, set()).add(tree.topic.cid)
                out += self._adopt(self.adoption.fetch(record.version), now)
            heads += record.heads
            if newest is None or record.created > newest.created:
                newest = record
            found += [p for p in record.peers if p not in tree.sync_asked and p != self.me]
        if tree.deliver:
            tree.sync_heads.update(dict.fromkeys(heads))
        out += self._learn_record_heads(tree, now)
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

    def _learn_record_heads(self, tree: Tree, now: float) -> Out:
        """Backfill the heads the records named, once the versions they name are known
        (fetched, or given up on). Events are judged by the latest version known when
        they arrive: walking back from the heads before that would refuse, for good, an
        event naming a version still being fetched — the author's events after a topic
        update — and a revoked publisher's events, which only the version that revoked
        it vouches for, would be judged without it."""
        if tree.sync_waiting or not tree.sync_heads:
            return []
        heads, tree.sync_heads = tree.sync_heads, {}
        return self.backfill.learn_heads(tree.topic.cid, heads, None, now)

    def _version_resolved(self, cid: CID, now: float) -> Out:
        """A version trees waited for before publishing was registered or given up on."""
        out: Out = []
        for topic in self._version_waiters.pop(cid, ()):
            tree = self._trees.get(topic)
            if tree is not None and cid in tree.sync_waiting:
                tree.sync_waiting.discard(cid)
                out += self._learn_record_heads(tree, now)
                out += self._maybe_synced(tree, now)
        return out

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

    def _announce(self, request: int, version: TopicDescriptor, now: float) -> Out:
        """A new version of ours is persisted and adopted: name it in our heads record at
        once and announce it on the meta topic; the update is ready once announced."""
        assert version.parent is not None
        out: Out = []
        first = self.versions.first_of(version.cid)
        tree = None if first is None else self._trees.get(first)
        meta_tree = None if version.meta is None else self._trees.get(version.meta)
        if tree is not None:
            out += self._arm_record(tree, 0.0, now)
        ready = ev.TopicReady(request, version)
        if meta_tree is None:
            out.append(ready)
            return out
        announcement = EventDescriptor.create(
            self.identity, meta_tree.topic.cid, version.cid.raw,
            parent=self._parent_for(meta_tree), now=now,
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
        self._remember(tree, event.cid)
        tree.last_seen = event.cid
        self._stores.add(Stored(tree.topic.cid, event, request, then))
        return [ev.StoreDht(event.cid, event.block)]

    def _on_dht_stored(self, result: ev.DhtStored, now: float) -> Out:
        """An event of ours was stored (or not) by the DHT: forward what is ready."""
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
                tree.last_seen = self._stores.last_persisted(item.event.parent)
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
            if tree is not None and self._acks_wait_for_record(tree):
                tree.record_waiters.append(published)
            else:
                out.append(published)
        if pending.then is not None:
            out.append(pending.then)
        if tree is None:
            return out
        self._saw_publisher(tree, event.publisher)
        out += self.backfill.accepted(topic_cid, event, 0, None, now)
        self._match_request(tree, event, out)
        eager = self._eager(tree)
        blocks = self._large_blocks(event)
        if blocks is not None and eager:
            # A large event: the fragment layer sends the EVENT, then its chunk tree, to
            # each eager link in staggered groups, paced (pulsar.proto.fragments.layer).
            head = Event(topic_cid, event.block, 1, True)
            out += self.frags.publish(topic_cid, head, blocks, eager, now)
            self.metrics["forwarded"] += len(eager)
        else:
            message = Event(topic_cid, event.block, 1)
            for peer in eager:
                out.append(ev.Send(peer, message))
                self.metrics["forwarded"] += 1
        out += self.lazy.accepted(topic_cid, event.cid, 0, None, now)
        self._cover(tree, event.cid, eager, None)
        if not tree.topic.is_meta:
            # A publish waiting for its acknowledgement has the record written at once
            # (one write in flight per tree: publishes meanwhile share the next one).
            delay = 0.0 if tree.record_waiters else self.config.record_delay
            out += self._arm_record(tree, delay, now)
        out.append(ev.KeepPublished(topic_cid, event.cid))
        return out

    def _acks_wait_for_record(self, tree: Tree) -> bool:
        """Whether a publish on ``tree`` is acknowledged only once a heads record naming
        it is stored at the write quorum. Without a quorum (``min_acks`` 0, a lone node)
        there is nobody to store it, and meta topics carry versions, not events."""
        return self.config.min_acks > 0 and not tree.topic.is_meta

    def _on_record_stored(self, stored: ev.RecordStored, now: float) -> Out:
        """Our heads record was stored (or not): acknowledge the publishes it names, or
        write it again; after ``record_retries`` misses in a row they fail as
        ``unrecorded`` (stored and forwarded, but a reader of the records may not find
        them: the caller cannot count on them)."""
        tree = self._trees.get(stored.topic)
        if tree is None or tree.record_writing is None or tree.record_writing[0] != stored.seq:
            return []  # an answer overtaken by a later write (which carries its publishes)
        waiters = tree.record_writing[1]
        tree.record_writing = None
        out: Out = []
        if stored.acks >= max(1, self.config.min_acks):
            tree.record_failures = 0
            out += waiters
        elif waiters:
            tree.record_failures += 1
            if tree.record_failures <= self.config.record_retries:
                tree.record_waiters[:0] = waiters
                backoff = self.config.record_delay * 2 ** (tree.record_failures - 1)
                tree.record_again = False
                return out + self._arm_record(tree, backoff, now)
            tree.record_failures = 0
            self.metrics["record_quorum_failed"] += 1
            reason = quorum_reason(stored.acks, self.config.min_acks, "heads record").replace(
                "not published", "the event may still be delivered, but this publish is "
                "not acknowledged")
            out += [ev.CommandFailed(w.request, reason, kind="unrecorded") for w in waiters]
        if tree.record_waiters or tree.record_again:
            tree.record_again = False
            delay = 0.0 if tree.record_waiters else self.config.record_delay
            out += self._arm_record(tree, delay, now)
        return out

    def _large_blocks(self, event: EventDescriptor) -> list[tuple[CID, bytes]] | None:
        """The chunk tree of our own event's payload, pre-order, if it is to travel the
        tree as fragments: fragments are on, the payload is a link to a chunk tree held
        here (the driver split and stored it) and over the threshold. None otherwise: the
        event carries only the link and readers pull the payload from the DHT."""
        cfg = self.config.fragments
        root = event.payload
        if not cfg.enabled or not isinstance(root, CID) or root.codec != DAG_CBOR:
            return None
        block = self._lookup(root)
        if block is None:
            return None
        try:
            size, _ = parse_node(root, block)
        except ChunkError:
            return None
        if not cfg.threshold < size <= cfg.max_event_size:
            return None
        return local_blocks(root, self._lookup, max_blocks=cfg.max_fragments)

    def _arm_record(self, tree: Tree, delay: float, now: float) -> Out:
        """Write the heads record ``delay`` from ``now``, unless one is due sooner: a
        publish gathers what follows it for ``record_delay``, and a new version is
        written at once even if a slower write was already armed."""
        due = now + delay
        if tree.record_due is not None and tree.record_due <= due:
            return []
        tree.record_due = due
        return [ev.SetTimer(delay, RecordTimer(tree.topic.cid, due))]

    def _flush_records(self, now: float) -> Out:
        """Write every heads record armed but not written yet (the node is stopping)."""
        out: Out = []
        for tree in self._trees.values():
            if tree.record_due is not None or tree.record_again:
                due = tree.record_due if tree.record_due is not None else now
                tree.record_due = due
                out += self._write_record(tree, RecordTimer(tree.topic.cid, due), now,
                                          force=True)
        return out

    def _write_record(
        self, tree: Tree, timer: RecordTimer, now: float, *, force: bool = False
    ) -> Out:
        if timer.due != tree.record_due:
            return []  # overtaken: an earlier timer wrote the record already
        tree.record_due = None
        if tree.record_writing is not None and not force:
            tree.record_again = True  # written when the one in flight is answered
            return []
        latest = self.versions.latest(tree.topic.cid)
        if latest is None:
            return []
        heads = self.backfill.heads(tree.topic.cid)
        last = self._stores.last_persisted(tree.last_seen)
        if last is not None and last not in heads:
            heads.append(last)
        tree.record_seq = max(tree.record_seq + 1, int(now * 1000))
        peers = tuple(p for p in tree.publishers if p != self.me)[-MAX_RECORD_PEERS:]
        tree.recorded_publishers = frozenset(peers)
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
        waiters = tree.record_waiters
        if tree.record_writing is not None:  # forced (stopping): this one carries all
            waiters = tree.record_writing[1] + waiters
        tree.record_waiters = []
        tree.record_again = False
        tree.record_writing = (tree.record_seq, waiters)
        return [ev.StoreRecord(record)]

    def _saw_publisher(self, tree: Tree, publisher: PeerId) -> None:
        tree.publishers[publisher] = None
        tree.publishers.move_to_end(publisher)
        if len(tree.publishers) > MAX_RECORD_PEERS + 1:
            tree.publishers.popitem(last=False)

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
        merges: tuple[CID, ...] = ()
        if latest.event_linking is EventLinking.LAST_SEEN:
            parent = self._parent_for(tree)
            merges = self._merges_for(tree, parent)
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
                content_type=msg.content_type,
                merges=merges,
            )
        except InvalidDescriptor as exc:
            return self._reject(peer, f"request to publish: {exc}")
        return self._publish(tree, event, None)
