"""The OpenAPI 3.1 document the node serves at ``/v1/openapi.json``.

Built from small helpers rather than written out as one literal, so each path says only
what is particular to it; the problem types come from :data:`api.problems.PROBLEM_TYPES`
and every limit from :mod:`api.limits`, the same constants the handlers enforce.

It describes what the server accepts as closely as JSON Schema can. What JSON Schema cannot
say is written in descriptions and checked by the server with a ``400``: a CID's multihash,
a name's length in UTF-8 *bytes* (``maxLength`` counts characters, so it is the bound for
ASCII names), the 7 KiB encoded size of a topic descriptor, the calendar validity of a
date-time, and a JSON body's nesting depth (``x-max-depth``).
"""

from __future__ import annotations

from typing import Any

from dag.descriptors import (
    CONTENT_TYPE_PATTERN,
    MAX_CONTENT_TYPE,
    MAX_EVENT_KEY,
    MAX_MERGES,
    MAX_RETENTION,
)
from pulsar.runtime import consumer_config as consumer

from . import limits, publishing
from .history import SECONDS_PATTERN, SEQ_PATTERN
from .page import ASSETS
from .problems import PROBLEM_BASE, PROBLEM_TYPES

__all__ = ["openapi_document"]

_CID = {"type": "string", "pattern": "^b[a-z2-7]+$", "description": "CIDv1, base32"}
_PEER = {"type": "string", "pattern": "^[1-9A-HJ-NP-Za-km-z]+$",
         "description": "libp2p peer id, base58btc (12D3KooW...)"}
_NULLABLE_CID = {"oneOf": [_CID, {"type": "null"}]}
_SEQ = {"type": "string", "pattern": f"^{SEQ_PATTERN}$",
        "description": f"a delivery-log position, 0..{limits.SEQ_MAX}"}
_TIME = {"anyOf": [
    {"type": "string", "pattern": f"^{SECONDS_PATTERN}$",
     "description": "seconds since the epoch"},
    {"type": "string", "format": "date-time", "description": "RFC 3339, with a time zone"},
]}
_POSITION = {"anyOf": [_SEQ, _CID]}


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
    # 503: the node is stopping, or the connection caps are reached (docs/operations.md).
    op: dict[str, Any] = {"summary": summary,
                          "responses": {**responses, "4XX": _PROBLEM, "503": _PROBLEM}}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": body, "x-max-depth": limits.JSON_DEPTH,
            "x-max-bytes": limits.BODY_BYTES}}}
    if auth:
        op["security"] = [{"bearer": []}]
    return op


_KEY: dict[str, Any] = {
    "type": "string", "minLength": 1, "maxLength": MAX_EVENT_KEY,
    "pattern": "^[^\\x00-\\x1f\\x7f]+$",
    "description": f"the event's key, signed by its author: 1 to {MAX_EVENT_KEY} bytes of "
                   "UTF-8 without control characters; a compacted topic keeps only the "
                   "newest event of each key"}


def _raw_upload(op: dict[str, Any]) -> dict[str, Any]:
    """The publish operation also takes the payload itself as the body (streamed, up to the
    node's limit on an event), its media type and parent as query parameters."""
    op["requestBody"]["content"]["application/octet-stream"] = {
        "schema": {"type": "string", "format": "binary"},
        "x-max-bytes": limits.RAW_PAYLOAD_BYTES}
    op["parameters"] = [*op["parameters"],
                        _param("content_type", "query",
                               {"type": "string", "maxLength": MAX_CONTENT_TYPE,
                                "pattern": f"^{CONTENT_TYPE_PATTERN}$"},
                               "raw upload: the payload's media type"),
                        _param("parent", "query", _CID, "raw upload: a CUSTOM parent"),
                        _param("key", "query", _KEY, "raw upload: the event's key")]
    return op


