"""Heads records: a publisher's signed word, in the DHT, on the latest events it knows.

After publishing, a node writes its heads record of the topic (the version it publishes
under, its heads, the publishers it saw lately); the author also when a new publisher
appears or a version is made. One write is in flight per tree: what is armed meanwhile
is written when it is answered, so publishes share records (group commit).

**Acknowledged = recorded.** A publish is acknowledged only once a heads record naming
its event (or a later event of ours) is stored at the write quorum: a reader of the
topic's CID finds it even if this node never runs again. A record that misses the
quorum is written again with backoff; after ``record_retries`` misses in a row the
publishes it carried fail as ``unrecorded``.
"""

from __future__ import annotations

from collections.abc import Iterable

from dag import CID, Identity
from dag.records import MAX_RECORD_HEADS, MAX_RECORD_PEERS, HeadsRecord
from pulsar.proto.repair.backfill import Backfill
from pulsar.proto.tree.routing import Tree
from pulsar.proto.versions.lineage import TopicVersions

from .. import events as ev
from ..config import CoreConfig, quorum_reason
from ..events import Out
from ..timers import RecordTimer
from .stores import OwnStores

__all__ = ["RecordWriter"]


class RecordWriter:
    """The heads records of every tree this node publishes on (state on each Tree)."""

    def __init__(
        self,
        identity: Identity,
        config: CoreConfig,
        versions: TopicVersions,
        backfill: Backfill,
        stores: OwnStores,
    ) -> None:
        self.identity = identity
        self.me = identity.peer_id
        self.config = config
        self.versions = versions
        self.backfill = backfill
        self._stores = stores
        self.metrics: dict[str, int] = {"records_written": 0, "record_quorum_failed": 0}
        self._checkpoints: dict[CID, CID] = {}
        """The newest checkpoint of each topic we authored (our records name it)."""

    def acks_wait(self, tree: Tree) -> bool:
        """Whether a publish on ``tree`` is acknowledged only once a heads record naming
        it is stored at the write quorum. Without a quorum (``min_acks`` 0, a lone node)
        there is nobody to store it, and meta topics carry versions, not events."""
        return self.config.min_acks > 0 and not tree.topic.is_meta

    def on_stored(self, tree: Tree | None, stored: ev.RecordStored, now: float) -> Out:
        """Our heads record was stored (or not): acknowledge the publishes it names, or
        write it again; after ``record_retries`` misses in a row they fail as
        ``unrecorded`` (stored and forwarded, but a reader of the records may not find
        them: the caller cannot count on them)."""
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
                return out + self.arm(tree, backoff, now)
            tree.record_failures = 0
            self.metrics["record_quorum_failed"] += 1
            reason = quorum_reason(stored.acks, self.config.min_acks, "heads record").replace(
                "not published", "the event may still be delivered, but this publish is "
                "not acknowledged")
            out += [ev.CommandFailed(w.request, reason, kind="unrecorded") for w in waiters]
        if tree.record_waiters or tree.record_again:
            tree.record_again = False
            delay = 0.0 if tree.record_waiters else self.config.record_delay
            out += self.arm(tree, delay, now)
        return out

    def checkpoint(self, topic: CID, tree: Tree | None, checkpoint: CID, now: float) -> Out:
        """We made ``checkpoint`` of ``topic`` (or made it before a restart, and the tree
        is not joined yet): our heads records name it from now on, and the next is written
        at once so that a reader seeks from it."""
        if self._checkpoints.get(topic) == checkpoint:
            return []
        self._checkpoints[topic] = checkpoint
        return [] if tree is None else self.arm(tree, 0.0, now)

    def arm(self, tree: Tree, delay: float, now: float) -> Out:
        """Write the heads record ``delay`` from ``now``, unless one is due sooner: a
        publish gathers what follows it for ``record_delay``, and a new version is
        written at once even if a slower write was already armed."""
        due = now + delay
        if tree.record_due is not None and tree.record_due <= due:
            return []
        tree.record_due = due
        return [ev.SetTimer(delay, RecordTimer(tree.topic.cid, due))]

    def flush(self, trees: Iterable[Tree], now: float) -> Out:
        """Write every heads record armed but not written yet (the node is stopping)."""
        out: Out = []
        for tree in trees:
            if tree.record_due is not None or tree.record_again:
                due = tree.record_due if tree.record_due is not None else now
                tree.record_due = due
                out += self.write(tree, RecordTimer(tree.topic.cid, due), now,
                                          force=True)
        return out

    def write(
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
            checkpoint=self._checkpoints.get(tree.topic.cid),
        )
        self.metrics["records_written"] += 1
        waiters = tree.record_waiters
        if tree.record_writing is not None:  # forced (stopping): this one carries all
            waiters = tree.record_writing[1] + waiters
        tree.record_waiters = []
        tree.record_again = False
        tree.record_writing = (tree.record_seq, waiters)
        return [ev.StoreRecord(record)]
