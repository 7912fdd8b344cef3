"""Durable named consumers over REST: ``/v1/topics/{cid}/consumers`` and below.

A consumer (:mod:`pulsar.runtime.consumers`) reads the topic's delivery log at this node
and keeps its place; what it hands out must be acknowledged (per its ``ack_policy``) or it
is delivered again. Pull with ``POST .../fetch`` (a long poll: it answers as soon as there
is a message, or when ``expires`` has passed), push with ``GET .../stream`` (Server-Sent
Events), settle with ``POST .../ack`` (or, for a reader that reads the log itself by
position, with ``POST .../commit``: every position up to one at once). Every answer that
hands out or settles messages is sent after the consumer's state is committed to the
node's SQLite file, so a client that saw its acknowledgement answered never sees that
message again, even across a crash.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from dag import CID
from pulsar import Node, TopicNotFound
from pulsar.runtime.consumer_config import (
    MAX_BATCH,
    MAX_EXPIRES,
    MAX_SEQ,
    CommitRefused,
    ConsumerConfig,
    ConsumerConfigError,
    ConsumerExists,
    ConsumerLimit,
    ConsumerNotFound,
    NotFollowed,
    check_name,
)
from pulsar.runtime.consumers import ConsumerInfo, ConsumerMessage

from .common import check_fields, json_body, json_response, node_of, topic_of
from .connections import ClientGone, unless_client_gone
from .history import open_event_stream, parse_time
from .problems import Problem
from .topics import event_view

__all__ = ["FETCH_WAIT_KEY", "consumer_json", "routes"]

routes = web.RouteTableDef()

FETCH_WAIT_KEY: web.AppKey[float] = web.AppKey("fetch_wait", float)
"""The longest this server lets a fetch wait (``expires`` is capped to it; 300 s unless
the server was started with less)."""
STREAM_BATCH = 10
"""Messages a push stream takes at a time: what is handed out waits in the connection for
the client to read it, and its ``ack_wait`` runs meanwhile."""
_CONFIG_FIELDS = frozenset({"name", "deliver_policy", "ack_policy", "ack_wait", "max_deliver",
                            "backoff", "replay_policy", "max_ack_pending", "group"})
_FETCH_FIELDS = frozenset({"batch", "expires"})
_ACK_FIELDS = frozenset({"ids", "kind", "delay"})
_COMMIT_FIELDS = frozenset({"through"})
_BASE = "/v1/topics/{cid}/consumers"


@contextmanager
def _problems() -> Iterator[None]:
    """The consumer API's errors as problem documents."""
    try:
        yield
    except ConsumerNotFound as exc:
        raise Problem(404, "consumer-not-found", str(exc)) from None
    except NotFollowed as exc:
        raise Problem(404, "not-subscribed", f"{exc} (PUT /v1/subscriptions/{{cid}})"
                      ) from None
    except ConsumerExists as exc:
        raise Problem(409, "consumer-exists", str(exc)) from None
    except ConsumerLimit as exc:
        raise Problem(409, "consumer-limit", str(exc)) from None
    except CommitRefused as exc:
        raise Problem(409, "commit-refused", str(exc)) from None
    except ConsumerConfigError as exc:
        raise Problem(422, "invalid-consumer", str(exc)) from None


async def _root(request: web.Request) -> tuple[Node, CID]:
    """The node and the topic's first version (logs are named by it)."""
    node = node_of(request)
    topic = await topic_of(request)
    try:
        first = await node.first_version(topic)
    except TopicNotFound as exc:
        raise Problem(404, "topic-not-found", str(exc)) from None
    return node, first.cid


def _name(request: web.Request) -> str:
    try:
        return check_name(request.match_info["name"])
    except ConsumerConfigError as exc:
        raise Problem(400, "invalid-field", f"consumer {exc}") from None


