"""A Python client for the REST API of a pulsarcast node.

:class:`PulsarcastClient` is asyncio-first (one method per endpoint, on aiohttp) because the
interesting calls are streams: history that spans many pages and the live SSE tail. Its
:meth:`PulsarcastClient.live` iterator parses Server-Sent Events itself and, when the
connection drops, reconnects with ``Last-Event-ID`` set to the last sequence number it
handed out, so the consumer sees every event of the delivery log exactly once.

:class:`Client` is a blocking facade for scripts and notebooks. It does not repeat any HTTP
logic: it runs a :class:`PulsarcastClient` on a private event loop in a background thread and
waits for each call.

Events and topics come back as the JSON objects the API documents (plain dicts), so what a
script reads is what ``curl`` shows; :func:`payload_of` decodes an event's payload bytes,
:func:`payload_value` gives it back as it was published (JSON value, text or bytes).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Generator, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import quote

import aiohttp

__all__ = ["PROBLEM_BASE", "ApiError", "Client", "PulsarcastClient", "payload_of",
           "payload_value"]

PROBLEM_BASE: Final = "https://pulsarcast.dev/problems/"
Json = dict[str, Any]
T = TypeVar("T")


class _Unset:
    """Marks an argument left out, where ``None`` has a meaning of its own (anyone may
    publish)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()

MAX_LINE: Final = 4 * 1024 * 1024
"""Longest NDJSON or SSE line read: an event with a 1 MiB payload is ~1.4 MiB of JSON
(aiohttp's default refuses lines over 512 KiB)."""
MAX_BODY: Final = 16 * 1024 * 1024
"""Largest JSON answer read whole; a node (or something posing as one) sending more is an
error, not a memory exhaustion."""

# Connection-level failures a live stream recovers from by reconnecting.
_DROPPED = (
    aiohttp.ClientPayloadError,
    aiohttp.ClientConnectionError,
    asyncio.IncompleteReadError,
    asyncio.TimeoutError,
    ConnectionError,
)


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, refusing one over :data:`MAX_BODY` (``read(n)`` returns what is
    buffered, so read in chunks until the end)."""
    body = bytearray()
    while chunk := await response.content.read(256 * 1024):
        body += chunk
        if len(body) > MAX_BODY:
            raise ApiError(response.status, "answer-too-large", f"answer over {MAX_BODY} bytes",
                           {})
    return bytes(body)


class ApiError(Exception):
    """The node answered with a problem document (RFC 9457).

    ``kind`` is the stable slug of the problem type (``"topic-not-found"``, ...), the thing
    to branch on; ``detail`` is for humans; ``problem`` is the whole document.
    """

    def __init__(self, status: int, kind: str, detail: str, problem: Mapping[str, Any]) -> None:
        super().__init__(f"{status} {kind}: {detail}")
        self.status = status
        self.kind = kind
        self.detail = detail
        self.problem = dict(problem)

    @classmethod
    async def from_response(cls, response: aiohttp.ClientResponse) -> ApiError:
        text = await response.text(errors="replace")
        try:
            problem = json.loads(text)
        except ValueError:
            problem = None
        if not isinstance(problem, dict):
            # Not from the API itself (a proxy, another server on the port): keep the text.
            problem = {"status": response.status, "detail": text[:500] or response.reason}
        type_ = str(problem.get("type", ""))
        kind = type_[len(PROBLEM_BASE):] if type_.startswith(PROBLEM_BASE) else (
            type_ or f"http-{response.status}")
        detail = str(problem.get("detail") or problem.get("title") or response.reason or "")
        return cls(response.status, kind, detail, problem)


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


def _params(**values: Any) -> dict[str, str]:
    return {k: str(v) for k, v in values.items() if v is not None}


class _SSEParser:
    """Server-Sent Events framing (the WHATWG rules the API needs): fields accumulate until
    a blank line dispatches them; comment lines (heartbeats) are ignored."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.event = "message"
        self.data: list[str] = []
        self.id: str | None = None

    def feed(self, line: str) -> tuple[str, str, str | None] | None:
        """One line without its terminator; an ``(event, data, id)`` when one completes."""
        if not line:
            if not self.data and self.event == "message":
                self._reset()
                return None
            done = (self.event, "\n".join(self.data), self.id)
            self._reset()
            return done
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value
        elif name == "id" and "\0" not in value:
            self.id = value
        return None  # "retry" and unknown fields: this client keeps its own backoff


