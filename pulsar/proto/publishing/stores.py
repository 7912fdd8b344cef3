"""Our own events on their way into the DHT: "persisted before forwarded", in order.

A publisher hands each event it creates to the DHT (``StoreDht``) and may forward it only
once ``min_acks`` DHT nodes acknowledged it (``DhtStored``). Stores finish out of order, so
this module also keeps a publisher's chain in order: an event stored before its own parent
waits for it, and is released right after it (sending it first would make every subscriber
open a gap, and a WANT, for an event that is a moment behind). An event that does not
reach the quorum fails, and so does every event of ours waiting behind it: their parent
will never be in the DHT.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from dag import CID, EventDescriptor

from ..events import TopicReady

__all__ = ["OwnStores", "Stored"]


@dataclass(slots=True)
class Stored:
    """One event of ours being stored."""

    tree: CID
    event: EventDescriptor
    request: int | None
    then: TopicReady | None = None
    """Reported once the event is forwarded (a version announcement ends an update)."""


class OwnStores:
    """Every event of ours between ``StoreDht`` and forwarding."""

    def __init__(self, *, failed_limit: int = 10_000) -> None:
        self._pending: dict[CID, Stored] = {}
        self._early: dict[CID, Stored] = {}
        """Stored (acknowledged) before their own parent was."""
        self._after: dict[CID, list[CID]] = {}
        self._failed: OrderedDict[CID, CID | None] = OrderedDict()
        """Failed events of ours and their parents (bounded, oldest forgotten first)."""
        self._failed_limit = failed_limit

    def add(self, stored: Stored) -> None:
        self._pending[stored.event.cid] = stored

    def busy(self, tree: CID) -> bool:
        """Whether an event of ``tree`` is still on its way (the tree must not be left)."""
        return any(s.tree == tree for s in (*self._pending.values(), *self._early.values()))

    def complete(
        self, cid: CID, acks: int, min_acks: int
    ) -> tuple[list[Stored], list[Stored]]:
        """The DHT answered the store of ``cid`` with ``acks``: returns ``(forward,
        failed)``, the events now ready to forward (in chain order) and those that failed."""
        pending = self._pending.pop(cid, None)
        if pending is None:
            return [], []
        parent = pending.event.parent
        if acks < min_acks or (parent is not None and parent in self._failed):
            return [], self._fail(pending)
        if parent is not None and (parent in self._pending or parent in self._early):
            self._early[cid] = pending
            self._after.setdefault(parent, []).append(cid)
            return [], []
        ready: list[Stored] = []
        queue = [pending]
        while queue:
            item = queue.pop()
            ready.append(item)
            queue.extend(self._early.pop(c) for c in self._after.pop(item.event.cid, ()))
        return ready, []

    def last_persisted(self, cid: CID | None) -> CID | None:
        """``cid`` or, if it failed or is still being stored, its nearest ancestor that
        is persisted: what LAST_SEEN may link to after a failure (a failed event's parent
        may have failed too, and linking to either would fail every event after it), and
        what a heads record may name (a record naming an event that then fails would
        point readers at a block nobody has)."""
        seen: set[CID] = set()
        while cid is not None and cid not in seen:
            seen.add(cid)
            if cid in self._failed:
                cid = self._failed[cid]
                continue
            waiting = self._pending.get(cid) or self._early.get(cid)
            if waiting is None:
                break
            cid = waiting.event.parent  # not stored yet: it may still fail
        return cid

    def _fail(self, first: Stored) -> list[Stored]:
        failed: list[Stored] = []
        queue = [first]
        while queue:
            item = queue.pop()
            failed.append(item)
            self._failed[item.event.cid] = item.event.parent
            if len(self._failed) > self._failed_limit:
                self._failed.popitem(last=False)
            queue.extend(self._early.pop(c) for c in self._after.pop(item.event.cid, ()))
        return failed
