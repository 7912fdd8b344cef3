"""The REST API of one node: the aiohttp application and its lifecycle.

``ApiServer.start(node, ...)`` serves the routes of :mod:`api.topics`, :mod:`api.history`,
:mod:`api.consumers`, :mod:`api.replay` and :mod:`api.node_info`, and the web page
(:mod:`api.page`), behind the problem-document and bearer-token middlewares, with a request
body limit, header and body read timeouts and connection caps
(:class:`api.limits.ServerLimits`). It binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import time
from pathlib import Path

from aiohttp import web

from pulsar import Node
from pulsar.runtime.consumer_config import MAX_EXPIRES

from . import advisories, consumers, history, node_info, page, replay, topics
from .auth import auth_middleware, load_or_create_token
from .common import LIMITS_KEY, NODE, json_response
from .connections import GUARD_KEY, ConnectionGuard, GuardedSite
from .limits import BODY_BYTES, ServerLimits
from .openapi import openapi_document
from .problems import problem_middleware

__all__ = ["ApiServer", "create_app"]

MAX_BODY = BODY_BYTES
LINGER_S = 1.0


def create_app(node: Node, token: str, *, heartbeat: float = history.HEARTBEAT_S,
               max_body: int = MAX_BODY, limits: ServerLimits | None = None,
               fetch_wait: float = MAX_EXPIRES) -> web.Application:
    """The API's application; ``heartbeat`` is the SSE comment interval and ``fetch_wait``
    the longest a consumer fetch waits (both shorter in tests)."""
    app = web.Application(
        middlewares=[problem_middleware, auth_middleware(token)], client_max_size=max_body
    )
    app[NODE] = node
    app[LIMITS_KEY] = limits or ServerLimits()
    app[history.HEARTBEAT_KEY] = heartbeat
    app[consumers.FETCH_WAIT_KEY] = fetch_wait
    app[node_info.STARTED] = time.time()
    app.add_routes(topics.routes)
    app.add_routes(history.routes)
    app.add_routes(consumers.routes)
    app.add_routes(replay.routes)
    app.add_routes(node_info.routes)
    app.add_routes(advisories.routes)
    app.add_routes(page.routes)
    document = openapi_document()

    async def serve_openapi(request: web.Request) -> web.Response:
        return json_response(document)

    app.router.add_get("/v1/openapi.json", serve_openapi)
    return app


class ApiServer:
    """A running REST API for ``node``; ``url`` is where it listens, ``token`` its secret."""

    def __init__(self, runner: web.AppRunner, site: GuardedSite, token: str) -> None:
        self._runner = runner
        self._site = site
        self.token = token
        self.guard = site.guard

    @classmethod
    async def start(cls, node: Node, *, host: str = "127.0.0.1", port: int = 0,
                    token: str | None = None, data_dir: Path | None = None,
                    heartbeat: float = history.HEARTBEAT_S, limits: ServerLimits | None = None,
                    fetch_wait: float = MAX_EXPIRES) -> ApiServer:
        """``token`` given, or kept in ``data_dir`` (default: the node's data directory);
        ``limits`` default to :meth:`ServerLimits.from_env`."""
        if token is None:
            token = load_or_create_token(data_dir or node.config.data_dir)
        limits = limits or ServerLimits.from_env()
        app = create_app(node, token, heartbeat=heartbeat, limits=limits,
                         fetch_wait=fetch_wait)
        # Open SSE streams end when the node stops; do not wait a minute for them.
        # keepalive_timeout is also the header timeout: aiohttp arms it when a connection
        # opens and closes the connection if no complete request head came by then.
        # lingering_time: after answering a request whose body was not read (a 408, a
        # 413), how long aiohttp keeps reading and discarding the rest before it closes.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0,
                               keepalive_timeout=limits.header_timeout,
                               lingering_time=LINGER_S)
        guard = ConnectionGuard(limits)
        app[GUARD_KEY] = guard
        await runner.setup()
        site = GuardedSite(runner, host, port, guard)
        await site.start()
        return cls(runner, site, token)

    @property
    def url(self) -> str:
        server = self._site._server
        # aiohttp types _server as AbstractServer, which has no .sockets in typeshed; the
        # loop.create_server in GuardedSite.start gives a Server, which has them.
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        host, port = server.sockets[0].getsockname()[:2]  # type: ignore[attr-defined]
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        await self._runner.cleanup()
