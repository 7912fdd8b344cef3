"""JSON shapes of descriptors and log entries, and parsing of what clients send.

One place decides how a topic or an event looks over HTTP, so the REST answers, the NDJSON
history, the SSE stream and the Python client agree.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from dag import CID, EventDescriptor, PeerId, TopicDescriptor, check_content_type
from dag.errors import InvalidCID, SchemaError

from .limits import PEERS
from .problems import Problem
from .strict_json import JsonRejected, strict_loads

__all__ = [
    "JSON_TYPE",
    "TEXT_TYPE",
    "decoded_payload",
    "event_json",
    "parse_cid",
    "parse_payload",
    "parse_peers",
    "topic_json",
]


def parse_cid(value: Any, what: str = "cid") -> CID:
    if not isinstance(value, str):
        raise Problem(400, "invalid-cid", f"{what} must be a CID string")
    try:
        return CID.parse(value)
    except (InvalidCID, ValueError) as exc:
        raise Problem(400, "invalid-cid", f"{what}: {exc}") from None


def parse_peers(value: Any, field: str) -> list[PeerId] | bool | None:
    """A publishing rule as clients write it: null (default), true/false, or peer ids."""
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, list) or len(value) > PEERS:
        raise Problem(400, "invalid-field", f"{field} must be null, a boolean or a list of "
                      f"at most {PEERS} peer ids")
    peers = []
    for item in value:
        try:
            peers.append(PeerId.parse(item))
        except (ValueError, TypeError) as exc:
            raise Problem(400, "invalid-field", f"{field}: {item!r} is not a peer id: "
                          f"{exc}") from None
    return peers


JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
_DEFAULT_TYPE: dict[str, str | None] = {"json": JSON_TYPE, "text": TEXT_TYPE, "base64": None}


def parse_payload(body: dict[str, Any], limit: int) -> tuple[bytes, str | None]:
    """The payload and its media type. Exactly one of ``json`` (any JSON value, sent
    compact; ``application/json``), ``text`` (UTF-8; ``text/plain; charset=utf-8``) or
    ``base64`` (bytes, no media type); ``content_type`` names another media type."""
    given = [k for k in ("json", "text", "base64") if k in body]
    if len(given) != 1:
        raise Problem(400, "invalid-field", "give the payload as exactly one of 'json', "
                      "'text' or 'base64'")
    kind = given[0]
    value = body[kind]
    if kind == "json":
        data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    elif kind == "text":
        if not isinstance(value, str):
            raise Problem(400, "invalid-field", "text must be a string")
        data = value.encode()
    else:
        if not isinstance(value, str):
            raise Problem(400, "invalid-field", "base64 must be a string")
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Problem(400, "invalid-field", "base64 is not valid base64") from None
    if len(data) > limit:
        raise Problem(413, "payload-too-large", f"payload is {len(data)} bytes; the limit "
                      f"is {limit}")
    content_type = body.get("content_type", _DEFAULT_TYPE[kind])
    if content_type is not None:
        if not isinstance(content_type, str):
            raise Problem(400, "invalid-field", "content_type must be a string or null")
        try:
            check_content_type(content_type)
        except SchemaError as exc:
            raise Problem(400, "invalid-field", str(exc)) from None
    return data, content_type


def _is_json(content_type: str) -> bool:
    """``application/json`` and the ``+json`` structured-syntax types (RFC 6839)."""
    essence = content_type.split(";", 1)[0].strip().lower()
    return essence == JSON_TYPE or essence.endswith("+json")


def _is_utf8_text(content_type: str) -> bool:
    """``text/*`` whose charset, if named, is UTF-8 (or its ASCII subset)."""
    essence, _, params = content_type.partition(";")
    if not essence.strip().lower().startswith("text/"):
        return False
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower() in ("utf-8", "utf8", "us-ascii")
    return True


def decoded_payload(content_type: str | None, payload: bytes) -> dict[str, Any]:
    """``{"json": value}`` or ``{"text": str}`` for a payload published as JSON or text
    that still parses as such, else nothing: the payload is then read from ``payload``
    (base64). A publisher can label any bytes, so a label that does not fit its bytes
    falls back to base64 rather than failing the whole answer."""
    if content_type is None:
        return {}
    try:
        if _is_json(content_type):
            return {"json": strict_loads(payload)}
        if _is_utf8_text(content_type):
            return {"text": payload.decode("utf-8")}
    except (JsonRejected, UnicodeDecodeError):
        pass
    return {}


_TEXT_CACHE: dict[CID | PeerId, str] = {}
_TEXT_CACHE_SIZE = 4096


def _text(value: CID | PeerId) -> str:
    """The text form of a CID or peer id. base32/base58 encoding was most of the cost of
    an event's JSON (profiled); in a history every event repeats the topic, author and
    publisher and names the previous event as parent, so a small cache answers most."""
    text = _TEXT_CACHE.get(value)
    if text is None:
        if len(_TEXT_CACHE) >= _TEXT_CACHE_SIZE:
            _TEXT_CACHE.clear()  # cheap, never stale: the values are immutable
        text = _TEXT_CACHE[value] = str(value)
    return text


def _rule(rule: Any) -> dict[str, Any]:
    return {"enabled": rule.enabled, "peers": [str(p) for p in rule.peers]}


def topic_json(topic: TopicDescriptor) -> dict[str, Any]:
    return {
        "cid": str(topic.cid),
        "name": topic.name,
        "author": str(topic.author),
        "parent": None if topic.parent is None else str(topic.parent),
        "subtopics": {k: str(v) for k, v in topic.subtopics.items()},
        "created": topic.created,
        "protocol_version": topic.protocol_version,
        "allowed_publishers": _rule(topic.allowed_publishers),
        "request_to_publish": _rule(topic.request_to_publish),
        "event_linking": topic.event_linking.value,
        "retention": None if topic.retention is None else {
            "max_age": topic.retention.max_age, "max_events": topic.retention.max_events,
            "compact": topic.retention.compact},
    }


def event_json(
    event: EventDescriptor,
    payload: bytes,
    *,
    seq: int | None = None,
    delivered_at: float | None = None,
) -> dict[str, Any]:
    """``payload`` is the event's bytes (reassembled if they live in a chunk tree): always
    there as base64, and also as ``json`` or ``text`` when it was published as such."""
    body: dict[str, Any] = {
        "cid": _text(event.cid),
        "topic": _text(event.topic),
        "author": _text(event.author),
        "publisher": _text(event.publisher),
        "parent": None if event.parent is None else _text(event.parent),
        "merges": [_text(m) for m in event.merges],
        "created": event.created,
        "payload": base64.b64encode(payload).decode(),
        "payload_size": len(payload),
        "content_type": event.content_type,
        "key": event.key,
    }
    if event.content_type is not None:
        body.update(decoded_payload(event.content_type, payload))
    if isinstance(event.payload, CID):
        body["payload_link"] = str(event.payload)
    if seq is not None:
        body["seq"] = seq
    if delivered_at is not None:
        body["delivered_at"] = delivered_at
    return body
