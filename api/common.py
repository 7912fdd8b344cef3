"""What every handler module needs: the node of the app, body and query parsing."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from dag import CID, TopicDescriptor
from pulsar import Node, TopicNotFound

from .problems import Problem
from .views import parse_cid

__all__ = ["NODE", "json_body", "json_response", "node_of", "path_cid", "query_int", "topic_of"]

NODE: web.AppKey[Node] = web.AppKey("node", Node)
MAX_PAGE = 1000
"""Largest ``limit`` of one JSON history page (NDJSON streams have no such bound)."""


def _dumps(body: Any) -> str:
    return json.dumps(body) + "\n"  # a newline ends each answer, as curl users expect


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.json_response(body, status=status, headers=headers, dumps=_dumps)


def node_of(request: web.Request) -> Node:
    return request.app[NODE]


async def json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; problem documents for anything else."""
    if request.content_type != "application/json":
        raise Problem(415, "unsupported-media-type", "send the body as application/json")
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem(400, "invalid-json", f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Problem(400, "invalid-json", "body must be a JSON object")
    return body


def path_cid(request: web.Request, name: str = "cid") -> CID:
    return parse_cid(request.match_info[name], name)


def query_int(request: web.Request, name: str, default: int | None, low: int, high: int
              ) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Problem(400, "invalid-field", f"{name} must be an integer") from None
    if not low <= value <= high:
        raise Problem(400, "invalid-field", f"{name} must be in {low}..{high}")
    return value


async def topic_of(request: web.Request) -> TopicDescriptor:
    """The topic named in the path, by any of its versions' CIDs."""
    cid = path_cid(request)
    try:
        return await node_of(request).get_topic(cid)
    except TopicNotFound as exc:
        raise Problem(404, "topic-not-found", str(exc)) from None
