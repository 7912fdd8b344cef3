"""The REST API of one node: the aiohttp application and its lifecycle.

``ApiServer.start(node, ...)`` serves the routes of :mod:`api.topics`, :mod:`api.history`,
:mod:`api.replay` and :mod:`api.node_info`, behind the problem-document and bearer-token
middlewares, with a request body limit. It binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import time
from pathlib import Path

from aiohttp import web

from pulsar import Node

from . import history, node_info, replay, topics
from .auth import auth_middleware, load_or_create_token
from .common import NODE, json_response
from .openapi import openapi_document
from .problems import problem_middleware

__all__ = ["ApiServer", "create_app"]

MAX_BODY = 2 * 1024 * 1024
"""Largest request body (a 1 MiB payload as base64 fits with room to spare)."""


def create_app(node: Node, token: str, *, heartbeat: float = history.HEARTBEAT_S,
               max_body: int = MAX_BODY) -> web.Application:
    app = web.Application(
        middlewares=[problem_middleware, auth_middleware(token)], client_max_size=max_body
    )
    app[NODE] = node
    app[history.HEARTBEAT_KEY] = heartbeat
    app[node_info.STARTED] = time.time()
    app.add_routes(topics.routes)
    app.add_routes(history.routes)
    app.add_routes(replay.routes)
    app.add_routes(node_info.routes)
    document = openapi_document()

    async def serve_openapi(request: web.Request) -> web.Response:
        return json_response(document)

    app.router.add_get("/v1/openapi.json", serve_openapi)
    return app


class ApiServer:
    """A running REST API for ``node``; ``url`` is where it listens, ``token`` its secret."""

    def __init__(self, runner: web.AppRunner, site: web.TCPSite, token: str) -> None:
        self._runner = runner
        self._site = site
        self.token = token

    @classmethod
    async def start(cls, node: Node, *, host: str = "127.0.0.1", port: int = 0,
                    token: str | None = None, data_dir: Path | None = None,
                    heartbeat: float = history.HEARTBEAT_S) -> ApiServer:
        """``token`` given, or kept in ``data_dir`` (default: the node's data directory)."""
        if token is None:
            token = load_or_create_token(data_dir or node.config.data_dir)
        app = create_app(node, token, heartbeat=heartbeat)
        # Open SSE streams end when the node stops; do not wait a minute for them.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        return cls(runner, site, token)

    @property
    def url(self) -> str:
        server = self._site._server
        assert server is not None and server.sockets  # type: ignore[union-attr]
        host, port = server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        await self._runner.cleanup()