def _batch_upload(op: dict[str, Any]) -> dict[str, Any]:
    """The publish operation also takes many events at once: an NDJSON body, one
    ``PublishRequest`` a line, answered with one outcome a line, in order."""
    op["requestBody"]["content"]["application/x-ndjson"] = {
        "schema": _ref("PublishRequest"), "x-max-lines": publishing.BATCH_EVENTS,
        "x-max-bytes": publishing.BATCH_BYTES}
    op["responses"]["200"] = {
        "description": "a batch: one line per event, in order: {cid} or {error: problem}",
        "content": {"application/x-ndjson": {"schema": {"oneOf": [
            {"type": "object", "required": ["cid"], "properties": {"cid": _CID}},
            {"type": "object", "required": ["error"], "properties": {"error": _ref("Problem")}},
        ]}}}}
    return op


def _param(name: str, where: str, schema: dict[str, Any], description: str,
           required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path",
            "schema": schema, "description": description}


_PATH_CID = _param("cid", "path", _CID, "a topic CID (any version)")
_CONSUMER_NAME = {"type": "string", "minLength": 1, "maxLength": consumer.MAX_NAME,
                  "pattern": f"^{consumer.NAME_PATTERN}$",
                  "description": "letters, digits, '_' and '-'"}
_PATH_NAME = _param("name", "path", _CONSUMER_NAME, "the consumer's name")


