"""Fault injection at the transport, for tests and the testbed.

A :class:`FaultInjector` decides, for each outgoing DATA frame, whether it is dropped or how
long it is held back before it is written; and, for each pair of peers, whether they can
reach each other at all (partitions, blocked peers). The transport asks it; nothing here
does I/O or reads a clock, so decisions are reproducible from the seed.

What is affected:

* ``drop_rate``, ``latency`` and ``jitter`` apply to outgoing DATA frames only. The handshake,
  keepalive and GOAWAY frames are never dropped or delayed by them, so the connection itself
  stays healthy and only the pub-sub traffic suffers.
* A partition or a block cuts everything between the two peers: DATA frames (in both
  directions, so one injector on one side is enough), PING/PONG (so a long partition ends in
  a keepalive timeout, as a real one would), and new connections (dials fail, inbound
  handshakes are refused). Connections already open stay open, as TCP connections do through
  a short partition, and carry traffic again after :meth:`FaultInjector.heal`.

Ordering under latency and jitter: each DATA frame is held for ``latency + U(0, jitter)``
seconds. By default (``reorder=False``) a frame is never written before the one queued
ahead of it on the same connection, so per-peer order is kept and jitter shows up as
head-of-line delay, which is what jitter does to a TCP stream. With ``reorder=True`` every
frame keeps its own delay and frames may arrive out of order, to test the protocol against
a network that reorders.

Bandwidth: ``bandwidth`` (bytes per second, None for unlimited) models each sender's
uplink as a token bucket that empties at that rate: a DATA frame leaves the uplink once the
frames queued on it before (to any peer) are out, so its hold grows by its own size over the
rate plus the backlog of the sending node. ``latency`` is added after that (propagation),
so a 1 MiB burst at 50 Mbit/s costs ~168 ms of serialisation plus the link latency, as on a
real access link. Only the sender's uplink is modelled (downlinks are taken as wide);
the transport passes the frame size and its clock's ``now`` in, so this module still reads
no clock.

One injector may be shared by all the transports of a testbed (decisions take the sending
and receiving peer ids), or each transport may have its own. Random draws happen in the
order frames are sent, so a single sender with a given seed always drops the same frames.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from dag import PeerId

__all__ = ["FaultInjector", "FaultStats"]


@dataclass(slots=True)
class FaultStats:
    """What the injector did, by cause."""

    dropped_random: int = 0
    """Outgoing DATA frames dropped by ``drop_rate``."""
    dropped_partition: int = 0
    """DATA frames between peers in different partition groups."""
    dropped_blocked: int = 0
    """DATA frames to or from a blocked peer."""
    dropped_control: int = 0
    """PING/PONG/GOAWAY frames not sent across a partition or block."""
    delayed: int = 0
    """Outgoing DATA frames held back by ``latency``/``jitter``/``bandwidth``."""
    shaped_bytes: int = 0
    """Bytes of DATA frames that went through the bandwidth limit."""
    refused_connections: int = 0
    """Dials not attempted and handshakes refused across a partition or block."""

    @property
    def dropped(self) -> int:
        """DATA frames dropped, all causes."""
        return self.dropped_random + self.dropped_partition + self.dropped_blocked

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


_REST = -1  # the partition group of every peer not listed in partition()


class FaultInjector:
    """Seeded network faults: random loss, latency and jitter, partitions, blocked peers."""

    def __init__(
        self,
        seed: int | None = 0,
        *,
        drop_rate: float = 0.0,
        latency: float = 0.0,
        jitter: float = 0.0,
        reorder: bool = False,
        bandwidth: float | None = None,
        burst: int = 16 * 1024,
    ) -> None:
        self.rng = random.Random(seed)
        self.stats = FaultStats()
        self.reorder = reorder
        self._drop_rate = 0.0
        self._latency = 0.0
        self._jitter = 0.0
        self.drop_rate = drop_rate
        self.latency = latency
        self.jitter = jitter
        self._bandwidth: float | None = None
        self.bandwidth = bandwidth
        if burst < 0:
            raise ValueError(f"burst must not be negative, got {burst}")
        self.burst = burst
        """Bytes a sender may put on its uplink at once without waiting (a NIC's buffer)."""
        self._uplink_free: dict[PeerId, float] = {}
        """Per sender: when its uplink will have sent everything queued on it so far."""
        self._groups: dict[PeerId, int] = {}
        self._blocked: set[PeerId] = set()

    # --- settings (may change while running) --------------------------------------------

    @property
    def drop_rate(self) -> float:
        """Probability that an outgoing DATA frame is silently dropped, 0..1."""
        return self._drop_rate

    @drop_rate.setter
    def drop_rate(self, value: float) -> None:
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"drop_rate must be in 0..1, got {value}")
        self._drop_rate = float(value)

    @property
    def latency(self) -> float:
        """Seconds every outgoing DATA frame is held before it is written."""
        return self._latency

    @latency.setter
    def latency(self, value: float) -> None:
        self._latency = _seconds("latency", value)

    @property
    def jitter(self) -> float:
        """Extra hold, uniform in 0..jitter seconds, drawn per frame."""
        return self._jitter

    @jitter.setter
    def jitter(self, value: float) -> None:
        self._jitter = _seconds("jitter", value)

    @property
    def bandwidth(self) -> float | None:
        """Bytes per second each sender's uplink carries (None: unlimited)."""
        return self._bandwidth

    @bandwidth.setter
    def bandwidth(self, value: float | None) -> None:
        if value is not None and not (math.isfinite(value) and value > 0.0):
            raise ValueError(f"bandwidth must be a positive number of bytes/s, got {value}")
        self._bandwidth = None if value is None else float(value)

    def uplink_backlog(self, src: PeerId, now: float) -> float:
        """Seconds of traffic queued on ``src``'s uplink at ``now`` (0.0: idle)."""
        return max(0.0, self._uplink_free.get(src, now) - now)

    # --- partitions and blocks --------------------------------------------------------------

    def partition(self, groups: Iterable[Iterable[PeerId]]) -> None:
        """Split the network: peers in different groups cannot reach each other. Peers listed
        in no group form one more group together ("the rest"). Replaces any earlier
        partition; a peer listed twice is an error."""
        assignment: dict[PeerId, int] = {}
        for index, group in enumerate(groups):
            for peer in group:
                if peer in assignment:
                    raise ValueError(f"peer {peer} is in more than one partition group")
                assignment[peer] = index
        self._groups = assignment

    def heal(self) -> None:
        """End the partition (blocked peers stay blocked)."""
        self._groups = {}

    def block(self, peer: PeerId) -> None:
        """Cut ``peer`` off from everyone this injector speaks for."""
        self._blocked.add(peer)

    def unblock(self, peer: PeerId) -> None:
        self._blocked.discard(peer)

    @property
    def partitioned(self) -> bool:
        return bool(self._groups)

    def reachable(self, a: PeerId, b: PeerId) -> bool:
        """True unless a partition or a block separates ``a`` and ``b``."""
        if self._blocked and (a in self._blocked or b in self._blocked):
            return False
        if self._groups:
            return self._groups.get(a, _REST) == self._groups.get(b, _REST)
        return True

    # --- decisions the transport asks for ---------------------------------------------------

    def outgoing(
        self, src: PeerId, dst: PeerId, size: int = 0, now: float = 0.0
    ) -> float | None:
        """For one DATA frame of ``size`` bytes from ``src`` to ``dst`` sent at ``now``
        (the transport's clock): None to drop it, else the seconds to hold it (0.0: write
        now)."""
        if self._blocked and (src in self._blocked or dst in self._blocked):
            self.stats.dropped_blocked += 1
            return None
        if self._groups and self._groups.get(src, _REST) != self._groups.get(dst, _REST):
            self.stats.dropped_partition += 1
            return None
        if self._drop_rate and self.rng.random() < self._drop_rate:
            self.stats.dropped_random += 1
            return None
        delay = self._latency
        if self._jitter:
            delay += self.rng.uniform(0.0, self._jitter)
        if self._bandwidth is not None:
            delay += self._shape(src, size, now)
        if delay:
            self.stats.delayed += 1
        return delay

    def _shape(self, src: PeerId, size: int, now: float) -> float:
        """The token bucket: seconds until this frame is through ``src``'s uplink, beyond
        the first ``burst`` bytes of backlog (those go at once)."""
        assert self._bandwidth is not None
        self.stats.shaped_bytes += size
        start = max(self._uplink_free.get(src, now), now)
        done = start + size / self._bandwidth
        self._uplink_free[src] = done
        return max(0.0, done - now - self.burst / self._bandwidth)

    def incoming(self, src: PeerId, dst: PeerId) -> bool:
        """Whether a DATA frame that arrived from ``src`` at ``dst`` is delivered; only
        partitions and blocks apply (loss and delay were the sender's to apply)."""
        if self.reachable(src, dst):
            return True
        if self._blocked and (src in self._blocked or dst in self._blocked):
            self.stats.dropped_blocked += 1
        else:
            self.stats.dropped_partition += 1
        return False

    def control(self, src: PeerId, dst: PeerId) -> bool:
        """Whether a keepalive or GOAWAY frame may be sent (only cuts stop them)."""
        if self.reachable(src, dst):
            return True
        self.stats.dropped_control += 1
        return False

    def connect(self, src: PeerId, dst: PeerId) -> bool:
        """Whether a connection between the two may be made (dial or inbound handshake)."""
        if self.reachable(src, dst):
            return True
        self.stats.refused_connections += 1
        return False


def _seconds(name: str, value: float) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a non-negative number of seconds, got {value}")
    return float(value)
