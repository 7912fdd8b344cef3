"""The node's advisories over REST: ``GET /v1/node/advisories`` (docs/api.md).

A page of JSON by default (``{"advisories": [...], "last_id": n, "lost_before": id|null}``),
or a Server-Sent-Events stream with ``Accept: text/event-stream``: each advisory as
``id: <id>`` / ``event: advisory``, heartbeats while nothing happens, and ``event: lost``
first when what the reader asks for is no longer all there (see
:mod:`pulsar.runtime.advisories`). ``after`` (query) or ``Last-Event-ID`` resumes.
"""

from __future__ import annotations

import json

from aiohttp import web

from pulsar.runtime.advisories import KEPT

from .common import json_response, node_of
from .connections import ClientGone, unless_client_gone
from .history import open_event_stream
from .problems import Problem

__all__ = ["routes"]

routes = web.RouteTableDef()

MAX_ID = 2**63 - 1


def _after(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    try:
        after = int(raw.strip())
    except ValueError:
        raise Problem(400, "invalid-field", "after (or Last-Event-ID) must be an advisory "
                      "id, a non-negative integer") from None
    if not 0 <= after <= MAX_ID:
        raise Problem(400, "invalid-field", "after (or Last-Event-ID) must be an advisory "
                      "id, a non-negative integer")
    return after


@routes.get("/v1/node/advisories")
async def advisories(request: web.Request) -> web.StreamResponse:
    node = node_of(request)
    unknown = set(request.query) - {"after"}
    if unknown:
        raise Problem(400, "invalid-field", f"unknown query parameters: {sorted(unknown)}")
    after = _after(request)
    board = node.consumers.advisories
    if "text/event-stream" not in request.headers.get("Accept", ""):
        lost = board.oldest(after) if after else None
        page = board.after(after, KEPT)
        return json_response({"advisories": [a.to_json() for a in page],
                              "last_id": page[-1].id if page else after,
                              "lost_before": lost})
    response, heartbeat = await open_event_stream(request)
    try:
        await response.write(b"retry: 1000\n\n")
        while not node.stopped:
            lost = board.oldest(after) if after else None
            if lost is not None:  # asked for, or fell behind, past what is kept: said once
                await response.write(f"event: lost\ndata: {json.dumps({'before': lost})}\n\n"
                                     .encode())
                after = lost
            page = board.after(after)
            if page:
                after = page[-1].id
                await response.write("".join(
                    f"id: {a.id}\nevent: advisory\ndata: {json.dumps(a.to_json())}\n\n"
                    for a in page).encode())
                continue
            try:
                woke = await unless_client_gone(request, board.wait(after, heartbeat))
            except ClientGone:
                return response
            if not woke:
                await response.write(b": heartbeat\n\n")
        await response.write(b'event: end\ndata: {"reason": "node stopping"}\n\n')
    except ConnectionError:
        return response
    await response.write_eof()
    return response
