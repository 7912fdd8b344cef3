"""A Python client for the REST API of a pulsarcast node.

:class:`PulsarcastClient` is asyncio-first (one method per endpoint, on aiohttp) because the
interesting calls are streams: history that spans many pages and the live SSE tail. Its
:meth:`PulsarcastClient.live` iterator parses Server-Sent Events itself and, when the
connection drops, reconnects with ``Last-Event-ID`` set to the last sequence number it
handed out, so the consumer sees every event of the delivery log exactly once.

:class:`Client` is a blocking facade for scripts and notebooks. It does not repeat any HTTP
logic: it runs a :class:`PulsarcastClient` on a private event loop in a background thread and
waits for each call.

Durable consumers are made and inspected here (:meth:`PulsarcastClient.add_consumer`,
:meth:`~PulsarcastClient.consumer_info`); their messages flow through
:meth:`~PulsarcastClient.consume` (``async for msg in client.consume(topic, "billing"):
... await msg.ack()``), a :class:`ConsumerMessage` each.

Events and topics come back as the JSON objects the API documents (plain dicts), so what a
script reads is what ``curl`` shows; :func:`payload_of` decodes an event's payload bytes,
:func:`payload_value` gives it back as it was published (JSON value, text or bytes).

The client is three modules, each importing only aiohttp and the standard library: the
request plumbing and :class:`ApiError` (:mod:`api.client_http`), the history and live
streams (:mod:`api.client_streams`), and this one, the endpoint methods of
:class:`PulsarcastClient`, the blocking :class:`Client` and the payload helpers. Import
everything from here.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import AsyncIterator, Coroutine, Generator, Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Final, TypeVar

from .client_http import MAX_BODY as MAX_BODY
from .client_http import MAX_LINE as MAX_LINE
from .client_http import PROBLEM_BASE, ApiError, Json, _params
from .client_streams import ConsumerMessage, _ClientStreams

__all__ = ["PROBLEM_BASE", "ApiError", "Client", "ConsumerMessage", "PulsarcastClient",
           "payload_of", "payload_value"]

T = TypeVar("T")


class _Unset:
    """Marks an argument left out, where ``None`` has a meaning of its own (anyone may
    publish)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


def payload_of(event: Mapping[str, Any]) -> bytes:
    """An event's payload bytes (the API sends them as base64)."""
    return base64.b64decode(event["payload"])


def payload_value(event: Mapping[str, Any]) -> Any:
    """An event's payload as it was published: the JSON value of a JSON payload, the
    ``str`` of a text payload, else the bytes."""
    if "json" in event:
        return event["json"]
    if "text" in event:
        return event["text"]
    return payload_of(event)


