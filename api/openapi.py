"""The OpenAPI 3.1 document the node serves at ``/v1/openapi.json``.

Built from small helpers rather than written out as one literal, so each path says only
what is particular to it; the problem types come from :data:`api.problems.PROBLEM_TYPES`.
"""

from __future__ import annotations

from typing import Any

from .problems import PROBLEM_BASE, PROBLEM_TYPES

__all__ = ["openapi_document"]

_CID = {"type": "string", "pattern": "^b[a-z2-7]+$", "description": "CIDv1, base32"}
_PEER = {"type": "string", "description": "libp2p peer id, base58btc (12D3KooW...)"}
_NULLABLE_CID = {"oneOf": [_CID, {"type": "null"}]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_PROBLEM = {
    "description": "A problem document (RFC 9457)",
    "content": {"application/problem+json": {"schema": _ref("Problem")}},
}


def _op(summary: str, responses: dict[str, Any], *, params: list[Any] | None = None,
        body: dict[str, Any] | None = None, auth: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**responses, "4XX": _PROBLEM}}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": body}}}
    if auth:
        op["security"] = [{"bearer": []}]
    return op


def _param(name: str, where: str, schema: dict[str, Any], description: str,
           required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path",
            "schema": schema, "description": description}


_PATH_CID = _param("cid", "path", _CID, "a topic CID (any version)")


