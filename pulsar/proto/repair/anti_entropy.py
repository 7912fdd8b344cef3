"""Heads anti-entropy and WANT answering.

Each ``heads_interval`` a node sends its heads to its tree and lazy neighbours (only where
they changed, and to everyone after 1, 2, 4, 8, 16 and 32 quiet ticks); a head it does not
know opens a gap toward the neighbour that named it — or the DHT, for heads read from heads records.
This finds branches nobody forwarded. A WANT is answered from the local store with one
BLOCKS batch, newest first, stopping where the asker said its history resumes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from dag import CID, PeerId
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .causal import CausalOrder
from .gaps import GapFetching
from .messages import MAX_BLOCK, Blocks, Heads, HeadsDigest, Want, heads_digest
from .state import BackfillConfig, Lookup, Neighbours, bounded_put, event_links
from .timers import HeadsTick

__all__ = ["AntiEntropy", "Exchange"]

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


@dataclass(slots=True, eq=False)
class Exchange:
    """What one topic's neighbours were sent and told of our heads."""

    sent: dict[PeerId, frozenset[CID]] = field(default_factory=dict)
    covered: OrderedDict[CID, frozenset[PeerId]] = field(default_factory=OrderedDict)
    """Recent events -> the neighbours that have them or were told of them (the sender,
    the eager links it was forwarded to, the lazy links it was announced to): a HEADS
    naming only such events tells that neighbour nothing."""
    quiet: int = 0
    """Heads ticks since the heads last changed (the topic is active until the refresh)."""
    ticks: int = 0
    """Heads ticks on which the heads had changed: every ``_FULL_EVERY`` th goes to every
    neighbour."""
    digested: dict[PeerId, frozenset[CID]] = field(default_factory=dict)
    """Neighbours sent a digest of these heads: their HEADS answer is compared with them."""
    deferred: set[PeerId] = field(default_factory=set)
    """Neighbours whose last digest differed while our heads were moving, and was not
    answered: their next one is, whatever our heads do."""
    agreed: set[PeerId] = field(default_factory=set)
    """Neighbours whose digest matched our heads since they last changed: they have what
    we have, so our refresh rounds need not send them ours."""
    last_heads: frozenset[CID] = frozenset()


