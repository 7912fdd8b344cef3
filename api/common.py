"""What every handler module needs: the node of the app, body and query parsing."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from dag import CID, TopicDescriptor
from pulsar import Node, TopicNotFound

from .limits import PAGE_EVENTS, ServerLimits
from .problems import Problem
from .strict_json import JsonRejected, strict_loads
from .views import parse_cid

__all__ = ["LIMITS_KEY", "NODE", "check_fields", "json_body", "json_response", "node_of",
           "path_cid", "query_choice", "query_int", "topic_of"]

NODE: web.AppKey[Node] = web.AppKey("node", Node)
LIMITS_KEY: web.AppKey[ServerLimits] = web.AppKey("limits", ServerLimits)
MAX_PAGE = PAGE_EVENTS
_INTEGER = re.compile(r"-?[0-9]{1,19}")  # ASCII only: int() would take "١٢" and "1_0"


def _dumps(body: Any) -> str:
    return json.dumps(body) + "\n"  # a newline ends each answer, as curl users expect


NDJSON = "application/x-ndjson"
"""Newline-delimited JSON: history and replay streams, and publishing in batches."""


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.json_response(body, status=status, headers=headers, dumps=_dumps)


def node_of(request: web.Request) -> Node:
    return request.app[NODE]


async def json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; problem documents for anything else: not JSON (NaN,
    Infinity, numbers beyond a double), too deep, lone surrogates, too slow to arrive."""
    if request.content_type != "application/json":
        raise Problem(415, "unsupported-media-type", "send the body as application/json")
    timeout = request.app[LIMITS_KEY].body_timeout
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise Problem(408, "request-timeout", f"the body did not arrive within {timeout:g} "
                      "s") from None
    try:
        body = strict_loads(raw)
    except JsonRejected as exc:
        raise Problem(400, "invalid-json", f"body: {exc}") from None
    if not isinstance(body, dict):
        raise Problem(400, "invalid-json", "body must be a JSON object")
    return body


async def raw_body(request: web.Request, limit: int) -> bytes:
    """The body as bytes, read as it streams in: refused (``413``) as soon as it passes
    ``limit`` (by its declared length, or by what arrived), so an over-sized upload is
    never buffered whole; ``408`` when it does not arrive within the body timeout."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise Problem(413, "payload-too-large", f"payload is {declared} bytes; the limit is "
                      f"{limit}")
    timeout = request.app[LIMITS_KEY].body_timeout
    chunks: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.content.iter_chunked(RAW_CHUNK):
                total += len(chunk)
                if total > limit:
                    raise Problem(413, "payload-too-large", f"payload is over the limit of "
                                  f"{limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise Problem(408, "request-timeout", f"the body did not arrive within {timeout:g} "
                      "s") from None
    return b"".join(chunks)


RAW_CHUNK = 64 * 1024
"""Bytes read at a time from a streamed upload."""


def check_fields(body: dict[str, Any], allowed: frozenset[str] | set[str]) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise Problem(400, "invalid-field", f"unknown fields: {sorted(unknown)}; this body "
                      f"takes {sorted(allowed)}")


def path_cid(request: web.Request, name: str = "cid") -> CID:
    return parse_cid(request.match_info[name], name)


def query_int(request: web.Request, name: str, default: int | None, low: int, high: int
              ) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not _INTEGER.fullmatch(raw):
        raise Problem(400, "invalid-field", f"{name} must be an integer in {low}..{high}")
    value = int(raw)
    if not low <= value <= high:
        raise Problem(400, "invalid-field", f"{name} must be in {low}..{high}")
    return value


def query_choice(request: web.Request, name: str, choices: tuple[str, ...], default: str
                 ) -> str:
    """A query parameter that takes one of a few words."""
    value = request.query.get(name, default)
    if value not in choices:
        raise Problem(400, "invalid-field", f"{name} must be one of {', '.join(choices)}")
    return value


async def topic_of(request: web.Request) -> TopicDescriptor:
    """The topic named in the path, by any of its versions' CIDs."""
    cid = path_cid(request)
    try:
        return await node_of(request).get_topic(cid)
    except TopicNotFound as exc:
        raise Problem(404, "topic-not-found", str(exc)) from None
