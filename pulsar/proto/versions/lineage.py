"""Topic versions, their lineage, and the publishing-rights rule (sans-I/O).

A topic changes by new *versions*: descriptors by the same author whose ``parent`` links
the previous version. Trees are named by the first version; every event names the
version it was published under. This module keeps every version a node knows, maps each
to its first version, picks the latest, and decides whether an event may be accepted.

**The rights rule** (``docs/protocol.md`` §"Publishing rights and revocation"): a receiver
judges every event by the *latest* version it knows of the topic. An event whose publisher
(and, for a request to publish, whose author) that version allows is valid, whatever
version it names. An event that only an *older* version allows is valid only if it was
already part of the topic when the author made a later version: each version records the
topic's heads at that moment (``metadata.heads``), and such an event must be one of those
heads or an ancestor of one. Back-dating cannot defeat this: ``created`` is not used at
all; what counts is whether the author's signed version vouches for the event.

The ancestry test is incremental: the recorded heads are *sanctioned*, and when a
sanctioned event is admitted its parent becomes sanctioned too, so a walk back from the
recorded heads (which is what backfill does) admits the whole history before the change,
while a new event from a revoked publisher — which no recorded head descends from — is
refused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from dag import CID, EventDescriptor, InvalidDescriptor, TopicDescriptor, check_rights

__all__ = ["MAX_VERSION_CHAIN", "Added", "TopicVersions", "lineage_problem"]

MAX_VERSION_CHAIN: Final = 64
"""Versions of one topic beyond this are refused (a chain walked on every lookup)."""


@dataclass(slots=True)
class Added:
    """What :meth:`TopicVersions.add` did: versions registered (the one added and any
    waiting descendants it completed), a parent still to fetch, or a refusal."""

    registered: list[TopicDescriptor] = field(default_factory=list)
    missing: CID | None = None
    refused: str | None = None


class TopicVersions:
    """Every topic version this node knows, for every topic."""

    def __init__(self, *, limit: int = 100_000, sanctioned_limit: int = 50_000) -> None:
        self._limit = limit
        self._sanctioned_limit = sanctioned_limit
        self._topics: dict[CID, TopicDescriptor] = {}
        self._first: dict[CID, CID] = {}
        self._depth: dict[CID, int] = {}
        self._latest: dict[CID, TopicDescriptor] = {}
        self._orphans: dict[CID, TopicDescriptor] = {}
        """Versions whose parent is not registered yet, by their own CID."""
        self._sanctioned: dict[CID, OrderedDict[CID, None]] = {}

    # ------------------------------------------------------------------ queries

    def get(self, cid: CID) -> TopicDescriptor | None:
        """A registered version (its lineage is known and checked)."""
        return self._topics.get(cid)

    def first_of(self, cid: CID) -> CID | None:
        """The first version of the topic ``cid`` is a version of (None: unknown)."""
        return self._first.get(cid)

    def latest(self, first: CID) -> TopicDescriptor | None:
        return self._latest.get(first)

    def chain(self, first: CID) -> list[TopicDescriptor]:
        """The versions from the latest back to ``first``, newest first."""
        out: list[TopicDescriptor] = []
        cursor = self._latest.get(first)
        while cursor is not None:
            out.append(cursor)
            cursor = None if cursor.parent is None else self._topics.get(cursor.parent)
        return out

    # ------------------------------------------------------------------ adding

    def add(self, topic: TopicDescriptor) -> Added:
        """Register a valid (signature-checked) version. Its parent chain must reach a
        registered version of the same author; if the parent is unknown the version waits
        and :attr:`Added.missing` names what to fetch."""
        result = Added()
        if topic.cid in self._topics:
            return result
        if topic.parent is None:
            self._register(topic, topic.cid, 0, result)
            return result
        parent = self._topics.get(topic.parent)
        if parent is None:
            if len(self._orphans) >= 1000:
                result.refused = "too many topic versions waiting for their parents"
                return result
            self._orphans[topic.cid] = topic
            result.missing = topic.parent
            return result
        first = self._first[parent.cid]
        if self._topics[first].author != topic.author:
            result.refused = f"topic version {topic.cid} has another author than the topic"
            return result
        depth = self._depth[parent.cid] + 1
        if depth >= MAX_VERSION_CHAIN:
            result.refused = f"topic version chain longer than {MAX_VERSION_CHAIN}"
            return result
        self._register(topic, first, depth, result)
        return result

    def _register(self, topic: TopicDescriptor, first: CID, depth: int, result: Added) -> None:
        if len(self._topics) >= self._limit:
            result.refused = "too many topic versions"
            return
        self._topics[topic.cid] = topic
        self._first[topic.cid] = first
        self._depth[topic.cid] = depth
        self._orphans.pop(topic.cid, None)
        result.registered.append(topic)
        current = self._latest.get(first)
        if current is None or self._key(topic) > self._key(current):
            self._latest[first] = topic
        if topic.heads:
            sanctioned = self._sanctioned.setdefault(first, OrderedDict())
            for head in topic.heads:
                self._sanction(sanctioned, head)
        for waiting in [o for o in self._orphans.values() if o.parent == topic.cid]:
            if self._topics[first].author != waiting.author:
                self._orphans.pop(waiting.cid, None)
                continue
            self._register(waiting, first, depth + 1, result)

    def _key(self, topic: TopicDescriptor) -> tuple[int, str, bytes]:
        """Latest = longest chain; the author's clock then the CID break a fork's tie, so
        every node picks the same version."""
        return (self._depth[topic.cid], topic.created, topic.cid.raw)

    def drop_orphan(self, cid: CID) -> list[CID]:
        """Forget waiting versions that can never register (their parent was not found);
        returns their CIDs, the given one first."""
        gone = [cid] if self._orphans.pop(cid, None) is not None else []
        for orphan in [o for o in self._orphans.values() if o.parent == cid]:
            gone += self.drop_orphan(orphan.cid)
        return gone

    def waiting_on(self, parent: CID) -> list[CID]:
        """Orphans that wait for ``parent`` (directly)."""
        return [o.cid for o in self._orphans.values() if o.parent == parent]

    # ------------------------------------------------------------------ the rule

    def admit(self, first: CID, event: EventDescriptor) -> str | None:
        """Judge ``event`` of the topic ``first`` by the rights rule (module docstring).
        Returns why it is refused, or None when it is valid; a valid sanctioned event
        sanctions its parent and merges, which is how the ancestry test walks back."""
        if self._first.get(event.topic) != first:
            return f"event {event.cid} names a version of another topic"
        latest = self._latest[first]
        named = self._topics[event.topic]
        try:
            check_rights(event, latest)
        except InvalidDescriptor as exc:
            if named is latest:
                return str(exc)
            try:
                check_rights(event, named)
            except InvalidDescriptor as older:
                return str(older)
            if not self.is_sanctioned(first, event.cid):
                return (
                    f"event {event.cid}: {event.publisher} may no longer publish (version "
                    f"{latest.cid}) and the event is not in the history that version records"
                )
        sanctioned = self._sanctioned.get(first)
        if sanctioned is not None and event.cid in sanctioned:
            if event.parent is not None:
                self._sanction(sanctioned, event.parent)
            for merged in event.merges:
                self._sanction(sanctioned, merged)
        return None

    def needs_vouching(self, first: CID, event: EventDescriptor) -> bool:
        """Whether :meth:`admit` refuses ``event`` only because no recorded history vouches
        for it yet: its publisher may publish under the version it names but not under the
        latest. A caller that has not seen the whole DAG yet may judge it again later."""
        latest = self._latest.get(first)
        named = self._topics.get(event.topic)
        if latest is None or named is None or named is latest:
            return False
        try:
            check_rights(event, latest)
            return False
        except InvalidDescriptor:
            pass
        try:
            check_rights(event, named)
        except InvalidDescriptor:
            return False
        return not self.is_sanctioned(first, event.cid)

    def sanctioned(self, first: CID) -> list[CID]:
        """The events of topic ``first`` known to be vouched for so far (recorded heads
        and the ancestors admitted from them)."""
        return list(self._sanctioned.get(first, ()))

    def vouch(self, first: CID, cid: CID) -> None:
        """Mark ``cid`` as in the history a version records, because its caller found it
        to be an ancestor of a vouched event by other means (a replay that walked the
        whole DAG first)."""
        self._sanction(self._sanctioned.setdefault(first, OrderedDict()), cid)

    def is_sanctioned(self, first: CID, cid: CID) -> bool:
        sanctioned = self._sanctioned.get(first)
        return sanctioned is not None and cid in sanctioned

    def _sanction(self, sanctioned: OrderedDict[CID, None], cid: CID) -> None:
        sanctioned[cid] = None
        if len(sanctioned) > self._sanctioned_limit:
            sanctioned.popitem(last=False)


def lineage_problem(chain: Sequence[TopicDescriptor]) -> str | None:
    """Why ``chain`` (a first version, then later versions oldest first, each the parent
    of the next) is not one topic's lineage, or None. It is the rule :meth:`TopicVersions.add`
    applies (the same author on every link, fewer than :data:`MAX_VERSION_CHAIN` versions),
    for a walk made outside the core (the runtime resolving a CID it was given), so both
    judge a lineage alike."""
    versions = TopicVersions()
    for topic in chain:
        added = versions.add(topic)
        if added.refused is not None:
            return added.refused
        if added.missing is not None:
            return f"topic version {topic.cid} does not follow the one before it"
    return None
