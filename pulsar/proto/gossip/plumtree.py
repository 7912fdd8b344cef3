"""Plumtree lazy repair over Pulsarcast's dissemination trees (sans-I/O).

The join-routed tree gives every topic member its *eager* links (parent and children),
which are never pruned: they are the tree. This layer adds, per topic:

* a **passive view** of other members, learned HyParView-style: a topic that lacks lazy
  links sends a SHUFFLE with a sample of the members it knows to a random neighbour, which
  merges it and answers with its own sample. Entries vanish when their peer goes down or
  says (PRUNE for a topic it is not in) that it left. A new member's first lazy links come
  from the sample in its parent's JOINED. Lazy links only serve repair, so only a topic
  that carried an event since its last shuffle and lacks lazy links shuffles, with a
  backoff that doubles while shuffles bring nobody new (a small topic has no more members
  to find). An idle topic, or one with its links, costs nothing: no timer, no message;
* a few **lazy links** drawn from the passive view: after accepting an event, a node
  queues ``(topic, cid, hop)`` for each lazy peer and, when the node's one short dispatch
  timer fires, sends each neighbour the IHAVEs of every topic at once (the core packs
  them into one BATCH);
* **repair**: an IHAVE for an event not received starts a graft timer; when it fires, the
  node sends GRAFT to the first announcer (who answers with the event and treats the link
  as eager), then, after a shorter timer, to the next announcer, and so on;
* **PRUNE**: an event arriving twice over a grafted (non-tree) link makes the receiver
  prune that link back to lazy;
* the **hop-count optimisation**: if an IHAVE announces an event (before or after its
  eager copy) at a hop count at least ``optimisation_threshold`` lower than the copy that
  came over a grafted link, the announcer is grafted and that sender pruned. Tree edges
  are not swapped: join routing keeps the tree acyclic, which a swap could undo;
* **waits that follow the network**: both graft timers are at least the RTO
  (:mod:`pulsar.proto.tree.rtt`) of the links the copy should come over.

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
from pulsar.proto import events as ev
from pulsar.proto.events import Out
from pulsar.proto.tree.messages import Event
from pulsar.proto.tree.rtt import RttTable

from .messages import MAX_IHAVE, MAX_SAMPLE, Graft, IHave, Prune, Shuffle
from .timers import DispatchTimer, GraftTimer, PlumtreeTimer, ShuffleTimer

__all__ = ["DispatchTimer", "GraftTimer", "Plumtree", "PlumtreeConfig", "ShuffleTimer"]


@dataclass(frozen=True, slots=True)
class PlumtreeConfig:
    lazy_peers: int = 3
    """Lazy links per topic: enough that a lost eager copy is announced by someone else."""
    passive_size: int = 32
    shuffle_interval: float = 2.0
    """The first wait of a topic that carries events and lacks lazy links (its first
    shuffle comes within this of its first event); each shuffle doubles the wait, and
    learning a new member resets it. Idle topics never shuffle."""
    shuffle_backoff_max: float = 600.0
    """The longest a topic lacking lazy links waits between shuffles (a small topic may
    have no more members to find)."""
    shuffle_tick: float = 1.0
    """The shortest time between two runs of the node's shuffle tick."""
    dispatch_delay: float = 0.05
    """IHAVE batching delay (iroh uses 5 ms over QUIC; we favour fewer, larger frames)."""
    graft_timeout_1: float = 0.5
    """How long to wait for the eager copy after the first IHAVE before grafting, at
    least: once round-trip times are measured the wait is the longest retransmission wait
    (RTO) of the topic's eager links, so a copy one hop behind on a slow path is not
    grafted for."""
    graft_timeout_2: float = 0.25
    """How long to wait for a grafted peer before grafting the next announcer, at least:
    with the grafted peer's round-trip time measured, its RTO if longer."""
    graft_timeout_max: float = 10.0
    """The longest either graft wait grows to, however slow the path."""
    optimisation_threshold: int = 7
    cache_size: int = 10_000
    """Hop counts of recent events remembered (for GRAFT answers and the optimisation)."""


