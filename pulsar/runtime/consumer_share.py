"""A group consumer's share of its topic: which log entries it hands out, which it leaves
to other members and watches, and which it takes over when their member goes.

The group's membership and beats are :mod:`pulsar.runtime.consumer_groups`'; the durable
consumer that reads the log is :mod:`pulsar.runtime.consumers`'. This is what sits between:
it answers the consumer's questions (is this entry mine? may I hand out yet?) and carries
out what the group's beats say (another member settled these events; the view changed) on
the consumer's tables, in one transaction each.

A watched entry (``consumer_watched``) names the member that handles it. It goes when that
member's acknowledgement is heard; when the member is no longer in the view (it went
silent, left, or its node restarted as a new incarnation), whoever the view names now gets
it — this member, if the view says so: the entry becomes pending and due at once, handed
out as a second delivery (``delivery.count`` 2), and counted as taken over. An event that
another member settles while this one also has it pending or settled was handled twice: it
is counted as a duplicate (a pending one is dropped, since it is done).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from dag import CID, EventDescriptor, PeerId
from pulsar.proto.groups.view import MemberId

from .consumer_groups import ConsumerGroups, LocalMember
from .consumer_table import ConsumerRow, ConsumerTable, Watched

__all__ = ["GroupInfo", "GroupMember", "GroupShare"]

log = logging.getLogger("pulsar.node")

_SETTLED_MEMORY: Final = 20_000
"""Events a member settled that it remembers, to count another member settling one of
them too (a duplicate)."""
_DONE_MEMORY: Final = 100_000
"""Events other members settled that a member had not reached in its log yet (its cursor
is behind theirs, or the event has not arrived): when it gets there it skips them. Kept in
memory, the newest this many per consumer: after a restart such an event is watched
instead, and taken over (a duplicate, counted) only if its handler then leaves."""
_GONE_OWNER: Final = b""
"""The owner of entries a member had pending when its node stopped: that incarnation is
over, so whoever the view names now takes them."""

EventAt = Callable[[tuple[CID, float, bytes | None] | None], EventDescriptor | None]


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A member of a consumer's group, as this node sees it."""

    peer: str
    name: str
    incarnation: int
    since: float
    me: bool
    heard_ago: float


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """Where a group consumer stands in its group (``group`` of its info)."""

    name: str
    epoch: int
    """Changes of the view this member has seen (a member came or went)."""
    ready: bool
    """False during the join lead: it hands out nothing yet."""
    members: tuple[GroupMember, ...]
    num_watched: int
    """Log entries left to another member whose acknowledgement was not heard yet."""
    taken_over: int
    """Entries it took over from members that went, since its node started."""
    duplicates: int
    """Events another member settled that it had also handed out, since its node started."""


