"""``pulsarcast bench api``: what the REST API adds on top of the node it fronts.

One real node (UDP DHT, TCP transport, SQLite) with its REST API on a loopback socket, one
topic, 256-byte payloads. The HTTP client runs in a **separate process**
(``python -m pulsar.tools.bench.api client ...``) with its own event loop, as a real
client would: in the server's loop it would take half of the one core that loop has,
and the figures would be those of client and server together. Each figure is timed
inside the client. Figures:

* ``publish_req_per_s`` — ``POST /v1/topics/{cid}/events`` over keep-alive connections of
  one ``aiohttp.ClientSession``, ``publish_concurrency`` requests in flight at a time
  (``publish_requests`` in all), each answered 201 with the event; against
  ``embedded_publish_per_s``, ``node.publish()`` called in the server process with the same
  number in flight (``publish_vs_embedded`` is the ratio);
* ``sse_events_per_s`` — ``GET /v1/topics/{cid}/stream?from=earliest`` over a delivery log
  of ``events`` events: from sending the request to reading the ``events``-th event;
* ``history_ndjson_events_per_s`` — ``GET /v1/topics/{cid}/events?format=ndjson`` of the
  same ``events`` events, request to last line;
* ``log_entries_per_s`` — the baseline for both reads: ``node.log_entries()`` called
  directly in pages of 1,000 (reading and decoding the log, no JSON, no HTTP);
  ``sse_vs_direct`` and ``ndjson_vs_direct`` are the ratios.

The log is filled through the embedded node (``node.publish()``, 64 in flight) — what is
measured is reading it, not filling it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from api.server import ApiServer
from dht import DhtConfig
from pulsar import Node, NodeConfig
from pulsar.proto.core import LONE_NODE
from pulsar.runtime.loop import run as run_loop

__all__ = ["bench_api"]

PAYLOAD_BYTES = 256
PUBLISH_CONCURRENCY = 8
FILL_WINDOW = 64
READ_PAGE = 1000
PUBLISH_MAX = 3000
"""Publish requests are at most this many (the log size ``events`` is usually larger)."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the client process


async def _client_publish(url: str, token: str, topic: str, count: int,
                          concurrency: int) -> dict[str, Any]:
    body = json.dumps({"base64": base64.b64encode(os.urandom(PAYLOAD_BYTES)).decode()})
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    target = f"{url}/v1/topics/{topic}/events"
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:
        async def post() -> None:
            async with http.post(target, data=body) as response:
                await response.read()
                if response.status != 201:
                    raise RuntimeError(f"publish answered {response.status}")

        await asyncio.gather(*(post() for _ in range(concurrency)))  # open the connections
        left = count

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await post()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"count": count, "seconds": elapsed}


async def _client_read(url: str, token: str, path: str, count: int,
                       marker: bytes) -> dict[str, Any]:
    """Read ``path`` until ``marker`` has been seen ``count`` times."""
    headers = {"Authorization": f"Bearer {token}"}
    seen = 0
    carry = b""
    async with aiohttp.ClientSession(headers=headers) as http:
        start = time.perf_counter()
        async with http.get(url + path) as response:
            if response.status != 200:
                raise RuntimeError(f"{path} answered {response.status}")
            async for chunk in response.content.iter_any():
                data = carry + chunk
                seen += data.count(marker)
                carry = data[-(len(marker) - 1):] if len(marker) > 1 else b""
                if seen >= count:
                    break
        elapsed = time.perf_counter() - start
    if seen < count:
        raise RuntimeError(f"{path} ended after {seen} of {count} events")
    return {"count": seen, "seconds": elapsed}


