"""Network replay of a topic's history from its CID alone: ``GET /v1/topics/{cid}/replay``.

Unlike ``/events`` (this node's delivery log of a topic it follows), this walks the topic's
DAG through the DHT from the heads the publishers' heads records name, so it works on a
node that never followed the topic, with every publisher and subscriber offline. The
answer is NDJSON, oldest first in causal order. The first :data:`STREAM_AFTER` events are
read before the first line is sent, so a history the network could not give whole is a
``503 replay-incomplete`` (with ``Retry-After``), never a short ``200``; a longer one
streams the rest as it is read, and a failure then ends the answer unfinished (a broken
chunked stream, not a short history that looks whole). ``partial=true`` asks for what was
found.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from dag import CID, EventDescriptor
from dag.errors import ChunkError
from dht import BlockNotFound
from pulsar import Node
from pulsar.runtime.replay import ReplayError, ReplayIncomplete

from .common import NDJSON, node_of, query_int, topic_of
from .history import ChunkedWriter, parse_time
from .problems import STREAMING, Problem
from .publishing import RETRY_AFTER
from .topics import event_view
from .views import parse_cid

__all__ = ["STREAM_AFTER", "routes"]

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

_MAX_LIMIT = 1_000_000
STREAM_AFTER = 1000
"""Events read before the answer starts; a longer replay streams the rest as it reads."""


def _point(value: str, name: str) -> CID | float:
    """An event CID, or a time (seconds since the epoch or RFC 3339): a CID never starts
    with a digit or a sign in the bases the API prints, a time always does."""
    if value[:1] in "-0123456789" and value:
        return parse_time(value, name)
    return parse_cid(value, name)


@routes.get("/v1/topics/{cid}/replay")
async def replay(request: web.Request) -> web.StreamResponse:
    """``since`` (exclusive) and ``until`` (inclusive): an event CID or a time compared
    with the events' ``created``; ``limit``: at most this many events."""
    node = node_of(request)
    topic = await topic_of(request)
    q = request.query
    since = _point(q["since"], "since") if "since" in q else None
    until = _point(q["until"], "until") if "until" in q else None
    limit = query_int(request, "limit", None, 1, _MAX_LIMIT)
    partial = query_bool(request, "partial")
    stream = node.replay(topic.cid, since=since, until=until, limit=limit, partial=partial)
    events: list[EventDescriptor] = []
    try:
        # The first events are read before the answer starts, so a short history that
        # cannot be read whole is a 503 (or a 422), never a 200.
        async for event in stream:
            events.append(event)
            if len(events) >= STREAM_AFTER:
                break
    except ReplayIncomplete as exc:
        raise _incomplete(exc) from None
    except ReplayError as exc:
        raise Problem(422, "replay-too-long", str(exc)) from None
    # Payloads (chunk trees of large events) are fetched before the answer starts, so a
    # payload nobody holds is a 503 too, not a stream cut short.
    lines: list[bytes] = []
    missing: list[str] = []
    for event in events:
        try:
            lines.append(await _line(node, event))
        except (BlockNotFound, TimeoutError, ChunkError) as exc:
            if not partial:
                missing.append(f"{event.cid} ({exc})")
    if missing:
        raise Problem(503, "replay-incomplete",
                      f"the payloads of {len(missing)} event(s) could not be fetched "
                      f"(first: {missing[0]})", retry_after=RETRY_AFTER,
                      missing=len(missing), found=len(events) - len(missing),
                      missing_cids=[m.split()[0] for m in missing[:16]])
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    request[STREAMING] = True
    out = ChunkedWriter(response)  # a reader that stalls holds one piece, not the range
    try:
        for line in lines:
            await out.add(line)
        if len(events) >= STREAM_AFTER:
            # A long history streams as it is read (a replay through checkpoints holds a
            # window, not the range). Failing now, the answer ends unfinished: a reader
            # sees a broken stream, never a short history that looks whole.
            async for event in stream:
                try:
                    await out.add(await _line(node, event))
                except (BlockNotFound, TimeoutError, ChunkError) as exc:
                    if not partial:
                        raise ConnectionResetError(f"payload of {event.cid}: {exc}") from None
        await out.flush()
    except (ReplayError, ConnectionResetError) as exc:
        log.info("replay of %s ended unfinished: %s", topic.cid, exc)
        raise ConnectionResetError(str(exc)) from None
    except ConnectionError:  # the client went away
        return response
    await response.write_eof()
    return response


async def _line(node: Node, event: EventDescriptor) -> bytes:
    return json.dumps(await event_view(node, event)).encode() + b"\n"


def _incomplete(exc: ReplayIncomplete) -> Problem:
    return Problem(503, "replay-incomplete", str(exc), retry_after=RETRY_AFTER,
                   missing=len(exc.missing), found=exc.found,
                   missing_cids=[str(c) for c in exc.missing[:16]])


def query_bool(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise Problem(400, "invalid-field", f"{name} must be true or false, not {raw!r}")
    return raw in ("true", "1")