@dataclass(slots=True)
class _Topic:
    passive: dict[PeerId, float] = field(default_factory=dict)
    lazy: set[PeerId] = field(default_factory=set)
    grafted: set[PeerId] = field(default_factory=set)
    shuffle_due: float = 0.0
    shuffle_backoff: float = 0.0
    carried: bool = False
    """An event was accepted since the last shuffle: lazy links only serve repair, so a
    topic that carries nothing has no use for them and never shuffles."""
    missing: dict[CID, deque[tuple[PeerId, int]]] = field(default_factory=dict)
    hops: dict[CID, int] = field(default_factory=dict)
    via: dict[CID, PeerId] = field(default_factory=dict)
    """Recent events that came over a grafted link, by who sent them: the links the
    hop-count optimisation may replace."""


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
        *,
        rtt: RttTable | None = None,
    ) -> None:
        self.me = me
        self.config = config or PlumtreeConfig()
        self.rng = rng or random.Random(0)
        self.rtt = rtt or RttTable()
        self._neighbours = neighbours
        self._lookup = lookup
        self._topics: dict[CID, _Topic] = {}
        self._queue: dict[PeerId, dict[CID, list[tuple[CID, int]]]] = {}
        self._dispatch_armed = False
        self._shuffle_armed = False
        self.metrics: dict[str, int] = {
            "ihave_sent": 0, "ihave_suppressed": 0, "grafts": 0, "prunes": 0, "repaired": 0,
            "optimised": 0,
        }

    # ------------------------------------------------------------------ membership

    def start(self, topic: CID, now: float) -> Out:
        """A tree the node joined. Its first lazy links come from its parent's JOINED; if
        it still lacks some once it carries events, it shuffles within one interval
        (jittered, so topics started together do not shuffle together)."""
        if topic in self._topics:
            return []
        interval = self.config.shuffle_interval
        due = now + interval * self.rng.random()
        self._topics[topic] = _Topic(shuffle_due=due, shuffle_backoff=interval)
        return []

    def stop(self, topic: CID) -> None:
        self._topics.pop(topic, None)
        for queued in self._queue.values():
            queued.pop(topic, None)

    def _hungry(self, state: _Topic) -> bool:
        return state.carried and len(state.lazy) < self.config.lazy_peers

    def _arm_shuffle(self, delay: float | None = None) -> Out:
        if self._shuffle_armed:
            return []
        self._shuffle_armed = True
        return [ev.SetTimer(max(self.config.shuffle_tick, delay or 0.0), ShuffleTimer())]

    def sample(self, topic: CID, exclude: PeerId) -> tuple[PeerId, ...]:
        """Members of ``topic`` we know, for a JOINED: the new child's first lazy links."""
        state = self._topics.get(topic)
        return () if state is None else self._sample(topic, state, exclude)

    def eager_extra(self, topic: CID) -> set[PeerId]:
        """Links made eager by GRAFT, on top of the tree's own edges."""
        state = self._topics.get(topic)
        return set() if state is None else set(state.grafted)

    def lazy(self, topic: CID) -> set[PeerId]:
        state = self._topics.get(topic)
        return set() if state is None else set(state.lazy)

    def peer_down(self, peer: PeerId) -> Out:
        """A neighbour failed: it leaves every view; topics that now lack lazy links
        shuffle again."""
        self._queue.pop(peer, None)
        lost_link = False
        for state in self._topics.values():
            lost_link = lost_link or peer in state.lazy
            self._forget(state, peer)
            for announcers in state.missing.values():
                for entry in [e for e in announcers if e[0] == peer]:
                    announcers.remove(entry)
        return self._arm_shuffle() if lost_link else []

    def _forget(self, state: _Topic, peer: PeerId) -> None:
        """``peer`` is gone from this topic (down, or it left): a lost lazy link makes the
        topic shuffle again soon, whatever its backoff had grown to."""
        if peer in state.lazy:
            state.shuffle_backoff = self.config.shuffle_interval
            state.shuffle_due = 0.0
        state.passive.pop(peer, None)
        state.lazy.discard(peer)
        state.grafted.discard(peer)

    def learn(self, topic: CID, peers: Iterable[PeerId], now: float) -> None:
        """Add members to the passive view (also used by the core for JOIN senders)."""
        state = self._topics.get(topic)
        if state is None:
            return
        for peer in peers:
            if peer == self.me:
                continue
            if peer not in state.passive:
                state.shuffle_backoff = self.config.shuffle_interval  # more may be near
            state.passive[peer] = now
        if len(state.passive) > self.config.passive_size:
            oldest = sorted(state.passive, key=state.passive.__getitem__)
            for peer in oldest[: len(state.passive) - self.config.passive_size]:
                del state.passive[peer]
        self._refresh_lazy(topic, state, now)

    def _refresh_lazy(self, topic: CID, state: _Topic, now: float) -> None:
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
            return [ev.Send(peer, Prune(msg.topic))]  # not (or no longer) a member
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
        if not state.carried:
            state.carried = True
            if self._hungry(state):
                out += self._arm_shuffle(state.shuffle_due - now)
        state.hops[cid] = hop
        if len(state.hops) > self.config.cache_size:
            del state.hops[next(iter(state.hops))]
        if sender is not None and sender in state.grafted:
            state.via[cid] = sender
            if len(state.via) > self.config.cache_size:
                del state.via[next(iter(state.via))]
        announcers = state.missing.pop(cid, None)
        if announcers and sender is not None and sender in state.grafted:
            best = min(announcers, key=lambda a: a[1])
            if hop - best[1] >= self.config.optimisation_threshold:
                state.via.pop(cid, None)
                out += self._swap(topic, state, sender, best[0])
        queued = False
        told = {a[0] for a in announcers} if announcers else ()
        for peer in state.lazy:
            if peer != sender and peer not in told:  # those that announced it have it
                self._queue.setdefault(peer, {}).setdefault(topic, []).append((cid, hop))
                queued = True
        if queued and not self._dispatch_armed:
            self._dispatch_armed = True
            out.append(ev.SetTimer(self.config.dispatch_delay, DispatchTimer()))
        return out

    def duplicate(self, topic: CID, sender: PeerId | None, cid: CID | None = None) -> Out:
        """A copy of an event already received: prune the link if it is a grafted one
        (tree edges are the tree and stay eager).

        A copy over a tree edge of an event a grafted link brought first prunes that
        grafted link instead: the tree carries the topic again, and a grafted link the
        tree duplicates would otherwise stay eager for good — nothing else ever prunes it
        (the tree's copy comes second, over an edge that is never pruned), and the node
        forwards each of its copies up the tree, a duplicate at the parent too."""
        state = self._topics.get(topic)
        if state is None or sender is None:
            return []
        tree = self._neighbours(topic)
        if sender in tree:
            first = state.via.pop(cid, None) if cid is not None else None
            if first is None or first not in state.grafted or first in tree:
                return []
            sender = first
        elif sender not in state.grafted:
            return []
        state.grafted.discard(sender)
        state.lazy.add(sender)
        self.metrics["prunes"] += 1
        return [ev.Send(sender, Prune(topic))]

    def on_ihave(self, peer: PeerId, msg: IHave, known: Callable[[CID], bool], now: float) -> Out:
        state = self._topics.get(msg.topic)
        if state is None:
            return [ev.Send(peer, Prune(msg.topic))]  # not (or no longer) a member
        state.passive[peer] = now
        out: Out = []
        queued = self._queue.get(peer, {}).get(msg.topic)
        for cid, hop in msg.entries:
            if known(cid):
                if queued:
                    self._unqueue(queued, cid)
                out += self._optimise(msg.topic, state, peer, cid, hop)
                continue
            announcers = state.missing.get(cid)
            if announcers is None:
                if len(state.missing) >= self.config.cache_size:
                    continue
                announcers = state.missing[cid] = deque()
                out.append(ev.SetTimer(self._first_wait(msg.topic, state),
                                       GraftTimer(msg.topic, cid)))
            if all(a[0] != peer for a in announcers):
                announcers.append((peer, hop))
        return out

    def _unqueue(self, queued: list[tuple[CID, int]], cid: CID) -> None:
        """The peer announced ``cid`` to us before our IHAVE of it left: it has it, so
        ours is dropped (two members that got an event within ``dispatch_delay`` of each
        other used to announce it to each other both ways)."""
        for i, (queued_cid, _) in enumerate(queued):
            if queued_cid == cid:
                del queued[i]
                self.metrics["ihave_suppressed"] += 1
                return

    def _optimise(self, topic: CID, state: _Topic, peer: PeerId, cid: CID, hop: int) -> Out:
        """Plumtree's tree optimisation for an event we have: if it came over a grafted
        link at least ``optimisation_threshold`` hops later than ``peer`` had it, make
        ``peer`` the eager link and the grafted sender lazy again. Tree edges are the tree
        (join routing keeps it acyclic) and are never swapped this way."""
        sender = state.via.get(cid)
        received = state.hops.get(cid)
        if sender is None or received is None or sender == peer or sender not in state.grafted:
            return []
        if received - hop < self.config.optimisation_threshold:
            return []
        del state.via[cid]
        return self._swap(topic, state, sender, peer)

    def _swap(self, topic: CID, state: _Topic, old: PeerId, new: PeerId) -> Out:
        """Replace the grafted link to ``old`` by one to ``new`` (GRAFT without an event
        asks ``new`` to push from now on; PRUNE makes ``old`` lazy again)."""
        state.grafted.discard(old)
        state.lazy.add(old)
        state.lazy.discard(new)
        if new not in self._neighbours(topic):
            state.grafted.add(new)
        self.metrics["grafts"] += 1
        self.metrics["prunes"] += 1
        self.metrics["optimised"] += 1
        return [ev.Send(new, Graft(topic, None)), ev.Send(old, Prune(topic))]

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

    def demote(self, topic: CID, peer: PeerId) -> None:
        """``peer`` asked for no more eager pushes of ``topic`` (a LEAVE): a grafted link
        to it becomes lazy. A PRUNE lost on the way left links pushing every event as a
        duplicate for good (the order scenario's 5 % loss: 1,359 duplicate copies, most
        of them over a handful of such links); the receiver's stale-edge LEAVE now ends
        them too."""
        state = self._topics.get(topic)
        if state is not None and peer in state.grafted:
            state.grafted.discard(peer)
            state.lazy.add(peer)

    def on_prune(self, peer: PeerId, msg: Prune, now: float) -> Out:
        state = self._topics.get(msg.topic)
        if state is None:
            return []
        if peer in state.grafted:
            state.grafted.discard(peer)
            state.lazy.add(peer)
            return []
        # A PRUNE over a link we never grafted: the peer is not in the topic (any more).
        lost_link = peer in state.lazy
        self._forget(state, peer)
        return self._arm_shuffle() if lost_link else []

    # ------------------------------------------------------------------ timers

    def on_timer(self, timer: PlumtreeTimer, known: Callable[[CID], bool], now: float) -> Out:
        match timer:
            case DispatchTimer():
                return self._dispatch()
            case GraftTimer():
                return self._graft(timer, known)
            case ShuffleTimer():
                return self._shuffle(now)
            case _:
                assert_never(timer)

    def _dispatch(self) -> Out:
        """Every queued IHAVE, neighbour by neighbour: the core packs what goes to one
        neighbour into one BATCH."""
        self._dispatch_armed = False
        out: Out = []
        queue, self._queue = self._queue, {}
        for peer, topics in sorted(queue.items(), key=lambda kv: bytes(kv[0])):
            for topic, entries in topics.items():
                if topic not in self._topics:
                    continue
                for start in range(0, len(entries), MAX_IHAVE):
                    chunk = tuple(entries[start : start + MAX_IHAVE])
                    out.append(ev.Send(peer, IHave(topic, chunk)))
                    self.metrics["ihave_sent"] += 1
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
            ev.SetTimer(self._wait(self.config.graft_timeout_2, {peer}), timer),
        ]

    def _first_wait(self, topic: CID, state: _Topic) -> float:
        """How long an announced event may take to come eagerly: the eager links' longest
        RTO (the copy comes over one of them, at most about a round trip behind the
        announcement on a sound tree)."""
        return self._wait(self.config.graft_timeout_1, self._neighbours(topic) | state.grafted)

    def _wait(self, floor: float, peers: set[PeerId]) -> float:
        rto = self.rtt.worst_rto(peers)
        if rto is None:
            return floor
        return min(max(floor, rto), max(floor, self.config.graft_timeout_max))

    def _shuffle(self, now: float) -> Out:
        """The node's shuffle tick: each topic that lacks lazy links and is due shuffles
        with one neighbour and backs off (doubling, reset when it learns someone new);
        the tick stays armed only while some topic lacks lazy links."""
        self._shuffle_armed = False
        out: Out = []
        next_due: float | None = None
        for topic, state in self._topics.items():
            if not self._hungry(state):
                continue
            if state.shuffle_due > now:
                next_due = min(next_due or state.shuffle_due, state.shuffle_due)
                continue
            self._refresh_lazy(topic, state, now)
            if not self._hungry(state):
                continue
            state.shuffle_due = now + state.shuffle_backoff
            state.carried = False  # the next shuffle waits for the next event
            state.shuffle_backoff = min(state.shuffle_backoff * 2,
                                        self.config.shuffle_backoff_max)
            targets = sorted(self._neighbours(topic) | state.lazy, key=bytes)
            if targets:
                peer = self.rng.choice(targets)
                out.append(ev.Send(peer, Shuffle(topic, self._sample(topic, state, peer), False)))
        if next_due is not None:
            out += self._arm_shuffle(next_due - now)
        return out
