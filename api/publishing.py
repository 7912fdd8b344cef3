"""Publishing through the API: one event per JSON request, or many in one NDJSON request.

One request per event costs the node an HTTP request's parsing and answer per event: with
8 requests in flight a node on loopback took 1,435 publishes/s, against 2,900/s for the
same node publishing from its own process (2026-11-28). A writer with thousands of rows —
the Spark sink, a bulk import — sends them as a batch instead:
``POST /v1/topics/{cid}/events`` with ``Content-Type: application/x-ndjson``, one publish
body per line (the JSON request's fields), at most :data:`BATCH_EVENTS` lines and
:data:`BATCH_BYTES` bytes.

Every line is checked before any is published: a malformed line refuses the whole batch
(``400``, naming the line) and nothing is published. Then the events are published in line
order, up to :data:`BATCH_IN_FLIGHT` at a time (a node links its own events in the order
their publishes begin, so the lines of a batch follow each other in the topic as they do
in the body), and the answer is NDJSON, one line per input line, in order: ``{"cid": ...}``
for an acknowledged event, or ``{"error": <problem document>}`` — the same status and
type the single request would have answered. One line's failure does not stop the others:
each outcome is its own, as for that many single requests.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from dag import CID, EventDescriptor, TopicDescriptor, check_event_key
from dag.errors import SchemaError
from pulsar import (
    Node,
    NotPersisted,
    NotRecorded,
    PayloadTooLarge,
    PublishError,
    StorageFull,
)

from .common import NDJSON, check_fields, raw_body
from .limits import BATCH_BYTES, BATCH_EVENTS, PAYLOAD_BYTES
from .problems import Problem, problem_document
from .strict_json import JsonRejected, strict_loads
from .views import parse_cid, parse_payload

__all__ = ["BATCH_BYTES", "BATCH_EVENTS", "BATCH_IN_FLIGHT", "PUBLISH_FIELDS", "RETRY_AFTER",
           "WRITE_REFUSALS", "Publication", "WriteRefused", "check_key", "parse_publication",
           "publish_batch", "publish_one", "refusal"]

PUBLISH_FIELDS: Final = frozenset({"json", "text", "base64", "content_type", "parent", "key"})
BATCH_IN_FLIGHT: Final = 64
"""Publishes of one batch under way at once: enough to keep the node's write path full
(64 gave 1,810/s over single requests, 8 gave 1,435/s), few enough that one batch cannot
hold thousands of DHT stores open."""
RETRY_AFTER: Final = 5
"""Seconds a client is told to wait before it tries again a write the DHT did not take:
the node's contacts are re-probed and re-found within about that (docs/operations.md)."""


@dataclass(frozen=True, slots=True)
class Publication:
    """One event to publish, as a request gave it."""

    payload: bytes
    content_type: str | None
    parent: CID | None
    key: str | None


def check_key(key: Any) -> None:
    """A publish's ``key``: null, or 1 to 256 bytes of UTF-8 without control characters."""
    if key is None:
        return
    if not isinstance(key, str):
        raise Problem(400, "invalid-field", "key must be a string or null")
    try:
        check_event_key(key)
    except SchemaError as exc:
        raise Problem(400, "invalid-field", f"key: {exc}") from None


def parse_publication(body: dict[str, Any]) -> Publication:
    """A JSON publish body, checked: the fields, the payload, the parent and the key."""
    check_fields(body, PUBLISH_FIELDS)
    payload, content_type = parse_payload(body, PAYLOAD_BYTES)
    parent = body.get("parent")
    key = body.get("key")
    check_key(key)
    return Publication(payload, content_type,
                       None if parent is None else parse_cid(parent, "parent"), key)


WriteRefused = NotPersisted | StorageFull | PayloadTooLarge | PublishError
"""The node's refusals of a write (a publish, a topic created or updated)."""
WRITE_REFUSALS: Final = (NotPersisted, StorageFull, PayloadTooLarge, PublishError)
"""The same, for ``except``."""


def refusal(exc: WriteRefused) -> Problem:
    """The problem a client is answered for one of the node's refusals of a write."""
    match exc:
        case NotRecorded():
            # Stored and sent but not yet named by a heads record: *indeterminate* (it may
            # still be delivered), so a client does not count it as refused.
            return Problem(503, "not-recorded", str(exc), retry_after=RETRY_AFTER,
                           indeterminate=True)
        case NotPersisted():
            return Problem(503, "not-persisted", str(exc), retry_after=RETRY_AFTER,
                           indeterminate=False)
        case StorageFull():
            return Problem(507, "storage-full", str(exc), retry_after=RETRY_AFTER)
        case PayloadTooLarge():
            return Problem(413, "payload-too-large", str(exc))
        case _:
            return Problem(403, "publish-refused", str(exc))


async def publish_one(node: Node, topic: CID, publication: Publication) -> EventDescriptor:
    """Publish; the node's refusals as problems."""
    try:
        return await node.publish(topic, publication.payload, parent=publication.parent,
                                  content_type=publication.content_type, key=publication.key)
    except WRITE_REFUSALS as exc:
        raise refusal(exc) from None


def _lines(raw: bytes) -> list[Publication]:
    """Every line of a batch body, checked; the first bad one refuses the batch."""
    publications: list[Publication] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        if len(publications) == BATCH_EVENTS:
            raise Problem(413, "payload-too-large", f"a batch holds at most {BATCH_EVENTS} "
                          "events")
        try:
            body = strict_loads(line)
        except JsonRejected as exc:
            raise Problem(400, "invalid-json", f"line {number}: {exc}") from None
        if not isinstance(body, dict):
            raise Problem(400, "invalid-json", f"line {number} must be a JSON object")
        try:
            publications.append(parse_publication(body))
        except Problem as problem:
            raise Problem(problem.status, problem.kind, f"line {number}: {problem.detail}",
                          **problem.extra) from None
    if not publications:
        raise Problem(400, "bad-request", "the batch holds no events")
    return publications


async def publish_batch(request: web.Request, node: Node, topic: TopicDescriptor
                        ) -> web.Response:
    """``POST /v1/topics/{cid}/events`` with an NDJSON body (see the module docstring)."""
    publications = _lines(await raw_body(request, BATCH_BYTES))
    gate = asyncio.Semaphore(BATCH_IN_FLIGHT)

    async def outcome(publication: Publication) -> dict[str, Any]:
        async with gate:
            try:
                event = await publish_one(node, topic.cid, publication)
            except Problem as problem:
                return {"error": problem_document(problem.status, problem.kind,
                                                  problem.detail, **problem.extra)}
        return {"cid": str(event.cid)}

    # Tasks are created, and so take the gate, in line order: the publishes begin in it.
    results = await asyncio.gather(*(outcome(p) for p in publications))
    body = "".join(json.dumps(result) + "\n" for result in results)
    return web.Response(text=body, content_type=NDJSON)
