"""The node itself: identity, addresses, routing table, trees (with repair links and RTTs),
health, metrics (Prometheus text, and JSON for the web page)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from dag import PeerId
from pulsar import Node

from .common import json_response, node_of, query_int
from .problems import Problem

if TYPE_CHECKING:
    from pulsar.proto.tree.routing import TreeView

__all__ = ["routes", "prometheus_text"]

routes = web.RouteTableDef()
STARTED: web.AppKey[float] = web.AppKey("started", float)


@routes.get("/v1/node")
async def node_identity(request: web.Request) -> web.Response:
    node = node_of(request)
    host, port = node.address
    return json_response({
        "peer_id": str(node.peer_id),
        "kademlia_id": node.dht.node_id.hex(),
        "address": {"host": host, "port": port, "udp": "dht", "tcp": "pub-sub transport"},
        "api": f"{request.scheme}://{request.host}",
    })


@routes.get("/v1/node/routing")
async def routing(request: web.Request) -> web.Response:
    node = node_of(request)
    k = query_int(request, "k", 20, 1, 1000)
    contacts = node.dht.closest_known_peers(node.dht.node_id, k)
    return json_response({
        "contacts": [
            {"kademlia_id": c.node_id.hex(), "host": c.host, "port": c.port,
             "peer_id": None if c.peer_id is None else str(c.peer_id)}
            for c in contacts
        ]
    })


def _tree_json(node: Node, tree: TreeView, rtts: dict[PeerId, tuple[float, float]]
               ) -> dict[str, Any]:
    """One tree as the page and operators read it: the edges, the repair links and the
    round-trip times of every neighbour in it (``null`` while not measured yet)."""
    lazy, grafted = node.repair_links(tree.topic)
    neighbours = tree.parents | tree.children | lazy | grafted
    rtt: dict[str, dict[str, float] | None] = {}
    for peer in sorted(neighbours, key=str):
        sample = rtts.get(peer)
        rtt[str(peer)] = None if sample is None else {
            "srtt_ms": round(sample[0] * 1000, 3), "rto_ms": round(sample[1] * 1000, 3)}
    return {
        "topic": str(tree.topic),
        "parents": sorted(str(p) for p in tree.parents),
        "children": sorted(str(c) for c in tree.children),
        "lazy": sorted(str(p) for p in lazy),
        "grafted": sorted(str(p) for p in grafted),
        "is_root": tree.is_root,
        "subscribed": tree.subscribed,
        "attached": tree.attached,
        "rtt": rtt,
    }


@routes.get("/v1/node/trees")
async def trees(request: web.Request) -> web.Response:
    node = node_of(request)
    rtts = node.rtts()
    return json_response({"trees": [_tree_json(node, t, rtts) for t in node.trees()]})


@routes.get("/v1/node/metrics")
async def metrics_json(request: web.Request) -> web.Response:
    """The counters of ``/metrics`` as JSON, with the time they were read, so a client
    (the web page) turns two readings into rates. Counters start at 0 with the node: a
    reading lower than the last means the node restarted."""
    node = node_of(request)
    return json_response({
        "at": time.time(),
        "uptime_s": round(time.time() - request.app[STARTED], 3),
        "subscriptions": len(node.subscribed()),
        "node": dict(node.metrics),
        "transport": node.transport.stats.snapshot(),
        "dht": dict(node.dht.stats.as_dict()),
    })


@routes.post("/v1/auth/check")
async def auth_check(request: web.Request) -> web.Response:
    """Changes nothing: it is a POST so that the token check every state change passes
    through (:func:`api.auth.auth_middleware`) answers it. Clients (``pulsarcast doctor``,
    the Spark writer at planning time) learn that a token is wrong before they act."""
    return web.Response(status=204)


@routes.get("/v1/health")
async def health(request: web.Request) -> web.Response:
    node = node_of(request)
    if node.stopped:
        raise Problem(503, "unavailable", "the node is stopping")
    return json_response({
        "status": "ok",
        "uptime_s": round(time.time() - request.app[STARTED], 3),
        "subscriptions": len(node.subscribed()),
    })


GAUGES = frozenset({"gaps_open", "held", "trees", "trees_attached", "loop_lag_max_ms",
                    "topics_to_resume"})
"""Node metrics that are levels, not counts: exported as gauges, without ``_total``."""


def prometheus_text(node: Node) -> str:
    """Counters of the protocol cores, the DHT and the transport in the text format."""
    lines: list[str] = []
    families = [("pulsarcast", node.metrics), ("pulsarcast_dht", node.dht.stats.as_dict()),
                ("pulsarcast_transport", node.transport.stats.snapshot())]
    for prefix, counters in families:
        for name, value in sorted(counters.items()):
            if prefix == "pulsarcast" and name in GAUGES:
                metric = f"{prefix}_{name}"
                lines.append(f"# TYPE {metric} gauge")
            else:
                metric = f"{prefix}_{name.replace('.', '_')}_total"
                lines.append(f"# TYPE {metric} counter")
            lines.append(f"{metric} {value}")
    lines.append("# TYPE pulsarcast_subscriptions gauge")
    lines.append(f"pulsarcast_subscriptions {len(node.subscribed())}")
    return "\n".join(lines) + "\n"


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=prometheus_text(node_of(request)),
                        content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})
