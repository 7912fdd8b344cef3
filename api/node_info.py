"""The node itself: identity, addresses, routing table, trees, health, Prometheus metrics."""

from __future__ import annotations

import time

from aiohttp import web

from pulsar import Node

from .common import json_response, node_of, query_int
from .problems import Problem

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


@routes.get("/v1/node/trees")
async def trees(request: web.Request) -> web.Response:
    node = node_of(request)
    return json_response({
        "trees": [
            {"topic": str(t.topic), "parents": sorted(str(p) for p in t.parents),
             "children": sorted(str(c) for c in t.children), "is_root": t.is_root,
             "subscribed": t.subscribed}
            for t in node.trees()
        ]
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


def prometheus_text(node: Node) -> str:
    """Counters of the protocol cores, the DHT and the transport in the text format."""
    lines: list[str] = []
    families = [("pulsarcast", node.metrics), ("pulsarcast_dht", node.dht.stats.as_dict())]
    for prefix, counters in families:
        for name, value in sorted(counters.items()):
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