def openapi_document() -> dict[str, Any]:
    rule = {"oneOf": [{"type": "null"}, {"type": "boolean"},
                      {"type": "array", "items": _PEER, "maxItems": 1000}]}
    topic_settings = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 256},
            "allowed_publishers": {"oneOf": [{"type": "null"},
                                             {"type": "array", "items": _PEER}]},
            "request_to_publish": rule,
            "event_linking": {"enum": ["LAST_SEEN", "CUSTOM"]},
            "subtopics": {"type": "object", "additionalProperties": _CID},
        },
        "additionalProperties": False,
    }
    schemas: dict[str, Any] = {
        "Problem": {
            "type": "object",
            "required": ["type", "title", "status", "detail"],
            "properties": {
                "type": {"enum": [PROBLEM_BASE + k for k in PROBLEM_TYPES]},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
            },
        },
        "PublishRule": {"type": "object", "properties": {
            "enabled": {"type": "boolean"}, "peers": {"type": "array", "items": _PEER}}},
        "Topic": {
            "type": "object",
            "required": ["cid", "name", "author", "parent", "subtopics", "created",
                         "allowed_publishers", "request_to_publish", "event_linking"],
            "properties": {
                "cid": _CID, "name": {"type": "string"}, "author": _PEER,
                "parent": _NULLABLE_CID,
                "subtopics": {"type": "object", "additionalProperties": _CID},
                "created": {"type": "string"}, "protocol_version": {"type": "string"},
                "allowed_publishers": _ref("PublishRule"),
                "request_to_publish": _ref("PublishRule"),
                "event_linking": {"enum": ["LAST_SEEN", "CUSTOM"]},
            },
        },
        "Event": {
            "type": "object",
            "required": ["cid", "topic", "author", "publisher", "parent", "created",
                         "payload", "payload_size"],
            "properties": {
                "cid": _CID, "topic": _CID, "author": _PEER, "publisher": _PEER,
                "parent": _NULLABLE_CID, "created": {"type": "string"},
                "payload": {"type": "string", "contentEncoding": "base64"},
                "payload_size": {"type": "integer"}, "payload_link": _CID,
                "seq": {"type": "integer", "description": "delivery-log position (cursor)"},
                "delivered_at": {"type": "number"},
            },
        },
        "PublishRequest": {
            "type": "object",
            "description": "exactly one of json, text, base64",
            "properties": {"json": {}, "text": {"type": "string"},
                           "base64": {"type": "string", "contentEncoding": "base64"},
                           "parent": _CID},
        },
        "Subscription": {"type": "object", "required": ["topic", "position"], "properties": {
            "topic": _CID, "position": {"type": "integer"}}},
        "HistoryPage": {"type": "object", "required": ["topic", "events"], "properties": {
            "topic": _CID, "events": {"type": "array", "items": _ref("Event")},
            "next_cursor": {"type": "string"}}},
    }
    history_params = [
        _PATH_CID,
        _param("cursor", "query", {"type": "string"},
               "exclusive start: a delivery-log position or an event CID"),
        _param("since", "query", {"type": "string"}, "delivered at or after (epoch s or "
               "RFC 3339)"),
        _param("until", "query", {"type": "string"}, "delivered before (epoch s or RFC 3339)"),
        _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000},
               "page size (default 100)"),
        _param("direction", "query", {"enum": ["forward", "backward"]}, "paging direction"),
        _param("format", "query", {"enum": ["json", "ndjson"]},
               "ndjson streams the whole range as JSON lines"),
    ]
    event = _json(_ref("Event"), "an event")
    topic = _json(_ref("Topic"), "a topic version")
    paths: dict[str, Any] = {
        "/v1/topics": {"post": _op("Create a topic (and its meta topic)", {
            "201": topic}, body={**topic_settings, "required": ["name"]}, auth=True)},
        "/v1/topics/{cid}": {
            "get": _op("A topic descriptor", {"200": topic}, params=[_PATH_CID]),
            "patch": _op("Publish a new version of the topic (author only)", {"200": topic},
                         params=[_PATH_CID], body=topic_settings, auth=True),
        },
        "/v1/topics/{cid}/versions": {"get": _op("Every version, newest first", {
            "200": _json({"type": "object", "properties": {"versions": {
                "type": "array", "items": _ref("Topic")}}}, "versions")}, params=[_PATH_CID])},
        "/v1/topics/{cid}/events": {
            "post": _op("Publish an event", {"201": event}, params=[_PATH_CID],
                        body=_ref("PublishRequest"), auth=True),
            "get": _op("History from the delivery log", {
                "200": {"description": "a page, or NDJSON",
                        "content": {"application/json": {"schema": _ref("HistoryPage")},
                                    "application/x-ndjson": {"schema": _ref("Event")}}}},
                params=history_params),
        },
        "/v1/topics/{cid}/stream": {"get": _op("Live events as Server-Sent Events", {
            "200": {"description": "an event stream; id: is the delivery-log position",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
            params=[_PATH_CID,
                    _param("from", "query", {"type": "string"},
                           "earliest | latest | a position | an event CID | a time"),
                    _param("Last-Event-ID", "header", {"type": "string"},
                           "resume after this position")])},
        "/v1/topics/{cid}/replay": {"get": _op(
            "The topic's history from its CID alone (heads records and a DHT walk)", {
                "200": {"description": "NDJSON, oldest first in causal order",
                        "content": {"application/x-ndjson": {"schema": _ref("Event")}}},
                "422": _PROBLEM},
            params=[_PATH_CID,
                    _param("since", "query", {"type": "string"},
                           "exclusive: an event CID or a time (created)"),
                    _param("until", "query", {"type": "string"},
                           "inclusive: an event CID or a time (created, exclusive)"),
                    _param("limit", "query",
                           {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                           "at most this many events")])},
        "/v1/events/{cid}": {"get": _op("An event by CID (local store, then the DHT)",
                                        {"200": event},
                                        params=[_param("cid", "path", _CID, "event CID")])},
        "/v1/subscriptions": {"get": _op("Subscriptions and their log positions", {
            "200": _json({"type": "object", "properties": {"subscriptions": {
                "type": "array", "items": _ref("Subscription")}}}, "subscriptions")})},
        "/v1/subscriptions/{cid}": {
            "put": _op("Subscribe (replay=true backfills the whole history)", {
                "200": _json(_ref("Subscription"), "already subscribed"),
                "201": _json(_ref("Subscription"), "subscribed")},
                params=[_PATH_CID, _param("replay", "query", {"type": "boolean"},
                                          "backfill the whole history")], auth=True),
            "delete": _op("Unsubscribe", {"204": {"description": "unsubscribed"}},
                          params=[_PATH_CID], auth=True),
        },
        "/v1/node": {"get": _op("Identity and addresses", {
            "200": _json({"type": "object"}, "the node")})},
        "/v1/node/routing": {"get": _op("Closest known DHT contacts", {
            "200": _json({"type": "object"}, "contacts")},
            params=[_param("k", "query", {"type": "integer", "minimum": 1, "maximum": 1000},
                           "how many")])},
        "/v1/node/trees": {"get": _op("This node's place in each topic tree", {
            "200": _json({"type": "object"}, "trees")})},
        "/v1/health": {"get": _op("Liveness", {"200": _json({"type": "object"}, "ok"),
                                               "503": _PROBLEM})},
        "/metrics": {"get": _op("Prometheus metrics", {"200": {
            "description": "text format 0.0.4",
            "content": {"text/plain": {"schema": {"type": "string"}}}}})},
        "/v1/openapi.json": {"get": _op("This document", {
            "200": _json({"type": "object"}, "OpenAPI 3.1")})},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "pulsarcast node API", "version": "1.0.0",
                 "description": "Create topics, subscribe, publish, replay and stream "
                                "events of a pulsarcast node. See docs/api.md."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
