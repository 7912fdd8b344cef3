"""Heads anti-entropy and WANT answering.

Each ``heads_interval`` a node sends its heads to its tree and lazy neighbours (only where
they changed, and to everyone after 1, 2, 4, 8, 16 and 32 quiet ticks); a head it does not
know opens a gap toward the neighbour that named it — or the DHT, for heads read from heads records.
This finds branches nobody forwarded. A WANT is answered from the local store with one
BLOCKS batch, newest first, stopping where the asker said its history resumes.
"""

from __future__ import annotations

from collections.abc import Iterable

from dag import CID, PeerId
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .messages import MAX_BLOCK, Blocks, Heads, HeadsDigest, Want, heads_digest
from .state import (
    BackfillParts,
    TopicState,
    bounded_put,
    event_links,
)

__all__ = ["AntiEntropy"]

_REFRESH_ROUNDS = (1, 2, 4, 8, 16, 32)
"""Quiet periods (in ``heads_refresh`` ticks) after which heads go to every neighbour,
whatever it was sent or told: a copy lost on a live connection (injected loss, a cut
mid-write, a partition that drops silently) is caught up as soon as the topic is quiet.
Only a tick on which the heads changed skips the neighbours that have every head. The
testbed's smoke scenario showed why the first round must already be full: with full
rounds only from the fourth (8 s of quiet), a partitioned node learned of a branch tip
published during the partition after the run had settled."""
_FULL_EVERY = 16
"""A topic whose heads change on every tick is never quiet: every this many ticks its
heads go to every neighbour anyway, so a lost copy is caught up under steady traffic."""


