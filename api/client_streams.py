"""Reading a topic's delivery log with the Python client: history pages, history iteration,
NDJSON, replay, the live SSE iterator that resumes after a dropped connection, and the
messages of durable consumers (pulled in batches or pushed over SSE) with their
acknowledgements.

``_ClientStreams`` holds the methods of :class:`api.client.PulsarcastClient` that read the
log: :meth:`~_ClientStreams.history` follows ``next_cursor`` page after page,
:meth:`~_ClientStreams.history_ndjson` and :meth:`~_ClientStreams.replay` parse one NDJSON
response line by line, and :meth:`~_ClientStreams.live` parses Server-Sent Events itself
(``_SSEParser``) and reconnects with ``Last-Event-ID``, so the consumer sees every event
exactly once. Kept apart from the request plumbing (:mod:`api.client_http`) and the
one-request endpoint methods (:mod:`api.client`): these are the client's long-lived reads,
with their own framing, timeouts and reconnection. :meth:`~_ClientStreams.consume` pulls a
durable consumer's messages batch after batch (each a :class:`ConsumerMessage` that settles
itself: ``await msg.ack()``), :meth:`~_ClientStreams.consume_stream` takes them pushed.
Needs only aiohttp and the standard library.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping

import aiohttp

from .client_http import ApiError, Json, _ClientBase, _params

__all__ = ["ConsumerMessage"]  # and a base class of api.client.PulsarcastClient

# Connection-level failures a live stream recovers from by reconnecting.
_DROPPED = (
    aiohttp.ClientPayloadError,
    aiohttp.ClientConnectionError,
    asyncio.IncompleteReadError,
    asyncio.TimeoutError,
    ConnectionError,
)


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


class ConsumerMessage:
    """A message a durable consumer handed out: ``event`` (the event's JSON as every reader
    gets it, with its log ``seq``), ``id`` (what an acknowledgement names: the same for
    every delivery of the event) and ``count`` (which delivery this is: 2 and up means it
    was delivered before and not acknowledged in time).

    Settle it with :meth:`ack`, :meth:`nak`, :meth:`term` or :meth:`progress`; each returns
    True if the node applied it, False if the message was no longer pending (acknowledged
    already, set aside, or its consumer does not track acknowledgements)."""

    __slots__ = ("_client", "consumer", "count", "event", "id", "topic")

    def __init__(self, client: _ClientStreams, topic: str, consumer: str, data: Json) -> None:
        delivery = data["delivery"]
        self._client = client
        self.topic = topic
        self.consumer = consumer
        self.event: Json = {k: v for k, v in data.items() if k != "delivery"}
        self.id = int(delivery["id"])
        self.count = int(delivery["count"])

    def __repr__(self) -> str:
        return (f"ConsumerMessage(consumer={self.consumer!r}, id={self.id}, "
                f"count={self.count}, cid={self.event.get('cid')!r})")

    async def _settle(self, kind: str, delay: float | None = None) -> bool:
        answer = await self._client.ack(self.topic, self.consumer, [self.id], kind=kind,
                                        delay=delay)
        return self.id in answer["done"]

    async def ack(self) -> bool:
        """Done with it: it is not delivered again (with ``ack_policy=all``, nor is any
        earlier one)."""
        return await self._settle("ack")

    async def nak(self, delay: float | None = None) -> bool:
        """Not done: deliver it again now, or after ``delay`` seconds."""
        return await self._settle("nak", delay)

    async def term(self) -> bool:
        """Never deliver it again (counted as terminated, not as acknowledged)."""
        return await self._settle("term")

    async def progress(self) -> bool:
        """Still working on it: its ``ack_wait`` starts again now."""
        return await self._settle("progress")


class _ClientStreams(_ClientBase):
    """The delivery-log reads of :class:`api.client.PulsarcastClient`, and the durable
    consumers' messages."""

    # ------------------------------------------------------------------ events

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

    # ------------------------------------------------------------------ durable consumers

    def _consumer_path(self, topic: str, name: str) -> str:
        return f"/v1/topics/{self._cid(topic)}/consumers/{self._cid(name)}"

    async def fetch(self, topic: str, name: str, *, batch: int = 1, expires: float = 0.0
                    ) -> list[ConsumerMessage]:
        """Up to ``batch`` (1..1000) messages of the durable consumer ``name``, waiting up
        to ``expires`` seconds (at most 300) for the first; an empty list when none came.
        Each must be settled (``await msg.ack()``) within the consumer's ``ack_wait`` or it
        is delivered again."""
        answer = await self._call("POST", self._consumer_path(topic, name) + "/fetch",
                                  body={"batch": batch, "expires": expires},
                                  timeout=expires + 30.0)
        return [ConsumerMessage(self, topic, name, m) for m in answer["messages"]]

    async def ack(self, topic: str, name: str, ids: Iterable[int], *, kind: str = "ack",
                  delay: float | None = None) -> Json:
        """Settle messages by delivery id: ``kind`` is ``ack``, ``nak`` (``delay``: deliver
        again after that many seconds), ``term`` or ``progress``. Answers ``{"kind",
        "done", "unknown"}``: ``unknown`` are the ids that were not pending."""
        body: Json = {"ids": [int(i) for i in ids], "kind": kind}
        if delay is not None:
            body["delay"] = delay
        result: Json = await self._call("POST", self._consumer_path(topic, name) + "/ack",
                                        body=body)
        return result

    async def consume(self, topic: str, name: str, *, batch: int = 10, expires: float = 30.0,
                      max_retries: int = 5, backoff: float = 0.1, max_backoff: float = 5.0
                      ) -> AsyncGenerator[ConsumerMessage, None]:
        """The durable consumer's messages, for as long as the caller iterates: pulled
        ``batch`` at a time, each pull waiting up to ``expires`` seconds, so an idle topic
        costs one request per ``expires``. A dropped connection (or a node answering 5xx
        while it restarts) is retried after a growing pause; after ``max_retries`` failures
        in a row the last error is raised. Problems (4xx: the consumer was deleted, say)
        are raised at once.

        A message fetched and not settled within ``ack_wait`` is delivered again, so keep
        ``batch`` times the time one message takes below it."""
        failures = 0
        while True:
            try:
                messages = await self.fetch(topic, name, batch=batch, expires=expires)
            except ApiError as exc:
                if exc.status < 500:
                    raise
                failures += 1
                if failures > max_retries:
                    raise
            except _DROPPED:
                failures += 1
                if failures > max_retries:
                    raise
            else:
                failures = 0
                for message in messages:
                    yield message
                continue
            await asyncio.sleep(min(max_backoff, backoff * 2 ** max(0, failures - 1)))

    async def consume_stream(self, topic: str, name: str, *, max_retries: int = 5,
                             backoff: float = 0.1, max_backoff: float = 5.0,
                             idle_timeout: float | None = 60.0
                             ) -> AsyncGenerator[ConsumerMessage, None]:
        """The durable consumer's messages pushed by the node (``GET .../stream``, Server-
        Sent Events) rather than pulled; reconnects after a drop (the consumer keeps its
        place on the node; what was sent and not acknowledged comes again after
        ``ack_wait``). Ends when the consumer is deleted."""
        url = f"{self.base_url}{self._consumer_path(topic, name)}/stream"
        async for kind, data, _ in self._sse(url, lambda: {}, max_retries=max_retries,
                                             backoff=backoff, max_backoff=max_backoff,
                                             idle_timeout=idle_timeout):
            if kind == "message":
                yield ConsumerMessage(self, topic, name, json.loads(data))

    async def _sse(self, url: str, extra: Callable[[], dict[str, str]], *, max_retries: int,
                   backoff: float, max_backoff: float, idle_timeout: float | None
                   ) -> AsyncGenerator[tuple[str, str, str | None], None]:
        """The ``(event, data, id)`` of a Server-Sent-Events stream that reconnects after a
        drop or a 5xx, ``max_retries`` times in a row with exponential ``backoff``
        (``extra()`` gives headers for each attempt, e.g. ``Last-Event-ID``); a 4xx
        raises :class:`ApiError`; ends at ``event: end``."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout)
        failures = 0
        while True:
            headers = self._headers({"Accept": "text/event-stream", **extra()})
            try:
                async with self.session.get(url, headers=headers, timeout=timeout) as response:
                    if response.status >= 500:
                        raise aiohttp.ClientResponseError(
                            response.request_info, (), status=response.status,
                            message=response.reason or "")
                    if response.status >= 400:
                        raise await ApiError.from_response(response)
                    parser = _SSEParser()
                    while raw := await response.content.readline():
                        done = parser.feed(raw.decode().rstrip("\r\n"))
                        if done is None:
                            continue
                        if done[0] == "end":
                            return
                        failures = 0
                        yield done
            except ApiError:
                raise
            except (*_DROPPED, aiohttp.ClientResponseError):
                failures += 1
                if failures > max_retries:
                    raise
            await asyncio.sleep(min(max_backoff, backoff * 2 ** max(0, failures - 1)))

    async def advisories(self, *, after: int = 0, max_retries: int = 5, backoff: float = 0.1,
                         max_backoff: float = 5.0, idle_timeout: float | None = 60.0
                         ) -> AsyncGenerator[Json, None]:
        """The node's advisories as they happen (``GET /v1/node/advisories``, Server-Sent
        Events): messages set aside after ``max_deliver``, terminated, skipped. Each is a
        dict with ``id``, ``kind``, ``at`` and its fields; one with ``kind`` ``"lost"``
        (and ``before``) says the node no longer holds what came before that id. Resumes
        after a drop with ``Last-Event-ID``; ends when the node stops."""
        url = f"{self.base_url}/v1/node/advisories"
        last = after

        def resume() -> dict[str, str]:
            return {"Last-Event-ID": str(last)} if last else {}

        async for kind, data, event_id in self._sse(
                url, resume, max_retries=max_retries, backoff=backoff,
                max_backoff=max_backoff, idle_timeout=idle_timeout):
            if kind == "lost":
                yield {"kind": "lost", **json.loads(data)}
            elif kind == "advisory":
                if event_id is not None:
                    last = int(event_id)
                yield dict(json.loads(data))
