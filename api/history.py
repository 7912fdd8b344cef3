"""History (cursor-paged JSON or NDJSON) and live Server-Sent Events, both read from the
node's durable delivery log, whose sequence numbers are the cursors.

Reading the log rather than tapping live deliveries is what makes resume exact: a stream
that starts (or resumes with ``Last-Event-ID``) at position p sends p+1, p+2, ... from the
log, and the same loop then waits for the log to grow, so the replayed gap and the live
tail meet with no event lost or repeated.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from aiohttp import web

from dag import CID, TopicDescriptor
from pulsar import BeforeRetention, LogEntry, Node

from .common import MAX_PAGE, NDJSON, node_of, query_choice, query_int, topic_of
from .limits import PAGE_BYTES, SEQ_DIGITS
from .logblocks import MAGIC, MEDIA_TYPE, encode_record
from .problems import STREAMING, Problem
from .topics import event_view
from .views import parse_cid

__all__ = ["routes"]

routes = web.RouteTableDef()

HEARTBEAT_S = 15.0
"""An SSE comment line this often keeps proxies and clients from timing the stream out."""
HEARTBEAT_KEY: web.AppKey[float] = web.AppKey("heartbeat", float)


async def open_event_stream(request: web.Request) -> tuple[web.StreamResponse, float]:
    """A Server-Sent-Events answer, prepared (uncached, unbuffered by proxies), and the
    heartbeat interval to keep it alive with: what every SSE endpoint starts with."""
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no"})
    await response.prepare(request)
    return response, float(request.app.get(HEARTBEAT_KEY, HEARTBEAT_S))
_MAX_SEQ = 2**62  # beyond any position; an exclusive upper bound
READ_BATCH = 100
"""Log entries read at a time by a stream (descriptors only; payloads are read per event)."""
BLOCKS_READ_BATCH = 1000
"""Log rows read at a time for ``format=blocks``: no parsing, so a larger page costs the
loop ~1 ms (measured: ~1 us per row for SQLite and the record)."""
WRITE_CHUNK = 64 * 1024
"""A stream hands its output to the connection in pieces of about this size; each write
waits while the connection's send buffer is over its high-water mark, so a reader that
stalls holds at most that buffer, one piece and one event."""
SEQ_PATTERN = f"[0-9]{{1,{SEQ_DIGITS}}}"
SECONDS_PATTERN = r"-?[0-9]{1,20}(\.[0-9]{0,20})?([eE][-+]?[0-9]{1,2})?"  # always finite
_SEQ = re.compile(SEQ_PATTERN)
_SECONDS = re.compile(SECONDS_PATTERN)
_RFC3339 = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
                      r"(\.[0-9]+)?([Zz]|[-+][0-9]{2}:[0-9]{2})")


def parse_time(value: str, name: str) -> float:
    """Seconds since the epoch: a number, or an RFC 3339 date-time."""
    if _SECONDS.fullmatch(value):  # ASCII, no "nan", "inf" or "1_0" as float() takes
        return float(value)
    match = _RFC3339.fullmatch(value)
    if match:
        year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
        zone = match[8].upper().replace("Z", "+00:00")
        try:
            # RFC 3339 allows a leap second (:60), which datetime does not.
            moment = datetime.fromisoformat(f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:"
                                            f"{minute:02d}:{min(second, 59):02d}{zone}")
            if second > 60:
                raise ValueError(second)
        except ValueError:
            raise Problem(400, "invalid-field", f"{name} is not a valid calendar date-time"
                          ) from None
        return moment.timestamp() + (second == 60) + float("0" + (match[7] or ""))
    try:
        if not value.isascii():
            raise ValueError(value)
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Problem(400, "invalid-field", f"{name} must be seconds since the epoch or an "
                      "RFC 3339 date-time") from None
    if moment.tzinfo is None:
        raise Problem(400, "invalid-field", f"{name} needs a time zone (e.g. Z)")
    return moment.timestamp()


def parse_cursor(node: Node, topic: CID, value: str, name: str) -> int:
    """A delivery-log position: a sequence number, or the CID of an event in the log."""
    if value.isascii() and value.isdigit():  # "²".isdigit() is true too, int() disagrees
        if not _SEQ.fullmatch(value):  # int() of 4,300+ digits raises, and is slow before
            raise Problem(400, "invalid-field", f"{name} is out of range (at most "
                          f"{SEQ_DIGITS} digits)")
        return int(value)
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
    pages with ``next_cursor`` while more remain, or NDJSON or bulk blocks of any length."""
    node, topic = await _root(request)
    q = request.query
    direction = query_choice(request, "direction", ("forward", "backward"), "forward")
    form = query_choice(request, "format", ("json", "ndjson", "blocks"), "json")
    if "format" not in q:
        accept = request.headers.get("Accept", "")
        form = "ndjson" if NDJSON in accept else "blocks" if MEDIA_TYPE in accept else form
    ndjson = form == "ndjson"
    streamed = form != "json"
    limit = query_int(request, "limit", None if streamed else 100, 1,
                      _MAX_SEQ if streamed else MAX_PAGE)
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
    if streamed:
        return await _blocks(request, node, topic.cid, low, high, limit, backward)
    assert limit is not None
    entries = node.log_entries(topic.cid, after=low, before=high, limit=limit + 1,
                               descending=backward)
    # The page is serialized event by event and stops at PAGE_BYTES, so one answer (and
    # what it leaves in a stalled reader's send buffer) stays a few MiB however large the
    # events are; next_cursor then says where to go on.
    parts: list[str] = []
    size = 0
    for entry in entries[:limit]:
        text = json.dumps(await _entry_json(node, entry))
        parts.append(text)
        size += len(text)
        if size >= PAGE_BYTES:
            break
    body = f'{{"topic": {json.dumps(str(topic.cid))}, "events": [{", ".join(parts)}]'
    if len(entries) > len(parts) and parts:
        body += f', "next_cursor": "{entries[len(parts) - 1].seq}"'
    return web.Response(text=body + "}\n", content_type="application/json")


