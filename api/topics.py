"""Topics, subscriptions and publishing: ``/v1/topics``, ``/v1/subscriptions``,
``/v1/events``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from dag import (
    CID,
    MAX_RETENTION,
    EventDescriptor,
    EventLinking,
    Retention,
    TopicDescriptor,
    check_content_type,
)
from dag.errors import SchemaError
from pulsar import EventNotFound, Node

from .common import (
    NDJSON,
    check_fields,
    json_body,
    json_response,
    node_of,
    path_cid,
    raw_body,
    topic_of,
)
from .limits import (
    SUBTOPIC_NAME_BYTES,
    SUBTOPICS,
    TOPIC_NAME_BYTES,
)
from .problems import Problem
from .publishing import (
    WRITE_REFUSALS,
    Publication,
    check_key,
    parse_publication,
    publish_batch,
    publish_one,
    refusal,
)
from .views import event_json, parse_cid, parse_peers, topic_json

__all__ = ["routes"]

routes = web.RouteTableDef()

_TOPIC_FIELDS = frozenset({"name", "allowed_publishers", "request_to_publish",
                           "event_linking", "subtopics", "retention"})
_BOOLEAN = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _name(value: Any, what: str, limit: int) -> str:
    """A name: a string of 1..limit bytes in UTF-8 (lone surrogates were refused with the
    body)."""
    if not isinstance(value, str) or not 0 < len(value.encode()) <= limit:
        raise Problem(400, "invalid-field", f"{what} must be a string of 1..{limit} bytes "
                      "in UTF-8")
    return value


def _settings(body: dict[str, Any], *, creating: bool) -> dict[str, Any]:
    check_fields(body, _TOPIC_FIELDS)
    settings: dict[str, Any] = {}
    if "name" in body or creating:
        settings["name"] = _name(body.get("name"), "name", TOPIC_NAME_BYTES)
    if isinstance(body.get("allowed_publishers"), bool):
        raise Problem(400, "invalid-field", "allowed_publishers takes a list of peer ids "
                      "(or null for anyone)")
    for field in ("allowed_publishers", "request_to_publish"):
        if field in body:
            rule = parse_peers(body[field], field)
            if rule is not None or not creating:
                settings[field] = rule
    if "event_linking" in body:
        try:
            settings["event_linking"] = EventLinking(body["event_linking"])
        except (ValueError, TypeError):
            raise Problem(400, "invalid-field", "event_linking must be LAST_SEEN or "
                          "CUSTOM") from None
    if "subtopics" in body:
        subs = body["subtopics"]
        if not isinstance(subs, dict) or len(subs) > SUBTOPICS:
            raise Problem(400, "invalid-field", f"subtopics must be an object of at most "
                          f"{SUBTOPICS} name -> topic CID")
        if "meta" in subs:
            raise Problem(400, "invalid-field", "the meta sub-topic is made by the node")
        settings["subtopics"] = {
            _name(k, "a subtopics name", SUBTOPIC_NAME_BYTES): parse_cid(v, f"subtopics.{k}")
            for k, v in subs.items()
        }
    if "retention" in body:
        settings["retention"] = _retention(body["retention"])
    return settings


def _retention(value: Any) -> Retention | None:
    """``{"max_age": seconds, "max_events": n, "compact": true}`` (one or more), or null:
    every event is kept (on an update: again)."""
    if isinstance(value, dict):  # null members are unset: what GET shows can be sent back
        value = {k: v for k, v in value.items() if v is not None} or None
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"max_age", "max_events", "compact"}:
        raise Problem(400, "invalid-field", "retention must be an object with max_age "
                      "(seconds), max_events and/or compact, or null")
    compact = value.pop("compact", False)
    if type(compact) is not bool:
        raise Problem(400, "invalid-field", "retention.compact must be true or false")
    if not value and not compact:
        return None
    bounds: dict[str, int] = {}
    for key, item in value.items():
        # JSON has one number type: 3600.0 is the integer 3600 (as JSON Schema says).
        if type(item) is float and item.is_integer():
            item = int(item)
        if type(item) is not int or not 1 <= item <= MAX_RETENTION:
            raise Problem(400, "invalid-field",
                          f"retention.{key} must be an integer in 1..{MAX_RETENTION}")
        bounds[key] = item
    return Retention(bounds.get("max_age"), bounds.get("max_events"), compact)


@routes.post("/v1/topics")
async def create_topic(request: web.Request) -> web.Response:
    settings = _settings(await json_body(request), creating=True)
    name = settings.pop("name")
    try:
        topic = await node_of(request).create_topic(name, **settings)
    except WRITE_REFUSALS as exc:
        raise refusal(exc) from None
    except (ValueError, TypeError) as exc:
        raise Problem(400, "invalid-field", str(exc)) from None
    return json_response(topic_json(topic), status=201,
                             headers={"Location": f"/v1/topics/{topic.cid}"})


@routes.get("/v1/topics/{cid}")
async def get_topic(request: web.Request) -> web.Response:
    return json_response(topic_json(await topic_of(request)))


@routes.get("/v1/topics/{cid}/versions")
async def topic_versions(request: web.Request) -> web.Response:
    topic = await topic_of(request)
    versions = await node_of(request).topic_versions(topic.cid)
    return json_response({"versions": [topic_json(v) for v in versions]})


@routes.patch("/v1/topics/{cid}")
async def update_topic(request: web.Request) -> web.Response:
    topic = await topic_of(request)
    settings = _settings(await json_body(request), creating=False)
    if not settings:
        raise Problem(400, "invalid-field", "nothing to change")
    try:
        new = await node_of(request).update_topic(topic.cid, **settings)
    except WRITE_REFUSALS as exc:
        raise refusal(exc) from None
    except (ValueError, TypeError) as exc:
        raise Problem(400, "invalid-field", str(exc)) from None
    return json_response(topic_json(new))


# ------------------------------------------------------------------ subscriptions


def _subscription_json(node: Node, topic: CID) -> dict[str, Any]:
    return {"topic": str(topic), "position": node.last_position(topic)}


@routes.put("/v1/subscriptions/{cid}")
async def subscribe(request: web.Request) -> web.Response:
    topic = await topic_of(request)
    node = node_of(request)
    raw = request.query.get("replay", "false").lower()
    if raw not in _BOOLEAN:
        raise Problem(400, "invalid-field", "replay must be true or false")
    replay = _BOOLEAN[raw]
    root = await node.first_version(topic)
    already = root.cid in node.subscribed()
    if not already:
        await node.subscribe(root.cid, replay=replay)
    return json_response(_subscription_json(node, root.cid), status=200 if already else 201)


@routes.delete("/v1/subscriptions/{cid}")
async def unsubscribe(request: web.Request) -> web.Response:
    topic = await topic_of(request)
    node = node_of(request)
    root = await node.first_version(topic)
    if root.cid not in node.subscribed():
        raise Problem(404, "not-subscribed", f"not subscribed to {root.cid}")
    await node.unsubscribe(root.cid)
    return web.Response(status=204)


@routes.get("/v1/subscriptions")
async def subscriptions(request: web.Request) -> web.Response:
    node = node_of(request)
    return json_response(
        {"subscriptions": [_subscription_json(node, t) for t in node.subscribed()]}
    )


# ------------------------------------------------------------------ events


async def event_view(node: Node, event: EventDescriptor, **position: Any) -> dict[str, Any]:
    return event_json(event, await node.payload_of(event), **position)


@routes.post("/v1/topics/{cid}/events")
async def publish(request: web.Request) -> web.Response:
    topic: TopicDescriptor = await topic_of(request)
    node = node_of(request)
    if request.content_type == NDJSON:
        return await publish_batch(request, node, topic)
    if request.content_type == RAW_TYPE:
        # The payload's bytes as the body, streamed: up to the node's own limit on an
        # event (core.fragments.max_event_size, 16 MiB by default), past the JSON body's.
        publication = await _raw_publication(request, node)
    else:
        publication = parse_publication(await json_body(request))
    event = await publish_one(node, topic.cid, publication)
    answer = event_json(event, publication.payload)
    return json_response(answer, status=201, headers={"Location": f"/v1/events/{event.cid}"})


RAW_TYPE = "application/octet-stream"
"""A publish whose body is the payload itself (streamed), not a JSON document."""


async def _raw_publication(request: web.Request, node: Node) -> Publication:
    """Payload, media type (query ``content_type``), parent (query ``parent``) and key
    (query ``key``) of a raw upload."""
    unknown = set(request.query) - {"content_type", "parent", "key"}
    if unknown:
        raise Problem(400, "invalid-field", f"unknown query parameters: {sorted(unknown)}; "
                      "a raw upload takes content_type, parent and key")
    content_type = request.query.get("content_type")
    if content_type is not None:
        try:
            check_content_type(content_type)
        except SchemaError as exc:
            raise Problem(400, "invalid-field", f"content_type: {exc}") from None
    parent, key = request.query.get("parent"), request.query.get("key")
    check_key(key)
    payload = await raw_body(request, node.config.core.fragments.max_event_size)
    return Publication(payload, content_type,
                       None if parent is None else parse_cid(parent, "parent"), key)


@routes.get("/v1/events/{cid}")
async def get_event(request: web.Request) -> web.Response:
    node = node_of(request)
    try:
        event = await node.get_event(path_cid(request))
    except EventNotFound as exc:
        raise Problem(404, "event-not-found", str(exc)) from None
    return json_response(await event_view(node, event))
