"""Plumtree lazy repair over Pulsarcast's dissemination trees (sans-I/O).

The join-routed tree gives every topic member its *eager* links (parent and children),
which are never pruned: they are the tree. This layer adds, per topic:

* a **passive view** of other members, learned HyParView-style: members periodically send
  a SHUFFLE with a sample of the members they know to a random neighbour, which merges it
  and answers with its own sample; entries expire when not refreshed and vanish when their
  peer goes down;
* a few **lazy links** drawn from the passive view: after accepting an event, a node
  queues ``(cid, hop)`` for each lazy peer and sends the queue as one IHAVE when a short
  dispatch timer fires;
* **repair**: an IHAVE for an event not received starts a graft timer; when it fires, the
  node sends GRAFT to the first announcer (who answers with the event and treats the link
  as eager), then, after a shorter timer, to the next announcer, and so on;
* **PRUNE**: an event arriving twice over a grafted (non-tree) link makes the receiver
  prune that link back to lazy;
* the **hop-count optimisation**: if an IHAVE announced an event at a hop count at least
  ``optimisation_threshold`` lower than the copy that arrived eagerly over a grafted link,
  the announcer is grafted and the eager sender pruned.

As in iroh-gossip's ``proto/plumtree``, timers are outputs (``SetTimer``) and come back as
inputs; the core owns tree membership and calls in here.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import assert_never

from dag import CID, PeerId

from . import events as ev
from .events import Out
from .gossip_messages import MAX_IHAVE, MAX_SAMPLE, Graft, IHave, Prune, Shuffle
from .messages import Event
from .timers import DispatchTimer, GraftTimer, PlumtreeTimer, ShuffleTimer

__all__ = ["DispatchTimer", "GraftTimer", "Plumtree", "PlumtreeConfig", "ShuffleTimer"]


@dataclass(frozen=True, slots=True)
class PlumtreeConfig:
    lazy_peers: int = 3
    """Lazy links per topic: enough that a lost eager copy is announced by someone else."""
    passive_size: int = 32
    passive_ttl: float = 60.0
    """A passive-view entry not refreshed by a shuffle for this long is dropped."""
    shuffle_interval: float = 2.0
    dispatch_delay: float = 0.05
    """IHAVE batching delay (iroh uses 5 ms over QUIC; we favour fewer, larger frames)."""
    graft_timeout_1: float = 0.5
    """How long to wait for the eager copy after the first IHAVE before grafting."""
    graft_timeout_2: float = 0.25
    """How long to wait for a grafted peer before grafting the next announcer."""
    optimisation_threshold: int = 7
    cache_size: int = 10_000
    """Hop counts of recent events remembered (for GRAFT answers and the optimisation)."""


@dataclass(slots=True)
class _Topic:
    passive: dict[PeerId, float] = field(default_factory=dict)
    lazy: set[PeerId] = field(default_factory=set)
    grafted: set[PeerId] = field(default_factory=set)
    queue: dict[PeerId, list[tuple[CID, int]]] = field(default_factory=dict)
    dispatch_armed: bool = False
    missing: dict[CID, deque[tuple[PeerId, int]]] = field(default_factory=dict)
    hops: dict[CID, int] = field(default_factory=dict)


Neighbours = Callable[[CID], set[PeerId]]
Lookup = Callable[[CID], bytes | None]


class Plumtree:
    """Lazy links and repair for every topic a node is in.

    ``neighbours(topic)`` returns the node's tree edges for a topic (from the core);
    ``lookup(cid)`` returns a stored event block (to answer GRAFT).
    """

    def __init__(
        self,
        me: PeerId,
        neighbours: Neighbours,
        lookup: Lookup,
        config: PlumtreeConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.me = me
        self.config = config or PlumtreeConfig()
        self.rng = rng or random.Random(0)
        self._neighbours = neighbours
        self._lookup = lookup
        self._topics: dict[CID, _Topic] = {}
        self.metrics: dict[str, int] = {"ihave_sent": 0, "grafts": 0, "prunes": 0, "repaired": 0}

    # ------------------------------------------------------------------ membership

    def start(self, topic: CID) -> Out:
        """A tree the node joined: begin shuffling its members."""
        if topic in self._topics:
            return []
        self._topics[topic] = _Topic()
        delay = self.config.shuffle_interval * (0.5 + self.rng.random())
        return [ev.SetTimer(delay, ShuffleTimer(topic))]

    def stop(self, topic: CID) -> None:
        self._topics.pop(topic, None)

    def eager_extra(self, topic: CID) -> set[PeerId]:
        """Links made eager by GRAFT, on top of the tree's own edges."""
        state = self._topics.get(topic)
        return set() if state is None else set(state.grafted)

    def lazy(self, topic: CID) -> set[PeerId]:
        state = self._topics.get(topic)
        return set() if state is None else set(state.lazy)

    def peer_down(self, peer: PeerId) -> None:
        for state in self._topics.values():
            state.passive.pop(peer, None)
            state.lazy.discard(peer)
            state.grafted.discard(peer)
            state.queue.pop(peer, None)
            for announcers in state.missing.values():
                for entry in [e for e in announcers if e[0] == peer]:
                    announcers.remove(entry)

    def learn(self, topic: CID, peers: Iterable[PeerId], now: float) -> None:
        """Add members to the passive view (also used by the core for JOIN senders)."""
        state = self._topics.get(topic)
        if state is None:
            return
        for peer in peers:
            if peer != self.me:
                state.passive[peer] = now
        if len(state.passive) > self.config.passive_size:
            oldest = sorted(state.passive, key=state.passive.__getitem__)
            for peer in oldest[: len(state.passive) - self.config.passive_size]:
                del state.passive[peer]
        self._refresh_lazy(topic, state, now)

    def _refresh_lazy(self, topic: CID, state: _Topic, now: float) -> None:
        for peer, seen in list(state.passive.items()):
            if now - seen > self.config.passive_ttl:
                del state.passive[peer]
                state.lazy.discard(peer)
        tree = self._neighbours(topic)
        state.lazy -= tree
        state.lazy &= set(state.passive)
        candidates = sorted(
            (p for p in state.passive if p not in tree and p not in state.lazy), key=bytes
        )
        self.rng.shuffle(candidates)
        while len(state.lazy) < self.config.lazy_peers and candidates:
            state.lazy.add(candidates.pop())

    def on_shuffle(self, peer: PeerId, msg: Shuffle, now: float) -> Out:
        state = self._topics.get(msg.topic)
        if state is None:
            return []
        self.learn(msg.topic, [peer, *msg.peers], now)
        if msg.reply:
            return []
        return [ev.Send(peer, Shuffle(msg.topic, self._sample(msg.topic, state, peer), True))]

    def _sample(self, topic: CID, state: _Topic, exclude: PeerId) -> tuple[PeerId, ...]:
        pool = sorted((set(state.passive) | self._neighbours(topic)) - {exclude}, key=bytes)
        self.rng.shuffle(pool)
        return tuple(pool[: MAX_SAMPLE - 1])

    # ------------------------------------------------------------------ events

    def accepted(self, topic: CID, cid: CID, hop: int, sender: PeerId | None, now: float) -> Out:
        """An event was accepted (first copy): announce it lazily, stop repairing it, and
        apply the hop-count optimisation."""
        state = self._topics.get(topic)
        if state is None:
            return []
        out: Out = []
        state.hops[cid] = hop
        if len(state.hops) > self.config.cache_size:
            del state.hops[next(iter(state.hops))]
        announcers = state.missing.pop(cid, None)
        if announcers and sender is not None and sender in state.grafted:
            best = min(announcers, key=lambda a: a[1])
            if hop - best[1] >= self.config.optimisation_threshold:
                state.grafted.discard(sender)
                state.lazy.add(sender)
                state.grafted.add(best[0])
                self.metrics["grafts"] += 1
                self.metrics["prunes"] += 1
                out += [ev.Send(best[0], Graft(topic, None)), ev.Send(sender, Prune(topic))]
        for peer in state.lazy:
            if peer != sender:
                state.queue.setdefault(peer, []).append((cid, hop))
        if state.queue and not state.dispatch_armed:
            state.dispatch_armed = True
            out.append(ev.SetTimer(self.config.dispatch_delay, DispatchTimer(topic)))
        return out

    def duplicate(self, topic: CID, sender: PeerId | None) -> Out:
        """A copy of an event already received: prune the link if it is a grafted one
        (tree edges are the tree and stay eager)."""
        state = self._topics.get(topic)
        if state is None or sender is None or sender not in state.grafted:
            return []
        if sender in self._neighbours(topic):
            return []
        state.grafted.discard(sender)
        state.lazy.add(sender)
        self.metrics["prunes"] += 1
        return [ev.Send(sender, Prune(topic))]

    def on_ihave(self, peer: PeerId, msg: IHave, known: Callable[[CID], bool], now: float) -> Out:
        state = self._topics.get(msg.topic)
        if state is None:
            return []
        state.passive[peer] = now
        out: Out = []
        for cid, hop in msg.entries:
            if known(cid):
                continue
            announcers = state.missing.get(cid)
            if announcers is None:
                if len(state.missing) >= self.config.cache_size:
                    continue
                announcers = state.missing[cid] = deque()
                out.append(ev.SetTimer(self.config.graft_timeout_1, GraftTimer(msg.topic, cid)))
            if all(a[0] != peer for a in announcers):
                announcers.append((peer, hop))
        return out

    def on_graft(self, peer: PeerId, msg: Graft, now: float) -> Out:
        state = self._topics.get(msg.topic)
        if state is None:
            return []
        state.lazy.discard(peer)
        if peer not in self._neighbours(msg.topic):
            state.grafted.add(peer)
        if msg.event is None:
            return []
        block = self._lookup(msg.event)
        if block is None:
            return []
        hop = state.hops.get(msg.event, 0)
        return [ev.Send(peer, Event(msg.topic, block, hop + 1))]

    def on_prune(self, peer: PeerId, msg: Prune, now: float) -> Out:
        state = self._topics.get(msg.topic)
        if state is not None and peer in state.grafted:
            state.grafted.discard(peer)
            state.lazy.add(peer)
        return []

    # ------------------------------------------------------------------ timers

    def on_timer(self, timer: PlumtreeTimer, known: Callable[[CID], bool], now: float) -> Out:
        match timer:
            case DispatchTimer():
                return self._dispatch(timer.topic)
            case GraftTimer():
                return self._graft(timer, known)
            case ShuffleTimer():
                return self._shuffle(timer.topic, now)
            case _:
                assert_never(timer)

    def _dispatch(self, topic: CID) -> Out:
        state = self._topics.get(topic)
        if state is None:
            return []
        state.dispatch_armed = False
        out: Out = []
        for peer, entries in sorted(state.queue.items(), key=lambda kv: bytes(kv[0])):
            for start in range(0, len(entries), MAX_IHAVE):
                out.append(ev.Send(peer, IHave(topic, tuple(entries[start : start + MAX_IHAVE]))))
                self.metrics["ihave_sent"] += 1
        state.queue.clear()
        return out

    def _graft(self, timer: GraftTimer, known: Callable[[CID], bool]) -> Out:
        state = self._topics.get(timer.topic)
        if state is None:
            return []
        announcers = state.missing.get(timer.event)
        if announcers is None or known(timer.event):
            state.missing.pop(timer.event, None)
            return []
        if not announcers:
            del state.missing[timer.event]
            return []
        peer, _ = announcers.popleft()
        state.lazy.discard(peer)
        if peer not in self._neighbours(timer.topic):
            state.grafted.add(peer)
        self.metrics["grafts"] += 1
        return [
            ev.Send(peer, Graft(timer.topic, timer.event)),
            ev.SetTimer(self.config.graft_timeout_2, timer),
        ]

    def _shuffle(self, topic: CID, now: float) -> Out:
        state = self._topics.get(topic)
        if state is None:
            return []
        self._refresh_lazy(topic, state, now)
        out: Out = [ev.SetTimer(self.config.shuffle_interval, ShuffleTimer(topic))]
        targets = sorted(self._neighbours(topic) | state.lazy, key=bytes)
        if targets:
            peer = self.rng.choice(targets)
            out.append(ev.Send(peer, Shuffle(topic, self._sample(topic, state, peer), False)))
        return out
