"""What a simulator run measured, and the invariants checked after it.

The figures are defined as the testbed defines them (``docs/testbed.md``): RMR counts every
payload copy that reached a node — down a link, in a backfill answer, from the DHT — per
delivered (node, event) pair, minus one; LDH is the largest hop count at which an event
was first delivered; latencies are simulated time from the publish being acknowledged to
the delivery.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dag import CID, PeerId
from pulsar.proto import events as ev
from pulsar.proto.membership import messages as membership_messages

from .network import SimNetwork, SimNode

__all__ = [
    "check_invariants", "delivery_counts", "order_violations", "overlay_invariants", "percentiles",
]


def percentiles(values: Sequence[float], points: Iterable[int] = (50, 90, 99)) -> dict[str, float]:
    """Nearest-rank percentiles in milliseconds (and the maximum); empty if no values."""
    if not values:
        return {}
    ordered = sorted(values)
    out = {}
    for p in points:
        rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
        out[f"p{p}"] = round(ordered[rank] * 1000, 1)
    out["max"] = round(ordered[-1] * 1000, 1)
    return out


def delivery_counts(
    expected: dict[CID, tuple[CID, list[SimNode]]],
) -> tuple[int, int, int, int]:
    """``expected``: event -> (topic, the nodes that must have it). Returns the pairs
    expected, delivered, missed, and extra deliveries (the same event twice at a node)."""
    want = have = duplicates = 0
    seen_nodes: set[int] = set()
    by_node: dict[int, dict[CID, int]] = {}
    for cid, (_topic, nodes) in expected.items():
        for node in nodes:
            key = id(node)
            if key not in seen_nodes:
                seen_nodes.add(key)
                counts: dict[CID, int] = {}
                for events in node.delivered.values():
                    for event in events:
                        counts[event.cid] = counts.get(event.cid, 0) + 1
                by_node[key] = counts
                duplicates += sum(c - 1 for c in counts.values() if c > 1)
            want += 1
            if by_node[key].get(cid, 0):
                have += 1
    return want, have, want - have, duplicates


def order_violations(
    nodes: Iterable[SimNode], known: dict[CID, CID | None],
) -> tuple[int, int]:
    """Delivered events whose parent (an event of the run; ``known``: event -> parent) was
    delivered after them or not at all: causal order broken. Returns all of them and
    those the node did not report: a gap that timed out (``GapReported``) releases the
    events held behind it by design, so a violation whose parent is that gap's missing
    event or one of its ancestors is explained; any other one is a bug."""
    violations = unexplained = 0
    for node in nodes:
        reported: set[CID] | None = None
        for events in node.delivered.values():
            position = {e.cid: i for i, e in enumerate(events)}
            for i, event in enumerate(events):
                parent = event.parent
                if parent is None or parent not in known or position.get(parent, i + 1) <= i:
                    continue
                violations += 1
                if reported is None:
                    reported = _released_behind(node, known)
                if parent not in reported:
                    unexplained += 1
    return violations, unexplained


def _released_behind(node: SimNode, known: dict[CID, CID | None]) -> set[CID]:
    """The events a reported gap could have been missing: each gap's missing event and
    its ancestors (the gap's frontier moves back along them while it fetches)."""
    out: set[CID] = set()
    for gap in node.gaps:
        cursor: CID | None = gap.missing
        while cursor is not None and cursor not in out:
            out.add(cursor)
            cursor = known.get(cursor)
    return out


def check_invariants(net: SimNetwork, topics: Iterable[CID]) -> dict[str, int]:
    """After a run, over the live nodes: no cycle in any tree (following parents); every
    tree edge known at both ends (an attached child's parent lists it as a child); every
    member attached (its JOIN answered, or it is the root)."""
    if net.protocol != "pulsarcast":
        return {}
    cycles = asymmetric = unattached = 0
    live = {n.peer_id: n for n in net.nodes.values() if n.alive}
    for topic in topics:
        parents: dict[PeerId, frozenset[PeerId]] = {}
        children: dict[PeerId, frozenset[PeerId]] = {}
        for peer, node in live.items():
            view = node.core.tree(topic)
            if view is None:
                continue
            if not view.attached:
                unattached += 1
                continue  # its JOIN is still on its way: no edge yet
            parents[peer] = frozenset(p for p in view.parents if p in live)
            children[peer] = frozenset(c for c in view.children if c in live)
        for peer, ups in parents.items():
            for up in ups:
                if peer not in children.get(up, frozenset()):
                    asymmetric += 1
        cycles += _cycles(parents)
    return {"tree_cycles": cycles, "asymmetric_tree_edges": asymmetric,
            "unattached_members": unattached}


def overlay_invariants(net: SimNetwork) -> dict[str, float | int]:
    """The membership overlay of the live nodes: links known at one end only (not counting
    the pairs a NEIGHBOR_REPLY, DISCONNECT or failure notice is on its way between: a link
    is one-sided while it travels), connected components, mean active view, and the mean
    one-way latency of near-slot and random-slot links (proximity at work)."""
    overlay = net.overlay()
    if not overlay:
        return {}
    moving: set[frozenset[PeerId]] = set()
    for _, _, receiver, event in net._queue:
        if isinstance(event, ev.Received):
            if type(event.message).__module__ == membership_messages.__name__:
                moving.add(frozenset((receiver, event.peer)))
        elif isinstance(event, (ev.PeerDown, ev.SendFailed)):
            moving.add(frozenset((receiver, event.peer)))
    one_sided = sum(
        1 for a, view in overlay.items() for b in view
        if (b not in overlay or a not in overlay[b]) and frozenset((a, b)) not in moving
    )
    components, seen = 0, set()
    for start in sorted(overlay, key=bytes):
        if start in seen:
            continue
        components += 1
        seen.add(start)
        frontier = [start]
        while frontier:
            for peer in overlay[frontier.pop()]:
                if peer in overlay and peer not in seen:
                    seen.add(peer)
                    frontier.append(peer)
    near: list[float] = []
    random_links: list[float] = []
    for peer, node in net.nodes.items():
        if peer not in overlay:
            continue
        for other, is_near in node.core.overlay().items():
            (near if is_near else random_links).append(net.link_latency(peer, other))
    def mean_ms(values: list[float]) -> float:
        return round(1000 * sum(values) / len(values), 1) if values else 0.0
    return {
        "overlay_nodes": len(overlay),
        "overlay_one_sided_links": one_sided,
        "overlay_components": components,
        "active_view_mean": round(sum(len(v) for v in overlay.values()) / len(overlay), 2),
        "near_links": len(near),
        "near_link_ms": mean_ms(near),
        "random_link_ms": mean_ms(random_links),
    }


def _cycles(parents: dict[PeerId, frozenset[PeerId]]) -> int:
    """How many distinct cycles following parent links (iterative three-colour DFS)."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(parents, white)
    found = 0
    for start in parents:
        if colour[start] != white:
            continue
        stack = [(start, iter(parents[start]))]
        colour[start] = grey
        while stack:
            node, ups = stack[-1]
            nxt = next(ups, None)
            if nxt is None:
                colour[node] = black
                stack.pop()
            elif colour.get(nxt, black) == grey:
                found += 1
            elif colour.get(nxt, black) == white:
                colour[nxt] = grey
                stack.append((nxt, iter(parents.get(nxt, frozenset()))))
    return found
