"""``pulsarcast bench abuse``: the attacks of the hardening issue, against a real local node.

One ``pulsarcast node`` runs in a **child process** (UDP DHT, TCP transport, SQLite, REST API
on loopback, default settings), so its memory is its own and the attacker does not share its
event loop. This process plays the attacker (and, for latency, a client); a second child
floods the DHT. Figures, printed as one JSON line:

* ``rest_5xx`` — answers >= 500 to a fixed battery of bad REST inputs (``REST_BATTERY``:
  non-UTF-8 ``Authorization``, lone surrogates in ``text``/``json``/``name``, JSON nested
  3,000 deep, ``cursor=²``, 4,300-digit cursors, ``NaN``/``1e400``, unknown fields,
  ``format=xml`` ...); ``rest_bad_accepted`` counts those answered 2xx (each should be a
  4xx), ``rest_failed`` those that got no HTTP answer at all;
* ``stalled_readers_mem_mb`` — growth of the node's RSS while 10 clients request a large
  history (NDJSON) or stream (SSE, ``from=earliest``) of ``history_mb`` of large events and
  never read (peak over ``stall_seconds``, against the RSS just before they connected);
* ``dht_reflection_ratio`` — bytes that came back / bytes sent, for a fresh source address
  that never answers (what a forged address looks like): 100 PINGs with random node ids,
  then FIND_VALUE of records the node holds and FIND_NODE, counted for
  ``reflection_seconds`` (20 s, as in the issue's measurement; the node's validation PING
  times out after 5 s). At most 3 by design (``dht.address_check``);
* ``unproven_source_stored_bytes`` — bytes of valid 8,000-byte raw blocks one source (that
  answers PINGs, but is no proven peer) got acknowledged as stored, sending
  ``junk_mb`` paced under the byte rate limit; ``source_store_quota`` is the limit;
* ``rest_p99_ms_during_dht_flood`` — p99 of a small history page (``GET .../events?limit=
  20``), sequential requests, while a child process floods the DHT port as fast as it can
  (PINGs with random ids, STOREs, FIND_VALUEs, garbage); ``rest_p99_ms_baseline`` is the same
  without the flood.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["REST_BATTERY", "bench_abuse"]

TOKEN = "bench-abuse-token-0123456789"
_PING = b"\x92\xa4ping"  # how a PING request's msgpack body starts
STALLED = 10
SOURCE_QUOTA = 8 * 1024 * 1024  # dht.config.DhtConfig.source_store_quota, the default


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the node under attack


@dataclass
class _Node:
    process: asyncio.subprocess.Process
    api: tuple[str, int]
    dht: tuple[str, int]

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0


async def _start_node(data_dir: Path) -> _Node:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pulsar", "node", "--min-acks", "0", "--data-dir", str(data_dir),
        "--api-port", "0", "--token", TOKEN, "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    if not line:
        raise RuntimeError("the node did not start")
    info = json.loads(line)
    api_host, api_port = info["url"].removeprefix("http://").rsplit(":", 1)
    host, port = info["address"].rsplit(":", 1)
    return _Node(process, (api_host, int(api_port)), (host, int(port)))


async def _stop_node(node: _Node) -> None:
    if node.process.returncode is None:
        node.process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(node.process.wait(), 20)
        except TimeoutError:
            node.process.kill()
            await node.process.wait()


# ------------------------------------------------------------------ raw HTTP


def _request(method: str, path: bytes | str, *, auth: bytes | None = None,
             body: bytes | None = None, headers: dict[bytes, bytes] | None = None) -> bytes:
    path_bytes = path.encode() if isinstance(path, str) else path
    lines = [method.encode() + b" " + path_bytes + b" HTTP/1.1", b"Host: 127.0.0.1",
             b"Connection: close"]
    if auth is not None:
        lines.append(b"Authorization: " + auth)
    for name, value in (headers or {}).items():
        lines.append(name + b": " + value)
    if body is not None:
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


async def _status(api: tuple[str, int], raw: bytes, timeout: float = 15.0) -> int | None:
    """The status code answered to ``raw``, or None if the server closed without one."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*api), timeout)
    except OSError:
        return None
    try:
        writer.write(raw)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _json_call(api: tuple[str, int], method: str, path: str,
                     body: dict[str, Any] | None = None) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.request(
            method, f"http://{api[0]}:{api[1]}{path}", json=body,
            headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {await response.text()}")
        return await response.json()


# ------------------------------------------------------------------ 1. the REST battery

BEARER = ("Bearer " + TOKEN).encode()
DEEP = b"[" * 3000 + b"]" * 3000

REST_BATTERY: list[tuple[str, str, str, bytes | None, bytes | None, dict[bytes, bytes]]] = [
    # (name, method, path ({cid}: a topic), Authorization, body, other headers)
    ("auth-non-utf8-create", "POST", "/v1/topics", b"Bearer \xff\xfe\xfd", b'{"name":"x"}', {}),
    ("auth-non-utf8-publish", "POST", "/v1/topics/{cid}/events", b"Bearer \xc3(",
     b'{"text":"a"}', {}),
    ("auth-latin1-subscribe", "PUT", "/v1/subscriptions/{cid}", b"Bearer caf\xe9", None, {}),
    ("text-lone-surrogate", "POST", "/v1/topics/{cid}/events", BEARER,
     b'{"text":"\\ud800"}', {}),
    ("json-lone-surrogate", "POST", "/v1/topics/{cid}/events", BEARER,
     b'{"json":"\\udfff"}', {}),
    ("json-key-lone-surrogate", "POST", "/v1/topics/{cid}/events", BEARER,
     b'{"json":{"\\ud800":1}}', {}),
    ("name-lone-surrogate", "POST", "/v1/topics", BEARER, b'{"name":"\\ud800"}', {}),
    ("json-3000-deep", "POST", "/v1/topics/{cid}/events", BEARER,
     b'{"json":' + DEEP + b"}", {}),
    ("name-3000-deep", "POST", "/v1/topics", BEARER, b'{"name":' + DEEP + b"}", {}),
    ("cursor-superscript", "GET", "/v1/topics/{cid}/events?cursor=%C2%B2", None, None, {}),
    ("from-superscript", "GET", "/v1/topics/{cid}/stream?from=%C2%B2", None, None, {}),
    ("limit-superscript", "GET", "/v1/topics/{cid}/events?limit=%C2%B2", None, None, {}),
    ("since-superscript", "GET", "/v1/topics/{cid}/events?since=%C2%B2", None, None, {}),
    ("cursor-4300-digits", "GET", "/v1/topics/{cid}/events?cursor=" + "9" * 4300, None, None,
     {}),
    ("cursor-5000-digits-ndjson", "GET",
     "/v1/topics/{cid}/events?format=ndjson&cursor=" + "1" * 5000, None, None, {}),
    ("from-4300-digits", "GET", "/v1/topics/{cid}/stream?from=" + "7" * 4300, None, None, {}),
    ("json-nan", "POST", "/v1/topics/{cid}/events", BEARER, b'{"json":NaN}', {}),
    ("json-1e400", "POST", "/v1/topics/{cid}/events", BEARER, b'{"json":1e400}', {}),
    ("json-minus-infinity", "POST", "/v1/topics/{cid}/events", BEARER,
     b'{"json":-Infinity}', {}),
    ("publish-unknown-field", "POST", "/v1/topics/{cid}/events", BEARER,
     b'{"text":"a","colour":"red"}', {}),
    ("format-xml", "GET", "/v1/topics/{cid}/events?format=xml", None, None, {}),
    ("name-300-bytes", "POST", "/v1/topics", BEARER,
     json.dumps({"name": "\u00e9" * 150}).encode(), {}),
    ("body-truncated", "POST", "/v1/topics/{cid}/events", BEARER, b'{"text":', {}),
    ("body-not-an-object", "POST", "/v1/topics/{cid}/events", BEARER, b"[]", {}),
    ("body-not-utf8", "POST", "/v1/topics/{cid}/events", BEARER, b'{"text":"\xff"}', {}),
    ("parent-not-a-cid", "POST", "/v1/topics/{cid}/events", BEARER,
     b'{"text":"a","parent":"xyz"}', {}),
    ("event-not-a-cid", "GET", "/v1/events/not-a-cid", None, None, {}),
    ("topic-superscript", "GET", "/v1/topics/%C2%B2", None, None, {}),
    ("subtopics-not-cids", "POST", "/v1/topics", BEARER,
     b'{"name":"x","subtopics":{"a":"\\ud800"}}', {}),
]


async def _rest_battery(api: tuple[str, int], cid: str) -> dict[str, Any]:
    codes: dict[str, int | None] = {}
    for name, method, path, auth, body, headers in REST_BATTERY:
        raw = _request(method, path.replace("{cid}", cid), auth=auth, body=body,
                       headers=headers)
        codes[name] = await _status(api, raw)
    five = sorted(n for n, c in codes.items() if c is not None and c >= 500)
    accepted = sorted(n for n, c in codes.items() if c is not None and c < 400)
    failed = sorted(n for n, c in codes.items() if c is None)
    if five or accepted or failed:
        _say(f"REST battery: 5xx {five}; accepted {accepted}; no answer {failed}")
    return {"rest_battery": len(REST_BATTERY), "rest_5xx": len(five),
            "rest_bad_accepted": len(accepted), "rest_failed": len(failed)}


# ------------------------------------------------------------------ 2. stalled readers


async def _stalled_readers(node: _Node, cid: str, seconds: float) -> float:
    """Peak RSS growth (MB) while ``STALLED`` clients ask for everything and read nothing."""
    before = node.rss_mb()
    sockets = []
    for i in range(STALLED):
        path = (f"/v1/topics/{cid}/events?format=ndjson" if i % 2 == 0
                else f"/v1/topics/{cid}/stream?from=earliest")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(node.api)
        sock.sendall(_request("GET", path))
        sockets.append(sock)  # never read
    peak = before
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        peak = max(peak, node.rss_mb())
    for sock in sockets:
        sock.close()
    return peak - before


# ------------------------------------------------------------------ 3./4. the DHT


class _Udp(asyncio.DatagramProtocol):
    """A raw rpcudp endpoint: counts bytes, answers PINGs only if ``answers``."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.node_id = os.urandom(20)
        self.transport: asyncio.DatagramTransport | None = None
        self.sent = 0
        self.received = 0
        self.pinged = 0
        self.waiting: dict[bytes, asyncio.Future[object]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        import umsgpack

        self.received += len(data)
        if data[:1] == b"\x01":
            waiter = self.waiting.pop(data[1:21], None)
            if waiter is not None and not waiter.done():
                with contextlib.suppress(Exception):
                    waiter.set_result(umsgpack.unpackb(data[21:]))
        elif data[:1] == b"\x00" and data[21:27] == _PING:
            self.pinged += 1
            if self.answers:
                self.send(b"\x01" + data[1:21] + umsgpack.packb(self.node_id), addr)

    def send(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        self.sent += len(data)
        self.transport.sendto(data, addr)

    def request(self, addr: tuple[str, int], name: str, *args: object
                ) -> asyncio.Future[object]:
        from dht.wire import encode_request

        msg_id = os.urandom(20)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.waiting[msg_id] = future
        self.send(encode_request(msg_id, name, list(args)), addr)
        return future


async def _udp(answers: bool) -> _Udp:
    _, endpoint = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: _Udp(answers), local_addr=("127.0.0.1", 0))
    return endpoint


async def _reflection(node: _Node, keys: list[bytes], seconds: float) -> dict[str, Any]:
    """A source that never answers: what comes back for what it sends."""
    victim = await _udp(answers=False)
    try:
        for _ in range(100):
            victim.request(node.dht, "ping", os.urandom(20))
        for key in keys[:50]:
            victim.request(node.dht, "find_value", os.urandom(20), key)
            victim.request(node.dht, "find_node", os.urandom(20), key)
        await asyncio.sleep(seconds)  # > the node's validation PING timeout (rpc_timeout 5 s)
        return {"dht_reflection_ratio": round(victim.received / victim.sent, 3),
                "dht_reflection_bytes_sent": victim.sent,
                "dht_reflection_bytes_back": victim.received}
    finally:
        assert victim.transport is not None
        victim.transport.close()


async def _junk(node: _Node, total_bytes: int) -> dict[str, Any]:
    """One source (answers PINGs, no proven peer) stores valid 8,000-byte raw blocks."""
    from dag.cid import cid_of_raw
    from dht.keys import dht_key

    source = await _udp(answers=True)
    size, per_round, pause = 8000, 64, 0.2  # 2.5 MB/s: under the 4 MiB/s byte rate limit
    stored = 0
    sent = 0
    try:
        await asyncio.wait_for(source.request(node.dht, "ping", source.node_id), 10)
        await asyncio.sleep(0.2)  # the node's validation PING has been answered
        while sent < total_bytes:
            values = [os.urandom(size) for _ in range(per_round)]
            answers = [source.request(node.dht, "store", source.node_id,
                                      dht_key(cid_of_raw(v)), v) for v in values]
            sent += size * per_round
            done = await asyncio.gather(*(asyncio.wait_for(a, 10) for a in answers),
                                        return_exceptions=True)
            stored += size * sum(1 for d in done if d is True)
            await asyncio.sleep(pause)
    finally:
        assert source.transport is not None
        source.transport.close()
    return {"unproven_source_stored_bytes": stored, "source_store_quota": SOURCE_QUOTA,
            "junk_sent_bytes": sent}


def _flood(addr: tuple[str, int], stop: Any, counter: Any, running: Any) -> None:
    """Child process: flood the DHT port until ``stop`` is set (answering the node's PINGs,
    so that it serves the flood); ``running`` is set once the first datagrams are out,
    ``counter`` gets datagrams per second."""
    import umsgpack

    from dag.cid import cid_of_raw
    from dht.keys import dht_key
    from dht.wire import encode_request

    me = os.urandom(20)
    blocks = [os.urandom(8000) for _ in range(200)]
    stores = [encode_request(os.urandom(20), "store", [me, dht_key(cid_of_raw(b)), b])
              for b in blocks]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    sent = 0
    started = time.monotonic()
    end = started + 300.0  # in case the parent dies
    while not stop.is_set() and time.monotonic() < end:
        kind = sent % 4
        if kind == 0:
            data = encode_request(os.urandom(20), "ping", [os.urandom(20)])
        elif kind == 1:
            data = stores[sent % len(stores)]
        elif kind == 2:
            data = encode_request(os.urandom(20), "find_value", [me, os.urandom(20)])
        else:
            data = b"\x00" + os.urandom(60)
        with contextlib.suppress(BlockingIOError):
            sock.sendto(data, addr)
            sent += 1
        if sent == 256:
            running.set()
        if sent % 64 == 0:
            while True:
                try:
                    answer, src = sock.recvfrom(65536)
                except BlockingIOError:
                    break
                if answer[:1] == b"\x00" and answer[21:27] == _PING:
                    with contextlib.suppress(BlockingIOError):
                        sock.sendto(b"\x01" + answer[1:21] + umsgpack.packb(me), src)
    counter.value = round(sent / (time.monotonic() - started))
    sock.close()


async def _p99_ms(api: tuple[str, int], cid: str, requests: int) -> float:
    import aiohttp

    url = f"http://{api[0]}:{api[1]}/v1/topics/{cid}/events?limit=20"
    times = []
    async with aiohttp.ClientSession() as session:
        for _ in range(30):  # warm up: connection, caches
            async with session.get(url) as response:
                await response.read()
        for _ in range(requests):
            start = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
            times.append(time.perf_counter() - start)
    times.sort()
    return round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 2)


# ------------------------------------------------------------------ the run


async def bench_abuse(*, events: int = 40, payload_kb: int = 512, junk_mb: float = 24.0,
                      stall_seconds: float = 12.0, reflection_seconds: float = 20.0,
                      latency_requests: int = 500,
                      data_dir: Path | None = None) -> dict[str, Any]:
    """Run every attack against one fresh node; figures as in the module docstring."""
    from dag.cid import CID
    from dht.keys import dht_key

    with tempfile.TemporaryDirectory(prefix="pulsarcast-bench-abuse-") as tmp:
        node = await _start_node((data_dir or Path(tmp)) / "node")
        figures: dict[str, Any] = {"benchmark": "abuse"}
        try:
            big = await _json_call(node.api, "POST", "/v1/topics", {"name": "abuse/big"})
            small = await _json_call(node.api, "POST", "/v1/topics", {"name": "abuse/small"})
            _say(f"publishing {events} events of {payload_kb} KiB")
            payload = base64.b64encode(os.urandom(payload_kb * 1024)).decode()
            cids = []
            for _ in range(events):
                event = await _json_call(node.api, "POST", f"/v1/topics/{big['cid']}/events",
                                         {"base64": payload})
                cids.append(event["cid"])
            for i in range(50):
                event = await _json_call(node.api, "POST",
                                         f"/v1/topics/{small['cid']}/events",
                                         {"text": f"small {i}"})
                cids.append(event["cid"])
            keys = [dht_key(CID.parse(c)) for c in cids]
            figures["history_mb"] = round(events * payload_kb / 1024, 1)

            _say(f"REST battery (node RSS {node.rss_mb():.0f} MB)")
            figures |= await _rest_battery(node.api, big["cid"])
            _say(f"{STALLED} stalled readers for {stall_seconds} s")
            figures["stalled_readers"] = STALLED
            figures["stalled_readers_mem_mb"] = round(
                await _stalled_readers(node, big["cid"], stall_seconds), 1)
            await asyncio.sleep(1.0)
            _say(f"DHT reflection (node RSS {node.rss_mb():.0f} MB)")
            figures |= await _reflection(node, keys, reflection_seconds)
            _say(f"DHT junk: {junk_mb} MB from one source (node RSS {node.rss_mb():.0f} MB)")
            figures |= await _junk(node, int(junk_mb * 1e6))

            _say(f"REST latency, then during a DHT flood (node RSS {node.rss_mb():.0f} MB)")
            figures["rest_p99_ms_baseline"] = await _p99_ms(node.api, small["cid"],
                                                            latency_requests)
            context = multiprocessing.get_context("spawn")
            counter = context.Value("q", 0)
            stop = context.Event()
            running = context.Event()
            flooder = context.Process(target=_flood, args=(node.dht, stop, counter, running))
            flooder.start()
            try:
                # A spawned child imports before it sends: wait until the flood is under way
                # (on a loaded machine that took over 1.5 s), then give it a moment to build.
                loop = asyncio.get_running_loop()
                if not await loop.run_in_executor(None, running.wait, 60.0):
                    raise RuntimeError("the DHT flooder did not start within 60 s")
                await asyncio.sleep(1.0)  # the flood's own pace, not synchronisation
                figures["rest_p99_ms_during_dht_flood"] = await _p99_ms(
                    node.api, small["cid"], latency_requests)
            finally:
                stop.set()
                await asyncio.get_running_loop().run_in_executor(None, flooder.join, 30)
                if flooder.is_alive():
                    flooder.kill()
            figures["dht_flood_datagrams_per_s"] = counter.value
            figures["node_rss_mb_end"] = round(node.rss_mb(), 1)
            figures |= await _dht_counters(node)
        finally:
            await _stop_node(node)
    return figures


async def _dht_counters(node: _Node) -> dict[str, int]:
    """The node's own DHT counters, from its Prometheus endpoint."""
    import aiohttp

    wanted = ("stores_over_source_quota", "stores_rate_limited", "requests_unvalidated_dropped",
              "validations_failed", "handed_off")
    async with aiohttp.ClientSession() as session, session.get(
            f"http://{node.api[0]}:{node.api[1]}/metrics") as response:
        text = await response.text()
    out: dict[str, int] = {}
    for line in text.splitlines():
        for name in wanted:
            if line.startswith(f"pulsarcast_dht_{name}") and " " in line:
                out[f"dht_{name}"] = int(float(line.rsplit(" ", 1)[1]))
    return out
