"""Property-based conformance: schemathesis generates requests from the OpenAPI document the
node serves and checks every answer against it.

A real node and its REST API run on loopback in a background thread with their own event
loop (schemathesis calls the API synchronously, through ``requests``). The schema is loaded
from the live ``/v1/openapi.json``. Each operation gets up to ``MAX_EXAMPLES`` generated
cases with any path CID, and as many again aimed at a real topic or event (so publish,
history, subscribe and update reach the node rather than stopping at 400/404), all with
the bearer token, so the authenticated operations run too. Checked: no 5xx, and status
codes, content types and bodies as documented. The SSE stream is left out: its body never
ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from schemathesis.specs.openapi import checks as openapi_checks

from api import ApiServer
from pulsar import Node
from tests.node.conftest import Network

MAX_EXAMPLES = 30
TOKEN = "schema-test-token"
CHECKS = [
    checks.not_a_server_error,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance,
]


class LiveNode:
    """One node with its API, in a thread of its own running an event loop."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.net = Network(root)
        self.node: Node
        self.server: ApiServer
        self.topic: str
        self.event: str

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    async def _start(self) -> None:
        # Two nodes: a publish counts once another DHT node stored it (min_acks).
        self.node, _ = await self.net.start(2)
        self.server = await ApiServer.start(self.node, token=TOKEN, heartbeat=0.2)
        topic = await self.node.create_topic("schema")
        for i in range(5):
            event = await self.node.publish(topic.cid, f"event {i}".encode())
        self.topic = str(topic.cid)
        self.event = str(event.cid)

    async def _stop(self) -> None:
        await self.server.stop()
        await self.net.close()

    def start(self) -> None:
        self.run(self._start())

    def stop(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.loop.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    node = LiveNode(tmp_path_factory.mktemp("schema"))
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.mark.slow
def test_every_operation_conforms_to_the_served_document(live: LiveNode) -> None:
    url = live.server.url
    schema = schemathesis.openapi.from_url(f"{url}/v1/openapi.json").exclude(
        path="/v1/topics/{cid}/stream")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    failures: list[str] = []
    operations = 0
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            operations += 1
            strategies = [operation.as_strategy()]
            if any(p.name == "cid" for p in operation.path_parameters):
                real = live.event if operation.path.startswith("/v1/events/") else live.topic
                strategies.append(operation.as_strategy(path_parameters={"cid": real}))
            for strategy in strategies:

                @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                @given(case=strategy)
                def check(case: Any) -> None:
                    case.call_and_validate(base_url=url, session=session, headers=headers,
                                           checks=CHECKS, timeout=10)

                try:
                    check()
                except Exception as exc:  # collect every operation's failure, then report
                    failures.append(f"{operation.label}: {exc}")
    assert operations >= 15
    assert not failures, "\n\n".join(failures)
