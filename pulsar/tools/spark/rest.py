"""The node's REST API as the data source uses it, on :mod:`api.client`.

Spark calls the data source from plain threads in Python worker processes, never from an
event loop, while :class:`api.client.PulsarcastClient` is asyncio. Each user of this module
(:class:`NodeApi` for planning, :func:`read_range` for one partition, the writer for one
task) therefore runs the async client on a **private event loop in the calling thread**:
no helper thread, no per-event hop between threads, and nothing left behind when the call
returns. Nothing here survives pickling — :class:`NodeApi` drops its loop and connections
in ``__getstate__`` — because Spark pickles readers and writers to send them to executors.

Every failure leaves this module as a :class:`PulsarcastSparkError` with a code:
problem documents by their type, connection failures as ``UNREACHABLE``, anything
malformed as ``NODE_ERROR``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar
from urllib.parse import quote

import aiohttp
import pyarrow as pa
from aiohttp.http_exceptions import HttpProcessingError

from api.client import ApiError, PulsarcastClient
from api.logblocks import MEDIA_TYPE, LogRecord, RecordReader

from .errors import PulsarcastSparkError
from .options import Endpoint
from .schema import ParsedBlock, parse_block, seq_of

__all__ = [
    "MAX_LINE_BYTES",
    "UNREACHABLE_ERRORS",
    "NodeApi",
    "open_client",
    "read_range",
    "translate",
]

T = TypeVar("T")
_Chunk = TypeVar("_Chunk")

MAX_LINE_BYTES: Final = 4 * 1024 * 1024
"""Longest NDJSON line accepted: an event with the largest payload the API takes (1 MiB,
1.4 MB as base64) fits with room to spare, and a runaway line stops here."""
BLOCK_BYTES: Final = 2 * 1024 * 1024
"""NDJSON bytes parsed into one record batch (~2,800 events of 256-byte payloads)."""
BATCH_RECORDS: Final = 4096
"""Bulk-format records decoded into one record batch (~2.5 MB of 256-byte payloads)."""
FETCH_CONCURRENCY: Final = 8
"""Chunk-tree payloads asked of the node at a time."""

_PROBLEM_CODES: Final = {
    "topic-not-found": "TOPIC_NOT_FOUND",
    "event-not-found": "EVENT_NOT_FOUND",
    "not-subscribed": "NOT_SUBSCRIBED",
    "consumer-not-found": "CONSUMER_NOT_FOUND",
    "commit-refused": "INVALID_CONSUMER",
    "unauthorized": "UNAUTHORIZED",
    "invalid-cid": "INVALID_OPTION",
    "invalid-field": "INVALID_OPTION",
    "publish-refused": "PUBLISH_FAILED",
    "payload-too-large": "INVALID_ROW",
}
UNREACHABLE_ERRORS: Final = (aiohttp.ClientConnectionError, TimeoutError, ConnectionError,
                              OSError)


def translate(exc: BaseException, endpoint: Endpoint, doing: str) -> PulsarcastSparkError:
    """One error for whatever went wrong while ``doing`` something with the node."""
    if isinstance(exc, PulsarcastSparkError):
        return exc
    if isinstance(exc, ApiError):
        code = _PROBLEM_CODES.get(exc.kind, "NODE_ERROR")
        return PulsarcastSparkError(code, f"{doing}: the node at {endpoint.url} answered "
                                    f"{exc.status} {exc.kind}: {exc.detail}")
    if isinstance(exc, aiohttp.ClientResponseError):  # 5xx on a stream, a bad content type
        return PulsarcastSparkError("NODE_ERROR", f"{doing}: the node at {endpoint.url} "
                                    f"answered {exc.status} {exc.message}")
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return PulsarcastSparkError(
            "TIMEOUT", f"{doing}: the node at {endpoint.url} did not answer within "
            f"{endpoint.timeout:g} s; raise the option requestTimeout (seconds, now "
            f"{endpoint.timeout:g}) if it is busy rather than down")
    if isinstance(exc, UNREACHABLE_ERRORS):
        return PulsarcastSparkError("UNREACHABLE", f"{doing}: cannot reach the node's REST "
                                    f"API at {endpoint.url}: {type(exc).__name__}: {exc}")
    if isinstance(exc, HttpProcessingError | aiohttp.ClientPayloadError | ValueError
                  | KeyError | TypeError):
        return PulsarcastSparkError("NODE_ERROR", f"{doing}: unexpected answer from "
                                    f"{endpoint.url}: {type(exc).__name__}: {exc}")
    raise exc


async def open_client(endpoint: Endpoint) -> PulsarcastClient:
    """A client on a session of our own, made inside the loop that will use it (aiohttp
    sessions belong to one loop). Its larger read buffer hands history over in bigger
    chunks, and lets line-based reads take lines up to :data:`MAX_LINE_BYTES`: with
    aiohttp's default a line stops at 512 KiB, and an event whose payload is over ~390 KB
    (the API takes up to 1 MiB) would not fit."""
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=endpoint.timeout),
        read_bufsize=MAX_LINE_BYTES // 2,
    )
    return PulsarcastClient(endpoint.url, endpoint.token, session, timeout=endpoint.timeout)


class _Loop:
    """A private event loop and one client, for blocking calls from the current thread."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.client = self.loop.run_until_complete(open_client(endpoint))
        except BaseException:
            self.loop.close()
            raise

    def run(self, work: Awaitable[T]) -> T:
        return self.loop.run_until_complete(work)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.loop.run_until_complete(self.client.session.close())
        finally:
            self.loop.close()


