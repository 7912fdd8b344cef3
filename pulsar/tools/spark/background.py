"""Nodes and their REST APIs on an event loop in a background thread.

Spark's calls block the calling thread (``collect()``, ``awaitTermination()``) while Spark's
Python workers — other processes — call the node's REST API. A node served from the same
thread would never answer; served from this loop, it answers while the main thread waits in
Spark. The benchmark and the tests use it; applications run real nodes (``pulsarcast
node``/``devnet``) instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from api.server import ApiServer
from pulsar.node import Node

__all__ = ["BackgroundLoop", "ServedNode"]

T = TypeVar("T")


class BackgroundLoop:
    """An event loop running in a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self, name: str = "pulsarcast-nodes") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the loop's thread: a node's SQLite connection belongs to it."""
        async def on_loop() -> T:
            return fn(*args)

        return self.run(on_loop())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass
class ServedNode:
    """A node and the REST API in front of it."""

    node: Node
    server: ApiServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.token

    @classmethod
    async def serve(cls, node: Node, token: str | None = None) -> ServedNode:
        return cls(node, await ApiServer.start(node, token=token))

    async def stop(self) -> None:
        await self.server.stop()
        await self.node.stop()