def _consumer_schemas() -> dict[str, Any]:
    """The durable consumers' settings, info, messages and acknowledgements."""
    seconds = {"type": "number", "exclusiveMinimum": 0, "maximum": consumer.MAX_WAIT}
    policy = {"oneOf": [
        {"enum": ["all", "last", "new"]},
        {"type": "object", "required": ["start_seq"], "additionalProperties": False,
         "properties": {"start_seq": {"type": "integer", "minimum": 1,
                                      "maximum": consumer.MAX_SEQ}}},
        {"type": "object", "required": ["start_time"], "additionalProperties": False,
         "properties": {"start_time": {"anyOf": [
             {"type": "number", "description": "seconds since the epoch"},
             {"type": "string", "format": "date-time",
              "description": "RFC 3339, with a time zone"}]}}},
    ], "description": "where a new consumer starts: the oldest entry kept, the newest, "
                      "only new ones, a log position, or the first entry delivered at or "
                      "after a time"}
    config: dict[str, Any] = {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {
            "name": _CONSUMER_NAME,
            "deliver_policy": policy,
            "ack_policy": {"enum": ["explicit", "none", "all"]},
            "ack_wait": {**seconds, "description": "seconds before an unacknowledged message "
                                                   "is delivered again (default 30)"},
            "max_deliver": {"type": "integer", "minimum": -1,
                            "maximum": consumer.MAX_DELIVER_LIMIT, "not": {"const": 0},
                            "description": "deliveries before a message that times out "
                                           "again is set aside; -1 (default): no limit"},
            "backoff": {"type": "array", "items": seconds, "maxItems": consumer.MAX_BACKOFF,
                        "description": "the n-th redelivery waits backoff[min(n-1, len-1)] "
                                       "instead of ack_wait"},
            "replay_policy": {"enum": ["instant", "original"]},
            "max_ack_pending": {"type": "integer", "minimum": 1,
                                "maximum": consumer.MAX_ACK_PENDING,
                                "description": "unacknowledged messages it may hold "
                                               "(default 1000)"},
            "group": {"type": "string", "pattern": f"^{consumer.NAME_PATTERN}$",
                      "description": "consumers of the same group on the same topic, on "
                                     "any nodes, share its events (ack_policy explicit "
                                     "only)"},
        },
        "if": {"required": ["group"]},
        "then": {"properties": {"ack_policy": {"const": "explicit"}}},
    }
    stored = {**config, "required": [p for p in config["properties"] if p != "group"]}
    counters = ["start", "delivered", "ack_floor", "num_pending", "num_ack_pending",
                "num_redelivered", "redeliveries", "num_terminated",
                "num_max_deliver_reached", "num_skipped"]
    info = {
        "type": "object",
        "required": ["topic", "name", "config", "created_at", *counters, "last_skipped"],
        "properties": {
            "topic": _CID, "name": {"type": "string"}, "config": stored,
            "created_at": {"type": "number"},
            **{c: {"type": "integer"} for c in counters},
            "last_skipped": {"oneOf": [{"type": "null"}, {
                "type": "array", "items": {"type": "integer"}, "minItems": 2,
                "maxItems": 2}]},
            "group": {"oneOf": [{"type": "null"}, {
                "type": "object",
                "required": ["name", "epoch", "ready", "num_watched", "taken_over",
                             "duplicates", "members"],
                "properties": {
                    "name": {"type": "string"}, "epoch": {"type": "integer"},
                    "ready": {"type": "boolean"}, "num_watched": {"type": "integer"},
                    "taken_over": {"type": "integer"}, "duplicates": {"type": "integer"},
                    "members": {"type": "array", "items": {
                        "type": "object",
                        "required": ["peer", "name", "incarnation", "since", "me",
                                     "heard_ago"],
                        "properties": {"peer": {"type": "string"},
                                       "name": {"type": "string"},
                                       "incarnation": {"type": "integer"},
                                       "since": {"type": "number"},
                                       "me": {"type": "boolean"},
                                       "heard_ago": {"type": "number"}}}}}}]},
        },
    }
    message = {"allOf": [_ref("Event"), {
        "type": "object", "required": ["delivery", "seq", "delivered_at"],
        "properties": {"delivery": {
            "type": "object", "required": ["id", "count"],
            "properties": {"id": {"type": "integer", "description": "what an ack names: "
                                  "the event's log position"},
                           "count": {"type": "integer", "minimum": 1}}}}}]}
    ids = {"type": "array", "minItems": 1, "maxItems": consumer.MAX_ACK_IDS,
           "items": {"type": "integer", "minimum": 1, "maximum": consumer.MAX_SEQ}}
    return {
        "ConsumerConfig": config,
        "ConsumerInfo": info,
        "ConsumerMessage": message,
        "FetchRequest": {"type": "object", "additionalProperties": False, "properties": {
            "batch": {"type": "integer", "minimum": 1, "maximum": consumer.MAX_BATCH,
                      "description": "at most this many messages (default 1)"},
            "expires": {"type": "number", "minimum": 0, "maximum": consumer.MAX_EXPIRES,
                        "description": "seconds to wait for a first message (default 0)"}}},
        "AckRequest": {
            "type": "object", "required": ["ids"], "additionalProperties": False,
            "properties": {"ids": ids, "kind": {"enum": list(consumer.ACK_KINDS)},
                           "delay": {"type": "number", "minimum": 0,
                                     "maximum": consumer.MAX_WAIT,
                                     "description": "nak only: deliver again after this "
                                                    "many seconds"}},
            "anyOf": [{"required": ["kind"], "properties": {"kind": {"const": "nak"}}},
                      {"not": {"required": ["delay"]}}]},
        "CommitRequest": {
            "type": "object", "required": ["through"], "additionalProperties": False,
            "properties": {"through": {
                "type": "integer", "minimum": 1, "maximum": consumer.MAX_SEQ,
                "description": "settle every log position up to this one, handed out or not "
                               "(ack_policy all only; at most the log's last position)"}}},
        "AckAnswer": {"type": "object", "required": ["kind", "done", "unknown"],
                      "properties": {"kind": {"enum": list(consumer.ACK_KINDS)},
                                     "done": {"type": "array", "items": {"type": "integer"}},
                                     "unknown": {"type": "array",
                                                 "items": {"type": "integer"}}}},
    }


