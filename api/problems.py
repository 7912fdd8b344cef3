"""Errors as RFC 9457 problem documents (``application/problem+json``).

Every error the API answers has a stable ``type`` a client can branch on, a human ``title``
and ``detail``, and the HTTP ``status``. Handlers raise :class:`Problem`; the middleware turns
it, aiohttp's own HTTP errors (unknown route, wrong method, body too large) and anything
unexpected into a problem document, so a client never sees an HTML page or a stack trace.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pulsar.runtime.errors import BeforeRetention

__all__ = ["PROBLEM_TYPES", "STREAMING", "Problem", "problem_document", "problem_middleware",
           "problem_response"]

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://pulsarcast.dev/problems/"

PROBLEM_TYPES: dict[str, str] = {
    "bad-request": "The request is malformed",
    "invalid-json": "The body is not valid JSON",
    "invalid-field": "A field has a wrong type or value",
    "invalid-cid": "A CID string does not parse",
    "unauthorized": "A valid bearer token is required",
    "not-found": "No such resource",
    "topic-not-found": "Topic not found",
    "event-not-found": "Event not found",
    "not-subscribed": "This node is not subscribed to the topic",
    "publish-refused": "The topic's rules refuse this publication",
    "method-not-allowed": "Method not allowed",
    "request-timeout": "The request body did not arrive in time",
    "payload-too-large": "The request body is too large",
    "unsupported-media-type": "The body must be application/json",
    "unavailable": "The node is not serving (stopping)",
    "not-persisted": "Too few DHT nodes stored it; it was not published",
    "not-recorded": "Stored and sent, but no heads record names it yet; not acknowledged",
    "storage-full": "The node's disk cannot take the write; nothing was published",
    "replay-incomplete": "The history could not be read whole from the network",
    "before-retention": "The topic's retention policy has cut the log before this position",
    "consumer-not-found": "No consumer of that name on this topic at this node",
    "consumer-exists": "A consumer of that name exists with other settings",
    "consumer-limit": "The topic has as many consumers here as it may",
    "invalid-consumer": "The consumer's settings are not acceptable",
    "commit-refused": "The consumer cannot take this commit",
    "internal": "Internal error",
}
"""Slug -> title of every problem type the API uses (also listed in the OpenAPI document)."""


class Problem(Exception):
    """Raised by handlers: becomes a problem document with this status and type."""

    def __init__(
        self, status: int, kind: str, detail: str, *, retry_after: int | None = None,
        **extra: Any,
    ) -> None:
        assert kind in PROBLEM_TYPES, kind
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after
        """Seconds after which the same request may succeed (``Retry-After``); None when
        retrying cannot help."""
        self.extra = extra


def problem_document(status: int, kind: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The RFC 9457 problem document: a response's body, or one line's outcome in a batch."""
    return {"type": PROBLEM_BASE + kind, "title": PROBLEM_TYPES[kind], "status": status,
            "detail": detail, **extra}


def problem_response(
    status: int, kind: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> web.Response:
    body = problem_document(status, kind, detail, **extra)
    return web.Response(
        status=status,
        text=json.dumps(body) + "\n",
        content_type="application/problem+json",
        headers=headers,
    )


STREAMING: web.RequestKey[bool] = web.RequestKey("streaming", bool)
"""Set on a request once its handler has sent the status line of a streamed answer."""

_HTTP_KINDS = {404: "not-found", 405: "method-not-allowed", 413: "payload-too-large"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as problem:
        headers = {"WWW-Authenticate": "Bearer"} if problem.status == 401 else None
        if problem.retry_after is not None:
            headers = {**(headers or {}), "Retry-After": str(problem.retry_after)}
        return problem_response(
            problem.status, problem.kind, problem.detail, headers=headers, **problem.extra
        )
    except BeforeRetention as exc:  # a read of the delivery log, from any endpoint
        if request.get(STREAMING):
            # A stream (NDJSON, bulk) whose reader fell behind the topic's retention
            # mid-way: its status is sent, so end it unfinished, never as a short answer
            # that looks whole.
            log.info("%s %s: %s", request.method, request.path, exc)
            raise ConnectionResetError(str(exc)) from None
        return problem_response(410, "before-retention", str(exc),
                                retained_from=exc.retained_from)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = _HTTP_KINDS.get(exc.status, "bad-request")
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return problem_response(exc.status, kind, exc.reason, headers=headers)
    except ConnectionError:  # the client went away (reset, or lost while we waited)
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return problem_response(500, "internal", "the node could not answer; see its log")
