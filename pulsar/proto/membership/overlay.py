"""The node-wide membership layer: HyParView with proximity-aware active links (sans-I/O).

Every topic used to keep its own view of its members and shuffle it with its own timer,
so a node's idle cost grew with the topics it knew. This layer is one overlay per node,
shared by every topic (HyParView, Leitão et al. 2007, as the Episub spec and iroh-gossip
use it):

* a small **active view** (``active_size``, 5): symmetric links, kept up by the transport,
  which reports their failures (``PeerDown`` / ``SendFailed``);
* a larger **passive view** (``passive_size``, 30): peers known to exist, to replace a
  failed active one;
* **joining**: HVJOIN to a contact, who takes the newcomer as a neighbour and spreads it
  with FWDJOIN random walks (``active_walk`` steps; it enters passive views at step
  ``passive_walk`` and an active view where a walk ends);
* **repair**: a node short of neighbours asks passive peers (NEIGHBOR, ``high`` when it has
  none left, which cannot be refused); a refusal or a failure moves on to the next;
* **shuffle**: every ``shuffle_interval`` (30 s, not per topic) a sample of both views
  walks ``shuffle_walk`` steps and the node at the end answers with a sample of its
  passive view, both merging what they got (evicting what they sent first);
* **proximity** (Episub's C_rand / C_near, GoCast's idea): ``near_slots`` of the active
  links are kept for the nearest peers by measured round-trip time, the others stay
  random (random links keep the overlay connected, near ones make trees follow the
  network). At each shuffle a passive peer nearer than the farthest near link by
  ``near_gain`` is asked (low priority) to replace it.

How topics use it: the core tells active neighbours which topics it is in (INTERESTS,
:mod:`pulsar.proto.membership.messages`) when a link comes up and when it joins a tree,
and Plumtree draws a topic's lazy links from the neighbours that share it
(:meth:`pulsar.proto.gossip.plumtree.Plumtree.learn`). Tree edges still come from join routing
over the k-buckets.

Inputs are :meth:`start`, :meth:`on_message`, :meth:`peer_down` and :meth:`on_timer`;
outputs are ``Send`` and ``SetTimer``. After each step the core asks
:meth:`tell_interests` for the INTERESTS that links come up since (and trees joined)
call for. Random choices go through the given RNG over sorted
lists, so a seeded run is the same whatever the hash seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import assert_never

from dag import CID, PeerId
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .messages import (
    MAX_INTERESTS,
    MAX_VIEW_SAMPLE,
    Disconnect,
    ForwardJoin,
    HvJoin,
    Interests,
    MembershipMessage,
    Neighbor,
    NeighborReply,
    ViewShuffle,
    ViewShuffleReply,
)
from .timers import MembershipTick

__all__ = ["Membership", "MembershipConfig"]


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    active_size: int = 5
    passive_size: int = 30
    active_walk: int = 6
    """ARWL: steps a FWDJOIN walks before the node it reaches links with the newcomer."""
    passive_walk: int = 3
    """PRWL: the step at which the node a FWDJOIN reaches keeps the newcomer as passive."""
    join_contacts: int = 2
    """Contacts a node joins through (see :meth:`Membership._join`)."""
    shuffle_interval: float = 30.0
    shuffle_walk: int = 3
    shuffle_active: int = 3
    """Active peers in a shuffle sample (HyParView's k_a)."""
    shuffle_passive: int = 4
    """Passive peers in a shuffle sample (k_p)."""
    repair_interval: float = 1.0
    """The tick while the active view is short or requests are pending."""
    request_timeout: float = 5.0
    """A NEIGHBOR or HVJOIN unanswered this long has failed."""
    near_slots: int = 2
    """Active links kept for the nearest peers by RTT (C_near); the rest are random."""
    near_gain: float = 0.5
    """A passive peer replaces the farthest near link only if its smoothed RTT is below
    this share of that link's (so links do not flap between peers about as near)."""

    def __post_init__(self) -> None:
        if self.active_size < 1 or self.passive_size < 1:
            raise ValueError("the views need at least one slot each")
        if not 0 <= self.near_slots < self.active_size:
            raise ValueError("near_slots must leave at least one random active link")
        if not 0 < self.passive_walk <= self.active_walk:
            raise ValueError("passive_walk must be between 1 and active_walk")


Contacts = Callable[[], Sequence[PeerId]]
"""Peers to join through (the k-buckets), read whenever the node has no neighbour."""
Distance = Callable[[PeerId], float | None]
"""A peer's smoothed round-trip time, None while it is unmeasured."""


@dataclass(slots=True)
class _Request:
    sent: float
    near: bool
    """Asked to fill a near slot (proximity), not to replace a lost link."""


class Membership:
    """One node's active and passive views."""

    def __init__(
        self,
        me: PeerId,
        contacts: Contacts,
        config: MembershipConfig | None = None,
        rng: random.Random | None = None,
        *,
        distance: Distance | None = None,
    ) -> None:
        self.me = me
        self.config = config or MembershipConfig()
        self.rng = rng or random.Random(0)
        self._contacts = contacts
        self._distance = distance or (lambda peer: None)
        self.active: dict[PeerId, bool] = {}
        """Active neighbours, each with whether it holds a near slot."""
        self.passive: dict[PeerId, None] = {}
        self._requests: dict[PeerId, _Request] = {}
        """NEIGHBOR requests in flight (and the HVJOIN, which is answered the same way)."""
        self._refused: dict[PeerId, float] = {}
        """Peers that refused a NEIGHBOR lately, not asked again within a shuffle interval
        (two full nodes would otherwise ask and refuse each other without end)."""
        self._sent_sample: tuple[PeerId, ...] = ()
        """What our last shuffle gave away: evicted first when the answer is merged."""
        self._started = False
        self._shuffle_open = False
        """A shuffle of ours awaits its answer (a peer cannot fill our passive view unasked)."""
        self._tick_seq = 0
        self._tick_due: float | None = None
        self._next_shuffle = 0.0
        self._changes: list[tuple[PeerId, bool]] = []
        self.metrics: dict[str, int] = {
            "membership_joins": 0, "neighbor_requests": 0, "view_shuffles": 0,
            "active_failures": 0, "near_swaps": 0,
        }

    # ------------------------------------------------------------------ reading

    @property
    def started(self) -> bool:
        return self._started

    def neighbours(self) -> list[PeerId]:
        return sorted(self.active, key=bytes)

    def near(self) -> list[PeerId]:
        return sorted((p for p, near in self.active.items() if near), key=bytes)

    def tell_interests(self, topics: Collection[CID], joined: list[CID]) -> Out:
        """INTERESTS for the neighbours: every topic of ``topics`` (the trees we are in)
        to a neighbour that came up since the last call, ``joined`` (trees joined since)
        to the others. A few messages per link, never per period: an idle node sends
        none."""
        changes, self._changes = self._changes, []
        if not changes and not joined:
            return []
        out: Out = []
        fresh = {peer for peer, up in changes if up and peer in self.active}
        if fresh:
            everything = sorted(topics, key=bytes)
            for peer in sorted(fresh, key=bytes):
                out += _chunked(peer, everything)
        if joined:
            for peer in self.neighbours():
                if peer not in fresh:
                    out += _chunked(peer, joined)
        return out

    # ------------------------------------------------------------------ inputs

    def start(self, now: float) -> Out:
        """Enter the overlay through a contact from the k-buckets (again later, on the
        tick, if there is none yet)."""
        if self._started:
            return []
        self._started = True
        self._next_shuffle = now + self.config.shuffle_interval * (0.5 + self.rng.random())
        return self._join(now) + self._arm(now)

    def on_message(self, peer: PeerId, message: MembershipMessage, now: float) -> Out:
        if peer == self.me:
            return []
        match message:
            case HvJoin():
                out = self._on_join(peer, now)
            case ForwardJoin():
                out = self._on_forward_join(peer, message, now)
            case Neighbor():
                out = self._on_neighbor(peer, message, now)
            case NeighborReply():
                out = self._on_reply(peer, message, now)
            case Disconnect():
                out = self._on_disconnect(peer, message, now)
            case ViewShuffle():
                out = self._on_shuffle(peer, message, now)
            case ViewShuffleReply():
                if self._shuffle_open:  # one answer per shuffle; unasked ones are ignored
                    self._shuffle_open = False
                    self._merge(message.peers, self._sent_sample)
                out = []
            case _:
                assert_never(message)
        return out + self._arm(now)

    def peer_down(self, peer: PeerId, now: float) -> Out:
        """The transport lost ``peer``: it leaves both views; a lost link is replaced."""
        self.passive.pop(peer, None)
        self._requests.pop(peer, None)
        if peer in self.active:
            self.metrics["active_failures"] += 1
            self._drop_active(peer)
        return self._repair(now) + self._arm(now) if self._started else []

    def on_timer(self, timer: MembershipTick, now: float) -> Out:
        if timer.seq != self._tick_seq:
            return []  # overtaken by a tick armed since
        self._tick_due = None
        backoff = self.config.shuffle_interval
        self._refused = {p: t for p, t in self._refused.items() if now - t < backoff}
        for peer, request in list(self._requests.items()):
            if now - request.sent >= self.config.request_timeout:
                del self._requests[peer]
                self.passive.pop(peer, None)  # it did not answer: not worth keeping
        out: Out = []
        if not self.active and not self._requests:
            out += self._join(now)
        if not self.active or now >= self._next_shuffle:
            out += self._repair(now)
        if now >= self._next_shuffle:
            self._next_shuffle = now + self.config.shuffle_interval
            out += self._shuffle()
            out += self._seek_near(now)
        return out + self._arm(now)

    # ------------------------------------------------------------------ joining

    def _join(self, now: float) -> Out:
        """HVJOIN to ``join_contacts`` random contacts. HyParView joins through one; but
        when many nodes start at once (a testbed, a data centre after a power cut) each
        contact is itself alone, no walk goes anywhere, and one contact per node makes a
        random functional graph, which falls into islands (the simulator found 10 of 200
        nodes cut off for good). Two random contacts per node make a 2-out random graph,
        which is connected with high probability."""
        candidates = sorted(
            (p for p in self._contacts() if p != self.me and p not in self._requests), key=bytes
        )
        self.rng.shuffle(candidates)
        out: Out = []
        for contact in candidates[: self.config.join_contacts]:
            self._requests[contact] = _Request(now, near=False)
            self.metrics["membership_joins"] += 1
            out.append(ev.Send(contact, HvJoin()))
        return out

    def _on_join(self, peer: PeerId, now: float) -> Out:
        """Take the newcomer (it asked us, so it holds the link once we answer) and send
        it on random walks through our other neighbours."""
        out = self._add_active(peer, near=False)
        out.append(ev.Send(peer, NeighborReply(True)))
        walk = ForwardJoin(peer, self.config.active_walk)
        others = [p for p in self.neighbours() if p != peer]
        self.rng.shuffle(others)
        return out + [ev.Send(p, walk) for p in others[: self._walks_per_join()]]

    def _walks_per_join(self) -> int:
        """HyParView walks from every neighbour of the contact; with ``join_contacts``
        contacts that offers the newcomer far more links than its view holds, and each
        surplus link is an eviction (a DISCONNECT, a repair, a new connection) somewhere.
        So each contact starts only its share of the walks the newcomer's free slots
        need (2 each by default: 2 contacts + 4 walks for 5 slots)."""
        free = self.config.active_size - self.config.join_contacts
        return max(1, -(-free // self.config.join_contacts))

    def _on_forward_join(self, sender: PeerId, msg: ForwardJoin, now: float) -> Out:
        newcomer = msg.peer
        if newcomer == self.me or newcomer in self.active:
            return []
        ttl = min(msg.ttl, self.config.active_walk)
        others = sorted((p for p in self.active if p not in (sender, newcomer)), key=bytes)
        if ttl == 0 or not others:
            return self._ask(newcomer, high=True, near=False, now=now)
        if ttl == self.config.passive_walk:
            self._add_passive(newcomer)
        return [ev.Send(self.rng.choice(others), ForwardJoin(newcomer, ttl - 1))]

    # ------------------------------------------------------------------ links

    def _ask(self, peer: PeerId, *, high: bool, near: bool, now: float) -> Out:
        if peer in self._requests or peer in self.active or peer == self.me:
            return []
        self._requests[peer] = _Request(now, near)
        self.metrics["neighbor_requests"] += 1
        return [ev.Send(peer, Neighbor(high))]

    def _on_neighbor(self, peer: PeerId, msg: Neighbor, now: float) -> Out:
        if peer in self.active:
            return [ev.Send(peer, NeighborReply(True))]
        if msg.high or len(self.active) < self.config.active_size:
            out = self._add_active(peer, near=False)
            self._requests.pop(peer, None)
            return [*out, ev.Send(peer, NeighborReply(True))]
        self._add_passive(peer)
        return [ev.Send(peer, NeighborReply(False))]

    def _on_reply(self, peer: PeerId, msg: NeighborReply, now: float) -> Out:
        request = self._requests.pop(peer, None)
        if request is None:
            if msg.accept and peer not in self.active:
                # Not (or no longer) asked: the other side holds a link we do not want.
                return [ev.Send(peer, Disconnect(True))]
            return []
        if not msg.accept:
            self._add_passive(peer)
            self._refused[peer] = now
            return [] if self.active else self._repair(now)
        out = self._trim_near(keep=peer) if request.near else []
        return out + self._add_active(peer, near=request.near)

    def _on_disconnect(self, peer: PeerId, msg: Disconnect, now: float) -> Out:
        self._requests.pop(peer, None)
        if peer in self.active:
            self._drop_active(peer)
        if msg.alive:
            self._add_passive(peer)
        else:
            self.passive.pop(peer, None)
        return self._repair(now)

    def _add_active(self, peer: PeerId, *, near: bool) -> Out:
        """Make ``peer`` a neighbour, dropping one (a random link, near ones kept while
        random ones remain) if the view is full."""
        if peer == self.me:
            return []
        if peer in self.active:
            self.active[peer] = self.active[peer] or near
            return []
        out: Out = []
        while len(self.active) >= self.config.active_size:
            randoms = [p for p, n in self.active.items() if not n]
            victim = self.rng.choice(sorted(randoms or self.active, key=bytes))
            self._drop_active(victim)
            self._add_passive(victim)
            out.append(ev.Send(victim, Disconnect(True)))
        self.passive.pop(peer, None)
        self.active[peer] = near
        self._changes.append((peer, True))
        return out

    def _drop_active(self, peer: PeerId) -> None:
        del self.active[peer]
        self._changes.append((peer, False))

    def _add_passive(self, peer: PeerId, evict_first: Iterable[PeerId] = ()) -> None:
        if peer == self.me or peer in self.active or peer in self.passive:
            return
        if len(self.passive) >= self.config.passive_size:
            victims = [p for p in evict_first if p in self.passive]
            victim = victims[0] if victims else self.rng.choice(sorted(self.passive, key=bytes))
            del self.passive[victim]
        self.passive[peer] = None

    def _repair(self, now: float) -> Out:
        """Replace missing links from the passive view. A node with no neighbour asks as
        many peers as it has slots, with high priority; one that still has some asks one
        peer at a time (the next on the next tick), so a node whose passive peers are all
        full does not keep the network busy with refusals."""
        out: Out = []
        wanted = self.config.active_size - len(self.active)
        if self.active:
            wanted = min(wanted, 1)
        pending = sum(1 for r in self._requests.values() if not r.near)
        candidates = sorted(
            (p for p in self.passive if p not in self._requests and p not in self._refused),
            key=bytes,
        )
        self.rng.shuffle(candidates)
        while pending < wanted and candidates:
            peer = candidates.pop()
            out += self._ask(peer, high=not self.active, near=False, now=now)
            pending += 1
        return out

    # ------------------------------------------------------------------ proximity

    def _seek_near(self, now: float) -> Out:
        """Ask the nearest measured passive peer for a near slot if one is free, or if it
        is nearer than the farthest near link by ``near_gain``."""
        if self.config.near_slots == 0 or len(self.active) < self.config.active_size:
            return []
        if any(r.near for r in self._requests.values()):
            return []
        measured = [(d, bytes(p), p) for p in self.passive
                    if p not in self._requests and p not in self._refused
                    and (d := self._distance(p)) is not None]
        if not measured:
            return []
        distance, _, best = min(measured)
        near = [(self._distance(p), p) for p, n in self.active.items() if n]
        if len(near) >= self.config.near_slots:
            farthest = max((d for d, _ in near if d is not None), default=None)
            if farthest is None or distance >= self.config.near_gain * farthest:
                return []
        return self._ask(best, high=False, near=True, now=now)

    def _trim_near(self, keep: PeerId) -> Out:
        """A near link is about to be added: if the near slots are taken, the farthest
        near link goes back to passive to make room."""
        near = [p for p, n in self.active.items() if n and p != keep]
        if len(near) < self.config.near_slots:
            return []
        def far(p: PeerId) -> tuple[float, bytes]:
            d = self._distance(p)
            return (float("inf") if d is None else d, bytes(p))
        victim = max(near, key=far)
        self._drop_active(victim)
        self._add_passive(victim)
        self.metrics["near_swaps"] += 1
        return [ev.Send(victim, Disconnect(True))]

    # ------------------------------------------------------------------ shuffle

    def _shuffle(self) -> Out:
        if not self.active:
            return []
        target = self.rng.choice(self.neighbours())
        actives = sorted((p for p in self.active if p != target), key=bytes)
        passives = sorted(self.passive, key=bytes)
        self.rng.shuffle(actives)
        self.rng.shuffle(passives)
        sample = (self.me, *actives[: self.config.shuffle_active],
                  *passives[: self.config.shuffle_passive])
        self._sent_sample = sample[1:]
        self._shuffle_open = True
        self.metrics["view_shuffles"] += 1
        return [ev.Send(target, ViewShuffle(self.me, self.config.shuffle_walk, sample))]

    def _on_shuffle(self, sender: PeerId, msg: ViewShuffle, now: float) -> Out:
        ttl = min(msg.ttl, self.config.shuffle_walk)
        others = sorted((p for p in self.active if p not in (sender, msg.origin)), key=bytes)
        if ttl > 0 and others:
            return [ev.Send(self.rng.choice(others), ViewShuffle(msg.origin, ttl - 1, msg.peers))]
        if msg.origin == self.me:
            return []
        passives = sorted(self.passive, key=bytes)
        self.rng.shuffle(passives)
        answer = tuple(passives[: min(len(msg.peers), MAX_VIEW_SAMPLE)])
        self._merge((msg.origin, *msg.peers), answer)
        return [ev.Send(msg.origin, ViewShuffleReply(answer))]

    def _merge(self, peers: Iterable[PeerId], evict_first: Sequence[PeerId]) -> None:
        for peer in peers:
            self._add_passive(peer, evict_first)

    # ------------------------------------------------------------------ timer

    def _arm(self, now: float) -> Out:
        """One tick per node: every ``repair_interval`` while asks are in flight or the
        node has no neighbour; otherwise at the next shuffle, which also asks for a
        missing link (a network too small to fill the view is not polled)."""
        if not self._started:
            return []
        short = bool(self._requests) or not self.active
        due = now + self.config.repair_interval if short else self._next_shuffle
        if self._tick_due is not None and self._tick_due <= due + 1e-9:
            return []
        self._tick_seq += 1
        self._tick_due = due
        return [ev.SetTimer(max(due - now, 0.0), MembershipTick(self._tick_seq))]


def _chunked(peer: PeerId, topics: list[CID]) -> Out:
    return [
        ev.Send(peer, Interests(tuple(topics[i : i + MAX_INTERESTS])))
        for i in range(0, len(topics), MAX_INTERESTS)
    ]
