"""Long-running processes with the REST API: one node (``pulsarcast node``) or a local
network (``pulsarcast devnet``, what ``make run`` starts). They run until SIGINT or SIGTERM,
then stop the API, then the nodes (which flush their stores)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from api.limits import ServerLimits
from api.server import ApiServer
from pulsar import Node, NodeConfig

from .devnet import Devnet

__all__ = ["run_devnet", "run_node"]


@contextlib.contextmanager
def _signals() -> Iterator[asyncio.Event]:
    """An event set by SIGINT or SIGTERM. Enter it before saying the node is ready, so a
    supervisor that signals as soon as it reads that line gets a clean stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _limits() -> ServerLimits:
    """The API's connection limits from the environment (docs/operations.md)."""
    try:
        return ServerLimits.from_env()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def describe(index: int, node: Node, server: ApiServer) -> dict[str, Any]:
    host, port = node.address
    return {
        "node": index,
        "peer_id": str(node.peer_id),
        "address": f"{host}:{port}",
        "url": server.url,
        "token": server.token,
        "data_dir": str(node.config.data_dir),
    }


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tour(first: dict[str, Any]) -> str:
    url, token = first["url"], first["token"]
    return f"""
Open {url}/ in a browser: each node serves a page of its topics, trees and live events.
Try it (node 0; every node has its own URL and token):
  export PC={url} TOKEN={token}
  curl -s -X POST $PC/v1/topics -H "Authorization: Bearer $TOKEN" \\
       -H 'Content-Type: application/json' -d '{{"name": "demo"}}'
  curl -s -X POST $PC/v1/topics/<cid>/events -H "Authorization: Bearer $TOKEN" \\
       -H 'Content-Type: application/json' -d '{{"text": "hello"}}'
  curl -N "$PC/v1/topics/<cid>/stream?from=earliest"
or with the CLI:
  export PULSARCAST_URL={url} PULSARCAST_TOKEN={token}
  CID=$(.venv/bin/pulsarcast topic create demo)
  .venv/bin/pulsarcast publish $CID --text hello
  .venv/bin/pulsarcast subscribe $CID --from earliest
  .venv/bin/pulsarcast doctor
API reference: docs/api.md. Press Ctrl-C to stop."""


async def run_devnet(count: int, data_dir: Path | None, as_json: bool, base_port: int,
                     api_base_port: int = 0, api_host: str = "127.0.0.1") -> int:
    """Start ``count`` nodes and an API on each; print how to reach them; run until
    signalled."""
    if count < 1:
        raise SystemExit("--nodes must be at least 1")
    limits = _limits()
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="devnet-")))
        net = Devnet(data_dir, count, base_port)
        servers: list[ApiServer] = []

        def progress(done: int, total: int) -> None:
            if not as_json:
                print(f"\rstarting nodes: {done}/{total}", end="", file=sys.stderr, flush=True)

        try:
            await net.start(progress)
            if not as_json:
                print(file=sys.stderr)
            stop = stack.enter_context(_signals())
            described = []
            for i, node in enumerate(net.nodes):
                port = api_base_port + i if api_base_port else 0
                try:
                    server = await ApiServer.start(node, host=api_host, port=port,
                                                   limits=limits)
                except OSError as exc:
                    raise SystemExit(f"cannot serve the API of node {i} on "
                                     f"{api_host}:{port}: {exc.strerror}") from None
                servers.append(server)
                info = describe(i, node, server)
                described.append(info)
                if as_json:
                    print(json.dumps(info), flush=True)
                else:
                    print(f"node {i}: {info['url']}  token {info['token']}  "
                          f"peer {info['peer_id']}  p2p {info['address']}", flush=True)
            if not as_json:
                _say(_tour(described[0]))
            await stop.wait()
        finally:
            for server in servers:
                await server.stop()
            await net.stop()
    return 0


GC_HOLD_MAX_S = 120.0
"""Longest the collector is held back while a restarted node rejoins its trees."""


async def _freeze_after_resume(node: Node) -> None:
    """With the collector held back since before the node started: once every durable
    subscription is rejoined (or :data:`GC_HOLD_MAX_S` passed), move every object into
    the permanent generation and let the collector run again. A full collection walks
    every object of the process: with 20,000 trees resumed that is a stall of half a
    second or more, several times while they are created; frozen, the node's long-lived
    state is never walked again. Nothing is collected first: with the collector held back,
    the youngest generation holds everything the resume made, and collecting it was itself
    a stall of half a second (``bench restart``); the price is that cyclic garbage made
    during the resume is never freed. Only ``pulsarcast node`` does this: the process is
    the node's. An embedded node leaves the host's collector alone (docs/operations.md)."""
    deadline = time.monotonic() + GC_HOLD_MAX_S
    try:
        while node.metrics.get("topics_to_resume", 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # polling interval: nothing signals the end of a resume
    finally:
        gc.freeze()
        gc.enable()


async def run_node(config: NodeConfig, api_host: str, api_port: int, token: str | None,
                   as_json: bool, gc_freeze: bool = True) -> int:
    """One node with its API, until signalled. With ``gc_freeze`` the garbage collector is
    held back while the node resumes, then its state frozen (:func:`_freeze_after_resume`)."""
    limits = _limits()
    if gc_freeze:
        gc.disable()
    try:
        node = await Node.start(config)
    except BaseException:
        gc.enable()
        raise
    freezer = asyncio.ensure_future(_freeze_after_resume(node)) if gc_freeze else None
    server = None
    try:
        server = await ApiServer.start(node, host=api_host, port=api_port, token=token,
                                       limits=limits)
        info = describe(0, node, server)
        del info["node"]
        with _signals() as stop:
            _announce(info, config, token, as_json)
            await stop.wait()
    finally:
        if freezer is not None:
            freezer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await freezer
        if server is not None:
            await server.stop()
        await node.stop()
    return 0


def _announce(info: dict[str, Any], config: NodeConfig, token: str | None, as_json: bool
              ) -> None:
    if as_json:
        print(json.dumps(info), flush=True)
        return
    where = ("given with --token (not stored)" if token is not None
             else f"in {config.data_dir / 'api-token'}")
    print(f"node {info['peer_id']}\n  p2p  {info['address']} (UDP DHT + TCP)\n"
          f"  api  {info['url']}\n  token {where}", flush=True)
