"""The node's open gaps, kept three ways: by id (timers name gaps by id), by topic and
frontier (an arriving event finds the gap it closes), and by DHT fetch in flight (an
answer finds the gap that asked). This is bookkeeping only: when a gap opens, moves or
ends is decided by gap fetching (:mod:`.gaps`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from dag import CID, PeerId
from pulsar.proto import events as ev
from pulsar.proto.events import Out

from .causal import Ordering
from .state import Gap
from .timers import GapTimeout

__all__ = ["Fetching", "GapTable"]


@dataclass(slots=True, eq=False)
class Fetching:
    """One topic's gaps and fetch memos, over its causal order."""

    order: Ordering
    frontier: dict[CID, Gap] = field(default_factory=dict)
    """Missing CID -> the gap whose frontier it is."""
    wants: dict[tuple[PeerId, CID], Gap] = field(default_factory=dict)
    """WANTs in flight, by (peer, head asked for)."""
    failed: OrderedDict[CID, float] = field(default_factory=OrderedDict)
    """Heads we could not get or found invalid -> not asked for again until then."""
    lost: OrderedDict[CID, int] = field(default_factory=OrderedDict)
    """Missing events of gaps given up on -> how many times they were asked for again."""
    reconciling: PeerId | None = None
    """The peer this topic reconciles with; its gaps wait (see ``BackfillConfig.reconcile``)."""
    reconcile_seq: int = 0
    """Names the newest reconciliation's timeout: an older one's is stale."""


class GapTable:
    """Every open gap of one node."""

    def __init__(self) -> None:
        self.topics: dict[CID, Fetching] = {}
        self.by_id: dict[int, Gap] = {}
        """Open gaps, oldest first (the node-wide bound evicts the first)."""
        self.fetches: dict[CID, Gap] = {}
        self._next_id = 0

    def open_topic(self, order: Ordering) -> None:
        self.topics[order.cid] = Fetching(order)

    def close_topic(self, topic: CID) -> None:
        """Forget ``topic`` and close its gaps."""
        f = self.topics.pop(topic, None)
        if f is None:
            return
        for gap in list(f.frontier.values()):
            self.close(gap)

    def new(self, f: Fetching, missing: CID, now: float, peer: PeerId | None,
            patience: float) -> Gap:
        gap = Gap(self._next_id, f.order.cid, missing, now, peer, patience=patience)
        self._next_id += 1
        self.by_id[gap.id] = gap
        f.frontier[missing] = gap
        return gap

    def close(self, gap: Gap) -> None:
        if gap.closed:
            return
        gap.closed = True
        self.by_id.pop(gap.id, None)
        f = self.topics.get(gap.topic)
        if f is not None and f.frontier.get(gap.frontier) is gap:
            del f.frontier[gap.frontier]
        if f is not None and gap.asked is not None and gap.asked_peer is not None:
            key = (gap.asked_peer, gap.asked)
            if f.wants.get(key) is gap:
                del f.wants[key]  # its answer still counts if it comes (as a late one)

    @staticmethod
    def arm(gap: Gap, delay: float, out: Out) -> None:
        """(Re)arm ``gap``'s timeout: only the newest timer counts."""
        gap.timer_seq += 1
        out.append(ev.SetTimer(delay, GapTimeout(gap.topic, gap.id, gap.timer_seq)))

    @staticmethod
    def wants_to(f: Fetching, peer: PeerId | None, other_than: Gap) -> list[float]:
        """When the WANTs in flight to ``peer`` for ``f``'s topic left (``other_than``'s
        own excepted)."""
        return [gap.asked_at for (to, _), gap in f.wants.items()
                if to == peer and gap is not other_than]
