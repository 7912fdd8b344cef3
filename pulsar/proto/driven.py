"""What a driver needs of a protocol core: the one interface the asyncio runtime and the
simulator drive, whichever core it is (:class:`~pulsar.proto.core.PulsarCore`, or the
:class:`~pulsar.proto.flood.core.FloodCore` baseline).

A driver feeds ``handle`` the inputs and carries out the outputs (:mod:`pulsar.proto.events`)
and reads views for status pages and metrics. What one core has and the other lacks (the
Plumtree links, RTT estimates and the membership overlay exist in Pulsarcast alone) is
asked through methods that answer empty for the core without it, so no driver branches on
a core's class.
"""

from __future__ import annotations

from typing import Protocol

from dag import CID, PeerId, TopicDescriptor
from pulsar.proto.tree.routing import Routing, TreeView

from . import events as ev

__all__ = ["Core"]


class Core(Protocol):
    """A sans-I/O protocol core as its drivers see it."""

    routing: Routing
    """Where the core finds peers (the DHT's routing table, or the simulator's)."""

    @property
    def min_acks(self) -> int:
        """DHT acknowledgements a store needs before the core counts it done."""
        ...

    @property
    def keeps_outbox(self) -> bool:
        """Whether the core reports its own events as ``KeepPublished`` when they go out
        (the driver's trace of a publish starts there); a core that does not is traced at
        ``Published``."""
        ...

    def handle(self, event: ev.InEvent, now: float) -> ev.Out:
        """One input at time ``now`` (seconds); the outputs it causes, in order."""
        ...

    def tree(self, topic: CID) -> TreeView | None: ...

    def trees(self) -> list[TreeView]: ...

    def topic(self, cid: CID) -> TopicDescriptor | None: ...

    def latest(self, topic: CID) -> TopicDescriptor | None: ...

    def is_subscribed(self, topic: CID) -> bool: ...

    def heads(self, topic: CID) -> list[CID]: ...

    def counters(self) -> dict[str, int]: ...

    def repair_links(self, topic: CID) -> tuple[frozenset[PeerId], frozenset[PeerId]]:
        """``(lazy, grafted)`` Plumtree links of ``topic``; empty where there are none."""
        ...

    def rtt_snapshot(self) -> dict[PeerId, tuple[float, float]]:
        """``peer -> (smoothed RTT, RTO)`` in seconds; empty where nothing is measured."""
        ...

    def overlay(self) -> dict[PeerId, bool]:
        """The membership overlay's active view, ``peer -> near`` (a low-RTT slot);
        empty for a core without one."""
        ...
