"""Walks over a topic's event DAG, as pure functions over a block source.

Events link one parent each, so a topic's history is a forest of chains that branch where
two publishers linked the same parent (concurrent LAST_SEEN publishers, CUSTOM linking).
These functions never do I/O: callers pass a lookup (the local store, a cache, a dict in a
test), and the network layers decide what to fetch for the CIDs reported missing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Final

from .cid import CID
from .descriptors import EventDescriptor

__all__ = ["ancestors", "causal_order", "heads", "missing_parents", "order_key"]

Lookup = Callable[[CID], EventDescriptor | None]
DEFAULT_WALK_LIMIT: Final = 1_000_000


def ancestors(
    start: CID, lookup: Lookup, *, limit: int | None = None, include_start: bool = False
) -> tuple[list[EventDescriptor], CID | None]:
    """Follow parent links back from ``start``.

    Returns ``(events, missing)``: the events found, nearest first, and the first CID the
    lookup could not resolve (``None`` when the walk reached a root or ``limit``). A cycle
    cannot occur with honest content addressing; a lookup that fabricates one is cut off by
    the visited set.
    """
    bound = DEFAULT_WALK_LIMIT if limit is None else limit
    found: list[EventDescriptor] = []
    seen: set[CID] = set()
    cursor: CID | None = start
    if not include_start:
        first = lookup(start)
        if first is None:
            return [], start
        cursor = first.parent
        seen.add(start)
    while cursor is not None and len(found) < bound and cursor not in seen:
        seen.add(cursor)
        event = lookup(cursor)
        if event is None:
            return found, cursor
        found.append(event)
        cursor = event.parent
    return found, None


def order_key(event: EventDescriptor) -> tuple[str, bytes]:
    """The deterministic tie-break among events with no causal order: creation time, then
    CID bytes. Every node sorts concurrent branches the same way."""
    return (event.created, event.cid.raw)


def causal_order(events: Iterable[EventDescriptor]) -> list[EventDescriptor]:
    """Topological order: every event after its parent (when the parent is in the set),
    concurrent events by :func:`order_key`. Duplicates are dropped."""
    by_cid: dict[CID, EventDescriptor] = {}
    for event in events:
        by_cid.setdefault(event.cid, event)
    children: dict[CID, list[EventDescriptor]] = {}
    ready: list[tuple[tuple[str, bytes], EventDescriptor]] = []
    for event in by_cid.values():
        if event.parent is not None and event.parent in by_cid and event.parent != event.cid:
            children.setdefault(event.parent, []).append(event)
        else:
            ready.append((order_key(event), event))
    heapq.heapify(ready)
    ordered: list[EventDescriptor] = []
    while ready:
        _, event = heapq.heappop(ready)
        ordered.append(event)
        for child in children.pop(event.cid, ()):
            heapq.heappush(ready, (order_key(child), child))
    return ordered


def missing_parents(
    events: Iterable[EventDescriptor], known: Callable[[CID], bool]
) -> set[CID]:
    """Parent CIDs referenced by ``events`` that are neither among them nor ``known``."""
    batch = list(events)
    present = {e.cid for e in batch}
    return {
        e.parent
        for e in batch
        if e.parent is not None and e.parent not in present and not known(e.parent)
    }


def heads(events: Iterable[EventDescriptor]) -> set[CID]:
    """The events no other event in the set names as parent: the tips of the DAG."""
    batch = list(events)
    parents = {e.parent for e in batch if e.parent is not None}
    return {e.cid for e in batch if e.cid not in parents}
