"""Version adoption: the room that owns every topic version a node knows, and what waits
for one.

Versions come from meta events, heads records, restarts, JOINs and the events that name
them. One not known yet is fetched; it is registered only if its lineage holds, and
adopted where it is the newest of its topic. Events that named an unknown version wait
for it (bounded) and are judged once it is known or given up on: those that came down
the tree, and those backfill fetched (a DHT block, a BLOCKS answer) — judged before their
version is known, a backfilled event would be refused for good and the walk back would
end there.

:class:`Adoption` owns that state and nothing else. It does not call the layers around
it: what follows from a version for them comes back, in order, as values among its
outputs (:data:`AdoptionItem`) — an event to judge again, a version adopted, a version
resolved, an input refused, backfilled blocks to judge now — and the core maps each
where it stands, as iroh-gossip's layers hand their events to the layer above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

from dag import CID, EventDescriptor, InvalidDescriptor, PeerId, TopicDescriptor, cid_of
from dag.event_links import event_links, event_version
from pulsar.proto.repair.messages import Blocks
from pulsar.proto.tree.messages import Event

from .. import events as ev
from ..events import OutEvent
from ..reports import Refused
from .lineage import TopicVersions

__all__ = [
    "VOUCH_WALK_LIMIT",
    "Adopted",
    "Adoption",
    "AdoptionItem",
    "Backfilled",
    "Refused",
    "Rejudge",
    "Resolved",
    "Unparked",
]

VOUCH_WALK_LIMIT: Final = 4096
"""Local blocks one vouching is passed down through (one store read each)."""

Backfilled = ev.BlockFetched | ev.Received
"""What backfill fetched, waiting for the topic version an event in it names: a DHT
block (``BlockFetched``) or a neighbour's ``BLOCKS`` answer (``Received``)."""


@dataclass(frozen=True, slots=True)
class Unparked:
    """An event that waited for its topic version, now known: judge it again."""

    peer: PeerId | None
    message: Event


@dataclass(frozen=True, slots=True)
class Adopted:
    """``version`` is now the newest version of the topic whose first version is
    ``first``: a tree of that topic stores it, reports it and backfills its heads."""

    first: CID
    version: TopicDescriptor


@dataclass(frozen=True, slots=True)
class Resolved:
    """``version`` was registered or given up on: whatever waited for it to publish may
    go on."""

    version: CID


@dataclass(frozen=True, slots=True)
class Rejudge:
    """Backfilled blocks to hand to backfill now: they name no unknown version, or the
    one they waited for was registered (``known``: a BLOCKS answer is looked at again,
    and may wait for another version) or given up on (judged as they are, the events
    naming it refused)."""

    item: Backfilled
    known: bool


AdoptionItem = OutEvent | Unparked | Adopted | Resolved | Refused | Rejudge
AdoptionOut = list[AdoptionItem]


