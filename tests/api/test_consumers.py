"""Durable consumers through every door: REST (pull, push, acknowledgements, errors), the
Python client, the command line, and a node process SIGKILLed between a fetch and its
acknowledgement."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from api.client import ApiError, PulsarcastClient, payload_value
from pulsar.tools.cli import main
from tests.waiting import eventually

from .conftest import Api

BASE = "https://pulsarcast.dev/problems/"
ROOT = Path(__file__).resolve().parents[2]


async def _topic_followed_by(author: Api, reader: Api, name: str) -> str:
    """A topic ``author`` created and ``reader`` subscribes to; its CID."""
    status, topic = await author.call("POST", "/v1/topics", json={"name": name})
    assert status == 201
    cid: str = topic["cid"]  # type: ignore[index]
    status, _ = await reader.call("PUT", f"/v1/subscriptions/{cid}")
    assert status == 201
    return cid


async def _publish(author: Api, cid: str, *values: Any) -> list[str]:
    cids = []
    for value in values:
        status, event = await author.call("POST", f"/v1/topics/{cid}/events",
                                          json={"json": value})
        assert status == 201
        cids.append(event["cid"])  # type: ignore[index]
    return cids


async def _logged(api: Api, cid: str, count: int) -> None:
    async def there() -> bool:
        _, page = await api.call("GET", f"/v1/topics/{cid}/events")
        return len(page["events"]) >= count  # type: ignore[index]

    await eventually(there, timeout=15, what=f"{count} events in the log")


async def test_rest_pull_acks_and_errors(apis: list[Api]) -> None:
    author, reader, other = apis
    cid = await _topic_followed_by(author, reader, "orders")
    events = await _publish(author, cid, {"n": 1}, {"n": 2}, {"n": 3})
    await _logged(reader, cid, 3)
    path = f"/v1/topics/{cid}/consumers"

    status, problem = await reader.call("POST", path, auth=False, json={"name": "billing"})
    assert status == 401
    status, info = await reader.call("POST", path, json={"name": "billing", "ack_wait": 30})
    assert status == 201, info
    assert (info["name"], info["delivered"], info["num_pending"], info["ack_floor"]) == (
        "billing", 0, 3, 0)
    assert info["config"] == {"name": "billing", "deliver_policy": "all",
                              "ack_policy": "explicit", "ack_wait": 30.0, "max_deliver": -1,
                              "backoff": [], "replay_policy": "instant",
                              "max_ack_pending": 1000}
    status, same = await reader.call("POST", path, json={"name": "billing", "ack_wait": 30.0})
    assert status == 200 and same["created_at"] == info["created_at"]
    status, problem = await reader.call("POST", path, json={"name": "billing", "ack_wait": 5})
    assert status == 409 and problem["type"] == BASE + "consumer-exists"
    for bad in ({"name": "x", "max_deliver": 0}, {"name": "no spaces"},
                {"name": "x", "deliver_policy": {"start_seq": 0}},
                {"name": "x", "backoff": [1, -1]}, {"name": "x", "ack_policy": "maybe"}):
        status, problem = await reader.call("POST", path, json=bad)
        assert status == 422 and problem["type"] == BASE + "invalid-consumer", bad
    status, problem = await reader.call("POST", path, json={"name": "x", "colour": "g"})
    assert status == 400 and problem["type"] == BASE + "invalid-field"
    status, problem = await other.call("POST", path, json={"name": "x"})
    assert status == 404 and problem["type"] == BASE + "not-subscribed"
    missing = "bafyreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    status, problem = await reader.call("POST", f"/v1/topics/{missing}/consumers",
                                        json={"name": "x"})
    assert status == 404 and problem["type"] == BASE + "topic-not-found"

    status, page = await reader.call("POST", f"{path}/billing/fetch", json={"batch": 2})
    assert status == 200
    messages = page["messages"]
    assert [(m["cid"], m["seq"], m["json"], m["delivery"]) for m in messages] == [
        (events[0], 1, {"n": 1}, {"id": 1, "count": 1}),
        (events[1], 2, {"n": 2}, {"id": 2, "count": 1})]
    status, answer = await reader.call("POST", f"{path}/billing/ack", json={"ids": [1, 99]})
    assert status == 200 and answer == {"kind": "ack", "done": [1], "unknown": [99]}
    status, answer = await reader.call("POST", f"{path}/billing/ack",
                                       json={"ids": [2], "kind": "nak"})
    assert answer == {"kind": "nak", "done": [2], "unknown": []}
    status, page = await reader.call("POST", f"{path}/billing/fetch", json={"batch": 5})
    assert [m["delivery"] for m in page["messages"]] == [{"id": 2, "count": 2},
                                                        {"id": 3, "count": 1}]
    status, info = await reader.call("GET", f"{path}/billing")
    assert status == 200
    assert (info["delivered"], info["ack_floor"], info["num_pending"], info["num_ack_pending"],
            info["num_redelivered"], info["redeliveries"]) == (3, 1, 0, 2, 1, 1)

    # Bad input is a clear 400: a delay on anything but a nak, oversized batches, waits.
    for url, body in ((f"{path}/billing/ack", {"ids": [2], "kind": "ack", "delay": 1}),
                      (f"{path}/billing/ack", {"ids": []}),
                      (f"{path}/billing/ack", {"ids": ["2"]}),
                      (f"{path}/billing/ack", {"ids": [2], "kind": "maybe"}),
                      (f"{path}/billing/fetch", {"batch": 1001}),
                      (f"{path}/billing/fetch", {"expires": 301}),
                      (f"{path}/billing/fetch", {"batch": 1, "wait": 1})):
        status, problem = await reader.call("POST", url, json=body)
        assert status == 400 and problem["type"] == BASE + "invalid-field", body

    # A fetch waits (a long poll) until the log grows.
    waiting = asyncio.create_task(reader.call("POST", f"{path}/billing/fetch",
                                              json={"batch": 10, "expires": 20}))
    [late] = await _publish(author, cid, {"n": 4})
    status, page = await asyncio.wait_for(waiting, 25)
    assert [(m["cid"], m["delivery"]) for m in page["messages"]] == [
        (late, {"id": 4, "count": 1})]
    status, page = await reader.call("POST", f"{path}/billing/fetch", json={"expires": 0.1})
    assert status == 200 and page == {"messages": []}

    status, listed = await reader.call("GET", path)
    assert status == 200 and [c["name"] for c in listed["consumers"]] == ["billing"]
    _, text = await reader.call("GET", "/metrics", auth=False)
    assert "pulsarcast_consumer_delivered_total 5" in text
    assert "pulsarcast_consumer_redelivered_total 1" in text

    status, _ = await reader.call("DELETE", f"{path}/billing")
    assert status == 204
    for method, url, body in (("GET", f"{path}/billing", None),
                              ("DELETE", f"{path}/billing", None),
                              ("POST", f"{path}/billing/fetch", {}),
                              ("POST", f"{path}/billing/ack", {"ids": [1]})):
        status, problem = await reader.call(method, url, json=body)
        assert status == 404 and problem["type"] == BASE + "consumer-not-found", url
    status, problem = await reader.call("GET", f"{path}/bad%20name")
    assert status == 400 and problem["type"] == BASE + "invalid-field"


async def test_a_fetch_whose_client_went_away_takes_nothing(apis: list[Api]) -> None:
    """aiohttp does not cancel a handler whose client disconnected: a long poll went on
    waiting, took the next event for nobody, and the consumer saw it only after ack_wait,
    as a second delivery. Now the wait ends with the connection."""
    author, reader, _ = apis
    cid = await _topic_followed_by(author, reader, "abandoned")
    path = f"/v1/topics/{cid}/consumers"
    status, _ = await reader.call("POST", path, json={"name": "w", "ack_wait": 60})
    assert status == 201
    guard = reader.server.guard
    waiting = asyncio.create_task(reader.call("POST", f"{path}/w/fetch",
                                              json={"batch": 1, "expires": 60}))
    consumers = reader.node.consumers
    await eventually(lambda: bool(consumers._signals), timeout=10, what="the fetch waiting")
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await eventually(lambda: not guard._lost, timeout=10, what="the connection closed")
    (event,) = await _publish(author, cid, {"n": 1})
    await _logged(reader, cid, 1)
    status, page = await reader.call("POST", f"{path}/w/fetch",
                                     json={"batch": 1, "expires": 10})
    assert status == 200
    assert [(m["cid"], m["delivery"]["count"]) for m in page["messages"]] == [(event, 1)]


async def test_rest_commit_settles_up_to_a_position(apis: list[Api]) -> None:
    """A reader by position (the Spark source) settles what it read with one call."""
    author, reader, _ = apis
    cid = await _topic_followed_by(author, reader, "ledger")
    await _publish(author, cid, {"n": 1}, {"n": 2}, {"n": 3})
    await _logged(reader, cid, 3)
    path = f"/v1/topics/{cid}/consumers"
    for body in ({"name": "spark", "ack_policy": "all"}, {"name": "billing"}):
        status, _ = await reader.call("POST", path, json=body)
        assert status == 201
    status, problem = await reader.call("POST", f"{path}/spark/commit", auth=False,
                                        json={"through": 2})
    assert status == 401
    status, info = await reader.call("POST", f"{path}/spark/commit", json={"through": 2})
    assert status == 200, info
    assert (info["delivered"], info["ack_floor"], info["num_pending"]) == (2, 2, 1)
    for url, body, kind in ((f"{path}/spark/commit", {"through": 4}, "commit-refused"),
                            (f"{path}/billing/commit", {"through": 1}, "commit-refused"),
                            (f"{path}/spark/commit", {}, "invalid-field"),
                            (f"{path}/spark/commit", {"through": 0}, "invalid-field"),
                            (f"{path}/spark/commit", {"through": "3"}, "invalid-field"),
                            (f"{path}/spark/commit", {"through": 3, "ids": [3]},
                             "invalid-field"),
                            (f"{path}/nobody/commit", {"through": 1}, "consumer-not-found")):
        status, problem = await reader.call("POST", url, json=body)
        assert problem["type"] == BASE + kind, (url, body, problem)  # type: ignore[index]
        assert status == {"commit-refused": 409, "invalid-field": 400,
                          "consumer-not-found": 404}[kind]
    async with PulsarcastClient(reader.url, reader.server.token) as client:
        info = await client.commit_consumer(cid, "spark", 3)
        assert (info["delivered"], info["ack_floor"], info["num_pending"]) == (3, 3, 0)
        assert await client.commit_consumer(cid, "spark", 1) == await client.consumer_info(
            cid, "spark")  # already settled: nothing changes
        assert await client.fetch(cid, "spark", expires=0) == []


async def _sse(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str, str]]:
    """``(id, event, data)`` of each message of an SSE response."""
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in fields:
                yield fields.get("id", ""), fields.get("event", ""), fields["data"]
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


async def test_push_stream_with_ack_policy_none_advances_and_ends_on_delete(
        apis: list[Api]) -> None:
    author, reader, _ = apis
    cid = await _topic_followed_by(author, reader, "audit")
    events = await _publish(author, cid, "a", "b")
    await _logged(reader, cid, 2)
    path = f"/v1/topics/{cid}/consumers"
    status, _ = await reader.call("POST", path, json={"name": "audit", "ack_policy": "none"})
    assert status == 201
    status, problem = await reader.call("GET", f"{path}/nobody/stream")
    assert status == 404 and problem["type"] == BASE + "consumer-not-found"
    seen: list[tuple[str, str, dict[str, Any]]] = []
    async with asyncio.timeout(30), reader.http.get(reader.url + f"{path}/audit/stream") as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        async for sse_id, kind, data in _sse(r):
            if kind == "end":
                assert json.loads(data) == {"reason": "deleted"}
                break
            assert kind == "message"
            seen.append((sse_id, json.loads(data)["cid"], json.loads(data)["delivery"]))
            if len(seen) == 2:
                status, info = await reader.call("GET", f"{path}/audit")
                # ack_policy none: handing out was enough, nothing waits for an ack.
                assert (info["delivered"], info["num_ack_pending"], info["ack_floor"]) == (
                    2, 0, 2)
                status, _ = await reader.call("DELETE", f"{path}/audit")
                assert status == 204
    assert seen == [("1", events[0], {"id": 1, "count": 1}),
                    ("2", events[1], {"id": 2, "count": 1})]


async def test_python_client_consumes_settles_and_sees_poison_messages_set_aside(
        apis: list[Api]) -> None:
    author, reader, _ = apis
    cid = await _topic_followed_by(author, reader, "jobs")
    events = await _publish(author, cid, {"job": 1}, {"job": 2}, {"job": 3})
    await _logged(reader, cid, 3)
    async with PulsarcastClient(reader.url, reader.server.token) as client:
        info = await client.add_consumer(cid, "workers", ack_wait=30, max_ack_pending=10)
        assert info["num_pending"] == 3
        assert (await client.add_consumer(cid, "workers", ack_wait=30,
                                          max_ack_pending=10))["created_at"] == \
            info["created_at"]
        with pytest.raises(ApiError) as refused:
            await client.add_consumer(cid, "workers", ack_wait=1)
        assert refused.value.kind == "consumer-exists"

        seen: list[tuple[Any, int]] = []
        stream = client.consume(cid, "workers", batch=2, expires=5)
        async for msg in stream:
            seen.append((payload_value(msg.event), msg.count))
            if msg.event["cid"] == events[0]:
                assert await msg.ack()
                assert not await msg.ack()  # once is enough: not pending any more
            elif msg.event["cid"] == events[1] and msg.count == 1:
                assert await msg.nak()
            elif msg.event["cid"] == events[1]:
                assert await msg.term()
            else:
                assert await msg.progress() and await msg.ack()
            if len(seen) == 4:
                break
        await stream.aclose()
        assert sorted(seen, key=lambda s: (s[0]["job"], s[1])) == [
            ({"job": 1}, 1), ({"job": 2}, 1), ({"job": 2}, 2), ({"job": 3}, 1)]
        info = await client.consumer_info(cid, "workers")
        assert (info["num_ack_pending"], info["num_terminated"], info["ack_floor"]) == (0, 1, 3)
        assert [c["name"] for c in await client.consumers(cid)] == ["workers"]

        # A message never acknowledged within max_deliver deliveries is set aside.
        await client.add_consumer(cid, "poison", ack_wait=0.2, max_deliver=1,
                                  deliver_policy="last")
        [msg] = await client.fetch(cid, "poison", batch=5, expires=5)
        assert (msg.event["cid"], msg.id, msg.count) == (events[2], 3, 1)

        async def set_aside() -> bool:
            found = await client.consumer_info(cid, "poison")
            return bool(found["num_max_deliver_reached"] == 1)

        await eventually(set_aside, timeout=10, what="the message set aside")
        info = await client.consumer_info(cid, "poison")
        assert (info["num_ack_pending"], info["num_terminated"]) == (0, 1)
        assert await client.fetch(cid, "poison", expires=0.3) == []
        assert reader.node.metrics["consumer_max_deliver_reached"] == 1

        # Both were advised: the term, then the message set aside, on the node's stream.
        watched = client.advisories()
        terminated, set_aside_one = [await anext(watched) for _ in range(2)]
        await watched.aclose()
        assert (terminated["kind"], terminated["consumer"], terminated["seqs"]) == (
            "consumer.terminated", "workers", [2])
        assert (set_aside_one["kind"], set_aside_one["consumer"], set_aside_one["seq"],
                set_aside_one["deliveries"]) == ("consumer.max_deliver", "poison", 3, 1)
        status, page = await reader.call(
            "GET", f"/v1/node/advisories?after={terminated['id']}")
        assert status == 200 and [a["id"] for a in page["advisories"]] == [  # type: ignore[index]
            set_aside_one["id"]]
        assert page["lost_before"] is None  # type: ignore[index]
        status, _ = await reader.call("GET", "/v1/node/advisories?after=-1")
        assert status == 400
        # Resuming from before this node started: told that the stream is whole only
        # from its start, then given what it holds.
        resumed = client.advisories(after=1)
        lost, first = await anext(resumed), await anext(resumed)
        await resumed.aclose()
        assert lost == {"kind": "lost", "before": reader.node.consumers.advisories.booted}
        assert first["id"] == terminated["id"]

        await client.delete_consumer(cid, "poison")
        with pytest.raises(ApiError) as gone:
            await client.consumer_info(cid, "poison")
        assert gone.value.status == 404 and gone.value.kind == "consumer-not-found"


async def _cli(api: Api, capsys: pytest.CaptureFixture[str], *argv: str
               ) -> tuple[int, str, str]:
    """``pulsarcast ARGV`` against ``api`` (in a thread: it runs its own event loop)."""
    code = await asyncio.to_thread(main, [*argv, "--url", api.url,
                                          f"--token={api.server.token}"])
    out, err = capsys.readouterr()
    return code, out, err


async def test_cli_consumer_commands(apis: list[Api],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    author, reader, _ = apis
    cid = await _topic_followed_by(author, reader, "cli-consumers")
    events = await _publish(author, cid, "first", "second")
    await _logged(reader, cid, 2)
    code, out, _ = await _cli(reader, capsys, "consumer", "add", cid, "ops", "--ack-wait",
                              "60", "--max-deliver", "3", "--backoff", "1", "5", "--json")
    assert code == 0
    added = json.loads(out)
    assert added["config"]["backoff"] == [1.0, 5.0] and added["config"]["max_deliver"] == 3
    code, out, _ = await _cli(reader, capsys, "consumer", "info", cid, "ops")
    assert code == 0 and "2 not delivered yet" in out and "backoff 1, 5 s" in out
    code, out, _ = await _cli(reader, capsys, "consumer", "ls", cid)
    assert code == 0 and out.startswith("ops ")

    code, out, _ = await _cli(reader, capsys, "consumer", "next", cid, "ops", "--no-ack")
    assert code == 0 and out == f"#1 (delivery 1) {events[0]} \"first\"\n"
    code, out, _ = await _cli(reader, capsys, "consumer", "next", cid, "ops", "--json")
    assert code == 0
    message = json.loads(out)
    assert message["cid"] == events[1] and message["delivery"] == {"id": 2, "count": 1}
    code, out, _ = await _cli(reader, capsys, "consumer", "ack", cid, "ops", "1", "2")
    assert code == 1 and out == "ack: 1; not pending: 2\n"  # next acknowledged 2 already
    code, out, err = await _cli(reader, capsys, "consumer", "next", cid, "ops", "--wait",
                                "0.2")
    assert code == 0 and out == "" and "no message within 0.2 s" in err
    code, out, _ = await _cli(reader, capsys, "consumer", "info", cid, "ops", "--json")
    info = json.loads(out)
    assert (info["delivered"], info["ack_floor"], info["num_ack_pending"]) == (2, 2, 0)
    code, _, err = await _cli(reader, capsys, "consumer", "ack", cid, "ops", "1", "--delay",
                              "1")
    assert code == 2 and "--delay goes with --nak" in err
    code, _, _ = await _cli(reader, capsys, "consumer", "rm", cid, "ops")
    assert code == 0
    code, _, err = await _cli(reader, capsys, "consumer", "info", cid, "ops")
    assert code == 1 and "consumer-not-found (404)" in err


# -- durability across a SIGKILL ------------------------------------------------------------

TOKEN = "consumer-durability-token"


@contextlib.asynccontextmanager
async def _node_process(data_dir: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``pulsarcast node`` alone on loopback (``--min-acks 0``), and its API's URL; killed
    at the end if the test has not killed it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pulsar.tools.cli", "node", "--data-dir", str(data_dir),
        "--port", "0", "--api-port", "0", "--min-acks", "0", "--token", TOKEN, "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = await process.stdout.readline()
        assert line, (await process.stderr.read()).decode()  # type: ignore[union-attr]
        yield process, json.loads(line)["url"]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.slow
async def test_a_sigkilled_node_redelivers_what_was_not_acknowledged(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with _node_process(data) as (process, url):
        async with PulsarcastClient(url, TOKEN) as client:
            topic = (await client.create_topic("payments"))["cid"]
            for i in range(3):
                await client.publish(topic, {"payment": i})

            async def logged() -> bool:
                return len((await client.history_page(topic))["events"]) == 3

            await eventually(logged, timeout=15, what="the node's own events in its log")
            await client.add_consumer(topic, "ledger", ack_wait=1)
            fetched = await client.fetch(topic, "ledger", batch=2, expires=5)
            assert [(m.id, m.count) for m in fetched] == [(1, 1), (2, 1)]
            assert await fetched[0].ack()
        # Killed between the fetch and the acknowledgement of the second message.
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL
    async with _node_process(data) as (process, url), PulsarcastClient(url, TOKEN) as client:
        info = await client.consumer_info(topic, "ledger")
        assert (info["delivered"], info["ack_floor"], info["num_ack_pending"]) == (2, 1, 1)
        # What comes next: the unacknowledged message (once its ack_wait is over, with its
        # delivery count kept), then the one never handed out. Never the acknowledged one.
        seen: list[tuple[int, int]] = []
        async with asyncio.timeout(30):
            while len(seen) < 2:
                for message in await client.fetch(topic, "ledger", batch=10, expires=5):
                    seen.append((message.id, message.count))
                    assert payload_value(message.event) == {"payment": message.id - 1}
                    assert await message.ack()
        assert sorted(seen) == [(2, 2), (3, 1)]
        assert await client.fetch(topic, "ledger", batch=10, expires=1.5) == []
        info = await client.consumer_info(topic, "ledger")
        assert (info["delivered"], info["ack_floor"], info["num_ack_pending"],
                info["redeliveries"]) == (3, 3, 0, 1)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await process.wait() == 0


async def test_a_group_over_rest_and_the_client_splits_a_topic_between_two_nodes(
        apis: list[Api]) -> None:
    """Two nodes' consumers of one group, made over REST and with the client: each event
    is fetched by exactly one of them, and each info shows the group."""
    author, reader, other = apis
    cid = await _topic_followed_by(author, reader, "jobs")
    status, _ = await other.call("PUT", f"/v1/subscriptions/{cid}")
    assert status == 201
    path = f"/v1/topics/{cid}/consumers"
    status, problem = await reader.call("POST", path, json={"name": "w", "group": "g",
                                                            "ack_policy": "all"})
    assert status == 422 and problem["type"] == BASE + "invalid-consumer"
    status, info = await reader.call("POST", path, json={"name": "w1", "group": "g"})
    assert status == 201 and info["config"]["group"] == "g", info
    async with PulsarcastClient(other.url, other.server.token) as client:
        made = await client.add_consumer(cid, "w2", group="g")
        assert made["group"]["name"] == "g"

        async def both_see_two() -> bool:
            infos = [(await reader.call("GET", f"{path}/w1"))[1],
                     await client.consumer_info(cid, "w2")]
            return all(i["group"]["ready"] and len(i["group"]["members"]) == 2
                       for i in infos)

        await eventually(both_see_two, timeout=20, what="a group of two on both nodes")
        published = set(await _publish(author, cid, *range(40)))
        fetched: dict[str, list[str]] = {"w1": [], "w2": []}

        async def drained() -> bool:
            _, got = await reader.call("POST", f"{path}/w1/fetch", json={"batch": 40})
            fetched["w1"] += [m["cid"] for m in got["messages"]]  # type: ignore[index]
            ids = [m["delivery"]["id"] for m in got["messages"]]  # type: ignore[index]
            if ids:
                await reader.call("POST", f"{path}/w1/ack", json={"ids": ids})
            for message in await client.fetch(cid, "w2", batch=40):
                fetched["w2"].append(message.event["cid"])
                assert await message.ack()
            return len(fetched["w1"]) + len(fetched["w2"]) >= len(published)

        await eventually(drained, timeout=30, what="every event fetched by the group")
        assert set(fetched["w1"]) | set(fetched["w2"]) == published
        assert not set(fetched["w1"]) & set(fetched["w2"])  # each by one member only
        assert fetched["w1"] and fetched["w2"]