def consumer_json(info: ConsumerInfo) -> dict[str, Any]:
    """A consumer as the API shows it: its settings, where it is, its counters."""
    return {
        "topic": str(info.topic), "name": info.name, "config": info.config.to_json(),
        "created_at": info.created_at, "start": info.start, "delivered": info.delivered,
        "ack_floor": info.ack_floor, "num_pending": info.num_pending,
        "num_ack_pending": info.num_ack_pending, "num_redelivered": info.num_redelivered,
        "redeliveries": info.redeliveries, "num_terminated": info.num_terminated,
        "num_max_deliver_reached": info.num_max_deliver_reached,
        "num_skipped": info.num_skipped,
        "last_skipped": None if info.last_skipped is None else list(info.last_skipped),
        "group": None if info.group is None else {
            "name": info.group.name, "epoch": info.group.epoch, "ready": info.group.ready,
            "num_watched": info.group.num_watched, "taken_over": info.group.taken_over,
            "duplicates": info.group.duplicates,
            "members": [{"peer": m.peer, "name": m.name, "incarnation": m.incarnation,
                         "since": m.since, "me": m.me, "heard_ago": m.heard_ago}
                        for m in info.group.members]},
    }


async def _message_json(node: Node, message: ConsumerMessage) -> dict[str, Any]:
    """The event as every reader gets it (with its log ``seq``), and the delivery."""
    event = await event_view(node, message.event, seq=message.seq,
                             delivered_at=message.delivered_at)
    event["delivery"] = {"id": message.id, "count": message.count}
    return event


def _number(body: dict[str, Any], field: str, default: float, low: float, high: float,
            *, integer: bool) -> Any:
    value = body.get(field, default)
    if integer and type(value) is float and value.is_integer():
        value = int(value)  # JSON has one number type: 3.0 is the integer 3
    number = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not number or not low <= value <= high:
        what = "an integer" if integer else "a number"
        raise Problem(400, "invalid-field", f"{field} must be {what} in {low:g}..{high:g}")
    return value


# ------------------------------------------------------------------ consumers


@routes.post(_BASE)
async def add(request: web.Request) -> web.Response:
    """Make a consumer: ``201`` with its info; ``200`` if it exists with these settings;
    ``409`` if it exists with others."""
    node, topic = await _root(request)
    body = await json_body(request)
    check_fields(body, _CONFIG_FIELDS)
    policy = body.get("deliver_policy")
    if isinstance(policy, dict) and isinstance(policy.get("start_time"), str):
        when = parse_time(policy["start_time"], "deliver_policy.start_time")
        body = {**body, "deliver_policy": {**policy, "start_time": when}}
    with _problems():
        config = ConsumerConfig.from_json(body)
        info, created = node.consumers.create(topic, config, node.consumers.clock())
    if not created:
        return json_response(consumer_json(info))
    return json_response(consumer_json(info), status=201,
                         headers={"Location": f"/v1/topics/{topic}/consumers/{info.name}"})


@routes.get(_BASE)
async def list_consumers(request: web.Request) -> web.Response:
    node, topic = await _root(request)
    infos = await node.consumers.list(topic)
    return json_response({"topic": str(topic), "consumers": [consumer_json(i) for i in infos]})


@routes.get(_BASE + "/{name}")
async def info(request: web.Request) -> web.Response:
    node, topic = await _root(request)
    name = _name(request)
    with _problems():
        described = await node.consumers.info(topic, name)
    return json_response(consumer_json(described))


@routes.delete(_BASE + "/{name}")
async def delete(request: web.Request) -> web.Response:
    node, topic = await _root(request)
    name = _name(request)
    with _problems():
        await node.consumers.delete(topic, name)
    return web.Response(status=204)


# ------------------------------------------------------------------ pull, settle, push