def _payload_body(payload: bytes | bytearray | str | Any) -> Json:
    """Bytes go as base64, text as text, anything else as a JSON value: the node stores the
    bytes it is given, so the choice decides what subscribers read."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(payload)).decode()}
    if isinstance(payload, str):
        return {"text": payload}
    return {"json": payload}


class PulsarcastClient(_ClientStreams):
    """The REST API of one node, asynchronously.

    ``token`` is needed for calls that change state. Pass ``session`` to share an aiohttp
    session (the client then leaves it open); otherwise one is created and closed with the
    client. Use as ``async with PulsarcastClient(url, token) as api: ...``.
    """

    # ------------------------------------------------------------------ topics

    async def create_topic(self, name: str, *, allowed_publishers: list[str] | None = None,
                           request_to_publish: bool | list[str] | None = None,
                           event_linking: str | None = None,
                           subtopics: Mapping[str, str] | None = None,
                           retention: Mapping[str, int | bool] | None = None) -> Json:
        """A new topic authored by the node; ``allowed_publishers=None`` lets anyone
        publish, ``event_linking="CUSTOM"`` lets publishers choose parents, ``retention``
        (``max_age`` seconds, ``max_events``, ``compact``: the newest event of each key)
        bounds the history every node keeps."""
        body: Json = {"name": name}
        if retention is not None:
            body["retention"] = dict(retention)
        if allowed_publishers is not None:
            body["allowed_publishers"] = list(allowed_publishers)
        if request_to_publish is not None:
            body["request_to_publish"] = request_to_publish
        if event_linking is not None:
            body["event_linking"] = event_linking
        if subtopics is not None:
            body["subtopics"] = dict(subtopics)
        result: Json = await self._call("POST", "/v1/topics", body=body)
        return result

    async def get_topic(self, cid: str) -> Json:
        """The topic version ``cid`` names."""
        result: Json = await self._call("GET", f"/v1/topics/{self._cid(cid)}")
        return result

    async def topic_versions(self, cid: str) -> list[Json]:
        """Every version of the topic, newest first."""
        answer = await self._call("GET", f"/v1/topics/{self._cid(cid)}/versions")
        return list(answer["versions"])

    async def update_topic(self, cid: str, *, name: str | _Unset = UNSET,
                           allowed_publishers: list[str] | _Unset | None = UNSET,
                           request_to_publish: bool | list[str] | _Unset | None = UNSET,
                           event_linking: str | _Unset = UNSET,
                           subtopics: Mapping[str, str] | _Unset = UNSET,
                           retention: Mapping[str, int | bool] | _Unset | None = UNSET) -> Json:
        """A new version of the topic with the given fields changed (only the author's node
        may); arguments left out keep their value, ``None`` resets a rule to its default
        (for ``retention``: every event is kept)."""
        changes = {"name": name, "allowed_publishers": allowed_publishers,
                   "request_to_publish": request_to_publish, "event_linking": event_linking,
                   "subtopics": subtopics, "retention": retention}
        body = {k: (dict(v) if isinstance(v, Mapping) else v)
                for k, v in changes.items() if v is not UNSET}
        result: Json = await self._call("PATCH", f"/v1/topics/{self._cid(cid)}", body=body)
        return result

    # ------------------------------------------------------------------ subscriptions

    async def subscribe(self, cid: str, *, replay: bool = False) -> Json:
        """Subscribe the node (idempotent); ``replay`` also fetches the topic's past.
        Answers ``{"topic": root cid, "position": last delivery-log seq}``."""
        params = {"replay": "true"} if replay else None
        result: Json = await self._call("PUT", f"/v1/subscriptions/{self._cid(cid)}",
                                        params=params)
        return result

    async def unsubscribe(self, cid: str) -> None:
        await self._call("DELETE", f"/v1/subscriptions/{self._cid(cid)}")

    async def subscriptions(self) -> list[Json]:
        answer = await self._call("GET", "/v1/subscriptions")
        return list(answer["subscriptions"])

    # ------------------------------------------------------------------ events

    async def publish(self, topic: str, payload: bytes | str | Any, *,
                      parent: str | None = None, content_type: str | None = None,
                      key: str | None = None) -> Json:
        """Publish ``payload``: bytes as they are, ``str`` as UTF-8 text, anything else as
        compact JSON; readers get JSON and text back as such (:func:`payload_value`).
        ``content_type`` labels the payload with another media type (for bytes, say
        ``image/png``). ``parent`` only for topics with custom linking. ``key``: a
        compacted topic keeps only the newest event of each key."""
        body = _payload_body(payload)
        if content_type is not None:
            body["content_type"] = content_type
        if parent is not None:
            body["parent"] = str(parent)
        if key is not None:
            body["key"] = key
        result: Json = await self._call("POST", f"/v1/topics/{self._cid(topic)}/events",
                                        body=body)
        return result

    async def publish_batch(self, topic: str, events: Iterable[Mapping[str, Any]]
                            ) -> list[Json]:
        """Publish several events in one request, at most 1,000 (docs/api.md, "Publishing
        in batches"). Each item has ``payload`` (as for :meth:`publish`) and optionally
        ``parent``, ``content_type`` and ``key``. The answer has one outcome per item, in
        order: ``{"cid": ...}`` when the event was acknowledged, ``{"error": problem}``
        when the node refused it (the same problem a single publish would raise as
        :class:`ApiError`). A malformed item refuses the whole batch: :class:`ApiError`,
        and nothing is published."""
        lines = []
        for item in events:
            body = _payload_body(item["payload"])
            if item.get("parent") is not None:
                body["parent"] = str(item["parent"])  # a CID object or its string
            for name in ("content_type", "key"):
                if item.get(name) is not None:
                    body[name] = item[name]  # as given: the node judges it, as for one
            lines.append(body)
        return await self._call_ndjson(f"/v1/topics/{self._cid(topic)}/events", lines)

    async def get_event(self, cid: str) -> Json:
        result: Json = await self._call("GET", f"/v1/events/{self._cid(cid)}")
        return result

    # ------------------------------------------------------------------ durable consumers

    async def add_consumer(self, topic: str, name: str, *,
                           deliver_policy: str | Mapping[str, Any] | None = None,
                           ack_policy: str | None = None, ack_wait: float | None = None,
                           max_deliver: int | None = None,
                           backoff: list[float] | None = None,
                           replay_policy: str | None = None,
                           max_ack_pending: int | None = None,
                           group: str | None = None) -> Json:
        """Make a durable consumer ``name`` of ``topic`` (which the node must follow) and
        answer its info; adding it again with the same settings is harmless, with others
        it raises :class:`ApiError` ``consumer-exists``. Settings left out take the node's
        defaults: ``deliver_policy`` ``"all"`` (or ``"last"``, ``"new"``,
        ``{"start_seq": n}``, ``{"start_time": t}``), ``ack_policy`` ``"explicit"`` (or
        ``"all"``, ``"none"``), ``ack_wait`` 30 s, ``max_deliver`` -1 (no limit),
        ``backoff`` none, ``replay_policy`` ``"instant"`` (or ``"original"``),
        ``max_ack_pending`` 1000. ``group``: consumers of the same group on the same
        topic, on any nodes, share its events (each is handed out by one of them)."""
        settings = {"deliver_policy": deliver_policy, "ack_policy": ack_policy,
                    "ack_wait": ack_wait, "max_deliver": max_deliver, "backoff": backoff,
                    "replay_policy": replay_policy, "max_ack_pending": max_ack_pending,
                    "group": group}
        body: Json = {"name": name}
        body.update({k: (dict(v) if isinstance(v, Mapping) else v)
                     for k, v in settings.items() if v is not None})
        result: Json = await self._call("POST", f"/v1/topics/{self._cid(topic)}/consumers",
                                        body=body)
        return result

    async def consumer_info(self, topic: str, name: str) -> Json:
        """The consumer's settings, position (``delivered``, ``ack_floor``) and counters
        (``num_pending``, ``num_ack_pending``, ``num_redelivered``, ...)."""
        result: Json = await self._call("GET", self._consumer_path(topic, name))
        return result

    async def commit_consumer(self, topic: str, name: str, through: int) -> Json:
        """Settle every log position up to ``through`` on the ``ack_policy=all`` consumer
        ``name``, handed out or not, and answer its info: for a reader that reads the log
        itself by position and says where it got to (the Spark source does). A position it
        settled already changes nothing; :class:`ApiError` ``commit-refused`` for another
        ack policy or a position beyond the log."""
        result: Json = await self._call("POST", self._consumer_path(topic, name) + "/commit",
                                        body={"through": int(through)})
        return result

    async def consumers(self, topic: str) -> list[Json]:
        """The info of every consumer of ``topic`` at the node."""
        answer = await self._call("GET", f"/v1/topics/{self._cid(topic)}/consumers")
        return list(answer["consumers"])

    async def delete_consumer(self, topic: str, name: str) -> None:
        """Remove the consumer and what it had pending."""
        await self._call("DELETE", self._consumer_path(topic, name))

    # ------------------------------------------------------------------ the node

    async def node(self) -> Json:
        """Peer id, Kademlia id and addresses of the node."""
        result: Json = await self._call("GET", "/v1/node")
        return result

    async def routing(self, k: int | None = None) -> list[Json]:
        """The ``k`` closest contacts of the node's routing table."""
        answer = await self._call("GET", "/v1/node/routing", params=_params(k=k))
        return list(answer["contacts"])

    async def trees(self) -> list[Json]:
        """The dissemination trees the node takes part in (parents, children)."""
        answer = await self._call("GET", "/v1/node/trees")
        return list(answer["trees"])

    async def check_token(self) -> None:
        """Return if the node accepts this client's token for state changes; raise
        :class:`ApiError` (``unauthorized``, 401) if not. Changes nothing on the node."""
        await self._call("POST", "/v1/auth/check")

    async def health(self) -> Json:
        """``{"status": "ok", ...}``; a stopping node answers 503, raised as ApiError."""
        result: Json = await self._call("GET", "/v1/health")
        return result

    async def metrics(self) -> str:
        """Prometheus text exposition of the node's counters."""
        async with self.session.get(self.base_url + "/metrics",
                                    headers=self._headers({"Accept": "text/plain"})) as r:
            if r.status >= 400:
                raise await ApiError.from_response(r)
            return await r.text()

    async def openapi(self) -> Json:
        result: Json = await self._call("GET", "/v1/openapi.json")
        return result


class Client:
    """Blocking facade over :class:`PulsarcastClient` for scripts and notebooks.

    A private event loop runs in a daemon thread, so this works even where a loop is already
    running in the caller's thread (Jupyter). Every method submits the async client's
    coroutine to that loop and waits; iterators pull one item at a time. Call
    :meth:`close` (or use ``with``) to stop the thread.
    """

    def __init__(self, base_url: str, token: str | None = None, *,
                 timeout: float = 30.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="pulsarcast-client", daemon=True)
        self._thread.start()
        self.api = PulsarcastClient(base_url, token, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.api.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    def _iterate(self, iterator: AsyncIterator[T]) -> Generator[T, None, None]:
        try:
            while True:
                try:
                    # __anext__() is typed Awaitable, but an async generator's is a
                    # Coroutine (send/throw/close), which run_coroutine_threadsafe accepts
                    yield self._run(iterator.__anext__())  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None and not self._loop.is_closed():
                self._run(aclose())

    # One line each: the behaviour lives in PulsarcastClient.
    def create_topic(self, name: str, **settings: Any) -> Json:
        return self._run(self.api.create_topic(name, **settings))

    def get_topic(self, cid: str) -> Json:
        return self._run(self.api.get_topic(cid))

    def topic_versions(self, cid: str) -> list[Json]:
        return self._run(self.api.topic_versions(cid))

    def update_topic(self, cid: str, **changes: Any) -> Json:
        return self._run(self.api.update_topic(cid, **changes))

    def subscribe(self, cid: str, *, replay: bool = False) -> Json:
        return self._run(self.api.subscribe(cid, replay=replay))

    def unsubscribe(self, cid: str) -> None:
        self._run(self.api.unsubscribe(cid))

    def subscriptions(self) -> list[Json]:
        return self._run(self.api.subscriptions())

    def publish(self, topic: str, payload: bytes | str | Any, *,
                parent: str | None = None, content_type: str | None = None) -> Json:
        return self._run(self.api.publish(topic, payload, parent=parent,
                                          content_type=content_type))

    def publish_batch(self, topic: str, events: Iterable[Mapping[str, Any]]) -> list[Json]:
        return self._run(self.api.publish_batch(topic, events))

    def get_event(self, cid: str) -> Json:
        return self._run(self.api.get_event(cid))

    def history_page(self, topic: str, **query: Any) -> Json:
        return self._run(self.api.history_page(topic, **query))

    def history(self, topic: str, **query: Any) -> Generator[Json, None, None]:
        return self._iterate(self.api.history(topic, **query))

    def history_ndjson(self, topic: str, **query: Any) -> Generator[Json, None, None]:
        return self._iterate(self.api.history_ndjson(topic, **query))

    def live(self, topic: str, from_: str | int = "latest",
             **options: Any) -> Generator[Json, None, None]:
        return self._iterate(self.api.live(topic, from_, **options))

    def add_consumer(self, topic: str, name: str, **settings: Any) -> Json:
        return self._run(self.api.add_consumer(topic, name, **settings))

    def consumer_info(self, topic: str, name: str) -> Json:
        return self._run(self.api.consumer_info(topic, name))

    def commit_consumer(self, topic: str, name: str, through: int) -> Json:
        return self._run(self.api.commit_consumer(topic, name, through))

    def consumers(self, topic: str) -> list[Json]:
        return self._run(self.api.consumers(topic))

    def delete_consumer(self, topic: str, name: str) -> None:
        self._run(self.api.delete_consumer(topic, name))

    def fetch(self, topic: str, name: str, *, batch: int = 1, expires: float = 0.0
              ) -> list[ConsumerMessage]:
        """Messages to settle with :meth:`ack` (their ``ack()`` is a coroutine of the
        async client's loop; this facade's callers use ids)."""
        return self._run(self.api.fetch(topic, name, batch=batch, expires=expires))

    def ack(self, topic: str, name: str, ids: Iterable[int], *, kind: str = "ack",
            delay: float | None = None) -> Json:
        return self._run(self.api.ack(topic, name, ids, kind=kind, delay=delay))

    def node(self) -> Json:
        return self._run(self.api.node())

    def routing(self, k: int | None = None) -> list[Json]:
        return self._run(self.api.routing(k))

    def trees(self) -> list[Json]:
        return self._run(self.api.trees())

    def health(self) -> Json:
        return self._run(self.api.health())

    def metrics(self) -> str:
        return self._run(self.api.metrics())
