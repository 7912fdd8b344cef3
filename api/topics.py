"""Topics, subscriptions and publishing: ``/v1/topics``, ``/v1/subscriptions``,
``/v1/events``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from dag import CID, EventDescriptor, EventLinking, TopicDescriptor
from pulsar import EventNotFound, Node, PublishError

from .common import json_body, json_response, node_of, path_cid, topic_of
from .problems import Problem
from .views import event_json, parse_cid, parse_payload, parse_peers, topic_json

__all__ = ["routes"]

routes = web.RouteTableDef()

MAX_PAYLOAD = 1024 * 1024
"""Largest event payload accepted over HTTP (bigger ones go into chunk trees in the DHT)."""
_TOPIC_FIELDS = {"name", "allowed_publishers", "request_to_publish", "event_linking",
                 "subtopics"}


def _settings(body: dict[str, Any], *, creating: bool) -> dict[str, Any]:
    unknown = set(body) - _TOPIC_FIELDS
    if unknown:
        raise Problem(400, "invalid-field", f"unknown fields: {sorted(unknown)}")
    settings: dict[str, Any] = {}
    if "name" in body or creating:
        name = body.get("name")
        if not isinstance(name, str) or not 0 < len(name.encode()) <= 256:
            raise Problem(400, "invalid-field", "name must be a string of 1..256 bytes")
        settings["name"] = name
    for field in ("allowed_publishers", "request_to_publish"):
        if field in body:
            rule = parse_peers(body[field], field)
            if rule is not None or not creating:
                settings[field] = rule
    if "event_linking" in body:
        try:
            settings["event_linking"] = EventLinking(body["event_linking"])
        except ValueError:
            raise Problem(400, "invalid-field", "event_linking must be LAST_SEEN or "
                          "CUSTOM") from None
    if "subtopics" in body:
        subs = body["subtopics"]
        if not isinstance(subs, dict) or len(subs) > 100:
            raise Problem(400, "invalid-field", "subtopics must be an object of at most 100 "
                          "name -> topic CID")
        if "meta" in subs:
            raise Problem(400, "invalid-field", "the meta sub-topic is made by the node")
        settings["subtopics"] = {str(k): parse_cid(v, f"subtopics.{k}") for k, v in subs.items()}
    return settings


@routes.post("/v1/topics")
async def create_topic(request: web.Request) -> web.Response:
    settings = _settings(await json_body(request), creating=True)
    name = settings.pop("name")
    if settings.get("allowed_publishers") is True:
        raise Problem(400, "invalid-field", "allowed_publishers takes a list of peer ids "
                      "(or null for anyone)")
    try:
        topic = await node_of(request).create_topic(name, **settings)
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
    except PublishError as exc:
        raise Problem(403, "publish-refused", str(exc)) from None
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
    replay = request.query.get("replay", "false").lower() in ("1", "true", "yes")
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
    body = await json_body(request)
    payload = parse_payload(body, MAX_PAYLOAD)
    parent = body.get("parent")
    parent_cid = None if parent is None else parse_cid(parent, "parent")
    node = node_of(request)
    try:
        event = await node.publish(topic.cid, payload, parent=parent_cid)
    except PublishError as exc:
        raise Problem(403, "publish-refused", str(exc)) from None
    answer = event_json(event, payload)
    return json_response(answer, status=201, headers={"Location": f"/v1/events/{event.cid}"})


@routes.get("/v1/events/{cid}")
async def get_event(request: web.Request) -> web.Response:
    node = node_of(request)
    try:
        event = await node.get_event(path_cid(request))
    except EventNotFound as exc:
        raise Problem(404, "event-not-found", str(exc)) from None
    return json_response(await event_view(node, event))