class GroupShare:
    """The group side of this node's consumers (``host`` of the groups' callbacks).

    ``poke`` wakes the fetches waiting on a consumer; ``event_at`` parses a log entry's
    event (None when it is gone). It counts in the groups' counters (the node's metrics)."""

    def __init__(self, table: ConsumerTable, groups: ConsumerGroups,
                 poke: Callable[[CID, str], None],
                 event_at: EventAt) -> None:
        self._table = table
        self.groups = groups
        self._counters = groups.counters
        self._poke = poke
        self._event_at = event_at
        self._settled: dict[tuple[CID, str], OrderedDict[CID, None]] = {}
        self._done: dict[tuple[CID, str], OrderedDict[CID, None]] = {}
        groups.host = self

    # ------------------------------------------------------------------ the consumer asks

    def member(self, row: ConsumerRow) -> LocalMember | None:
        """The consumer's membership, if it belongs to a group."""
        if row.config.group is None:
            return None
        member = self.groups.member(row.topic, row.name)
        if member is None:  # made before the groups knew it, or left: join again
            member = self.groups.join(row.topic, row.name, row.config.group)
        return member

    def joining_until(self, member: LocalMember, now: float) -> float | None:
        """While the member is joining (the others may not know it yet, so it hands out
        nothing), the wall-clock time to look again; None once it is ready."""
        if self.groups.ready(member):
            return None
        return now + max(0.05, member.ready_at - self.groups.monotonic())

    def elsewhere(self, member: LocalMember, seq: int, event: EventDescriptor
                  ) -> Watched | bool:
        """What to do with a log entry: hand it out (False), skip it (True: another
        member settled it already), or watch it (the entry: another member handles it)."""
        done = self._done.get((member.topic, member.name))
        if done is not None and event.cid in done:
            del done[event.cid]
            return True
        created = event.created_at
        owner = member.view.owner(event.cid, created)
        return False if owner == member.me else Watched(seq, event.cid, created, owner.key)

    def joined(self, row: ConsumerRow) -> None:
        """A group consumer was made: it joins its group."""
        if row.config.group is not None:
            self.groups.join(row.topic, row.name, row.config.group)

    def left(self, topic: CID, name: str) -> None:
        """A consumer was deleted: the others take its share over at once."""
        self.groups.leave(topic, name)
        self._settled.pop((topic, name), None)
        self._done.pop((topic, name), None)

    def settled(self, row: ConsumerRow, seqs: list[int]) -> None:
        """A group consumer settled the entries at ``seqs``: the others hear it."""
        if row.config.group is None or not seqs:
            return
        found = self._table.entries_at(row.topic, seqs)
        events = [found[seq][0] for seq in seqs if seq in found]
        settled = self._settled.setdefault((row.topic, row.name), OrderedDict())
        for event in events:
            settled[event] = None
        while len(settled) > _SETTLED_MEMORY:
            settled.popitem(last=False)
        self.groups.acked(row.topic, row.name, events)

    def info(self, row: ConsumerRow) -> GroupInfo | None:
        if row.config.group is None:
            return None
        local = self.groups.member(row.topic, row.name)
        watched = self._table.watched_count(row.topic, row.name)
        if local is None:
            return GroupInfo(row.config.group, 0, False, (), watched, 0, 0)
        now = self.groups.monotonic()
        members = tuple(
            GroupMember(str(PeerId(m.id.peer)), m.id.name, m.id.inc, m.since,
                        m is local.view.me, round(max(0.0, now - m.heard), 3))
            for m in sorted(local.view.live(), key=lambda m: m.id))
        return GroupInfo(row.config.group, local.view.epoch, self.groups.ready(local),
                         members, watched, local.taken_over, local.duplicates)

    # ------------------------------------------------------------------ the group says

    def group_acked(self, topic: CID, name: str, member: MemberId,
                    events: tuple[CID, ...]) -> None:
        """Another member settled ``events``: what this one watched for them is done."""
        row = self._table.get(topic, name)
        local = self.groups.member(topic, name)
        if row is None or local is None:
            return
        pending = self._table.pending_events(topic, name, events)
        settled: Mapping[CID, None] = self._settled.get((topic, name), {})
        twice = len(pending) + sum(1 for e in events if e in settled and e not in pending)
        if pending:
            self._table.save(row, deletes=list(pending.values()))
        unwatched = self._table.unwatch_events(topic, name, list(events))
        done = self._done.setdefault((topic, name), OrderedDict())
        for event in events:  # not reached yet: skipped when it is
            if event not in unwatched and event not in pending and event not in settled:
                done[event] = None
        while len(done) > _DONE_MEMORY:
            done.popitem(last=False)
        if twice:
            local.duplicates += twice
            self._counters["group_duplicates"] += twice
            log.info("consumer %s of topic %s: %d event(s) also settled by %s/%s", name, topic,
                     twice, PeerId(member.peer), member.name)
        if pending:
            self._poke(topic, name)

    def group_changed(self, topic: CID, name: str) -> None:
        """The view changed (or this member became ready): the entries it watched for
        members no longer in the view go to whoever the view names now."""
        local = self.groups.member(topic, name)
        row = self._table.get(topic, name)
        if local is None or row is None:
            return
        live = {m.id.key for m in local.view.live()}
        moved: list[Watched] = []
        mine: list[Watched] = []
        for watched in self._table.watched(topic, name):
            if watched.owner in live:
                continue
            owner = local.view.owner(watched.event, watched.created)
            if owner == local.me:
                mine.append(watched)
            else:
                moved.append(Watched(watched.seq, watched.event, watched.created, owner.key))
        if not (mine or moved):
            return
        now = self.groups.clock()
        self._table.save(row, upserts=[(w.seq, 1, now) for w in mine], watch=moved,
                         unwatch=[w.seq for w in mine])
        if mine:
            local.taken_over += len(mine)
            self._counters["group_taken_over"] += len(mine)
            log.info("consumer %s of topic %s: took over %d event(s) of members gone from "
                     "group %s", name, topic, len(mine), local.group)
            self._poke(topic, name)

    def rejoin(self) -> None:
        """At start: every group consumer joins again as a new incarnation. What it had
        pending belonged to the incarnation that stopped, and the others may have taken
        it over already: it is watched like any entry of a member gone, and goes to
        whoever the view names once this member is ready."""
        for row in self._table.grouped():
            assert row.config.group is not None
            due = self._table.due(row.topic, row.name, float("inf"))
            if due:
                found = self._table.entries_at(row.topic, [seq for seq, _ in due])
                watch: list[Watched] = []
                for seq, _ in due:
                    event = self._event_at(found.get(seq))
                    if event is not None:
                        watch.append(Watched(seq, event.cid, event.created_at, _GONE_OWNER))
                self._table.save(row, deletes=[seq for seq, _ in due], watch=watch)
            self.groups.join(row.topic, row.name, row.config.group)
