"""The clients of a verify run: they use only the REST API, and write down what they
were told (:mod:`pulsar.tools.verify.history`).

Roles (``n`` nodes, ``n >= 5``):

* three topics: ``A`` (LAST_SEEN, authored by node 0, allowed publishers 0, 1 and 2; node
  2 is revoked half-way), ``B`` (CUSTOM linking, node 1's; nodes 1 and 0 publish, each
  linking its own previous event) and ``C`` (LAST_SEEN, node 2's, open; nodes 2 and 1
  publish, one publish in ``large_every`` carries ``large_bytes``: fragments on the tree);
* nodes 0-2 publish, nodes 3 .. n-1 only subscribe (so when every publisher is gone at
  the end, the DHT still has holders); node n-1 subscribes late (at 30 % of the run) and
  node n-2 leaves topic A at 40 % and comes back at 60 %;
* every payload is unique (a run-wide counter in its first bytes), so a delivery is matched
  to its publish by its SHA-256 even when the publish's answer was lost.

A reader per node pages the node's delivery log (``GET /v1/topics/{cid}/events``) and
records each new entry as a ``deliver``; it keeps polling through crashes and pauses.
Publish outcomes: ``201`` is ok; a 4xx, ``503 not-persisted`` and ``507`` are fail (the node
refused before anything went out); ``503 not-recorded``, other 5xx, time-outs and lost
connections are info (indeterminate).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from api.client import ApiError, PulsarcastClient

from .history import HistoryWriter, Op

__all__ = ["TOPICS", "Workload"]

TOPICS = ("A", "B", "C")
CONTENT_TYPE = "application/x-pulsarcast-verify"
REQUEST_TIMEOUT = 20.0
READ_EVERY = 0.5


@dataclass
class _Topic:
    name: str
    author: int
    publishers: list[int]
    linking: str
    cid: str | None = None
    revoked: int | None = None
    last_own: dict[int, str | None] = field(default_factory=dict)


class Workload:
    """Drives topics, publishers, subscribers and readers against a cluster's APIs."""

    def __init__(
        self,
        history: HistoryWriter,
        urls: Callable[[int], str],
        token: str,
        nodes: int,
        *,
        seed: int,
        rate: float,
        large_every: int,
        large_bytes: int,
        alive: Callable[[int], bool],
    ) -> None:
        self.history = history
        self.urls = urls
        self.token = token
        self.n = nodes
        self.rate = rate
        self.large_every = large_every
        self.large_bytes = large_bytes
        self.alive = alive
        self.rng = random.Random(f"verify-workload-{seed}")
        self.topics = {
            "A": _Topic("A", 0, [0, 1, 2], "LAST_SEEN"),
            "B": _Topic("B", 1, [1, 0], "CUSTOM"),
            "C": _Topic("C", 2, [2, 1], "LAST_SEEN"),
        }
        self.peers: dict[int, str] = {}
        self.read_seq: dict[tuple[int, str], int] = {}
        self.reading: set[tuple[int, str]] = set()
        self._counter = 0
        self._clients: dict[int, PulsarcastClient] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._publishing = True
        self.published_ok = 0
        self.delivered = 0

    def client(self, index: int) -> PulsarcastClient:
        client = self._clients.get(index)
        if client is None:
            client = self._clients[index] = PulsarcastClient(
                self.urls(index), self.token, timeout=REQUEST_TIMEOUT
            )
        return client

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for client in self._clients.values():
            await client.close()

    # ------------------------------------------------------------------ setup

    async def setup(self) -> None:
        """Learn peer ids, create the topics, subscribe the first subscribers."""
        for i in range(self.n):
            self.peers[i] = (await self.client(i).node())["peer_id"]
        for topic in self.topics.values():
            allowed = [self.peers[p] for p in topic.publishers] if topic.name == "A" else None
            op = self.history.invoke(
                f"client-{topic.author}",
                "create",
                topic.author,
                None,
                {"name": topic.name, "linking": topic.linking, "allowed": allowed},
            )
            created = await self._retry(self._creator(topic, allowed))
            topic.cid = str(created["cid"])
            self.history.complete(op, "ok", {"cid": topic.cid}, topic=topic.cid)
            # The author follows its topic from creation on (created = subscribed).
            sub = self.history.invoke(
                f"client-{topic.author}", "subscribe", topic.author, topic.cid, {"author": True}
            )
            self.history.complete(sub, "ok", {})
            self.reading.add((topic.author, topic.cid))
        for i in range(self.n - 1):  # node n-1 comes late
            for topic in self.topics.values():
                if i != topic.author:
                    await self.subscribe(i, topic)

    def _creator(
        self, topic: _Topic, allowed: list[str] | None
    ) -> Callable[[], Awaitable[dict[str, Any]]]:
        def create() -> Awaitable[dict[str, Any]]:
            return self.client(topic.author).create_topic(
                f"verify-{topic.name}", allowed_publishers=allowed, event_linking=topic.linking
            )

        return create

    async def _retry(
        self, call: Callable[[], Awaitable[dict[str, Any]]], attempts: int = 20
    ) -> dict[str, Any]:
        """Setup steps retry through the first seconds of a network still forming."""
        for attempt in range(attempts):
            try:
                return await call()
            except (ApiError, aiohttp.ClientError, TimeoutError):
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    async def subscribe(self, node: int, topic: _Topic) -> None:
        if await self._membership(node, topic, "subscribe"):
            assert topic.cid is not None
            self.reading.add((node, topic.cid))

    async def unsubscribe(self, node: int, topic: _Topic) -> None:
        await self._membership(node, topic, "unsubscribe")

    async def _membership(self, node: int, topic: _Topic, f: str) -> bool:
        """One subscribe or unsubscribe, recorded: a problem answer is a fail, a lost
        connection or time-out an info (it may have taken effect). True when ok."""
        assert topic.cid is not None
        op = self.history.invoke(f"client-{node}", f, node, topic.cid, {})
        client = self.client(node)
        call = client.subscribe if f == "subscribe" else client.unsubscribe
        try:
            await call(topic.cid)
        except ApiError as exc:
            self.history.complete(op, "fail", {"error": str(exc)})
            return False
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.history.complete(op, "info", {"error": repr(exc)})
            return False
        self.history.complete(op, "ok", {})
        return True

    # ------------------------------------------------------------------ the run

    def start(self, duration: float) -> None:
        """Publishers, readers and the scripted membership changes, for ``duration`` s."""
        started = time.monotonic()
        for topic in self.topics.values():
            for publisher in topic.publishers:
                share = self.rate / sum(len(t.publishers) for t in self.topics.values())
                self._tasks.append(
                    asyncio.create_task(
                        self._publisher(topic, publisher, share, started + duration)
                    )
                )
        self._tasks.append(asyncio.create_task(self._readers()))
        self._tasks.append(asyncio.create_task(self._script(started, duration)))

    async def stop_publishing(self) -> None:
        self._publishing = False
        publishers = [t for t in self._tasks if t.get_coro().__name__ == "_publisher"]  # type: ignore[union-attr]
        await asyncio.gather(*publishers, return_exceptions=True)

    async def _script(self, started: float, duration: float) -> None:
        a = self.topics["A"]
        late, leaver = self.n - 1, self.n - 2
        steps: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (0.3, lambda: self._subscribe_all(late)),
            (0.4, lambda: self.unsubscribe(leaver, a)),
            (0.5, self._revoke),
            (0.6, lambda: self.subscribe(leaver, a)),
        ]
        for share, step in steps:
            await asyncio.sleep(max(0.0, started + share * duration - time.monotonic()))
            with contextlib.suppress(Exception):
                await step()

    async def _subscribe_all(self, node: int) -> None:
        for topic in self.topics.values():
            await self.subscribe(node, topic)

    async def _revoke(self) -> None:
        a = self.topics["A"]
        assert a.cid is not None
        revoked = 2
        op = self.history.invoke(
            f"client-{a.author}", "revoke", a.author, a.cid, {"revoked": self.peers[revoked]}
        )
        try:
            version = await self.client(a.author).update_topic(
                a.cid, allowed_publishers=[self.peers[p] for p in (0, 1)]
            )
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.history.complete(op, "info", {"error": repr(exc)})
            return
        self.history.complete(op, "ok", {"version": version["cid"]})
        a.revoked = revoked
        self._tasks.append(asyncio.create_task(self._watch_versions(a, str(version["cid"]))))

    async def _watch_versions(self, topic: _Topic, version: str) -> None:
        """Record when each node first shows the revoking version as its latest."""
        assert topic.cid is not None and topic.revoked is not None
        waiting = set(range(self.n))
        while waiting:
            for node in sorted(waiting):
                with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, OSError):
                    versions = await self.client(node).topic_versions(topic.cid)
                    if versions and versions[0]["cid"] == version:
                        # Read the log first: the checker judges a delivery by when it
                        # was first read, so what arrived before this must be read first.
                        await self.read(node)
                        self.history.record(
                            f"client-{node}",
                            "ok",
                            "version-seen",
                            node,
                            topic.cid,
                            {"revoked": self.peers[topic.revoked], "version": version},
                        )
                        waiting.discard(node)
            await asyncio.sleep(READ_EVERY)

    async def _publisher(self, topic: _Topic, node: int, rate: float, until: float) -> None:
        while self._publishing and time.monotonic() < until:
            await asyncio.sleep(self.rng.expovariate(rate))
            if not self._publishing or not self.alive(node):
                continue
            await self.publish(topic, node)

    def _payload(self, topic: _Topic) -> bytes:
        self._counter += 1
        head = f"verify {topic.name} #{self._counter} ".encode()
        if topic.name == "C" and self._counter % self.large_every == 0:
            return head + self.rng.randbytes(self.large_bytes)
        return head + self.rng.randbytes(64)

    async def publish(self, topic: _Topic, node: int) -> None:
        assert topic.cid is not None
        payload = self._payload(topic)
        parent = topic.last_own.get(node) if topic.linking == "CUSTOM" else None
        op = self.history.invoke(
            f"pub-{node}-{topic.name}",
            "publish",
            node,
            topic.cid,
            {
                "publisher": self.peers[node],
                "payload_sha256": hashlib.sha256(payload).hexdigest(),
                "content_type": CONTENT_TYPE,
                "size": len(payload),
                "parent": parent,
            },
        )
        try:
            event = await self.client(node).publish(
                topic.cid, payload, parent=parent, content_type=CONTENT_TYPE
            )
        except ApiError as exc:
            indeterminate = exc.status >= 500 and exc.kind not in ("not-persisted", "storage-full")
            self.history.complete(
                op,
                "info" if indeterminate else "fail",
                {"error": f"{exc.status} {exc.kind}: {exc.detail[:200]}"},
            )
            return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.history.complete(op, "info", {"error": repr(exc)[:200]})
            return
        self.history.complete(op, "ok", {"cid": event["cid"], "parent": event.get("parent")})
        self.published_ok += 1
        if topic.linking == "CUSTOM":
            topic.last_own[node] = str(event["cid"])

    # ------------------------------------------------------------------ reading

    async def _readers(self) -> None:
        while True:
            await asyncio.gather(
                *(self.read(node) for node in range(self.n)), return_exceptions=True
            )
            await asyncio.sleep(READ_EVERY)

    async def read(self, node: int) -> int:
        """Page every topic this node follows from the last position read; returns how
        many new deliveries were recorded."""
        if not self.alive(node):
            return 0
        new = 0
        for key in sorted(k for k in self.reading if k[0] == node):
            with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, OSError):
                new += await self._read_topic(node, key[1])
        return new

    async def _read_topic(self, node: int, topic: str) -> int:
        new = 0
        while True:
            cursor = self.read_seq.get((node, topic))
            page = await self.client(node).history_page(topic, cursor=cursor, limit=500)
            events = page.get("events", [])
            for event in events:
                self._record_delivery(node, topic, event)
                new += 1
            if not events or page.get("next_cursor") is None:
                return new

    def _record_delivery(self, node: int, topic: str, event: dict[str, Any]) -> None:
        payload = base64.b64decode(event["payload"])
        parent = event.get("parent")
        self.history.record(
            f"reader-{node}",
            "ok",
            "deliver",
            node,
            topic,
            {
                "cid": event["cid"],
                "seq": int(event["seq"]),
                "parents": [] if parent is None else [parent],
                "publisher": event["publisher"],
                "payload_sha256": hashlib.sha256(payload).hexdigest(),
                "content_type": event.get("content_type"),
            },
        )
        self.read_seq[(node, topic)] = int(event["seq"])
        self.delivered += 1

    # ------------------------------------------------------------------ the end

    async def replay(self, node: int, patience: float = 90.0) -> None:
        """Replay every topic from its CID alone through ``node`` (a fresh one). A replay
        the node answers ``503 replay-incomplete`` is tried again (each attempt is in the
        history) for up to ``patience`` seconds."""
        for topic in self.topics.values():
            deadline = time.monotonic() + patience
            while not await self._replay_once(node, topic) and time.monotonic() < deadline:
                await asyncio.sleep(2.0)

    async def _replay_once(self, node: int, topic: _Topic) -> bool:
        assert topic.cid is not None
        op = self.history.invoke("replayer", "replay", node, topic.cid, {})
        cids: list[str] = []
        parents: dict[str, list[str]] = {}
        payloads: dict[str, list[str | None]] = {}
        try:
            async for event in self.client(node).replay(topic.cid, idle_timeout=120.0):
                cid = str(event["cid"])
                cids.append(cid)
                parent = event.get("parent")
                parents[cid] = [] if parent is None else [parent]
                digest = hashlib.sha256(base64.b64decode(event["payload"])).hexdigest()
                payloads[cid] = [digest, event.get("content_type")]
        except ApiError as exc:
            self.history.complete(op, "fail", {"error": f"{exc.status} {exc.kind}: "
                                               f"{exc.detail[:300]}"})
            return False
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.history.complete(op, "info", {"error": repr(exc)[:300], "partial": len(cids)})
            return False
        self.history.complete(op, "ok", {"cids": cids, "parents": parents,
                                         "payloads": payloads})
        return True


def ops_of(history: list[Op], f: str) -> list[Op]:
    return [op for op in history if op.f == f]
