"""Peer faults: a misbehaviour score per peer, bans, and logs that a flood cannot fill.

Every malformed frame and every input the core refuses from a peer is a fault. Writing a
log line for each would let one peer write as many lines as it sends frames, so faults are
summarised: at most one line per peer per ``log_interval``, saying how many of each kind
came since the last line. Each fault also adds to the peer's score, which decays
exponentially (half-life ``half_life``), as GossipSub v1.1's invalid-message penalty does;
past ``ban_score`` the peer is disconnected and its frames ignored for ``ban_for``.

Pure bookkeeping: the node asks :meth:`PeerFaults.fault` and carries out the verdict
(write the line, disconnect the peer).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from dag import PeerId

__all__ = ["FaultConfig", "PeerFaults", "Verdict"]


@dataclass(frozen=True, slots=True)
class FaultConfig:
    malformed_weight: float = 1.0
    """Score of a frame that is not a well-formed message (never an honest peer's)."""
    rejected_weight: float = 0.2
    """Score of a well-formed input the core refused (honest peers cause a few, e.g. an
    event for a tree this node just left)."""
    ban_score: float = 50.0
    half_life: float = 10.0
    ban_for: float = 300.0
    log_interval: float = 10.0
    max_peers: int = 10_000
    """Peers tracked at once (the least recently faulty is forgotten first)."""

    def __post_init__(self) -> None:
        if min(self.ban_score, self.half_life, self.ban_for, self.log_interval) <= 0:
            raise ValueError("ban_score, half_life, ban_for and log_interval must be > 0")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do about a fault: ``log`` a summary line (None: stay quiet), ``ban``."""

    log: str | None
    ban: bool


@dataclass(slots=True)
class _Record:
    score: float = 0.0
    at: float = 0.0
    """When ``score`` was last decayed to."""
    counts: dict[str, int] = field(default_factory=dict)
    logged_at: float = -math.inf
    last: str = ""
    banned_until: float = -math.inf


class PeerFaults:
    def __init__(self, config: FaultConfig | None = None) -> None:
        self.config = config or FaultConfig()
        self._peers: OrderedDict[PeerId, _Record] = OrderedDict()
        self.bans = 0

    def banned(self, peer: PeerId, now: float) -> bool:
        record = self._peers.get(peer)
        return record is not None and record.banned_until > now

    def score(self, peer: PeerId, now: float) -> float:
        record = self._peers.get(peer)
        return 0.0 if record is None else self._decayed(record, now)

    def fault(self, peer: PeerId, kind: str, detail: str, now: float) -> Verdict:
        """Record a fault of ``kind`` (``malformed`` or ``rejected``) from ``peer``."""
        record = self._peers.get(peer)
        if record is None:
            record = self._peers[peer] = _Record(at=now)
            if len(self._peers) > self.config.max_peers:
                self._peers.popitem(last=False)
        self._peers.move_to_end(peer)
        weight = (self.config.malformed_weight if kind == "malformed"
                  else self.config.rejected_weight)
        record.score = self._decayed(record, now) + weight
        record.at = now
        record.counts[kind] = record.counts.get(kind, 0) + 1
        record.last = detail
        ban = record.score >= self.config.ban_score and record.banned_until <= now
        if ban:
            record.banned_until = now + self.config.ban_for
            self.bans += 1
        if not ban and now - record.logged_at < self.config.log_interval:
            return Verdict(None, False)
        counts = ", ".join(f"{n} {k}" for k, n in sorted(record.counts.items()))
        line = f"peer {peer}: {counts} since the last report (last: {detail[:200]})"
        if ban:
            line += f"; score {record.score:.1f}: disconnected and ignored for " \
                    f"{self.config.ban_for:.0f} s"
        record.counts.clear()
        record.logged_at = now
        return Verdict(line, ban)

    def _decayed(self, record: _Record, now: float) -> float:
        elapsed = max(0.0, now - record.at)
        return float(record.score * 0.5 ** (elapsed / self.config.half_life))