class Adoption:
    """Every known topic version, the fetches of unknown ones and what waits for them."""

    def __init__(self, lookup: Callable[[CID], bytes | None], *, parked_limit: int) -> None:
        self.versions = TopicVersions()
        self._lookup = lookup
        self._parked_limit = parked_limit
        self._fetches: set[CID] = set()
        self._parked: dict[CID, list[tuple[PeerId | None, Event]]] = {}
        """Events waiting for the topic version they name, by that version's CID."""
        self._parked_backfill: dict[CID, list[Backfilled]] = {}
        self._parked_count = 0

    def fetching(self, cid: CID) -> bool:
        return cid in self._fetches

    def add(self, topic: TopicDescriptor) -> AdoptionOut:
        """Register a validated topic version; fetch its parent if the lineage is not known
        yet; adopt it where it is the newest; release what waited for it."""
        added = self.versions.add(topic)
        if added.refused is not None:
            return self._gone(topic.cid, added.refused)
        if added.missing is not None:
            return self.fetch(added.missing)
        out: AdoptionOut = []
        for version in added.registered:
            first = self.versions.first_of(version.cid)
            assert first is not None
            if version.heads:
                self.vouch_below(first, version.heads)
            if version.parent is not None and self.versions.latest(first) is version:
                out.append(Adopted(first, version))
            out += self._release(version.cid)
            out.append(Resolved(version.cid))
        return out

    def judge(self, tree: TopicDescriptor, event: EventDescriptor) -> str | None:
        """Why ``event`` may not enter the tree of ``tree`` (its first version; None: it
        may). The meta topic takes events from its author only; every other topic follows
        the rights rule of its latest version."""
        if tree.is_meta:
            if self.versions.first_of(event.topic) != tree.cid:
                return f"event {event.cid} belongs to another topic"
            if event.publisher != tree.author or event.author != tree.author:
                return f"event {event.cid}: only the author publishes on a meta topic"
            return None
        first = tree.cid
        problem = self.versions.admit(first, event)
        if problem is None and self.versions.is_sanctioned(first, event.cid):
            # Its parent and merges are vouched for now; if this node holds them already
            # (admitted on their publishers' rights), the vouching must go on below them.
            self.vouch_below(first, [c for c in (event.parent, *event.merges) if c is not None])
        return problem

    def verify(
        self, tree: TopicDescriptor, block: bytes | EventDescriptor
    ) -> EventDescriptor | Literal["unvouched"] | None:
        """A block fetched for the tree of ``tree``, checked as an event that came down
        the tree would be. ``"unvouched"``: refused only because nothing vouches for it
        yet (a walk from a recorded head may still reach it); None: refused. An event
        already parsed (its CID, schema and signatures checked) is judged from there."""
        if isinstance(block, EventDescriptor):
            event = block
        else:
            try:
                event = EventDescriptor.from_block(block)
            except InvalidDescriptor:
                return None
        if self.versions.get(event.topic) is None:
            return None
        if self.judge(tree, event) is not None:
            if not tree.is_meta and self.versions.needs_vouching(tree.cid, event):
                return "unvouched"
            return None
        return event

    def vouch_below(self, first: CID, vouched: Iterable[CID]) -> None:
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

    def fetch(self, cid: CID) -> AdoptionOut:
        """Fetch the version ``cid`` unless it is known or on its way."""
        if cid in self._fetches or self.versions.get(cid) is not None:
            return []
        if len(self._fetches) >= self._parked_limit:
            return self._gone(cid, "too many topic versions being fetched")
        self._fetches.add(cid)
        return [ev.Fetch(cid)]

    def fetched(self, cid: CID, block: bytes | None) -> AdoptionOut:
        """The answer to :meth:`fetch` (``block`` None: not found, or not ``cid``'s)."""
        self._fetches.discard(cid)
        if block is None:
            return self._gone(cid, "topic version not found")
        try:
            topic = TopicDescriptor.from_block(block, cid)
        except InvalidDescriptor as exc:
            return self._gone(cid, f"invalid topic version: {exc}")
        return [ev.StoreLocal(cid, block), *self.add(topic)]

    def announced(self, event: EventDescriptor) -> AdoptionOut:
        """A meta-topic event (author-only, already judged) names a new topic version by
        its CID: fetch it and adopt it (its lineage and author are checked on the way)."""
        if not isinstance(event.payload, bytes):
            return [Refused(None, f"meta event {event.cid} does not carry a version CID")]
        try:
            cid = CID.parse(event.payload)
        except ValueError:
            return [Refused(None, f"meta event {event.cid} does not carry a version CID")]
        if self.versions.get(cid) is not None:
            return []
        block = self._lookup(cid)
        if block is not None:
            return self.fetched(cid, block)
        return self.fetch(cid)

    def park(self, version: CID, peer: PeerId | None, msg: Event) -> AdoptionOut:
        """``msg`` names ``version``, not known yet: it waits for it (bounded)."""
        if self._parked_count >= self._parked_limit:
            return [Refused(peer, "too many events waiting for topic versions")]
        self._parked_count += 1
        self._parked.setdefault(version, []).append((peer, msg))
        return self.fetch(version)

    def backfilled(self, fetched: ev.BlockFetched) -> AdoptionOut:
        """A block backfill asked the DHT for. An event naming a topic version not known
        yet waits for it; anything else goes to the backfill layer at once."""
        version = self.waiting_version(fetched)
        if version is None:
            return [Rejudge(fetched, False)]
        return self.park_backfill(version, fetched)

    def backfilled_blocks(self, received: ev.Received, frontier: set[CID]) -> AdoptionOut:
        """A neighbour's BLOCKS answer: it waits, whole, for the first topic version not
        known yet that an event it would give backfill names (then for the next, if any);
        ``frontier`` is the topic's gap frontier (see :meth:`first_unknown`)."""
        assert isinstance(received.message, Blocks)
        version = self.first_unknown(received.message, frontier)
        if version is None:
            return [Rejudge(received, False)]
        return self.park_backfill(version, received)

    def waiting_version(self, fetched: ev.BlockFetched) -> CID | None:
        """The unknown topic version an event block backfill fetched names, if any."""
        block = fetched.block
        if block is None or not fetched.cid.verifies(block):
            return None
        fields = event_version(block)
        if fields is None or self.versions.get(fields[0]) is not None:
            return None
        return fields[0]

    def first_unknown(self, msg: Blocks, frontier: set[CID]) -> CID | None:
        """The first topic version not known yet that an event of a BLOCKS answer names,
        among the blocks backfill may take: a chain of parents from one of the topic's
        gap ``frontier`` CIDs (so an answer nobody asked for fetches nothing)."""
        for block in msg.blocks:
            cid = cid_of(block)
            fields = event_version(block) if cid in frontier else None
            if fields is None:
                return None
            version, parent = fields
            if self.versions.get(version) is None:
                return version
            frontier = set() if parent is None else {parent}
        return None

    def park_backfill(self, version: CID, item: Backfilled) -> AdoptionOut:
        """Hold ``item`` until ``version`` is registered or given up on. Its gap stays
        open meanwhile (it times out and asks again as usual); over the limit the item is
        judged at once."""
        if self._parked_count >= self._parked_limit:
            return [Rejudge(item, False)]
        self._parked_count += 1
        self._parked_backfill.setdefault(version, []).append(item)
        return self.fetch(version)

    def _gone(self, cid: CID, reason: str) -> AdoptionOut:
        """``cid`` (a version or a parent some versions wait for) will not register: drop
        what waited on it, and stop waiting for it before publishing."""
        out: AdoptionOut = []
        gone = [cid, *self.versions.drop_orphan(cid)]
        for waiting in list(self.versions.waiting_on(cid)):
            gone += self.versions.drop_orphan(waiting)
        for version in dict.fromkeys(gone):
            waiting_events = self._parked.pop(version, [])
            self._parked_count -= len(waiting_events)
            out += [Refused(peer, f"{reason} ({version})") for peer, _ in waiting_events]
            out += self._release_backfill(version, False)
            out.append(Resolved(version))
        return out

    def _release(self, version: CID) -> AdoptionOut:
        waiting = self._parked.pop(version, [])
        self._parked_count -= len(waiting)
        out: AdoptionOut = [Unparked(peer, msg) for peer, msg in waiting]
        return out + self._release_backfill(version, True)

    def _release_backfill(self, version: CID, known: bool) -> AdoptionOut:
        waiting = self._parked_backfill.pop(version, [])
        self._parked_count -= len(waiting)
        return [Rejudge(item, known) for item in waiting]
