"""Real nodes with their REST APIs for the Spark tests, shared by the whole Spark run.

The nodes live on an event loop in a background thread (:class:`BackgroundLoop`): Spark's
calls block the test's thread while Spark's Python workers — other processes — call the
nodes' REST APIs. Node 0 authors the topics; node 1 follows some of them, so streams are
read from a subscriber whose log is filled by the network, not by itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pulsar.tools.spark.background import BackgroundLoop, ServedNode
from tests.node.conftest import Network

HISTORY = 5_000
PUBLISH_WINDOW = 64


@dataclass
class SparkNet:
    """Two served nodes and a 5,000-event topic authored by node 0, followed by node 1."""

    bg: BackgroundLoop
    nodes: list[ServedNode]
    filling: concurrent.futures.Future[list[str]] | None = None
    _history: str = ""

    @property
    def history_topic(self) -> str:
        """The 5,000-event topic, once filled: the fill runs while the Spark session starts
        (both take seconds; the nodes' thread and Spark's JVM use different cores)."""
        if self.filling is not None:
            assert len(self.filling.result(120)) == HISTORY
            self.filling = None
        return self._history

    def url(self, index: int = 0) -> str:
        return self.nodes[index].url

    def token(self, index: int = 0) -> str:
        return self.nodes[index].token

    def options(self, index: int = 0, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url(index), **extra}

    def create_topic(self, name: str, **settings: Any) -> str:
        topic = self.bg.run(self.nodes[0].node.create_topic(name, **settings))
        return str(topic.cid)

    def publish(self, topic: str, payloads: list[bytes], index: int = 0,
                window: int = PUBLISH_WINDOW) -> list[str]:
        """Publish through the embedded node, ``window`` at a time; the CIDs in call order."""
        return self.publish_soon(topic, payloads, index, window).result(120)

    def publish_soon(self, topic: str, payloads: list[bytes], index: int = 0,
                     window: int = PUBLISH_WINDOW) -> concurrent.futures.Future[list[str]]:
        """:meth:`publish`, started on the nodes' loop and not waited for."""
        from dag import CID

        node = self.nodes[index].node
        cid = CID.parse(topic)

        async def run() -> list[str]:
            out: list[str] = [""] * len(payloads)
            pending = iter(enumerate(payloads))

            async def worker() -> None:
                for i, payload in pending:
                    out[i] = str((await node.publish(cid, payload)).cid)

            await asyncio.gather(*(worker() for _ in range(window)))
            return out

        return asyncio.run_coroutine_threadsafe(run(), self.bg.loop)

    def log(self, topic: str, index: int = 0) -> list[tuple[int, str, float]]:
        """``(seq, cid, delivered_at)`` of a node's whole log of ``topic``."""
        from dag import CID

        node = self.nodes[index].node
        cid = CID.parse(topic)

        def read() -> list[tuple[int, str, float]]:
            out, after = [], 0
            while entries := node.log_entries(cid, after=after, limit=1000):
                out += [(e.seq, str(e.event.cid), e.delivered_at) for e in entries]
                after = entries[-1].seq
            return out

        return self.bg.call(read)

    def payloads(self, topic: str, index: int = 0) -> list[bytes]:
        """The (inline) payloads of a node's log of ``topic``, in log order."""
        from dag import CID

        node = self.nodes[index].node
        cid = CID.parse(topic)

        def read() -> list[bytes]:
            out: list[bytes] = []
            after = 0
            while entries := node.log_entries(cid, after=after, limit=1000):
                out += [bytes(e.event.payload) for e in entries]  # type: ignore[arg-type]
                after = entries[-1].seq
            return out

        return self.bg.call(read)

    def last(self, topic: str, index: int = 0) -> int:
        from dag import CID

        return self.bg.call(self.nodes[index].node.last_position, CID.parse(topic))

    def subscribe(self, topic: str, index: int) -> None:
        from dag import CID

        self.bg.run(self.nodes[index].node.subscribe(CID.parse(topic)))


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0,
             interval: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds. The synchronous
    twin of :func:`tests.waiting.eventually`: Spark's calls and the data source's own
    blocking calls (each on a private event loop) cannot run inside a running loop."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


@pytest.fixture(scope="session")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkNet]:
    bg = BackgroundLoop("spark-test-nodes")
    network = Network(tmp_path_factory.mktemp("spark-nodes"))
    served: list[ServedNode] = []
    try:
        nodes = bg.run(network.start(2), timeout=60)
        served = [bg.run(ServedNode.serve(n)) for n in nodes]
        sparknet = SparkNet(bg, served)
        sparknet._history = sparknet.create_topic("spark/history")
        sparknet.filling = sparknet.publish_soon(
            sparknet._history, [os.urandom(64) + i.to_bytes(4, "big") for i in range(HISTORY)])
        yield sparknet
        if sparknet.filling is not None:
            sparknet.filling.result(120)
    finally:
        for s in served:
            bg.run(s.server.stop(), timeout=30)
        bg.run(network.close(), timeout=30)
        bg.close()


@pytest.fixture(scope="session")
def source(net: SparkNet, spark: Any) -> Any:
    """The shared Spark session with the data source registered (after ``net``, so the
    history fills while the session starts)."""
    from pulsar.tools.spark import PulsarcastDataSource

    spark.dataSource.register(PulsarcastDataSource)
    return spark
