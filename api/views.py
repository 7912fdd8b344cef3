"""JSON shapes of descriptors and log entries, and parsing of what clients send.

One place decides how a topic or an event looks over HTTP, so the REST answers, the NDJSON
history, the SSE stream and the Python client agree.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from dag import CID, EventDescriptor, PeerId, TopicDescriptor
from dag.errors import InvalidCID

from .limits import PEERS
from .problems import Problem

__all__ = [
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


def parse_payload(body: dict[str, Any], limit: int) -> bytes:
    """Exactly one of ``json`` (any JSON value, sent compact), ``text`` (UTF-8) or
    ``base64`` (bytes)."""
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
    return data


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
    }


def event_json(
    event: EventDescriptor,
    payload: bytes,
    *,
    seq: int | None = None,
    delivered_at: float | None = None,
) -> dict[str, Any]:
    """``payload`` is the event's bytes (reassembled if they live in a chunk tree)."""
    body: dict[str, Any] = {
        "cid": _text(event.cid),
        "topic": _text(event.topic),
        "author": _text(event.author),
        "publisher": _text(event.publisher),
        "parent": None if event.parent is None else _text(event.parent),
        "created": event.created,
        "payload": base64.b64encode(payload).decode(),
        "payload_size": len(payload),
    }
    if isinstance(event.payload, CID):
        body["payload_link"] = str(event.payload)
    if seq is not None:
        body["seq"] = seq
    if delivered_at is not None:
        body["delivered_at"] = delivered_at
    return body