class AntiEntropy:
    """HEADS exchange and WANT answering for every topic of one node: the top of the
    repair room. Unknown heads go to gap fetching (:meth:`GapFetching.learn_heads`);
    the heads and which topics changed lately are causal order's.

    ``neighbours`` names the peers to send heads to (without it no heads timer is set
    and the driver calls :meth:`tick` itself)."""

    def __init__(self, config: BackfillConfig, causal: CausalOrder, gaps: GapFetching,
                 lookup: Lookup, neighbours: Neighbours | None) -> None:
        self.config = config
        self._causal = causal
        self._gaps = gaps
        self._lookup = lookup
        self._neighbours = neighbours
        self.topics: dict[CID, Exchange] = {}
        self._tick_seq = 0
        self._tick_armed = False
        self._tick_prompt = False
        self.counts: dict[str, int] = dict.fromkeys((
            "wants_answered", "blocks_answered", "heads_sent", "heads_skipped",
            "digests_sent", "digests_matched", "digests_spared", "digests_deferred"), 0)

    def open_topic(self, topic: CID) -> None:
        self.topics[topic] = Exchange()

    def close_topic(self, topic: CID) -> None:
        self.topics.pop(topic, None)

    def forget_peer(self, peer: PeerId) -> None:
        """``peer`` is gone: what it was sent means nothing any more."""
        for state in self.topics.values():
            state.sent.pop(peer, None)

    def heads(self, topic: CID) -> list[CID]:
        return self._causal.heads(topic)

    def arm_tick(self) -> Out:
        """The heads tick's timer, if a topic is active and it is not armed yet, or armed
        for later than ``heads_first_delay`` while a topic just woke up (the core asks after
        every input: one live timer for the node, none while all is idle)."""
        causal = self._causal
        woke, causal.woke = causal.woke, False
        if not causal.active or self._neighbours is None:
            return []
        prompt = woke and not (self._tick_armed and self._tick_prompt)
        if self._tick_armed and not prompt:
            return []
        self._tick_seq += 1
        self._tick_armed, self._tick_prompt = True, prompt
        delay = self.config.heads_first_delay if prompt else self.config.heads_interval
        return [ev.SetTimer(delay, HeadsTick(self._tick_seq))]

    def on_tick(self, timer: HeadsTick, now: float) -> Out:
        if timer.seq != self._tick_seq:
            return []  # re-armed sooner since: this one is stale
        self._tick_armed = False
        out: Out = []
        for topic in list(self._causal.active):
            neighbours = self._neighbours(topic) if self._neighbours else ()
            out += self.tick(topic, neighbours, now)
        return out + self.arm_tick()

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
        self.counts["wants_answered"] += 1
        self.counts["blocks_answered"] += len(blocks)
        return [ev.Send(peer, Blocks(msg.topic, msg.head, tuple(blocks)))]

    def on_heads(self, peer: PeerId, msg: Heads, now: float) -> Out:
        """A neighbour's heads: backfill each one we do not know, from that neighbour.
        A HEADS names what its sender delivered lately, most likely still on its way
        down the tree to us, so those gaps wait one RTO first; a JOINED's heads are
        history we missed, asked for at once."""
        out = self._gaps.learn_heads(msg.topic, msg.heads, peer, now, reorder=type(msg) is Heads)
        state = self.topics.get(msg.topic)
        if state is None or type(msg) is not Heads:
            return out
        digested = state.digested.pop(peer, None)
        if digested is not None and frozenset(msg.heads) != digested:
            # The answer to our digest: it lacks something of ours, or we of its (which
            # the learning above is fetching). It cannot tell which, so it gets our list.
            out.append(self._our_list(msg.topic, state, peer))
        return out

    def _our_list(self, topic: CID, state: Exchange, peer: PeerId) -> ev.Send:
        """Our whole heads list to ``peer``, remembered as the set it last had from us."""
        current = self.heads(topic)
        state.sent[peer] = frozenset(current)
        self._told(state, peer, current)
        self.counts["heads_sent"] += 1
        return ev.Send(peer, Heads(topic, tuple(current)))

    def _told(self, state: Exchange, peer: PeerId, heads: Iterable[CID]) -> None:
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
        state = self.topics.get(msg.topic)
        if state is None:
            return []
        heads = self.heads(msg.topic)
        if heads_digest(heads) == msg.digest:
            self.counts["digests_matched"] += 1
            state.deferred.discard(peer)
            if frozenset(heads) == state.last_heads:
                state.agreed.add(peer)
            return []
        moving = state.quiet == 0 or frozenset(heads) != state.last_heads
        if moving and peer not in state.deferred:
            state.deferred.add(peer)
            self.counts["digests_deferred"] += 1
            return []
        state.deferred.discard(peer)
        return [self._our_list(msg.topic, state, peer)]

    def cover(self, topic: CID, cid: CID, peers: Iterable[PeerId]) -> None:
        """``peers`` have event ``cid`` of ``topic`` or were told of it (the core forwarded
        or announced it to them): a HEADS need not tell them."""
        state = self.topics.get(topic)
        if state is not None:
            bounded_put(state.covered, cid, frozenset(peers), self.config.heads_limit)

    def tick(self, topic: CID, neighbours: Iterable[PeerId], now: float) -> Out:
        """Send our heads of an active ``topic`` to each neighbour that has not had this
        set yet and was not sent or told of every head; after 1, 2, 4, 8, 16 and 32 times
        ``heads_refresh`` quiet ticks (and every ``_FULL_EVERY`` th tick) to all of them (a
        lost HEADS or event is caught up); then the topic falls idle (it costs nothing
        until its heads change again)."""
        state = self.topics.get(topic)
        if state is None:
            self._causal.active.pop(topic, None)
            return []
        heads = self.heads(topic)
        peers = sorted(set(neighbours), key=bytes)
        for gone in [p for p in state.sent if p not in peers]:
            del state.sent[gone]
            state.digested.pop(gone, None)
        state.deferred.intersection_update(peers)
        state.agreed.intersection_update(peers)
        if not heads:
            self._causal.active.pop(topic, None)
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
            self._causal.active.pop(topic, None)
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
                    self.counts["heads_skipped"] += 1  # it has them all, or was told
                    continue
                listed = message if len(new) == len(heads) else Heads(topic, tuple(new))
                self._told(state, peer, new)
                out.append(ev.Send(peer, listed))
                self.counts["heads_sent"] += 1
                continue
            if peer in state.agreed:
                # Its own refresh digest matched these heads: neither lacks anything, and
                # ours would only tell it so again (both sides' rounds sent one each way).
                self.counts["digests_spared"] += 1
                continue
            if all(peer in covered.get(head, ()) for head in heads):
                # Sent or told of every head, but a copy may have been lost: the digest
                # is enough to find out.
                if digest is None:
                    digest = HeadsDigest(topic, heads_digest(heads))
                state.digested[peer] = current
                out.append(ev.Send(peer, digest))
                self.counts["digests_sent"] += 1
                continue
            self._told(state, peer, heads)
            out.append(ev.Send(peer, message))
            self.counts["heads_sent"] += 1
        return out