class PulsarcastClient:
    """The REST API of one node, asynchronously.

    ``token`` is needed for calls that change state. Pass ``session`` to share an aiohttp
    session (the client then leaves it open); otherwise one is created and closed with the
    client. Use as ``async with PulsarcastClient(url, token) as api: ...``.
    """

    def __init__(self, base_url: str, token: str | None = None,
                 session: aiohttp.ClientSession | None = None, *,
                 timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def __aenter__(self) -> PulsarcastClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session belongs to the loop that is running when it is
        # made, and the blocking facade builds the client before its loop runs anything.
        if self._session is None:
            # aiohttp refuses lines over twice its read buffer.
            self._session = aiohttp.ClientSession(timeout=self._timeout,
                                                  read_bufsize=MAX_LINE // 2)
        return self._session

    # ------------------------------------------------------------------ plumbing

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if extra:
            headers.update(extra)
        return headers

    async def _call(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                    body: Json | None = None) -> Any:
        """One request; the JSON answer (None for 204); :class:`ApiError` for problems."""
        async with self.session.request(method, self.base_url + path, params=params,
                                        json=body, headers=self._headers()) as response:
            if response.status >= 400:
                raise await ApiError.from_response(response)
            if response.status == 204:
                return None
            data = await _read_bounded(response)
            return json.loads(data) if data else None

    @staticmethod
    def _cid(cid: str) -> str:
        return quote(str(cid), safe="")

    # ------------------------------------------------------------------ topics

    async def create_topic(self, name: str, *, allowed_publishers: list[str] | None = None,
                           request_to_publish: bool | list[str] | None = None,
                           event_linking: str | None = None,
                           subtopics: Mapping[str, str] | None = None) -> Json:
        """A new topic authored by the node; ``allowed_publishers=None`` lets anyone
        publish, ``event_linking="CUSTOM"`` lets publishers choose parents."""
        body: Json = {"name": name}
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
                           subtopics: Mapping[str, str] | _Unset = UNSET) -> Json:
        """A new version of the topic with the given fields changed (only the author's node
        may); arguments left out keep their value, ``None`` resets a rule to its default."""
        changes = {"name": name, "allowed_publishers": allowed_publishers,
                   "request_to_publish": request_to_publish, "event_linking": event_linking,
                   "subtopics": subtopics}
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
                      parent: str | None = None, content_type: str | None = None) -> Json:
        """Publish ``payload``: bytes as they are, ``str`` as UTF-8 text, anything else as
        compact JSON; readers get JSON and text back as such (:func:`payload_value`).
        ``content_type`` labels the payload with another media type (for bytes, say
        ``image/png``). ``parent`` only for topics with custom linking."""
        body = _payload_body(payload)
        if content_type is not None:
            body["content_type"] = content_type
        if parent is not None:
            body["parent"] = str(parent)
        result: Json = await self._call("POST", f"/v1/topics/{self._cid(topic)}/events",
                                        body=body)
        return result

    async def get_event(self, cid: str) -> Json:
        result: Json = await self._call("GET", f"/v1/events/{self._cid(cid)}")
        return result

    async def history_page(self, topic: str, *, cursor: str | int | None = None,
                           since: str | float | None = None, until: str | float | None = None,
                           limit: int | None = None, direction: str = "forward") -> Json:
        """One page of the delivery log: ``{"topic", "events", "next_cursor"?}``.
        ``cursor`` is exclusive (a seq or an event CID); ``since``/``until`` are times
        (seconds or RFC 3339); ``limit`` at most 1000."""
        params = _params(cursor=cursor, since=since, until=until, limit=limit,
                         direction=direction)
        result: Json = await self._call("GET", f"/v1/topics/{self._cid(topic)}/events",
                                        params=params)
        return result

    async def history(self, topic: str, *, cursor: str | int | None = None,
                      since: str | float | None = None, until: str | float | None = None,
                      direction: str = "forward", page_size: int = 1000
                      ) -> AsyncGenerator[Json, None]:
        """Every matching event, page after page, following ``next_cursor`` until the last
        page; memory stays at one page whatever the length of the history."""
        while True:
            page = await self.history_page(topic, cursor=cursor, since=since, until=until,
                                           limit=page_size, direction=direction)
            for event in page["events"]:
                yield event
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    async def history_ndjson(self, topic: str, *, cursor: str | int | None = None,
                             since: str | float | None = None,
                             until: str | float | None = None, limit: int | None = None,
                             direction: str = "forward", idle_timeout: float | None = 60.0
                             ) -> AsyncGenerator[Json, None]:
        """The same events as :meth:`history`, in one NDJSON response (one request, no
        page limit), parsed line by line as they arrive."""
        params = _params(cursor=cursor, since=since, until=until, limit=limit,
                         direction=direction, format="ndjson")
        async for event in self._ndjson(f"/v1/topics/{self._cid(topic)}/events", params,
                                        idle_timeout):
            yield event

    async def replay(self, topic: str, *, since: str | float | None = None,
                     until: str | float | None = None, limit: int | None = None,
                     partial: bool = False,
                     idle_timeout: float | None = 300.0) -> AsyncGenerator[Json, None]:
        """The topic's history found from its CID alone, oldest first in causal order
        (``GET /v1/topics/{cid}/replay``): works through a node that never followed the
        topic, with every publisher offline. ``since`` (exclusive) and ``until``
        (inclusive) take an event CID or a time. The node walks the whole range before it
        answers, hence the long default ``idle_timeout``. A history the network could not
        give whole raises :class:`ApiError` ``replay-incomplete`` (503, retry later) unless
        ``partial`` asks for what was found."""
        params = _params(since=since, until=until, limit=limit,
                         partial="true" if partial else None)
        async for event in self._ndjson(f"/v1/topics/{self._cid(topic)}/replay", params,
                                        idle_timeout):
            yield event

    async def _ndjson(self, path: str, params: Mapping[str, str],
                      idle_timeout: float | None) -> AsyncGenerator[Json, None]:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout)
        async with self.session.get(
            f"{self.base_url}{path}", params=params,
            headers=self._headers({"Accept": "application/x-ndjson"}), timeout=timeout,
        ) as response:
            if response.status >= 400:
                raise await ApiError.from_response(response)
            async for raw in response.content:
                line = raw.strip()
                if line:
                    yield json.loads(line)

    # ------------------------------------------------------------------ live

    async def live(self, topic: str, from_: str | int = "latest",
                   last_event_id: str | int | None = None, *, max_retries: int = 5,
                   backoff: float = 0.1, max_backoff: float = 5.0,
                   idle_timeout: float | None = 60.0) -> AsyncGenerator[Json, None]:
        """Events of a subscribed topic as the node delivers them, for as long as the node
        stays subscribed (the stream's ``end`` event stops the iterator).

        ``from_`` is ``"earliest"``, ``"latest"``, a seq (events *after* it), an event CID or
        a time; ``last_event_id`` resumes after a seq seen earlier and wins over ``from_``.
        Each event carries its delivery-log ``seq``. A dropped connection (or one silent for
        ``idle_timeout`` s, several server heartbeats) is reopened with ``Last-Event-ID``
        set to the last seq yielded, so nothing is skipped or repeated; after
        ``max_retries`` failed reconnections in a row the last error is raised. Problem
        answers (4xx) are raised at once: retrying cannot fix them.
        """
        last: str | None = None if last_event_id is None else str(last_event_id)
        start = str(from_)
        if last is None and start == "latest":
            # Pin "latest" to a seq now: a reconnection before the first event must resume
            # from here, not from whatever is latest by then.
            page = await self.history_page(topic, direction="backward", limit=1)
            last = str(page["events"][0]["seq"]) if page["events"] else "0"
        failures = 0
        url = f"{self.base_url}/v1/topics/{self._cid(topic)}/stream"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout)
        while True:
            headers = self._headers({"Accept": "text/event-stream"})
            params: dict[str, str] | None = {"from": start}
            if last is not None:
                headers["Last-Event-ID"] = last
                params = None
            try:
                async with self.session.get(url, params=params, headers=headers,
                                            timeout=timeout) as response:
                    if response.status >= 500:
                        raise aiohttp.ClientResponseError(
                            response.request_info, (), status=response.status,
                            message=response.reason or "")
                    if response.status >= 400:
                        raise await ApiError.from_response(response)
                    parser = _SSEParser()
                    while True:
                        raw = await response.content.readline()
                        if not raw:
                            break  # closed without "end": a drop, reconnect
                        done = parser.feed(raw.decode().rstrip("\r\n"))
                        if done is None:
                            continue
                        kind, data, seq = done
                        if kind == "end":
                            return
                        if kind != "event":
                            continue
                        event = json.loads(data)
                        last = seq if seq is not None else str(event.get("seq", last))
                        failures = 0
                        yield event
            except ApiError:
                raise
            except (*_DROPPED, aiohttp.ClientResponseError):
                failures += 1
                if failures > max_retries:
                    raise
            await asyncio.sleep(min(max_backoff, backoff * 2 ** max(0, failures - 1)))

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
