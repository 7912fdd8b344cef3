"""A real node network on loopback with each node's REST API served on a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from api import ApiServer
from pulsar import Node
from tests.node.conftest import Network


@dataclass
class Api:
    node: Node
    server: ApiServer
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.server.token}"}

    async def call(self, method: str, path: str, *, auth: bool = True, **kw: object
                   ) -> tuple[int, object]:
        headers = dict(self.auth) if auth else {}
        headers.update(kw.pop("headers", {}))  # type: ignore[call-overload]
        async with self.http.request(method, self.url + path, headers=headers, **kw) as r:
            if r.content_type in ("application/json", "application/problem+json"):
                return r.status, await r.json(content_type=None)
            return r.status, await r.text()


@pytest.fixture
async def apis(tmp_path: Path) -> AsyncIterator[list[Api]]:
    net = Network(tmp_path)
    servers: list[ApiServer] = []
    async with aiohttp.ClientSession() as http:
        try:
            nodes = await net.start(3)
            for node in nodes:
                servers.append(await ApiServer.start(node, heartbeat=0.2))
            yield [Api(n, s, http) for n, s in zip(nodes, servers, strict=True)]
        finally:
            for server in servers:
                await server.stop()
            await net.close()
