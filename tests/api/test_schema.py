"""Property-based conformance: schemathesis generates requests from the OpenAPI document the
node serves and checks every answer against it.

A real node and its REST API run on loopback in a background thread with their own event
loop (schemathesis calls the API synchronously, through ``requests``). The schema is loaded
from the live ``/v1/openapi.json``. Each operation gets up to ``MAX_EXAMPLES`` generated
cases with any path CID, and as many again aimed at a real topic or event (so publish,
history, subscribe and update reach the node rather than stopping at 400/404), all with
the bearer token, so the authenticated operations run too. Checked: no 5xx, and status
codes, content types and bodies as documented, and that no schema-valid request is refused
with a 4xx other than for what JSON Schema cannot state (see :data:`UNSTATABLE`). The SSE
streams (a topic's, a consumer's) are left out: their bodies never end. As many
schema-*invalid* requests again must never get a 5xx either.

``PULSARCAST_SCHEMA_EXAMPLES=N`` raises the examples per strategy for a long run (see
docs/api.md, "Conformance"); the default keeps this test to seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks
from schemathesis.specs.openapi import checks as openapi_checks

from api import ApiServer
from pulsar import Node
from tests.node.conftest import Network

MAX_EXAMPLES = int(os.environ.get("PULSARCAST_SCHEMA_EXAMPLES", "25"))
TOKEN = "schema-test-token"
CONSUMER = "schema"
STREAMS = ["/v1/topics/{cid}/stream", "/v1/topics/{cid}/consumers/{name}/stream"]
"""Left out: their bodies never end."""
UNSTATABLE = [
    # A base32 string matches the CID pattern; whether it decodes to a CID (multibase,
    # version, codec, multihash) is more than a pattern says.
    ("invalid-cid", re.compile(".")),
    # A base58 string of the right alphabet need not be a peer id (multihash of a key).
    ("invalid-field", re.compile("is not a peer id")),
    # maxLength counts characters; names are limited in UTF-8 bytes.
    ("invalid-field", re.compile("bytes in UTF-8")),
    # The encoded topic descriptor must fit 7 KiB (all fields together).
    ("invalid-field", re.compile("topic block is [0-9]+ bytes")),
    # A date-time matching the pattern need not exist (month 13, hour 24).
    ("invalid-field", re.compile("not a valid calendar date-time")),
]
"""Problem types (and detail patterns) a schema-valid request may still get: the checks
that JSON Schema cannot express, which the OpenAPI document states in descriptions."""


def schema_valid_request_accepted(ctx: Any, response: Any, case: Any) -> None:
    """A schema-valid request answered 4xx must be one of :data:`UNSTATABLE`. 401/403/404
    and 409-like answers depend on state (tokens, rights, what exists), not on the form."""
    if response.status_code not in (400, 408, 413, 415, 422):
        return
    try:
        problem = json.loads(response.content)
        kind = problem["type"].rsplit("/", 1)[-1]
        detail = problem["detail"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{response.status_code} without a problem document") from None
    if not any(kind == k and pattern.search(detail) for k, pattern in UNSTATABLE):
        raise AssertionError(f"schema-valid request refused: {response.status_code} {kind}: "
                             f"{detail}")


CHECKS = [
    checks.not_a_server_error,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance,
    schema_valid_request_accepted,
]
NEGATIVE_CHECKS = [checks.not_a_server_error, openapi_checks.content_type_conformance]
"""For schema-invalid requests (wrong types, missing fields, out-of-range values, extra
properties): never a 5xx, and problem documents as documented."""


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
        # A consumer fetch may wait up to 300 s by the document; here at most 0.5 s, so
        # a generated fetch of an existing consumer answers within the request timeout.
        self.server = await ApiServer.start(self.node, token=TOKEN, heartbeat=0.2,
                                            fetch_wait=0.5)
        topic = await self.node.create_topic("schema")
        for i in range(5):
            event = await self.node.publish(topic.cid, f"event {i}".encode())
        await self.node.consumers.add(topic.cid, {"name": CONSUMER})
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


def _runner(strategy: Any, case_checks: list[Any], examples: int, url: str,
            session: requests.Session, headers: dict[str, str]) -> Any:
    """A hypothesis test that sends ``examples`` cases of ``strategy`` and runs the checks."""

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case: Any) -> None:
        case.call_and_validate(base_url=url, session=session, headers=headers,
                               checks=case_checks, timeout=10)

    return check


@pytest.mark.slow
def test_every_operation_conforms_to_the_served_document(live: LiveNode) -> None:
    url = live.server.url
    schema = schemathesis.openapi.from_url(f"{url}/v1/openapi.json").exclude(path=STREAMS)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    failures: list[str] = []
    operations = 0
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            operations += 1
            strategies = [(operation.as_strategy(), CHECKS),
                          (operation.as_strategy(GenerationMode.NEGATIVE), NEGATIVE_CHECKS)]
            if any(p.name == "cid" for p in operation.path_parameters):
                real = live.event if operation.path.startswith("/v1/events/") else live.topic
                aimed = {"cid": real}
                if any(p.name == "name" for p in operation.path_parameters):
                    aimed["name"] = CONSUMER  # a consumer that exists (until deleted)
                for mode, mode_checks in ((GenerationMode.POSITIVE, CHECKS),
                                          (GenerationMode.NEGATIVE, NEGATIVE_CHECKS)):
                    strategies.append((operation.as_strategy(
                        mode, path_parameters=aimed), mode_checks))
            for strategy, case_checks in strategies:
                examples = MAX_EXAMPLES if case_checks is CHECKS else MAX_EXAMPLES // 2
                check = _runner(strategy, case_checks, examples, url, session, headers)
                try:
                    check()
                except Unsatisfiable:  # negative mode: nothing to make invalid
                    continue
                except Exception as exc:  # collect every operation's failure, then report
                    failures.append(f"{operation.label}: {exc}")
    assert operations >= 15
    assert not failures, "\n\n".join(failures)