class AntiEntropy(BackfillParts):
    """The anti-entropy part of :class:`~pulsar.proto.repair.backfill.Backfill`: HEADS exchange and
    WANT answering."""

    def on_want(self, peer: PeerId, msg: Want, now: float) -> Out:
        """Answer a WANT from the local store with one BLOCKS batch, newest first."""
        limit = min(msg.limit, self.config.answer_limit)
        budget = self.config.answer_bytes
        have = set(msg.have)
        blocks: list[bytes] = []
        total = 0
        cursor: CID | None = msg.head
        while cursor is not None and len(blocks) < limit and cursor not in have:
            block = self._lookup(cursor)
            if block is None or len(block) > MAX_BLOCK or total + len(block) > budget:
                break
            links = event_links(block)
            if links is None:
                break
            blocks.append(block)
            total += len(block)
            cursor, created = links.parent, links.created
            if msg.after is not None and created < msg.after:
                break  # the asker's horizon: this block tells it where history begins
        self._counts["wants_answered"] += 1
        self._counts["blocks_answered"] += len(blocks)
        return [ev.Send(peer, Blocks(msg.topic, msg.head, tuple(blocks)))]

    def on_heads(self, peer: PeerId, msg: Heads, now: float) -> Out:
        """A neighbour's heads: backfill each one we do not know, from that neighbour.
        A HEADS names what its sender delivered lately, most likely still on its way
        down the tree to us, so those gaps wait one RTO first; a JOINED's heads are
        history we missed, asked for at once."""
        out = self.learn_heads(msg.topic, msg.heads, peer, now, reorder=type(msg) is Heads)
        state = self._topics.get(msg.topic)
        if state is None or type(msg) is not Heads:
            return out
        digested = state.digested.pop(peer, None)
        if digested is not None and frozenset(msg.heads) != digested:
            # The answer to our digest: it lacks something of ours, or we of its (which
            # the learning above is fetching). It cannot tell which, so it gets our list.
            out.append(self._our_list(state, peer))
        return out

    def _our_list(self, state: TopicState, peer: PeerId) -> ev.Send:
        """Our whole heads list to ``peer``, remembered as the set it last had from us."""
        current = self.heads(state.cid)
        state.sent[peer] = frozenset(current)
        self._told(state, peer, current)
        self._counts["heads_sent"] += 1
        return ev.Send(peer, Heads(state.cid, tuple(current)))

    def _told(self, state: TopicState, peer: PeerId, heads: Iterable[CID]) -> None:
        """``peer`` was sent ``heads`` in a HEADS: like a peer an event was forwarded or
        announced to, it is covered for them, so refresh rounds send it the digest, not
        the list again. (A peer that became a neighbour after an event passed — a new
        lazy link, a tree repair — was sent the whole list on every refresh round: under
        500 ms of latency, 1,336 of the 2,043 HEADS of a 100-node run.) If the HEADS is
        lost, the digest differs and the list follows."""
        covered, limit = state.covered, self.config.heads_limit
        for head in heads:
            peers = covered.get(head)
            if peers is None:
                bounded_put(covered, head, frozenset((peer,)), limit)
            elif peer not in peers:
                covered[head] = peers | {peer}

    def on_digest(self, peer: PeerId, msg: HeadsDigest, now: float) -> Out:
        """A neighbour's heads, hashed: if ours hash the same there is nothing to do;
        otherwise it gets our list (and answers with its own if that differs).

        Unless our heads changed since our last tick or on it: then the difference is most
        likely an event still on its way to one of us (under 500 ms of latency one digest
        in five differed, and each cost a list of every head, often twice), and our own
        tick tells the neighbour our new heads anyway. Such a digest is let go once per
        neighbour; the neighbour's next digest (its next refresh round) is answered."""
        state = self._topics.get(msg.topic)
        if state is None:
            return []
        heads = self.heads(msg.topic)
        if heads_digest(heads) == msg.digest:
            self._counts["digests_matched"] += 1
            state.deferred.discard(peer)
            if frozenset(heads) == state.last_heads:
                state.agreed.add(peer)
            return []
        moving = state.quiet == 0 or frozenset(heads) != state.last_heads
        if moving and peer not in state.deferred:
            state.deferred.add(peer)
            self._counts["digests_deferred"] += 1
            return []
        state.deferred.discard(peer)
        return [self._our_list(state, peer)]

    def learn_heads(
        self, topic: CID, heads: Iterable[CID], peer: PeerId | None, now: float,
        *, reorder: bool = False,
    ) -> Out:
        """Heads learned from ``peer`` (None: from the DHT's heads records): open a gap
        for each one we do not know, asking that peer first (or the DHT)."""
        state = self._topics.get(topic)
        if state is None:
            return []
        out: Out = []
        for head in heads:
            gap = state.frontier.get(head)
            if gap is not None and gap.peer is None and peer is not None:
                gap.peer = peer  # a neighbour has it: its next request is a WANT, not the DHT
            if head in state.settled or head in state.held or gap is not None:
                continue
            if self.coming(head):
                continue
            until = state.failed.get(head)
            if until is not None:
                if until > now:
                    continue
                del state.failed[head]
            if self._is_delivered(state.cid, head):
                bounded_put(state.settled, head, None, self.config.settled_limit)
                continue
            self._counts["heads_unknown"] += 1
            self._open_gap(state, head, peer, now, out, reorder=reorder)
        return out

    def cover(self, topic: CID, cid: CID, peers: Iterable[PeerId]) -> None:
        """``peers`` have event ``cid`` of ``topic`` or were told of it (the core forwarded
        or announced it to them): a HEADS need not tell them."""
        state = self._topics.get(topic)
        if state is not None:
            bounded_put(state.covered, cid, frozenset(peers), self.config.heads_limit)

    def tick(self, topic: CID, neighbours: Iterable[PeerId], now: float) -> Out:
        """Send our heads of an active ``topic`` to each neighbour that has not had this
        set yet and was not sent or told of every head; after 1, 2, 4, 8, 16 and 32 times
        ``heads_refresh`` quiet ticks (and every ``_FULL_EVERY`` th tick) to all of them (a
        lost HEADS or event is caught up); then the topic falls idle (it costs nothing
        until its heads change again)."""
        state = self._topics.get(topic)
        if state is None:
            self._active.pop(topic, None)
            return []
        heads = self.heads(topic)
        peers = sorted(set(neighbours), key=bytes)
        for gone in [p for p in state.sent if p not in peers]:
            del state.sent[gone]
            state.digested.pop(gone, None)
        state.deferred.intersection_update(peers)
        state.agreed.intersection_update(peers)
        if not heads:
            self._active.pop(topic, None)
            return []
        current = frozenset(heads)
        changed = current != state.last_heads
        if changed:
            state.last_heads, state.quiet = current, 0
            state.ticks += 1
            state.digested.clear()  # answers to digests of an older set mean nothing now
            state.agreed.clear()
        else:
            state.quiet += 1
        rounds, rest = divmod(state.quiet, self.config.heads_refresh)
        refresh = rest == 0 and rounds in _REFRESH_ROUNDS
        full = refresh or (changed and state.ticks % _FULL_EVERY == 0)
        if rounds >= _REFRESH_ROUNDS[-1]:
            self._active.pop(topic, None)
        message = Heads(topic, tuple(heads))
        digest: HeadsDigest | None = None
        covered = state.covered
        out: Out = []
        for peer in peers:
            before = state.sent.get(peer)
            if not (full or before != current):
                continue
            state.sent[peer] = current
            if not full:
                # Only what is new since our last set to it: it has (or was sent) the
                # rest, and a lost copy is caught up by the refresh rounds.
                new = heads if before is None else [h for h in heads if h not in before]
                if all(peer in covered.get(head, ()) for head in new):
                    self._counts["heads_skipped"] += 1  # it has them all, or was told
                    continue
                listed = message if len(new) == len(heads) else Heads(topic, tuple(new))
                self._told(state, peer, new)
                out.append(ev.Send(peer, listed))
                self._counts["heads_sent"] += 1
                continue
            if peer in state.agreed:
                # Its own refresh digest matched these heads: neither lacks anything, and
                # ours would only tell it so again (both sides' rounds sent one each way).
                self._counts["digests_spared"] += 1
                continue
            if all(peer in covered.get(head, ()) for head in heads):
                # Sent or told of every head, but a copy may have been lost: the digest
                # is enough to find out.
                if digest is None:
                    digest = HeadsDigest(topic, heads_digest(heads))
                state.digested[peer] = current
                out.append(ev.Send(peer, digest))
                self._counts["digests_sent"] += 1
                continue
            self._told(state, peer, heads)
            out.append(ev.Send(peer, message))
            self._counts["heads_sent"] += 1
        return out
