"""History (cursor-paged JSON or NDJSON) and live Server-Sent Events, both read from the
node's durable delivery log, whose sequence numbers are the cursors.

Reading the log rather than tapping live deliveries is what makes resume exact: a stream
that starts (or resumes with ``Last-Event-ID``) at position p sends p+1, p+2, ... from the
log, and the same loop then waits for the log to grow, so the replayed gap and the live
tail meet with no event lost or repeated.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from aiohttp import web

from dag import CID, TopicDescriptor
from pulsar import LogEntry, Node

from .common import MAX_PAGE, json_response, node_of, query_int, topic_of
from .problems import Problem
from .topics import event_view
from .views import parse_cid

__all__ = ["routes"]

routes = web.RouteTableDef()

HEARTBEAT_S = 15.0
"""An SSE comment line this often keeps proxies and clients from timing the stream out."""
HEARTBEAT_KEY: web.AppKey[float] = web.AppKey("heartbeat", float)
NDJSON = "application/x-ndjson"
_MAX_SEQ = 2**62


def parse_time(value: str, name: str) -> float:
    """Seconds since the epoch: a number, or an RFC 3339 date-time."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Problem(400, "invalid-field", f"{name} must be seconds since the epoch or an "
                      "RFC 3339 date-time") from None
    if moment.tzinfo is None:
        raise Problem(400, "invalid-field", f"{name} needs a time zone (e.g. Z)")
    return moment.timestamp()


def parse_cursor(node: Node, topic: CID, value: str, name: str) -> int:
    """A delivery-log position: a sequence number, or the CID of an event in the log."""
    if value.isdigit():
        seq = int(value)
        if seq > _MAX_SEQ:
            raise Problem(400, "invalid-field", f"{name} is out of range")
        return seq
    cid = parse_cid(value, name)
    try:
        return node.log_position(topic, cid)
    except KeyError as exc:
        raise Problem(404, "event-not-found", str(exc.args[0])) from None


async def _root(request: web.Request) -> tuple[Node, TopicDescriptor]:
    node = node_of(request)
    return node, await node.first_version(await topic_of(request))


async def _entry_json(node: Node, entry: LogEntry) -> dict[str, Any]:
    return await event_view(node, entry.event, seq=entry.seq, delivered_at=entry.delivered_at)


@routes.get("/v1/topics/{cid}/events")
async def history(request: web.Request) -> web.StreamResponse:
    """``cursor`` (exclusive), ``since``/``until`` (times), ``limit``, ``direction``; JSON
    pages with ``next_cursor`` while more remain, or NDJSON of any length."""
    node, topic = await _root(request)
    q = request.query
    direction = q.get("direction", "forward")
    if direction not in ("forward", "backward"):
        raise Problem(400, "invalid-field", "direction must be forward or backward")
    ndjson = q.get("format") == "ndjson" or NDJSON in request.headers.get("Accept", "")
    limit = query_int(request, "limit", None if ndjson else 100, 1,
                      _MAX_SEQ if ndjson else MAX_PAGE)
    low = 0  # exclusive bounds on seq
    high = _MAX_SEQ
    if "since" in q:
        low = node.log_position(topic.cid, parse_time(q["since"], "since"))
    if "until" in q:
        high = node.log_position(topic.cid, parse_time(q["until"], "until")) + 1
    if "cursor" in q:
        cursor = parse_cursor(node, topic.cid, q["cursor"], "cursor")
        if direction == "forward":
            low = max(low, cursor)
        else:
            high = min(high, cursor)
    backward = direction == "backward"
    if ndjson:
        return await _ndjson(request, node, topic.cid, low, high, limit, backward)
    assert limit is not None
    entries = node.log_entries(topic.cid, after=low, before=high, limit=limit + 1,
                               descending=backward)
    more = len(entries) > limit
    entries = entries[:limit]
    body: dict[str, Any] = {
        "topic": str(topic.cid),
        "events": [await _entry_json(node, e) for e in entries],
    }
    if more and entries:
        body["next_cursor"] = str(entries[-1].seq)
    return json_response(body)


async def _ndjson(request: web.Request, node: Node, topic: CID, low: int, high: int,
                  limit: int | None, backward: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    remaining = limit
    while remaining is None or remaining > 0:
        size = 1000 if remaining is None else min(1000, remaining)
        entries = node.log_entries(topic, after=low, before=high, limit=size,
                                   descending=backward)
        if not entries:
            break
        lines = [json.dumps(await _entry_json(node, e)) for e in entries]
        await response.write(("\n".join(lines) + "\n").encode())
        if backward:
            high = entries[-1].seq
        else:
            low = entries[-1].seq
        if remaining is not None:
            remaining -= len(entries)
    await response.write_eof()
    return response


def _start_position(node: Node, topic: CID, request: web.Request) -> int:
    resume = request.headers.get("Last-Event-ID")
    if resume:
        return parse_cursor(node, topic, resume.strip(), "Last-Event-ID")
    start = request.query.get("from", "latest")
    if start == "earliest":
        return 0
    if start == "latest":
        return node.last_position(topic)
    if "-" in start or "." in start:  # 2026-11-23T10:00:00Z or 1795000000.0: a time
        return node.log_position(topic, parse_time(start, "from"))
    return parse_cursor(node, topic, start, "from")


@routes.get("/v1/topics/{cid}/stream")
async def stream(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: ``id:`` is the delivery-log position; ``from`` (earliest, latest,
    a position or event CID, a time) or ``Last-Event-ID`` say where to start."""
    node, topic = await _root(request)
    # A client resuming (Last-Event-ID) after the topic was unsubscribed still gets what
    # the log holds beyond its cursor, then the end; a new stream needs a subscription.
    if topic.cid not in node.subscribed() and not request.headers.get("Last-Event-ID"):
        raise Problem(404, "not-subscribed", f"subscribe to {topic.cid} first "
                      "(PUT /v1/subscriptions/{cid})")
    position = _start_position(node, topic.cid, request)
    heartbeat = float(request.app.get(HEARTBEAT_KEY, HEARTBEAT_S))
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    try:
        await _stream_log(response, node, topic.cid, position, heartbeat)
    except ConnectionResetError:  # the client went away: nothing to finish
        return response
    await response.write_eof()
    return response


async def _stream_log(response: web.StreamResponse, node: Node, topic: CID, position: int,
                      heartbeat: float) -> None:
    """Send the log after ``position`` as SSE messages, then wait for it to grow; end on
    unsubscribe or node stop. A disconnected client is noticed at the next write (at the
    latest one heartbeat later)."""
    await response.write(b"retry: 1000\n\n")
    while not node.stopped:
        entries = node.log_entries(topic, after=position, limit=500)
        if entries:
            chunks = []
            for entry in entries:
                data = json.dumps(await _entry_json(node, entry))
                chunks.append(f"id: {entry.seq}\nevent: event\ndata: {data}\n\n")
                position = entry.seq
            await response.write("".join(chunks).encode())
            continue
        if topic not in node.subscribed():
            await response.write(b"event: end\ndata: {\"reason\": \"unsubscribed\"}\n\n")
            break
        if not await node.wait_for_log(topic, position, heartbeat) and not node.stopped:
            await response.write(b": heartbeat\n\n")
    else:
        await response.write(b"event: end\ndata: {\"reason\": \"node stopping\"}\n\n")


