"""Hostile input and hostile clients against a live node's REST API on a real socket.

Every malformed request answers a 4xx problem document (never a 500); the documented limits
are the enforced ones; a client that stops reading holds a bounded send buffer; half-sent
heads and bodies time out; connections are capped per client address and in total.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from api import ApiServer
from api.history import WRITE_CHUNK
from api.limits import (
    JSON_DEPTH,
    LIMITS,
    PAGE_BYTES,
    PEERS,
    SUBTOPICS,
    TOPIC_NAME_BYTES,
    ServerLimits,
)
from api.openapi import openapi_document
from dag import CID, EventDescriptor, Identity
from pulsar import Node
from pulsar.tools.cli import main
from tests.node.conftest import Network
from tests.waiting import eventually

BASE = "https://pulsarcast.dev/problems/"
TOKEN = "hardening-test-token"
AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()
ROOT = Path(__file__).resolve().parents[2]

Serve = Callable[..., Awaitable[tuple[Node, ApiServer]]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """Start one node (once) and an API on it with the given :class:`ServerLimits`."""
    net = Network(tmp_path)
    servers: list[ApiServer] = []
    nodes: list[Node] = []

    async def start(**limits: Any) -> tuple[Node, ApiServer]:
        if not nodes:  # two: a publish counts once another DHT node stored it (min_acks)
            nodes.extend(await net.start(2))
        server = await ApiServer.start(nodes[0], token=TOKEN, heartbeat=0.2,
                                       limits=ServerLimits(**limits))
        servers.append(server)
        return nodes[0], server

    try:
        yield start
    finally:
        for server in servers:
            await server.stop()
        await net.close()


def _address(server: ApiServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def raw(server: ApiServer, request: bytes, *, timeout: float = 10.0
              ) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is (``Connection: close``); status, headers and body."""
    reader, writer = await asyncio.open_connection(*_address(server))
    try:
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def http(method: str, path: str, body: bytes | None = None, *, auth: bool = True,
         extra: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n".encode()
    if auth:
        head += AUTH
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
    return head + extra + b"\r\n" + (body or b"")


def problem(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert 400 <= status < 500, (status, body[:300])
    assert headers["content-type"].startswith("application/problem+json"), headers
    doc: dict[str, Any] = json.loads(body)
    assert doc["status"] == status and doc["type"].startswith(BASE) and doc["detail"]
    return doc


async def test_malformed_input_is_a_4xx_problem_never_a_500(serve: Serve) -> None:
    node, server = await serve()
    topic = await node.create_topic("hostile")
    await node.publish(topic.cid, b"one")
    events = f"/v1/topics/{topic.cid}/events"
    stream = f"/v1/topics/{topic.cid}/stream"
    deep = b'{"json": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    just_too_deep = b'{"json": ' + b"[" * JSON_DEPTH + b"]" * JSON_DEPTH + b"}"
    digits = "9" * 5000
    cases: list[tuple[bytes, int, str]] = [
        # a non-UTF-8 Authorization header, on every kind of state-changing call
        (http("POST", "/v1/topics", b'{"name": "x"}', auth=False,
              extra=b"Authorization: Bearer \xff\xfe\x80\r\n"), 401, "unauthorized"),
        (http("POST", events, b'{"text": "x"}', auth=False,
              extra=b"Authorization: \xc3\x28\xa0\xa1\r\n"), 401, "unauthorized"),
        (http("PUT", f"/v1/subscriptions/{topic.cid}", auth=False,
              extra=b"Authorization: Bearer \xed\xa0\x80\r\n"), 401, "unauthorized"),
        # lone surrogates
        (http("POST", events, b'{"text": "\\ud800"}'), 400, "invalid-json"),
        (http("POST", events, b'{"json": {"a": ["\\udfff"]}}'), 400, "invalid-json"),
        (http("POST", events, b'{"json": {"\\ud800": 1}}'), 400, "invalid-json"),
        (http("POST", "/v1/topics", b'{"name": "a\\ud800b"}'), 400, "invalid-json"),
        # nesting
        (http("POST", events, deep), 400, "invalid-json"),
        (http("POST", events, just_too_deep), 400, "invalid-json"),
        # not JSON although Python's json module takes it
        (http("POST", events, b'{"json": NaN}'), 400, "invalid-json"),
        (http("POST", events, b'{"json": Infinity}'), 400, "invalid-json"),
        (http("POST", events, b'{"json": [-Infinity]}'), 400, "invalid-json"),
        (http("POST", events, b'{"json": 1e400}'), 400, "invalid-json"),
        (http("POST", events, '{"text": "utf-16"}'.encode("utf-16")), 400, "invalid-json"),
        (http("POST", events, b'{"text": "\xff"}'), 400, "invalid-json"),
        # unknown fields
        (http("POST", events, b'{"text": "x", "colour": "red"}'), 400, "invalid-field"),
        (http("PATCH", f"/v1/topics/{topic.cid}", b'{"nmae": "x"}'), 400, "invalid-field"),
        # query parameters: only ASCII integers, in range; documented words only
        (http("GET", events + "?cursor=%C2%B2"), 400, "invalid-cid"),
        (http("GET", stream + "?from=%C2%B2"), 400, "invalid-cid"),
        (http("GET", events + f"?cursor={digits}"), 400, "invalid-field"),
        (http("GET", stream + f"?from={digits}"), 400, "invalid-field"),
        (http("GET", stream, extra=f"Last-Event-ID: {digits}\r\n".encode()), 400,
         "invalid-field"),
        (http("GET", events + "?format=xml"), 400, "invalid-field"),
        (http("GET", events + "?limit=%D9%A1%D9%A2"), 400, "invalid-field"),  # Arabic 12
        (http("GET", events + "?limit=1_0"), 400, "invalid-field"),
        (http("GET", events + "?since=nan"), 400, "invalid-field"),
        (http("GET", events + "?until=inf"), 400, "invalid-field"),
        (http("GET", events + "?since=2026-13-01T00:00:00Z"), 400, "invalid-field"),
        (http("PUT", f"/v1/subscriptions/{topic.cid}?replay=maybe"), 400, "invalid-field"),
        (http("GET", "/v1/node/routing?k=%C2%B2"), 400, "invalid-field"),
    ]
    for request, status, kind in cases:
        got = await raw(server, request)
        doc = problem(*got)
        assert (got[0], doc["type"]) == (status, BASE + kind), (request[:120], doc)
    # and what is well formed still works
    status, _, body = await raw(server, http("GET", events + "?format=json&limit=1"))
    assert status == 200 and json.loads(body)["events"][0]["seq"] == 1
    status, _, body = await raw(server, http("POST", events, b'{"json": {"n": 1.5e300}}'))
    assert status == 201


async def test_documented_limits_are_the_enforced_ones(serve: Serve) -> None:
    _, server = await serve()

    async def create(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, _, answer = await raw(server, http("POST", "/v1/topics",
                                                         json.dumps(body).encode()))
        return status, json.loads(answer)

    status, topic = await create({"name": "n" * TOPIC_NAME_BYTES})
    assert status == 201 and len(topic["name"]) == TOPIC_NAME_BYTES
    for name in ("n" * (TOPIC_NAME_BYTES + 1), "é" * (TOPIC_NAME_BYTES // 2 + 1)):
        status, doc = await create({"name": name})
        assert status == 400 and f"1..{TOPIC_NAME_BYTES} bytes" in doc["detail"]
    peers = [str(Identity.generate().peer_id) for _ in range(PEERS + 1)]
    status, topic = await create({"name": "p", "allowed_publishers": peers[:PEERS]})
    assert status == 201 and len(topic["allowed_publishers"]["peers"]) == PEERS
    status, doc = await create({"name": "p", "request_to_publish": peers})
    assert status == 400 and f"at most {PEERS} peer ids" in doc["detail"]
    # a topic descriptor is at most 7 KiB: two full lists do not fit, and that is a 400
    status, doc = await create({"name": "p", "allowed_publishers": peers[:PEERS],
                                "request_to_publish": peers[:PEERS]})
    assert status == 400 and "bytes, more than 7168" in doc["detail"]
    sub = topic["cid"]
    status, _ = await create({"name": "s", "subtopics": {f"s{i}": sub for i in range(10)}})
    assert status == 201
    status, doc = await create({"name": "s", "subtopics": {f"s{i}": sub
                                                          for i in range(SUBTOPICS + 1)}})
    assert status == 400 and f"at most {SUBTOPICS}" in doc["detail"]

    # the OpenAPI document and docs/api.md state the same numbers
    document = openapi_document()
    settings = document["paths"]["/v1/topics"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert settings["name"]["maxLength"] == TOPIC_NAME_BYTES
    assert settings["subtopics"]["maxProperties"] == SUBTOPICS
    assert settings["allowed_publishers"]["oneOf"][1]["maxItems"] == PEERS
    assert document["x-limits"] == LIMITS
    table = (ROOT / "docs" / "api.md").read_text()
    for what, value in LIMITS.items():
        row = re.search(rf"^\| {re.escape(what)} \| ([0-9,]+) \|", table, re.M)
        assert row, f"docs/api.md lacks the limit {what!r}"
        assert int(row[1].replace(",", "")) == value, what


async def _fill(node: Node, name: str, count: int, size: int) -> CID:
    """``count`` signed events of ``size`` bytes, straight into the store and the log."""
    topic = await node.create_topic(name)
    parent = None
    events = []
    for i in range(count):
        event = EventDescriptor.create(node.identity, topic.cid, bytes([i % 251]) * size,
                                       parent=parent)
        events.append(event)
        parent = event.cid
    node.store.put_many([(e.cid, e.block) for e in events])
    node.state.log_append(topic.cid, [e.cid for e in events], time.time())
    return topic.cid


async def test_stalled_readers_hold_a_bounded_send_buffer(serve: Serve) -> None:
    """3,000 events of 6 KiB (24 MiB of NDJSON) to clients that never read: the node keeps
    at most the write buffer, one piece and one event per connection."""
    limits = ServerLimits(write_buffer=64 * 1024)
    node, server = await serve(write_buffer=limits.write_buffer)
    cid = await _fill(node, "big", 3000, 6 * 1024)
    requests = [
        http("GET", f"/v1/topics/{cid}/events?format=ndjson"),
        http("GET", f"/v1/topics/{cid}/stream?from=earliest"),
        http("GET", f"/v1/topics/{cid}/events?limit=1000"),
    ]
    sockets = []
    for request in requests:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.connect(_address(server))
        sock.sendall(request)
        sockets.append(sock)
    try:
        bound = limits.write_buffer + WRITE_CHUNK + 16 * 1024  # + one event's JSON
        peak = 0
        for _ in range(20):
            await asyncio.sleep(0.1)
            sizes = [t.get_write_buffer_size() for t in server.guard.transports]
            peak = max(peak, *sizes)
            for size in sizes:
                # a JSON page is one body, but at most PAGE_BYTES of events
                assert size <= max(bound, PAGE_BYTES + 16 * 1024), sizes
        # The page (2 MiB) may have gone into the kernel's socket buffers and its
        # connection closed; the two streams (24 MiB each) are stalled, holding little.
        streams = [t.get_write_buffer_size() for t in server.guard.transports]
        assert len(streams) >= 2 and peak > limits.write_buffer // 2  # really stalled
        assert sorted(streams)[:2] <= [bound, bound]
    finally:
        for sock in sockets:
            sock.close()
    # and a reader that does read gets everything
    async with aiohttp.ClientSession() as http_client:
        async with http_client.get(f"{server.url}/v1/topics/{cid}/events?format=ndjson") as r:
            lines = [line async for line in r.content]
        async with http_client.get(f"{server.url}/v1/topics/{cid}/events?limit=1000") as r:
            page = await r.json()
    assert len(lines) == 3000
    assert 0 < len(page["events"]) < 1000 and page["next_cursor"] == str(len(page["events"]))


async def test_half_sent_heads_and_bodies_time_out(serve: Serve) -> None:
    _, server = await serve(header_timeout=0.5, body_timeout=0.5)
    reader, writer = await asyncio.open_connection(*_address(server))
    writer.write(b"GET /v1/health HTTP/1.1\r\nHost: test\r\nX-Slow: ")  # never ends
    # Closed, nothing answered. The configured 0.5 s closes it; the guard is only there so
    # that a head timeout left at its default (15 s) fails rather than passes slowly.
    async with asyncio.timeout(ServerLimits().header_timeout - 5):
        assert await reader.read() == b""
    writer.close()

    request = http("POST", "/v1/topics", b'{"name": "slow"}')
    reader, writer = await asyncio.open_connection(*_address(server))
    writer.write(request[:-5])  # the head and part of the body
    async with asyncio.timeout(60):  # a guard against a hang, not a measure
        answer = await reader.read()  # the answer, then the close
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"request-timeout" in answer
    # the configured body timeout did it, not the 30 s default
    assert b"did not arrive within 0.5 s" in answer
    await eventually(lambda: server.guard.total == 0, timeout=10.0, what="connections drained")




async def test_connections_are_capped_per_client_and_in_total(serve: Serve) -> None:
    _, server = await serve(max_connections_per_client=3, max_connections=100)
    held = [await asyncio.open_connection(*_address(server)) for _ in range(3)]
    await eventually(lambda: server.guard.total == 3, timeout=10.0)
    status, headers, body = await raw(server, http("GET", "/v1/health"))
    assert status == 503 and json.loads(body)["type"] == BASE + "unavailable"
    assert "per client address" in json.loads(body)["detail"]
    assert headers["content-type"] == "application/problem+json"
    held.pop()[1].close()
    await eventually(lambda: server.guard.total == 2, timeout=10.0)
    status, _, _ = await raw(server, http("GET", "/v1/health"))
    assert status == 200
    for _, writer in held:
        writer.close()

    _, small = await serve(max_connections=2)
    held = [await asyncio.open_connection(*_address(small)) for _ in range(2)]
    await eventually(lambda: small.guard.total == 2, timeout=10.0)
    status, _, body = await raw(small, http("GET", "/v1/health"))
    assert status == 503 and "at most 2 connections" in json.loads(body)["detail"]
    assert small.guard.refused == 1
    for _, writer in held:
        writer.close()




def test_server_limits_from_the_environment() -> None:
    limits = ServerLimits.from_env({"PULSARCAST_API_HEADER_TIMEOUT": "5",
                                    "PULSARCAST_API_MAX_CONNECTIONS_PER_CLIENT": "8"})
    assert (limits.header_timeout, limits.max_connections_per_client) == (5.0, 8)
    assert limits.max_connections == ServerLimits().max_connections
    with pytest.raises(ValueError, match="MAX_CONNECTIONS must be a number"):
        ServerLimits.from_env({"PULSARCAST_API_MAX_CONNECTIONS": "many"})
    with pytest.raises(ValueError, match="must be positive"):
        ServerLimits(body_timeout=0)


@pytest.mark.parametrize("token", ["a", "short-token", "sixteen chars ok", "ümlaut-token-xxxx"])
def test_node_refuses_a_weak_token_before_starting(
        token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["node", "--data-dir", str(tmp_path / "data"), "--token", token])
    message = str(refused.value.code)
    assert message.startswith("--token: the API token")
    assert "16 characters" in message or "visible ASCII" in message
    assert not (tmp_path / "data").exists()  # nothing started, no token file claimed