def _client_main(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["op"] == "publish":
        work = _client_publish(spec["url"], spec["token"], spec["topic"], spec["count"],
                               spec["concurrency"])
    else:
        work = _client_read(spec["url"], spec["token"], spec["path"], spec["count"],
                            spec["marker"].encode())
    return run_loop(work)


async def _in_client(spec: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pulsar.tools.bench.api", "client", json.dumps(spec),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"bench client failed: {err.decode(errors='replace')[-2000:]}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


# ------------------------------------------------------------------ the server side


async def _publish_many(node: Node, topic: Any, count: int, window: int) -> float:
    """Seconds to publish ``count`` events with ``window`` calls in flight."""
    payload = os.urandom(PAYLOAD_BYTES)
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await node.publish(topic, payload)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    return time.perf_counter() - start


def _read_log(node: Node, topic: Any) -> tuple[int, float]:
    start = time.perf_counter()
    position = 0
    total = 0
    while True:
        entries = node.log_entries(topic, after=position, limit=READ_PAGE)
        if not entries:
            break
        total += len(entries)
        position = entries[-1].seq
    return total, time.perf_counter() - start


async def bench_api(events: int = 10_000, publish_requests: int | None = None,
                    concurrency: int = PUBLISH_CONCURRENCY,
                    data_dir: Path | None = None) -> dict[str, Any]:
    """Run the benchmark; figures as described in the module docstring."""
    publishes = publish_requests or min(events, PUBLISH_MAX)
    # The SSE handler outlives its client (it waits for the log until the node stops) and
    # then writes its end event to a closed socket, which aiohttp logs as an error: noise
    # here, where the client has left on purpose.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="pulsarcast-bench-api-") as tmp:
        root = data_dir or Path(tmp)
        node = await Node.start(NodeConfig(data_dir=root / "n0",
                                           dht=DhtConfig(rpc_timeout=1.0),
                                           core=LONE_NODE))
        server: ApiServer | None = None
        try:
            server = await ApiServer.start(node, token="bench-token")
            topic = await node.create_topic("bench/api")
            cid = str(topic.cid)
            # Warm both paths (first-use caches, connection set-up) before measuring.
            await _publish_many(node, topic.cid, 50, concurrency)

            _say(f"embedded publish: {publishes} events, {concurrency} in flight")
            embedded_s = await _publish_many(node, topic.cid, publishes, concurrency)
            _say(f"HTTP publish: {publishes} requests, {concurrency} in flight")
            published = await _in_client({
                "op": "publish", "url": server.url, "token": server.token, "topic": cid,
                "count": publishes, "concurrency": concurrency,
            })

            have = node.last_position(topic.cid)
            if have < events:
                _say(f"filling the log: {events - have} more events")
                await _publish_many(node, topic.cid, events - have, FILL_WINDOW)
            size = node.last_position(topic.cid)
            _say(f"direct log read: {size} events")
            read, direct_s = _read_log(node, topic.cid)
            if read != size:
                raise RuntimeError(f"log holds {size} positions but {read} entries")

            _say(f"NDJSON history: {size} events")
            ndjson = await _in_client({
                "op": "read", "url": server.url, "token": server.token, "count": size,
                "path": f"/v1/topics/{cid}/events?format=ndjson", "marker": "\n",
            })
            _say(f"SSE from=earliest: {size} events")
            sse = await _in_client({
                "op": "read", "url": server.url, "token": server.token, "count": size,
                "path": f"/v1/topics/{cid}/stream?from=earliest",
                "marker": "\nevent: event\n",
            })
        finally:
            if server is not None:
                await server.stop()
            await node.stop()

    publish_rate = published["count"] / published["seconds"]
    embedded_rate = publishes / embedded_s
    direct_rate = size / direct_s
    sse_rate = sse["count"] / sse["seconds"]
    ndjson_rate = ndjson["count"] / ndjson["seconds"]
    return {
        "benchmark": "api",
        "nodes": 1,
        "payload_bytes": PAYLOAD_BYTES,
        "client": "separate process, one aiohttp.ClientSession, keep-alive",
        "publish_requests": publishes,
        "publish_concurrency": concurrency,
        "publish_req_per_s": round(publish_rate, 1),
        "embedded_publish_per_s": round(embedded_rate, 1),
        "publish_vs_embedded": round(publish_rate / embedded_rate, 3),
        "events": size,
        "sse_events_per_s": round(sse_rate, 1),
        "history_ndjson_events_per_s": round(ndjson_rate, 1),
        "log_entries_per_s": round(direct_rate, 1),
        "sse_vs_direct": round(sse_rate / direct_rate, 3),
        "ndjson_vs_direct": round(ndjson_rate / direct_rate, 3),
        "targets": {"publish_req_per_s": 1000, "sse_events_per_s": 5000,
                    "history_ndjson_events_per_s": 20000},
    }


if __name__ == "__main__":  # the client process: python -m pulsar.tools.bench.api client '<spec>'
    if len(sys.argv) != 3 or sys.argv[1] != "client":
        sys.exit("usage: python -m pulsar.tools.bench.api client '<json spec>'")
    print(json.dumps(_client_main(json.loads(sys.argv[2]))), flush=True)