class ChunkedWriter:
    """Output of a stream, handed to the response in pieces of about WRITE_CHUNK bytes."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.pending = bytearray()

    async def add(self, data: bytes) -> None:
        self.pending += data
        if len(self.pending) >= WRITE_CHUNK:
            await self.flush()

    async def flush(self) -> None:
        if self.pending:
            data = bytes(self.pending)
            self.pending.clear()
            await self.response.write(data)  # waits while the send buffer is full


async def _ndjson(request: web.Request, node: Node, topic: CID, low: int, high: int,
                  limit: int | None, backward: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    request[STREAMING] = True  # a cut now ends it unfinished
    try:
        await _ndjson_lines(response, node, topic, low, high, limit, backward)
    except ConnectionError:  # the client went away: nothing to finish, nothing to log
        return response
    await response.write_eof()
    return response


async def _ndjson_lines(response: web.StreamResponse, node: Node, topic: CID, low: int,
                        high: int, limit: int | None, backward: bool) -> None:
    out = ChunkedWriter(response)
    remaining = limit
    while remaining is None or remaining > 0:
        size = READ_BATCH if remaining is None else min(READ_BATCH, remaining)
        entries = node.log_entries(topic, after=low, before=high, limit=size,
                                   descending=backward)
        if not entries:
            break
        for entry in entries:
            await out.add(json.dumps(await _entry_json(node, entry)).encode() + b"\n")
        if backward:
            high = entries[-1].seq
        else:
            low = entries[-1].seq
        if remaining is not None:
            remaining -= len(entries)
    await out.flush()


async def _blocks(request: web.Request, node: Node, topic: CID, low: int, high: int,
                  limit: int | None, backward: bool) -> web.StreamResponse:
    """The range in the bulk format of :mod:`api.logblocks`: stored blocks copied into
    length-prefixed records, nothing parsed or turned into text on the node."""
    response = web.StreamResponse(headers={"Content-Type": MEDIA_TYPE})
    await response.prepare(request)
    request[STREAMING] = True  # a cut now ends it unfinished
    out = ChunkedWriter(response)
    remaining = limit
    try:
        await out.add(MAGIC)
        while remaining is None or remaining > 0:
            size = BLOCKS_READ_BATCH if remaining is None else min(BLOCKS_READ_BATCH,
                                                                   remaining)
            rows = node.log_blocks(topic, after=low, before=high, limit=size,
                                   descending=backward)
            if not rows:
                break
            records = [encode_record(seq, at, cid.raw, block)
                       for seq, cid, at, block in rows if block is not None]
            await out.add(b"".join(records))
            if backward:
                high = rows[-1][0]
            else:
                low = rows[-1][0]
            if remaining is not None:
                remaining -= len(records)  # pruned positions are skipped, not counted
        await out.flush()
    except ConnectionError:  # the client went away: nothing to finish, nothing to log
        return response
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
    if _SEQ.fullmatch(start):  # a bare integer is a position
        return parse_cursor(node, topic, start, "from")
    if _SECONDS.fullmatch(start) or "-" in start or ":" in start:
        return node.log_position(topic, parse_time(start, "from"))  # 1795000000.0, RFC 3339
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
    node.log_entries(topic.cid, after=position, limit=0)  # before-retention is said now
    response, heartbeat = await open_event_stream(request)
    try:
        await _stream_log(response, node, topic.cid, position, heartbeat)
    except ConnectionError:  # the client went away: nothing to finish
        return response
    await response.write_eof()
    return response


async def _stream_log(response: web.StreamResponse, node: Node, topic: CID, position: int,
                      heartbeat: float) -> None:
    """Send the log after ``position`` as SSE messages, then wait for it to grow; end on
    unsubscribe or node stop. A disconnected client is noticed at the next write (at the
    latest one heartbeat later)."""
    await response.write(b"retry: 1000\n\n")
    out = ChunkedWriter(response)
    while not node.stopped:
        try:
            entries = node.log_entries(topic, after=position, limit=READ_BATCH)
        except BeforeRetention as cut:  # the reader fell behind the topic's retention
            await out.flush()
            end = {"reason": "before-retention", "retained_from": cut.retained_from}
            await response.write(f"event: end\ndata: {json.dumps(end)}\n\n".encode())
            break
        if entries:
            for entry in entries:
                data = json.dumps(await _entry_json(node, entry))
                await out.add(f"id: {entry.seq}\nevent: event\ndata: {data}\n\n".encode())
                position = entry.seq
            await out.flush()
            continue
        if topic not in node.subscribed():
            await response.write(b"event: end\ndata: {\"reason\": \"unsubscribed\"}\n\n")
            break
        if not await node.wait_for_log(topic, position, heartbeat) and not node.stopped:
            await response.write(b": heartbeat\n\n")
    else:
        await response.write(b"event: end\ndata: {\"reason\": \"node stopping\"}\n\n")