@routes.post(_BASE + "/{name}/fetch")
async def fetch(request: web.Request) -> web.Response:
    """``{"batch", "expires"}``: up to ``batch`` messages, waiting up to ``expires`` seconds
    for the first; ``{"messages": []}`` when none came."""
    node, topic = await _root(request)
    name = _name(request)
    body = await json_body(request)
    check_fields(body, _FETCH_FIELDS)
    batch = _number(body, "batch", 1, 1, MAX_BATCH, integer=True)
    expires = float(_number(body, "expires", 0.0, 0.0, MAX_EXPIRES, integer=False))
    expires = min(expires, request.app.get(FETCH_WAIT_KEY, MAX_EXPIRES))
    with _problems():
        try:
            messages = await unless_client_gone(
                request, node.consumers.fetch(topic, name, batch, expires))
        except ClientGone:  # nothing was taken for it; nobody reads an answer
            return web.Response(status=499)
    return json_response({"messages": [await _message_json(node, m) for m in messages]})


@routes.post(_BASE + "/{name}/ack")
async def ack(request: web.Request) -> web.Response:
    """``{"ids", "kind", "delay"}``: settle delivered messages; answers which ids it
    applied to (``done``) and which are not pending (``unknown``)."""
    node, topic = await _root(request)
    name = _name(request)
    body = await json_body(request)
    check_fields(body, _ACK_FIELDS)
    ids = body.get("ids")
    if not isinstance(ids, list):
        raise Problem(400, "invalid-field", "ids must be a list of delivery ids")
    ids = [int(i) if type(i) is float and i.is_integer() else i for i in ids]
    kind = body.get("kind", "ack")
    delay = body.get("delay")
    with _problems():
        try:
            result = await node.consumers.ack(topic, name, ids, kind, delay)
        except ValueError as exc:
            raise Problem(400, "invalid-field", str(exc)) from None
    return json_response({"kind": result.kind, "done": list(result.done),
                          "unknown": list(result.unknown)})


@routes.post(_BASE + "/{name}/commit")
async def commit(request: web.Request) -> web.Response:
    """``{"through": n}``: settle every log position up to ``n``, handed out or not (an
    ``ack_policy=all`` consumer read by position, as a Spark query reads); answers the
    consumer's info."""
    node, topic = await _root(request)
    name = _name(request)
    body = await json_body(request)
    check_fields(body, _COMMIT_FIELDS)
    if "through" not in body:
        raise Problem(400, "invalid-field", "through (a log position) is required")
    through = _number(body, "through", 1, 1, MAX_SEQ, integer=True)
    with _problems():
        described = await node.consumers.commit(topic, name, through)
    return json_response(consumer_json(described))


@routes.get(_BASE + "/{name}/stream")
async def stream(request: web.Request) -> web.StreamResponse:
    """Push: each message as an SSE message (``id:`` its delivery id, ``event: message``);
    with ``ack_policy=none`` handing it out is all, otherwise acknowledge it with
    ``POST .../ack``. Ends with ``event: end`` when the consumer is deleted or the node
    stops."""
    node, topic = await _root(request)
    name = _name(request)
    with _problems():
        await node.consumers.info(topic, name)  # a 404 before the stream starts
    response, heartbeat = await open_event_stream(request)
    try:
        await response.write(b"retry: 1000\n\n")
        while True:
            if node.stopped:
                await response.write(b'event: end\ndata: {"reason": "node stopping"}\n\n')
                break
            try:
                messages = await unless_client_gone(request, node.consumers.fetch(
                    topic, name, STREAM_BATCH, min(heartbeat, MAX_EXPIRES)))
            except ClientGone:
                return response
            except ConsumerNotFound:
                await response.write(b'event: end\ndata: {"reason": "deleted"}\n\n')
                break
            if not messages:
                if not node.stopped:
                    await response.write(b": heartbeat\n\n")
                continue
            parts = [f"id: {m.id}\nevent: message\ndata: "
                     f"{json.dumps(await _message_json(node, m))}\n\n" for m in messages]
            await response.write("".join(parts).encode())
    except ConnectionError:  # the client went away: what it had not acknowledged comes back
        return response
    await response.write_eof()
    return response
