"""Topic commands: creating a topic and updating it, up to the moment its descriptors are
persisted.

* **Create** (paper, algorithm 1): the meta topic (author-only) and the topic, both
  stored in the DHT at the write quorum (``min_acks``); then the node becomes the root of
  both trees (:class:`Created`, carried out by the core).
* **Update**: a new version on top of the latest, recording the topic's heads now (what
  it vouches for, see :mod:`pulsar.proto.versions.lineage`), persisted; then the core
  adopts it and announces it on the meta topic (:class:`VersionStored`), and the update
  is ready once the announcement is published. An update that changes publishing rights
  first reads the heads records of every allowed publisher: a publisher losing its
  rights keeps the events it was acknowledged for only if the new version records them,
  and each acknowledged event is named by its publisher's record.

:class:`TopicCommands` owns the jobs in flight and nothing else; it reads the versions
the adoption room holds and is told the topic's heads by the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dag import CID, Identity, InvalidDescriptor, TopicDescriptor

from .. import events as ev
from ..config import quorum_reason
from ..events import OutEvent
from .descriptors import build_topic, build_version
from .lineage import TopicVersions

__all__ = ["CommandItem", "Created", "TopicCommands", "Unpersisted", "VersionStored"]


@dataclass(slots=True)
class _Job:
    """A create or update waiting for its descriptors to be persisted."""

    request: int
    topic: TopicDescriptor
    meta: TopicDescriptor | None
    left: set[CID] = field(default_factory=set)
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Created:
    """Both descriptors of a new topic are persisted: become the root of both trees."""

    request: int
    meta: TopicDescriptor
    topic: TopicDescriptor


@dataclass(frozen=True, slots=True)
class VersionStored:
    """A new version is persisted: adopt it, then announce it on the meta topic."""

    request: int
    version: TopicDescriptor


@dataclass(frozen=True, slots=True)
class Unpersisted:
    """A descriptor missed the write quorum: the command fails (and is counted)."""

    failure: ev.CommandFailed


CommandItem = OutEvent | Created | VersionStored | Unpersisted


class TopicCommands:
    """Creates and updates in flight, by the CIDs of the descriptors being stored."""

    def __init__(self, identity: Identity, versions: TopicVersions, min_acks: int) -> None:
        self._identity = identity
        self._versions = versions
        self._min_acks = min_acks
        self._jobs: dict[CID, _Job] = {}
        self._rights_updates: dict[int, ev.UpdateTopic] = {}

    def create(self, cmd: ev.CreateTopic, now: float) -> list[CommandItem]:
        try:
            meta, topic = build_topic(self._identity, cmd, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic: {exc}", kind="invalid")]
        job = _Job(cmd.request, topic, meta, {meta.cid, topic.cid})
        self._jobs[meta.cid] = self._jobs[topic.cid] = job
        return [ev.StoreDht(meta.cid, meta.block), ev.StoreDht(topic.cid, topic.block)]

    def update(
        self, cmd: ev.UpdateTopic, in_tree: bool, heads: list[CID], last_seen: CID | None,
        now: float,
    ) -> list[CommandItem]:
        """Start an update. ``heads`` are the topic's heads known here and ``last_seen``
        this node's newest event in the DHT (never one still being stored: it may fail)."""
        current = self._versions.latest(cmd.topic)
        if not in_tree or current is None:
            return [ev.CommandFailed(cmd.request, "not in this topic's tree; subscribe first")]
        if current.author != self._identity.peer_id:
            return [ev.CommandFailed(cmd.request, "only the topic's author may update it")]
        if current.is_meta:
            return [ev.CommandFailed(cmd.request, "a meta topic has no versions")]
        rights = cmd.changes.allowed_publishers is not None or (
            cmd.changes.request_to_publish is not None)
        if rights and current.allowed_publishers.enabled:
            publishers = tuple(dict.fromkeys((current.author, *current.allowed_publishers.peers)))
            self._rights_updates[cmd.request] = cmd
            return [ev.FetchRecords(cmd.topic, publishers, cmd.request)]
        return self._build(cmd, heads, last_seen, now)

    def waits_for_records(self, request: int | None) -> bool:
        """Whether the heads records answered with ``request`` are for a rights update."""
        return request is not None and request in self._rights_updates

    def records_fetched(
        self, fetched: ev.RecordsFetched, in_tree: bool, heads: list[CID],
        last_seen: CID | None, now: float,
    ) -> list[CommandItem]:
        """The publishers' heads records a rights update read: the new version records
        their heads beside this node's (``heads``, ``last_seen``: as for :meth:`update`)."""
        assert fetched.request is not None
        cmd = self._rights_updates.pop(fetched.request)
        if not in_tree or self._versions.latest(cmd.topic) is None:
            return [ev.CommandFailed(cmd.request, "not in this topic's tree; subscribe first")]
        recorded = list(heads)
        for record in fetched.records:
            if record.topic == cmd.topic:
                recorded += [h for h in record.heads if h not in recorded]
        return self._build(cmd, recorded, last_seen, now)

    def _build(
        self, cmd: ev.UpdateTopic, heads: list[CID], last_seen: CID | None, now: float
    ) -> list[CommandItem]:
        current = self._versions.latest(cmd.topic)
        assert current is not None
        if last_seen is not None and last_seen not in heads:
            heads = [*heads, last_seen]
        try:
            version = build_version(self._identity, current, cmd.changes, heads, now)
        except InvalidDescriptor as exc:
            return [ev.CommandFailed(cmd.request, f"invalid topic version: {exc}", kind="invalid")]
        self._jobs[version.cid] = _Job(cmd.request, version, None, {version.cid})
        return [ev.StoreDht(version.cid, version.block)]

    def is_job(self, cid: CID) -> bool:
        return cid in self._jobs

    def stored(self, result: ev.DhtStored) -> list[CommandItem]:
        """The DHT answered the store of one of our descriptors."""
        job = self._jobs.pop(result.cid)
        job.left.discard(result.cid)
        if job.failed:
            return []
        if result.acks < self._min_acks:
            job.failed = True
            reason = quorum_reason(result.acks, self._min_acks, "topic")
            return [Unpersisted(ev.CommandFailed(job.request, reason, kind="unpersisted"))]
        if job.left:
            return []
        if job.meta is not None:
            return [Created(job.request, job.meta, job.topic)]
        return [VersionStored(job.request, job.topic)]

