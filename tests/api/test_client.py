"""The Python client against real nodes on loopback: every endpoint, paging, problems, and
a live stream that survives a cut TCP connection with no gap and no duplicate."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import pytest

from api.client import ApiError, Client, PulsarcastClient, payload_of, payload_value
from tests.waiting import eventually

from .conftest import Api


@contextlib.asynccontextmanager
async def client_for(api: Api, token: str | None = None,
                     base_url: str | None = None) -> AsyncIterator[PulsarcastClient]:
    async with PulsarcastClient(base_url or api.url, token or api.server.token) as client:
        yield client


class CuttableProxy:
    """A TCP relay in front of a server whose open connections the test can cut, the way a
    network failure would (the server itself keeps running)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        for task in (asyncio.create_task(pipe(reader, up_writer)),
                     asyncio.create_task(pipe(up_reader, writer))):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def cut(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def test_every_endpoint(apis: list[Api]) -> None:
    author, reader, _ = apis
    async with client_for(author) as a, client_for(reader) as r:
        topic = await a.create_topic("weather", request_to_publish=True)
        cid = topic["cid"]
        assert topic["name"] == "weather" and topic["request_to_publish"]["enabled"] is True
        assert await r.get_topic(cid) == topic
        assert (await r.subscribe(cid)) == {"topic": cid, "position": 0}
        assert await r.subscribe(cid) == {"topic": cid, "position": 0}  # idempotent

        sent: list[object] = [b"\0\1\2", "héllo", {"t": 21.5}, [1, 2]]
        published = [await a.publish(cid, p) for p in sent]
        assert [payload_of(e) for e in published] == [
            b"\0\1\2", "héllo".encode(), b'{"t":21.5}', b"[1,2]"]
        assert published[1]["parent"] == published[0]["cid"]

        async def reader_has_all() -> bool:
            subs = await r.subscriptions()
            return [s["position"] for s in subs if s["topic"] == cid] == [len(sent)]

        await eventually(reader_has_all, timeout=10)
        assert (await r.get_event(published[2]["cid"]))["payload"] == published[2]["payload"]
        page = await r.history_page(cid, limit=2)
        assert [e["seq"] for e in page["events"]] == [1, 2] and page["next_cursor"] == "2"
        back = await r.history_page(cid, direction="backward", limit=1)
        assert back["events"][0]["cid"] == published[-1]["cid"] and "next_cursor" in back

        new = await a.update_topic(cid, name="weather-v2")
        assert new["parent"] == cid and new["name"] == "weather-v2"
        assert [v["cid"] for v in await a.topic_versions(cid)] == [new["cid"], cid]

        await r.unsubscribe(cid)
        assert cid not in {s["topic"] for s in await r.subscriptions()}

        node = await r.node()
        assert node["peer_id"] == str(reader.node.peer_id)
        assert {c["port"] for c in await r.routing()} == {
            x.node.address[1] for x in apis if x is not reader}
        assert len(await r.routing(k=1)) == 1
        assert cid in {t["topic"] for t in await a.trees()}
        assert (await r.health())["status"] == "ok"
        published_total = re.search(r"^pulsarcast_published_total (\d+)$", await a.metrics(),
                                    re.MULTILINE)
        assert published_total and int(published_total[1]) >= len(sent)
        assert "/v1/topics/{cid}/stream" in (await r.openapi())["paths"]


async def test_history_iterates_across_pages_and_ndjson(apis: list[Api]) -> None:
    author = apis[0]
    async with client_for(author) as api:
        cid = (await api.create_topic("paged"))["cid"]
        cids = [(await api.publish(cid, {"i": i}))["cid"] for i in range(23)]
        assert [e["cid"] async for e in api.history(cid, page_size=5)] == cids
        assert [e["cid"] async for e in api.history(cid, page_size=7, cursor=cids[9])] == \
            cids[10:]
        backward = [e["cid"] async for e in api.history(cid, page_size=4,
                                                          direction="backward")]
        assert backward == cids[::-1]
        assert [e["cid"] async for e in api.history_ndjson(cid)] == cids
        assert [e["seq"] async for e in api.history_ndjson(cid, cursor=20, limit=2)] == [21, 22]
        assert [e async for e in api.history(cid, since=2**40)] == []


async def test_problems_raise_api_error_with_fields(apis: list[Api]) -> None:
    api = apis[0]
    unknown = "bafyreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    async with client_for(api) as client:
        with pytest.raises(ApiError) as caught:
            await client.get_topic(unknown)
        error = caught.value
        assert (error.status, error.kind) == (404, "topic-not-found")
        assert error.detail and error.problem["status"] == 404
        assert "topic-not-found" in str(error)
        with pytest.raises(ApiError) as caught:
            await client.get_topic("not-a-cid")
        assert caught.value.kind == "invalid-cid"
        cid = (await client.create_topic("strict"))["cid"]
        with pytest.raises(ApiError) as caught:
            await client.history_page(cid, limit=5000)
        assert caught.value.kind == "invalid-field"
        with pytest.raises(ApiError) as caught:
            await client.publish(cid, "x", parent=cid)
        assert (caught.value.status, caught.value.kind) == (403, "publish-refused")
    async with client_for(api, token="wrong-token-wrong-token") as bad:
        with pytest.raises(ApiError) as caught:
            await bad.create_topic("nope")
        assert (caught.value.status, caught.value.kind) == (401, "unauthorized")
    async with PulsarcastClient(api.url) as anonymous:  # reads need no token
        assert (await anonymous.health())["status"] == "ok"


async def test_live_resumes_after_cut_connection_without_gap_or_duplicate(
        apis: list[Api]) -> None:
    author = apis[0]
    proxy = CuttableProxy(author.url)
    proxied = await proxy.start()
    try:
        async with client_for(author) as direct, client_for(author, base_url=proxied) as api:
            cid = (await direct.create_topic("live"))["cid"]
            published = [(await direct.publish(cid, i))["cid"] for i in range(5)]
            stream = api.live(cid, from_="earliest", backoff=0.01)
            got = [await anext(stream) for _ in range(3)]
            # Events 4 and 5 may sit in the client's buffer: the cut loses them there.
            proxy.cut()
            published += [(await direct.publish(cid, i))["cid"] for i in range(5, 9)]
            got += [await anext(stream) for _ in range(6)]
            assert proxy.connections >= 2
            # ... and the resumed stream is live: one more, published after the reconnect.
            published.append((await direct.publish(cid, 9))["cid"])
            got.append(await anext(stream))
            assert [e["cid"] for e in got] == published
            assert [e["seq"] for e in got] == list(range(1, 11))
            # The stream ends when the node unsubscribes.
            await direct.unsubscribe(cid)
            assert [e async for e in stream] == []
    finally:
        await proxy.close()


async def test_live_gives_up_after_bounded_retries(apis: list[Api]) -> None:
    author = apis[0]
    proxy = CuttableProxy(author.url)
    proxied = await proxy.start()
    try:
        async with client_for(author) as direct, client_for(author, base_url=proxied) as api:
            cid = (await direct.create_topic("gone"))["cid"]
            await direct.publish(cid, "x")
            stream = api.live(cid, from_="earliest", max_retries=2, backoff=0.01)
            assert (await anext(stream))["seq"] == 1
            await proxy.close()  # the node is now unreachable through this address
            with pytest.raises(aiohttp.ClientConnectionError):
                await anext(stream)
            assert proxy.connections == 1
    finally:
        await proxy.close()


async def test_live_from_latest_and_last_event_id(apis: list[Api]) -> None:
    author = apis[0]
    async with client_for(author) as api:
        cid = (await api.create_topic("tail"))["cid"]
        for i in range(3):
            await api.publish(cid, i)
        tail = api.live(cid)  # latest: pinned now, so only what comes next
        first = asyncio.ensure_future(anext(tail))
        event = await api.publish(cid, "new")
        assert (await first)["cid"] == event["cid"]
        await tail.aclose()
        resumed = api.live(cid, from_="earliest", last_event_id=1)
        assert [(await anext(resumed))["seq"] for _ in range(3)] == [2, 3, 4]
        await resumed.aclose()
        await api.unsubscribe(cid)
        with pytest.raises(ApiError) as caught:
            await anext(api.live(cid, from_="earliest"))
        assert caught.value.kind == "not-subscribed"


async def test_blocking_facade(apis: list[Api]) -> None:
    api = apis[0]

    def script() -> tuple[list[int], list[bytes], str]:
        with Client(api.url, api.server.token) as client:
            cid = client.create_topic("blocking")["cid"]
            for i in range(3):
                client.publish(cid, f"m{i}")
            seqs = [e["seq"] for e in client.history(cid, page_size=2)]
            live = client.live(cid, "earliest")
            payloads = [payload_of(next(live)) for _ in range(3)]
            live.close()
            try:
                client.get_topic("not-a-cid")
            except ApiError as exc:
                kind = exc.kind
            return seqs, payloads, kind

    seqs, payloads, kind = await asyncio.to_thread(script)
    assert seqs == [1, 2, 3] and payloads == [b"m0", b"m1", b"m2"] and kind == "invalid-cid"


async def test_payload_value_gives_back_what_was_published(apis: list[Api]) -> None:
    async with client_for(apis[0]) as client:
        cid = (await client.create_topic("values"))["cid"]
        sent: list[object] = [{"service": "api"}, "text", b"\xff\x00", [1, "two"], "{}"]
        for value in sent:
            await client.publish(cid, value)
        await client.publish(cid, b"\x89PNG", content_type="image/png")
        events = [e async for e in client.history(cid)]
    assert [payload_value(e) for e in events] == [*sent, b"\x89PNG"]
    assert events[-1]["content_type"] == "image/png"
    # A str is text, not a JSON string: "{}" comes back as the two characters.
    assert events[4]["content_type"].startswith("text/plain")


async def test_ndjson_and_live_carry_events_longer_than_aiohttps_default_line(
        apis: list[Api]) -> None:
    # A 600 kB payload is ~800 kB of JSON on one line: over aiohttp's 512 KiB default.
    big = bytes(range(256)) * 2344
    async with client_for(apis[0]) as api:
        cid = (await api.create_topic("large"))["cid"]
        published = await api.publish(cid, big)
        [event] = [e async for e in api.history_ndjson(cid)]
        assert event["cid"] == published["cid"] and payload_of(event) == big
        async for live in api.live(cid, from_="earliest"):
            assert payload_of(live) == big
            break


async def test_a_key_is_published_shown_and_a_bad_one_refused(apis: list[Api]) -> None:
    async with client_for(apis[0]) as client:
        cid = (await client.create_topic("keyed", retention={"compact": True}))["cid"]
        topic = await client.get_topic(cid)
        assert topic["retention"] == {"max_age": None, "max_events": None, "compact": True}
        event = await client.publish(cid, {"v": 1}, key="user/42")
        assert event["key"] == "user/42"
        plain = await client.publish(cid, {"v": 2})
        assert plain["key"] is None
        for bad in ("", "a\nb", "k" * 257, 7):
            with pytest.raises(ApiError) as caught:
                await client.publish(cid, "x", key=bad)  # type: ignore[arg-type]
            assert caught.value.status == 400 and caught.value.kind == "invalid-field"
        events = [e async for e in client.history(cid)]
    assert [e["key"] for e in events] == ["user/42", None]


async def test_publish_batch_answers_each_item_and_refuses_a_malformed_batch(
        apis: list[Api]) -> None:
    async with client_for(apis[0]) as client:
        topic = (await client.create_topic("client-batch"))["cid"]
        items = [{"payload": b"\x00raw"}, {"payload": "text", "key": "k"},
                 {"payload": {"n": 3}, "content_type": "application/json"}]
        outcomes = await client.publish_batch(topic, items)
        assert len(outcomes) == 3 and all(set(o) == {"cid"} for o in outcomes)
        events = [await client.get_event(o["cid"]) for o in outcomes]
        assert [payload_of(e) for e in events] == [b"\x00raw", b"text", b'{"n":3}']
        assert events[1]["key"] == "k" and events[0]["key"] is None
        # A CUSTOM parent on a LAST_SEEN topic: that item alone is refused.
        mixed = await client.publish_batch(topic, [{"payload": "a"},
                                                   {"payload": "b", "parent": events[0]["cid"]}])
        assert "cid" in mixed[0] and mixed[1]["error"]["status"] == 403
        with pytest.raises(ApiError) as caught:
            await client.publish_batch(topic, [{"payload": "ok"}, {"payload": "x", "key": ""}])
        assert caught.value.status == 400 and "line 2" in caught.value.detail