def _consumer_paths() -> dict[str, Any]:
    info = _json(_ref("ConsumerInfo"), "the consumer")
    base = "/v1/topics/{cid}/consumers"
    named = [_PATH_CID, _PATH_NAME]
    return {
        base: {
            "post": _op("Make a durable consumer of a topic this node follows", {
                "201": info, "200": _json(_ref("ConsumerInfo"), "it exists with these "
                                          "settings"), "409": _PROBLEM, "422": _PROBLEM},
                params=[_PATH_CID], body=_ref("ConsumerConfig"), auth=True),
            "get": _op("The topic's consumers at this node", {
                "200": _json({"type": "object", "required": ["topic", "consumers"],
                              "properties": {"topic": _CID, "consumers": {
                                  "type": "array", "items": _ref("ConsumerInfo")}}},
                             "consumers")}, params=[_PATH_CID]),
        },
        base + "/{name}": {
            "get": _op("A consumer: settings, position, counters", {"200": info},
                       params=named),
            "delete": _op("Remove a consumer (and what it had pending)", {
                "204": {"description": "removed"}}, params=named, auth=True),
        },
        base + "/{name}/fetch": {"post": _op(
            "Pull: up to batch messages, waiting up to expires seconds for the first", {
                "200": _json({"type": "object", "required": ["messages"], "properties": {
                    "messages": {"type": "array", "items": _ref("ConsumerMessage")}}},
                    "the messages (none when expires passed first)")},
            params=named, body=_ref("FetchRequest"), auth=True)},
        base + "/{name}/ack": {"post": _op(
            "Settle delivered messages: ack, nak (optionally after a delay), term, progress", {
                "200": _json(_ref("AckAnswer"), "what it applied to, and the ids not "
                             "pending")}, params=named, body=_ref("AckRequest"), auth=True)},
        base + "/{name}/commit": {"post": _op(
            "Settle every log position up to one, handed out or not (a reader by position)", {
                "200": _json(_ref("ConsumerInfo"), "the consumer afterwards"),
                "409": _PROBLEM}, params=named, body=_ref("CommitRequest"), auth=True)},
        base + "/{name}/stream": {"get": _op("Push: messages as Server-Sent Events", {
            "200": {"description": "an event stream; id: is the delivery id, each event a "
                                   "message, data its JSON",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
            params=named)},
    }


def openapi_document() -> dict[str, Any]:
    peers = {"type": "array", "items": _PEER, "maxItems": limits.PEERS}
    rule = {"oneOf": [{"type": "null"}, {"type": "boolean"}, peers]}
    name_bytes = limits.TOPIC_NAME_BYTES
    bound = {"type": "integer", "minimum": 1, "maximum": MAX_RETENTION}
    retention = {
        "type": "object", "minProperties": 1, "additionalProperties": False,
        "properties": {"max_age": {"oneOf": [{"type": "null"}, {**bound,
                                                                "description": "seconds"}]},
                       "max_events": {"oneOf": [{"type": "null"}, bound]},
                       "compact": {"type": "boolean", "description":
                                   "keep only the newest event of each key"}},
        "description": "how much history every node keeps (null on an update: all of it); "
                       "a read of the log from a position it cut answers 410 "
                       "before-retention; a compacted log skips the positions of events "
                       "a newer one with the same key replaced",
    }
    topic_settings = {
        "type": "object",
        "description": f"the encoded topic descriptor must fit {limits.DESCRIPTOR_BYTES} "
                       "bytes (about 150 peer ids in all, fewer with long names)",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": name_bytes,
                     "description": f"1..{name_bytes} bytes in UTF-8"},
            "allowed_publishers": {"oneOf": [{"type": "null"}, peers]},
            "request_to_publish": rule,
            "event_linking": {"enum": ["LAST_SEEN", "CUSTOM"]},
            "subtopics": {
                "type": "object", "maxProperties": limits.SUBTOPICS,
                "propertyNames": {"minLength": 1, "maxLength": limits.SUBTOPIC_NAME_BYTES,
                                  "not": {"const": "meta"}},
                "additionalProperties": _CID,
                "description": "name -> topic CID; names of 1.."
                               f"{limits.SUBTOPIC_NAME_BYTES} bytes, not meta",
            },
            "retention": {"oneOf": [{"type": "null"}, retention]},
        },
        "additionalProperties": False,
    }
    peer_list = {"type": "array", "items": _PEER}
    counters = {"type": "object", "additionalProperties": {"type": "integer"}}
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
                "retention": {"oneOf": [{"type": "null"}, {
                    "type": "object", "properties": {
                        "max_age": {"type": ["integer", "null"]},
                        "max_events": {"type": ["integer", "null"]},
                        "compact": {"type": "boolean"}}}]},
            },
        },
        "Event": {
            "type": "object",
            "required": ["cid", "topic", "author", "publisher", "parent", "merges", "created",
                         "payload", "payload_size", "content_type", "key"],
            "properties": {
                "cid": _CID, "topic": _CID, "author": _PEER, "publisher": _PEER,
                "parent": _NULLABLE_CID,
                "merges": {"type": "array", "items": _CID, "maxItems": MAX_MERGES,
                           "description": "other heads the publisher linked"},
                "created": {"type": "string"},
                "payload": {"type": "string", "contentEncoding": "base64",
                            "description": "the payload's bytes, always"},
                "payload_size": {"type": "integer"}, "payload_link": _CID,
                "content_type": {"type": ["string", "null"],
                                 "description": "media type the author signed, if any"},
                "key": {"oneOf": [{"type": "null"}, _KEY]},
                "json": {"description": "the payload's JSON value, when its content_type "
                                        "is application/json or *+json and it parses"},
                "text": {"type": "string",
                         "description": "the payload as text, when its content_type is "
                                        "text/* in UTF-8 and it decodes"},
                "seq": {"type": "integer", "description": "delivery-log position (cursor)"},
                "delivered_at": {"type": "number"},
            },
        },
        "PublishRequest": {
            "type": "object",
            "description": f"exactly one of json, text, base64; the payload at most "
                           f"{limits.PAYLOAD_BYTES} bytes. content_type defaults to "
                           "application/json for json, text/plain; charset=utf-8 for "
                           "text, none for base64",
            "properties": {"json": {"description": "any JSON value, published compact"},
                           "text": {"type": "string"},
                           "base64": {"type": "string", "contentEncoding": "base64",
                                      "pattern": "^([A-Za-z0-9+/]{4})*"
                                                 "([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"},
                           "content_type": {
                               "oneOf": [{"type": "null"},
                                         {"type": "string", "maxLength": MAX_CONTENT_TYPE,
                                          "pattern": f"^{CONTENT_TYPE_PATTERN}$"}],
                               "description": "the payload's media type"},
                           "parent": _NULLABLE_CID,
                           "key": {"oneOf": [{"type": "null"}, _KEY]}},
            "oneOf": [{"required": [k]} for k in ("json", "text", "base64")],
            "additionalProperties": False,
        },
        "Subscription": {"type": "object", "required": ["topic", "position"], "properties": {
            "topic": _CID, "position": {"type": "integer"}}},
        "HistoryPage": {"type": "object", "required": ["topic", "events"], "properties": {
            "topic": _CID, "events": {"type": "array", "items": _ref("Event")},
            "next_cursor": {"type": "string"}}},
        "Tree": {
            "type": "object",
            "required": ["topic", "parents", "children", "lazy", "grafted", "is_root",
                         "subscribed", "attached", "rtt"],
            "properties": {
                "topic": _CID,
                "parents": peer_list, "children": peer_list,
                "lazy": {**peer_list, "description": "Plumtree links that only announce"},
                "grafted": {**peer_list, "description": "links made eager by a GRAFT"},
                "is_root": {"type": "boolean"}, "subscribed": {"type": "boolean"},
                "attached": {"type": "boolean"},
                "rtt": {"type": "object", "description": "peer id -> smoothed RTT and RTO "
                        "in ms of each neighbour above, null until measured",
                        "additionalProperties": {"oneOf": [{"type": "null"}, {
                            "type": "object", "required": ["srtt_ms", "rto_ms"],
                            "properties": {"srtt_ms": {"type": "number"},
                                           "rto_ms": {"type": "number"}}}]}},
            },
        },
        **_consumer_schemas(),
        "Metrics": {
            "type": "object",
            "required": ["at", "uptime_s", "subscriptions", "node", "transport", "dht"],
            "properties": {
                "at": {"type": "number", "description": "when read, seconds since the epoch"},
                "uptime_s": {"type": "number"},
                "subscriptions": {"type": "integer"},
                "node": counters, "transport": counters, "dht": counters,
            },
        },
    }
    history_params = [
        _PATH_CID,
        _param("cursor", "query", _POSITION,
               "exclusive start: a delivery-log position or an event CID"),
        _param("since", "query", _TIME, "delivered at or after (epoch s or RFC 3339)"),
        _param("until", "query", _TIME, "delivered before (epoch s or RFC 3339)"),
        _param("limit", "query", {"type": "integer", "minimum": 1,
                                  "maximum": limits.PAGE_EVENTS},
               f"page size (default 100); a page also stops at {limits.PAGE_BYTES} bytes "
               "of events"),
        _param("direction", "query", {"enum": ["forward", "backward"]}, "paging direction"),
        _param("format", "query", {"enum": ["json", "ndjson", "blocks"]},
               "ndjson streams the whole range as JSON lines; blocks streams the stored "
               "event blocks as length-prefixed binary records "
               "(application/vnd.pulsarcast.log-blocks, see docs/api.md)"),
    ]
    event = _json(_ref("Event"), "an event")
    topic = _json(_ref("Topic"), "a topic version")
    paths: dict[str, Any] = {
        "/v1/topics": {"post": _op("Create a topic (and its meta topic)", {
            "201": topic, "507": _PROBLEM}, body={**topic_settings, "required": ["name"]},
            auth=True)},
        "/v1/topics/{cid}": {
            "get": _op("A topic descriptor", {"200": topic}, params=[_PATH_CID]),
            "patch": _op("Publish a new version of the topic (author only)",
                         {"200": topic, "507": _PROBLEM},
                         params=[_PATH_CID], body={**topic_settings, "minProperties": 1},
                         auth=True),
        },
        "/v1/topics/{cid}/versions": {"get": _op("Every version, newest first", {
            "200": _json({"type": "object", "properties": {"versions": {
                "type": "array", "items": _ref("Topic")}}}, "versions")}, params=[_PATH_CID])},
        "/v1/topics/{cid}/events": {
            "post": _batch_upload(_raw_upload(_op("Publish an event", {"201": event,
                                                                        "507": _PROBLEM},
                                                  params=[_PATH_CID],
                                                  body=_ref("PublishRequest"), auth=True))),
            "get": _op("History from the delivery log", {
                "200": {"description": "a page, NDJSON, or the bulk format",
                        "content": {"application/json": {"schema": _ref("HistoryPage")},
                                    "application/x-ndjson": {"schema": _ref("Event")},
                                    "application/vnd.pulsarcast.log-blocks": {
                                        "schema": {"type": "string", "format": "binary"}}}}},
                params=history_params),
        },
        "/v1/topics/{cid}/stream": {"get": _op("Live events as Server-Sent Events", {
            "200": {"description": "an event stream; id: is the delivery-log position",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
            params=[_PATH_CID,
                    _param("from", "query", {"anyOf": [
                        {"enum": ["earliest", "latest"]}, _SEQ, _CID, _TIME]},
                           "earliest | latest | a position | an event CID | a time"),
                    _param("Last-Event-ID", "header", _POSITION,
                           "resume after this position")])},
        "/v1/topics/{cid}/replay": {"get": _op(
            "The topic's history from its CID alone (heads records and a DHT walk)", {
                "200": {"description": "NDJSON, oldest first in causal order",
                        "content": {"application/x-ndjson": {"schema": _ref("Event")}}},
                "422": _PROBLEM},
            params=[_PATH_CID,
                    _param("since", "query", {"anyOf": [_CID, _TIME]},
                           "exclusive: an event CID, or a time the events' created must reach"),
                    _param("until", "query", {"anyOf": [_CID, _TIME]},
                           "inclusive: an event CID, or a time the events' created is before"),
                    _param("limit", "query",
                           {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                           "at most this many events"),
                    _param("partial", "query", {"enum": ["true", "false", "1", "0"]},
                           "true: what could be fetched, instead of 503 replay-incomplete")])},
        **_consumer_paths(),
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
            params=[_param("k", "query", {"type": "integer", "minimum": 1,
                                          "maximum": limits.ROUTING_K}, "how many")])},
        "/v1/node/trees": {"get": _op(
            "This node's place in each topic tree, its repair links and their RTTs", {
                "200": _json({"type": "object", "required": ["trees"], "properties": {
                    "trees": {"type": "array", "items": _ref("Tree")}}}, "trees")})},
        "/v1/node/metrics": {"get": _op("The counters of /metrics as JSON (for rates)", {
            "200": _json(_ref("Metrics"), "counters")})},
        "/v1/node/advisories": {"get": _op(
            "Advisories: consumer messages set aside after max_deliver, terminated, skipped "
            "(a JSON page, or Server-Sent Events with Accept: text/event-stream)", {
                "200": {"description": "a page, or the stream (id: the advisory's id, "
                                       "event: advisory / lost / end)",
                        "content": {
                            "application/json": {"schema": {
                                "type": "object",
                                "required": ["advisories", "last_id", "lost_before"],
                                "properties": {
                                    "advisories": {"type": "array", "items": {
                                        "type": "object",
                                        "required": ["id", "kind", "at"]}},
                                    "last_id": {"type": "integer"},
                                    "lost_before": {"type": ["integer", "null"]}}}},
                            "text/event-stream": {"schema": {"type": "string"}}}}},
            params=[_param("after", "query",
                           {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                           "only advisories with a larger id (also Last-Event-ID)"),
                    _param("Last-Event-ID", "header",
                           {"type": "string", "pattern": "^[0-9]{1,18}$"},
                           "resume the stream after this advisory id")])},
        "/v1/auth/check": {"post": _op("Check the API token; changes nothing", {
            "204": {"description": "the token is accepted"}}, auth=True)},
        "/v1/health": {"get": _op("Liveness", {"200": _json({"type": "object"}, "ok"),
                                               "503": _PROBLEM})},
        "/metrics": {"get": _op("Prometheus metrics", {"200": {
            "description": "text format 0.0.4",
            "content": {"text/plain": {"schema": {"type": "string"}}}}})},
        "/": {"get": _op("The node's web page", {"200": {
            "description": "HTML (no token needed; its forms send the one the user types)",
            "content": {"text/html": {"schema": {"type": "string"}}}}})},
        "/static/{name}": {"get": _op("A file the web page loads", {"200": {
            "description": "the script or the style sheet",
            "content": {"text/javascript": {"schema": {"type": "string"}},
                        "text/css": {"schema": {"type": "string"}}}}},
            params=[_param("name", "path", {"enum": sorted(ASSETS)}, "file name")])},
        "/v1/openapi.json": {"get": _op("This document", {
            "200": _json({"type": "object"}, "OpenAPI 3.1")})},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "pulsarcast node API", "version": "1.0.0",
                 "description": "Create topics, subscribe, publish, replay and stream "
                                "events of a pulsarcast node. See docs/api.md."},
        "paths": paths,
        "x-limits": dict(limits.LIMITS),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
