"""Round-trip times per neighbour, measured with PING/PONG and smoothed as TCP does.

Every wait of the protocol that is really "one more round trip, or a hop behind" (the
Plumtree graft timers, the JOIN timeout) must follow the network it runs on: a constant
that suits loopback grafts every event twice on a 500 ms path, and one that suits a slow
path makes repair slow everywhere. So the core keeps RFC 6298's estimator per neighbour:
``SRTT`` and ``RTTVAR`` from samples, and ``RTO = SRTT + max(G, 4 * RTTVAR)`` as the wait.

Samples come from the protocol's own PING/PONG (a nonce per probe, so a late PONG can
never be paired with the wrong probe, which is what Karn's rule is about). Probing follows
traffic, not time: :meth:`RttTable.wanted` names a peer only when the node is about to
send to it and holds no sample younger than ``refresh`` and no probe in flight. An idle
node sends no probe; a busy one at most one per neighbour per ``refresh``.

Nothing here does I/O or reads a clock; ``now`` is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from dag import PeerId

__all__ = ["RttConfig", "RttEstimate", "RttTable"]


@dataclass(frozen=True, slots=True)
class RttConfig:
    refresh: float = 60.0
    """A sample older than this is refreshed by the next probe (sent only with traffic)."""
    probe_timeout: float = 30.0
    """A probe not answered in this long is given up (lost): another may be sent."""
    granularity: float = 0.01
    """RFC 6298's G: the smallest variance term, so RTO stays above SRTT on a steady path."""
    min_rto: float = 0.05
    max_rto: float = 30.0
    peers: int = 4096
    """Estimates kept (least recently sampled forgotten first)."""
    fallback_of: int = 16
    """An unmeasured neighbour is assumed as far as the farthest of this many most
    recently sampled ones (not of every estimate ever kept: see ``worst_rto``)."""
    probes: int = 1024
    """Probes in flight at most (a bound on what unanswered PINGs can cost us)."""


@dataclass(slots=True)
class RttEstimate:
    """RFC 6298 section 2 for one neighbour."""

    srtt: float
    rttvar: float
    sampled_at: float
    samples: int = 1

    @classmethod
    def first(cls, rtt: float, now: float) -> RttEstimate:
        return cls(srtt=rtt, rttvar=rtt / 2, sampled_at=now)

    def update(self, rtt: float, now: float) -> None:
        # RTTVAR first, with the old SRTT (the RFC's order).
        self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
        self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.sampled_at = now
        self.samples += 1

    def rto(self, config: RttConfig) -> float:
        rto = self.srtt + max(config.granularity, 4 * self.rttvar)
        return min(max(rto, config.min_rto), config.max_rto)


class RttTable:
    """Estimates for every neighbour, and the probes in flight."""

    def __init__(self, config: RttConfig | None = None) -> None:
        self.config = config or RttConfig()
        self._estimates: OrderedDict[PeerId, RttEstimate] = OrderedDict()
        self._probes: OrderedDict[int, tuple[PeerId, float]] = OrderedDict()
        self._probing: dict[PeerId, int] = {}
        self._next_nonce = 1
        self._worst: float | None = None
        """The longest RTO of the ``fallback_of`` most recently sampled estimates, kept
        as samples come (they are rare: one per neighbour per ``refresh``), not
        recomputed on every wait that needs it."""

    # ------------------------------------------------------------------ reading

    def get(self, peer: PeerId) -> RttEstimate | None:
        return self._estimates.get(peer)

    def rto(self, peer: PeerId) -> float | None:
        """The retransmission-style wait for ``peer``: None while it has no sample."""
        estimate = self._estimates.get(peer)
        return None if estimate is None else estimate.rto(self.config)

    def worst_rto(self, peers: set[PeerId] | frozenset[PeerId]) -> float | None:
        """The longest wait among ``peers`` with a sample; if none of them has one, the
        longest of the neighbours sampled most recently (the best guess at how far away
        an unmeasured neighbour is); None when nothing was ever measured.

        Recent ones only: an estimate is updated only while its peer is talked to, so
        the longest of *every* estimate kept was set for good by one slow sample (a
        first probe answered late under load, a peer since gone), and stretched every
        graft, JOIN and WANT wait for unmeasured neighbours from then on."""
        known = [e.rto(self.config) for p in peers if (e := self._estimates.get(p)) is not None]
        if known:
            return max(known)
        return self._worst

    def snapshot(self) -> dict[PeerId, tuple[float, float]]:
        """``peer -> (srtt, rto)`` in seconds, for status pages and metrics."""
        return {p: (e.srtt, e.rto(self.config)) for p, e in self._estimates.items()}

    # ------------------------------------------------------------------ probing

    def probes(self, peers: Iterable[PeerId], now: float) -> list[tuple[PeerId, int]]:
        """``(peer, nonce)`` for each of ``peers`` (those a step is about to send to) that
        needs a probe now, each peer once, in the order given."""
        asked: set[PeerId] = set()
        wanted: list[tuple[PeerId, int]] = []
        for peer in peers:
            if peer in asked:
                continue
            asked.add(peer)
            nonce = self.wanted(peer, now)
            if nonce is not None:
                wanted.append((peer, nonce))
        return wanted

    def wanted(self, peer: PeerId, now: float) -> int | None:
        """The nonce of a new probe to send to ``peer`` if it needs one now, else None."""
        estimate = self._estimates.get(peer)
        if estimate is not None and now - estimate.sampled_at < self.config.refresh:
            return None
        nonce = self._probing.get(peer)
        if nonce is not None:
            _, sent = self._probes[nonce]
            if now - sent < self.config.probe_timeout:
                return None
            del self._probes[nonce]
        while len(self._probes) >= self.config.probes:
            old, (old_peer, _) = self._probes.popitem(last=False)
            if self._probing.get(old_peer) == old:
                del self._probing[old_peer]
        nonce = self._next_nonce
        self._next_nonce = nonce + 1 if nonce < (1 << 62) else 1
        self._probes[nonce] = (peer, now)
        self._probing[peer] = nonce
        return nonce

    def answered(self, peer: PeerId, nonce: int, now: float) -> float | None:
        """A PONG: the sample it gives (None if it answers no probe of ours to that peer:
        unknown, expired, or from someone else)."""
        probe = self._probes.get(nonce)
        if probe is None or probe[0] != peer:
            return None
        del self._probes[nonce]
        if self._probing.get(peer) == nonce:
            del self._probing[peer]
        rtt = max(now - probe[1], 0.0)
        self.sample(peer, rtt, now)
        return rtt

    def sample(self, peer: PeerId, rtt: float, now: float) -> None:
        estimate = self._estimates.get(peer)
        if estimate is None:
            self._estimates[peer] = RttEstimate.first(rtt, now)
            if len(self._estimates) > self.config.peers:
                self._estimates.popitem(last=False)
        else:
            estimate.update(rtt, now)
            self._estimates.move_to_end(peer)
        recent = islice(reversed(self._estimates.values()), self.config.fallback_of)
        self._worst = max(e.rto(self.config) for e in recent)

    def forget(self, peer: PeerId) -> None:
        """A neighbour went down: its probe is void (its estimate is kept: the path to
        it is the same when it comes back, and a stale one is refreshed by traffic)."""
        nonce = self._probing.pop(peer, None)
        if nonce is not None:
            self._probes.pop(nonce, None)