def _json_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object")
    return value


def _newest_seq(page: Any) -> int:
    """The position of the one event of a ``limit=1`` page, 0 if it is empty."""
    events = _json_object(page, "history page").get("events")
    if not isinstance(events, list):
        raise ValueError("history page has no events list")
    if not events:
        return 0
    return seq_of(events[0])


class NodeApi:
    """Blocking questions about a node's logs, for planning on the driver side.

    Created freely (no connection until the first call), closed with :meth:`close`, and
    reduced to its endpoint when pickled.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._loop: _Loop | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.endpoint = state["endpoint"]
        self._loop = None

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def _call(self, doing: str, work: Callable[[PulsarcastClient], Awaitable[T]]) -> T:
        try:
            if self._loop is None:
                self._loop = _Loop(self.endpoint)
            return self._loop.run(work(self._loop.client))
        except Exception as exc:
            raise translate(exc, self.endpoint, doing) from None

    def topic_root(self, topic: str) -> tuple[str, int]:
        """The CID of the topic's first version, which names its log, and the newest
        position of that log (0 if empty). ``TOPIC_NOT_FOUND`` if the node knows no such
        topic, locally or in the DHT."""
        doing = f"looking up topic {topic}"
        page = self._call(doing, lambda c: c.history_page(topic, direction="backward",
                                                          limit=1))

        def parse() -> tuple[str, int]:
            root = _json_object(page, "history page").get("topic")
            if type(root) is not str or not 0 < len(root) <= 256:
                raise ValueError("the history page names no topic")
            return root, _newest_seq(page)

        return self._checked(parse, doing)

    def _checked(self, parse: Callable[[], T], doing: str) -> T:
        try:
            return parse()
        except Exception as exc:
            raise translate(exc, self.endpoint, doing) from None

    def last_positions(self, topics: list[str]) -> dict[str, int]:
        """The newest position of each topic's log (the subscriptions list answers for the
        followed topics in one call; the others are asked one by one)."""
        doing = "reading the node's log positions"
        subs = self._call(doing, lambda c: c.subscriptions())

        def parse() -> dict[str, int]:
            known: dict[str, int] = {}
            for sub in subs:
                if isinstance(sub, dict) and sub.get("topic") in topics \
                        and type(sub.get("position")) is int and sub["position"] >= 0:
                    known[sub["topic"]] = sub["position"]
            return known

        known = self._checked(parse, doing)
        for topic in topics:
            if topic not in known:
                known[topic] = self.topic_root(topic)[1]
        return {t: known[t] for t in topics}

    def subscribed(self) -> set[str]:
        doing = "listing the node's subscriptions"
        subs = self._call(doing, lambda c: c.subscriptions())
        return self._checked(lambda: {s["topic"] for s in subs if isinstance(s, dict)
                                      and type(s.get("topic")) is str}, doing)

    def subscribe(self, topic: str, *, replay: bool) -> None:
        self._call(f"subscribing the node to {topic}",
                   lambda c: c.subscribe(topic, replay=replay))

    def consumer_position(self, topic: str, name: str) -> tuple[str, int]:
        """The durable consumer ``name`` of ``topic``: its ``ack_policy`` and its ack floor
        (every position up to it is settled). ``CONSUMER_NOT_FOUND`` if there is none."""
        doing = f"reading consumer {name} of topic {topic}"
        info = self._call(doing, lambda c: c.consumer_info(topic, name))
        return self._checked(lambda: _consumer_position(info), doing)

    def commit_consumer(self, topic: str, name: str, through: int) -> int:
        """Settle every position up to ``through`` on the consumer; its ack floor after."""
        doing = f"acknowledging positions up to {through} on consumer {name} of topic {topic}"
        info = self._call(doing, lambda c: c.commit_consumer(topic, name, through))
        return self._checked(lambda: _consumer_position(info)[1], doing)

    def check_token(self) -> None:
        """``UNAUTHORIZED`` now, at planning, if the node refuses the token. Every call
        that changes state checks the token before anything else (``api.auth``), so a
        subscription PUT for a name that is no CID answers 401 for a wrong token and 400
        for a right one, and changes nothing either way."""
        async def probe(client: PulsarcastClient) -> None:
            try:
                await client.subscribe("token-check")
            except ApiError as exc:
                if exc.status == 401:
                    raise
                return
            raise ValueError("the node accepted a subscription to no topic")

        self._call("checking the API token", probe)

    def takes_parent(self, topic: str) -> bool:
        """Whether the topic's events name their parent (CUSTOM linking, in the newest version:
        the versions come newest first)."""
        doing = f"reading the settings of topic {topic}"
        versions = self._call(doing, lambda c: c.topic_versions(topic))

        def parse() -> bool:
            if not isinstance(versions, list) or not versions:
                raise ValueError("no versions")
            return _json_object(versions[0], "topic").get("event_linking") == "CUSTOM"

        return self._checked(parse, doing)

    def position_before(self, topic: str, event: str) -> int:
        doing = f"finding event {event} in the log of {topic}"
        page = self._call(doing, lambda c: c.history_page(
            topic, cursor=event, direction="backward", limit=1))
        return self._checked(lambda: _newest_seq(page), doing)

    def first_kept(self, topic: str) -> int:
        doing = f"finding the first position the log of {topic} holds"
        page = self._call(doing, lambda c: c.history_page(topic, limit=1))
        first = self._checked(lambda: _newest_seq(page), doing)
        return first or self.topic_root(topic)[1] + 1

    def first_position_at(self, topic: str, when: float) -> int | None:
        doing = f"finding the first event of {topic} delivered at or after {when}"
        page = self._call(doing, lambda c: c.history_page(topic, since=repr(when), limit=1))
        seq = self._checked(lambda: _newest_seq(page), doing)
        return seq or None


def _consumer_position(info: Any) -> tuple[str, int]:
    config = _json_object(_json_object(info, "consumer info").get("config"), "consumer config")
    policy, floor = config.get("ack_policy"), info.get("ack_floor")
    if type(policy) is not str or type(floor) is not int or floor < 0:
        raise ValueError("the consumer info has no ack_policy or ack_floor")
    return policy, floor


async def _ndjson_blocks(client: PulsarcastClient, topic: str, cursor: int, limit: int,
                         idle_timeout: float) -> AsyncIterator[bytes]:
    """The NDJSON history after ``cursor`` in blocks of whole lines, about
    :data:`BLOCK_BYTES` each. This one call does not go through
    :meth:`PulsarcastClient.history_ndjson`, which parses each line into a dict: the rows
    are parsed by Arrow from the raw bytes instead (see :mod:`.schema`). The client's
    session, URL and problem parsing are still the ones used."""
    url = f"{client.base_url}/v1/topics/{quote(topic, safe='')}/events"
    params = {"cursor": str(cursor), "limit": str(limit), "format": "ndjson"}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout)
    async with client.session.get(url, params=params, timeout=timeout,
                                  headers={"Accept": "application/x-ndjson"}) as response:
        if response.status >= 400:
            raise await ApiError.from_response(response)
        pending = bytearray()
        async for chunk in response.content.iter_any():
            pending += chunk
            if len(pending) < BLOCK_BYTES:
                continue
            cut = pending.rfind(b"\n") + 1
            if cut == 0:
                if len(pending) > MAX_LINE_BYTES:
                    raise ValueError(f"a history line is longer than {MAX_LINE_BYTES} bytes")
                continue
            yield bytes(pending[:cut])
            del pending[:cut]
        if pending.strip():
            if len(pending) > MAX_LINE_BYTES:
                raise ValueError(f"a history line is longer than {MAX_LINE_BYTES} bytes")
            yield bytes(pending) + b"\n"


async def _record_chunks(client: PulsarcastClient, topic: str, cursor: int, limit: int,
                         idle_timeout: float) -> AsyncIterator[list[LogRecord]]:
    """The bulk history after ``cursor`` (:mod:`api.logblocks`), in lists of about
    :data:`BATCH_RECORDS` records."""
    url = f"{client.base_url}/v1/topics/{quote(topic, safe='')}/events"
    params = {"cursor": str(cursor), "limit": str(limit), "format": "blocks"}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout)
    async with client.session.get(url, params=params, timeout=timeout,
                                  headers={"Accept": MEDIA_TYPE}) as response:
        if response.status >= 400:
            raise await ApiError.from_response(response)
        if response.content_type != MEDIA_TYPE:
            raise ValueError(f"the node answered {response.content_type}, not the bulk "
                             "history format (set historyFormat=ndjson for older nodes)")
        reader = RecordReader()
        pending: list[LogRecord] = []
        async for chunk in response.content.iter_any():
            pending += reader.feed(chunk)
            if len(pending) >= BATCH_RECORDS:
                yield pending
                pending = []
        reader.finish()
        if pending:
            yield pending


async def _payloads(client: PulsarcastClient, cids: list[str]) -> dict[str, bytes]:
    """Payloads kept in chunk trees, reassembled (and verified) by the node."""
    import base64

    out: dict[str, bytes] = {}
    queue = iter(cids)

    async def worker() -> None:
        for cid in queue:
            event = _json_object(await client.get_event(cid), "event")
            text = event.get("payload")
            if type(text) is not str:
                raise ValueError(f"event {cid} came without its payload")
            out[cid] = base64.b64decode(text, validate=True)

    await asyncio.gather(*(worker() for _ in range(FETCH_CONCURRENCY)))
    return out


def read_range(endpoint: Endpoint, topic: str, start: int, end: int,
               history_format: str = "blocks") -> Iterator[pa.RecordBatch]:
    """Positions ``start <= seq < end`` of the log of ``topic`` as record batches, from one
    response in ``history_format`` (``cursor=start-1``, ``limit=end-start``: positions
    whose event was pruned are skipped by the node, so the limit can only over-reach, and
    whatever lies at or beyond ``end`` is dropped, and the response closed)."""
    if end <= start:
        return
    doing = f"reading positions {start}..{end - 1} of {topic}"
    if history_format == "ndjson":
        yield from _read_parsed(
            endpoint, doing,
            lambda client: _ndjson_blocks(client, topic, start - 1, end - start,
                                          endpoint.timeout),
            lambda _, block, previous: parse_block(block, topic, previous, end),
            start - 1)
        return
    from .blocks import (
        parse_records,  # the data model's parser, for this format only
    )

    def parse(loop: _Loop, records: list[LogRecord], previous: int) -> ParsedBlock:
        def fetch(cids: Any) -> dict[str, bytes]:
            try:
                return loop.run(_payloads(loop.client, list(cids)))
            except Exception as exc:
                raise translate(exc, endpoint, f"{doing}: fetching large payloads") from None

        return parse_records(records, topic, previous, end, fetch)

    yield from _read_parsed(
        endpoint, doing,
        lambda client: _record_chunks(client, topic, start - 1, end - start, endpoint.timeout),
        parse, start - 1)


def _read_parsed(endpoint: Endpoint, doing: str,
                 open_stream: Callable[[PulsarcastClient], AsyncIterator[_Chunk]],
                 parse: Callable[[_Loop, _Chunk, int], ParsedBlock],
                 previous: int) -> Iterator[pa.RecordBatch]:
    """The batches of one history response in either format: ``open_stream`` gives its
    chunks, ``parse`` turns each into the rows after ``previous`` (and says when the
    range's end was reached); the response is closed however the read ends."""
    runner: _Loop | None = None
    chunks: AsyncIterator[_Chunk] | None = None
    try:
        try:
            runner = _Loop(endpoint)
            chunks = open_stream(runner.client)
        except Exception as exc:
            raise translate(exc, endpoint, doing) from None
        while True:
            try:
                chunk = runner.run(anext(chunks, None))
            except Exception as exc:
                raise translate(exc, endpoint, doing) from None
            if chunk is None:
                return
            parsed = parse(runner, chunk, previous)
            previous = parsed.last_seq
            if parsed.batch is not None:
                yield parsed.batch
            if parsed.reached_end:
                return
    finally:
        if runner is not None:
            if chunks is not None:
                aclose = getattr(chunks, "aclose", None)
                if aclose is not None:
                    runner.run(aclose())
            runner.close()
