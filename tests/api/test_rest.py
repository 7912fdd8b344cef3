"""Every endpoint against a real server on loopback, with a real HTTP client."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import stat
import time

import aiohttp

from dag import CID, EventDescriptor
from tests.waiting import eventually

from .conftest import Api

BASE = "https://pulsarcast.dev/problems/"
JSON = {"Content-Type": "application/json"}


async def test_topic_lifecycle_publish_and_fetch(apis: list[Api]) -> None:
    author, reader, _ = apis
    status, topic = await author.call("POST", "/v1/topics", json={"name": "weather"})
    assert status == 201 and topic["name"] == "weather" and topic["event_linking"] == "LAST_SEEN"
    assert topic["author"] == str(author.node.peer_id) and "meta" in topic["subtopics"]
    cid = topic["cid"]
    status, same = await reader.call("GET", f"/v1/topics/{cid}")
    assert status == 200 and same == topic

    status, sub = await reader.call("PUT", f"/v1/subscriptions/{cid}")
    assert status == 201 and sub == {"topic": cid, "position": 0}
    status, _ = await reader.call("PUT", f"/v1/subscriptions/{cid}")
    assert status == 200

    raw = base64.b64encode(b"\0\1").decode()
    sent = [{"json": {"t": 21.5}}, {"text": "héllo"}, {"base64": raw}]
    published = []
    for body in sent:
        status, event = await author.call("POST", f"/v1/topics/{cid}/events", json=body)
        assert status == 201 and event["publisher"] == str(author.node.peer_id)
        published.append(event)
    assert [base64.b64decode(e["payload"]) for e in published] == [
        b'{"t":21.5}', "héllo".encode(), b"\0\1"]
    assert published[1]["parent"] == published[0]["cid"]

    async def reader_has_all() -> bool:
        _, subs = await reader.call("GET", "/v1/subscriptions")
        return subs["subscriptions"][0]["position"] == 3  # type: ignore[index]

    await eventually(reader_has_all, timeout=10)
    status, page = await reader.call("GET", f"/v1/topics/{cid}/events")
    assert status == 200 and [e["cid"] for e in page["events"]] == [e["cid"] for e in published]
    assert [e["seq"] for e in page["events"]] == [1, 2, 3] and "next_cursor" not in page

    status, fetched = await reader.call("GET", f"/v1/events/{published[2]['cid']}")
    assert status == 200 and fetched["payload"] == published[2]["payload"]

    status, new = await author.call("PATCH", f"/v1/topics/{cid}", json={"name": "weather-v2"})
    assert status == 200 and new["parent"] == cid and new["name"] == "weather-v2"
    status, versions = await author.call("GET", f"/v1/topics/{cid}/versions")
    assert [v["cid"] for v in versions["versions"]] == [new["cid"], cid]

    status, _ = await reader.call("DELETE", f"/v1/subscriptions/{cid}")
    assert status == 204
    status, problem = await reader.call("DELETE", f"/v1/subscriptions/{cid}")
    assert status == 404 and problem["type"] == BASE + "not-subscribed"


async def test_history_paging_cursors_and_ndjson(apis: list[Api]) -> None:
    author = apis[0]
    _, topic = await author.call("POST", "/v1/topics", json={"name": "paged"})
    cid = topic["cid"]
    cids = []
    for i in range(25):
        _, event = await author.call("POST", f"/v1/topics/{cid}/events", json={"json": i})
        cids.append(event["cid"])
    seen, cursor = [], None
    while True:
        query = f"?limit=10&cursor={cursor}" if cursor else "?limit=10"
        _, page = await author.call("GET", f"/v1/topics/{cid}/events{query}")
        seen += [e["cid"] for e in page["events"]]
        cursor = page.get("next_cursor")
        if cursor is None:
            break
    assert seen == cids
    _, back = await author.call("GET", f"/v1/topics/{cid}/events?direction=backward&limit=5")
    assert [e["cid"] for e in back["events"]] == cids[::-1][:5]
    _, after_cid = await author.call("GET", f"/v1/topics/{cid}/events?cursor={cids[19]}")
    assert [e["cid"] for e in after_cid["events"]] == cids[20:]
    async with author.http.get(f"{author.url}/v1/topics/{cid}/events?format=ndjson") as r:
        assert r.content_type == "application/x-ndjson"
        lines = (await r.text()).splitlines()
    assert [json.loads(line)["cid"] for line in lines] == cids


async def test_sse_live_and_resume_without_gap_or_duplicate(apis: list[Api]) -> None:
    author, reader, _ = apis
    _, topic = await author.call("POST", "/v1/topics", json={"name": "live"})
    cid = topic["cid"]
    await reader.call("PUT", f"/v1/subscriptions/{cid}")
    url = f"{reader.url}/v1/topics/{cid}/stream?from=earliest"

    async def read_events(response: aiohttp.ClientResponse, count: int) -> list[tuple[int, str]]:
        got: list[tuple[int, str]] = []
        seq = None
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("id: "):
                seq = int(line[4:])
            elif line.startswith("data: ") and seq is not None:
                got.append((seq, json.loads(line[6:])["cid"]))
                seq = None
                if len(got) == count:
                    return got
        raise AssertionError(f"stream ended after {len(got)} events")

    published = []
    for i in range(5):
        _, e = await author.call("POST", f"/v1/topics/{cid}/events", json={"json": i})
        published.append(e["cid"])
    async with reader.http.get(url) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        first = await read_events(stream, 5)
    # Dropped connection: five more are published while nobody listens.
    for i in range(5, 10):
        _, e = await author.call("POST", f"/v1/topics/{cid}/events", json={"json": i})
        published.append(e["cid"])
    last_id = str(first[-1][0])
    async with reader.http.get(url, headers={"Last-Event-ID": last_id}) as stream:
        second = await read_events(stream, 5)
        # ... then live: published after the stream resumed.
        _, e = await author.call("POST", f"/v1/topics/{cid}/events", json={"json": 10})
        published.append(e["cid"])
        third = await read_events(stream, 1)
    got = first + second + third
    assert [c for _, c in got] == published
    assert [s for s, _ in got] == list(range(1, 12))


async def test_stream_ends_when_unsubscribed(apis: list[Api]) -> None:
    author = apis[0]
    _, topic = await author.call("POST", "/v1/topics", json={"name": "ending"})
    cid = topic["cid"]
    async with author.http.get(f"{author.url}/v1/topics/{cid}/stream") as stream:
        await author.call("DELETE", f"/v1/subscriptions/{cid}")
        text = (await stream.read()).decode()
    assert "event: end" in text and "unsubscribed" in text


async def test_auth_refusals_and_token_file(apis: list[Api]) -> None:
    api = apis[0]
    status, problem = await api.call("POST", "/v1/topics", auth=False, json={"name": "x"})
    assert status == 401 and problem["type"] == BASE + "unauthorized"
    async with api.http.post(f"{api.url}/v1/topics", json={"name": "x"},
                             headers={"Authorization": "Bearer wrong"}) as r:
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    status, _ = await api.call("GET", "/v1/node", auth=False)
    assert status == 200
    token_file = api.node.config.data_dir / "api-token"
    assert token_file.read_text().strip() == api.server.token
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600


async def test_bad_input_is_answered_with_problem_documents(apis: list[Api]) -> None:
    api = apis[0]
    _, topic = await api.call("POST", "/v1/topics", json={"name": "strict"})
    cid = topic["cid"]
    unknown = "bafyreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    events = f"/v1/topics/{cid}/events"
    big = {"data": io.BytesIO(b"x" * 3_000_000), "headers": JSON}
    cases = [
        ("POST", "/v1/topics", {"data": b"{not json", "headers": JSON}, 400, "invalid-json"),
        ("POST", "/v1/topics", {"data": b"[]", "headers": JSON}, 400, "invalid-json"),
        ("POST", "/v1/topics", {"data": b"name=x"}, 415, "unsupported-media-type"),
        ("POST", "/v1/topics", {"json": {"name": 7}}, 400, "invalid-field"),
        ("POST", "/v1/topics", {"json": {"name": "x", "event_linking": "X"}}, 400, "invalid-field"),
        ("POST", "/v1/topics", {"json": {"name": "x", "allowed_publishers": 1}}, 400,
         "invalid-field"),
        ("POST", "/v1/topics", {"json": {"name": "x", "colour": "red"}}, 400, "invalid-field"),
        ("GET", "/v1/topics/not-a-cid", {}, 400, "invalid-cid"),
        ("GET", f"/v1/topics/{unknown}", {}, 404, "topic-not-found"),
        ("GET", f"/v1/events/{unknown}", {}, 404, "event-not-found"),
        ("POST", events, {"json": {"text": 5}}, 400, "invalid-field"),
        ("POST", events, {"json": {"text": "a", "json": 1}}, 400, "invalid-field"),
        ("POST", events, {"json": {"base64": "***"}}, 400, "invalid-field"),
        ("POST", events, {"json": {"text": "a", "parent": cid}}, 403, "publish-refused"),
        ("POST", events, big, 413, "payload-too-large"),
        ("GET", events + "?limit=0", {}, 400, "invalid-field"),
        ("GET", events + "?limit=abc", {}, 400, "invalid-field"),
        ("GET", events + "?direction=sideways", {}, 400, "invalid-field"),
        ("GET", events + "?since=yesterday", {}, 400, "invalid-field"),
        ("GET", events + f"?cursor={unknown}", {}, 404, "event-not-found"),
        ("GET", f"/v1/topics/{unknown}/stream", {}, 404, "topic-not-found"),
        ("GET", "/v1/nothing-here", {}, 404, "not-found"),
        ("DELETE", "/v1/topics", {}, 405, "method-not-allowed"),
    ]
    for method, path, kw, status, kind in cases:
        got, problem = await api.call(method, path, **kw)
        assert (got, problem["type"]) == (status, BASE + kind), (method, path, problem)
        assert problem["status"] == status and problem["detail"]


async def test_node_views_health_metrics_and_openapi(apis: list[Api]) -> None:
    api = apis[0]
    _, node = await api.call("GET", "/v1/node")
    assert node["peer_id"] == str(api.node.peer_id)
    assert node["address"]["port"] == api.node.address[1]
    _, routing = await api.call("GET", "/v1/node/routing")
    assert {c["port"] for c in routing["contacts"]} == {a.node.address[1] for a in apis[1:]}
    _, topic = await api.call("POST", "/v1/topics", json={"name": "viewed"})
    _, trees = await api.call("GET", "/v1/node/trees")
    assert topic["cid"] in {t["topic"] for t in trees["trees"]}
    status, health = await api.call("GET", "/v1/health")
    assert status == 200 and health["status"] == "ok"
    await api.call("POST", f"/v1/topics/{topic['cid']}/events", json={"text": "x"})
    status, text = await api.call("GET", "/metrics")
    assert status == 200 and "pulsarcast_published_total 1" in str(text)
    _, doc = await api.call("GET", "/v1/openapi.json")
    assert doc["openapi"].startswith("3.1") and "/v1/topics/{cid}/stream" in doc["paths"]


async def test_ndjson_history_of_ten_thousand_events(apis: list[Api]) -> None:
    """A long history streams completely, in order, as one NDJSON response. The log is
    filled directly (10,000 real signed events in the node's store and delivery log) so
    the test times the HTTP side, not 10,000 publications."""
    api = apis[0]
    _, topic = await api.call("POST", "/v1/topics", json={"name": "long"})
    cid = CID.parse(topic["cid"])
    parent = None
    events = []
    for i in range(10_000):
        event = EventDescriptor.create(api.node.identity, cid, b"%d" % i, parent=parent)
        events.append(event)
        parent = event.cid
    api.node.store.put_many([(e.cid, e.block) for e in events])
    api.node.state.log_append(cid, [e.cid for e in events], time.time())
    lines = []
    async with api.http.get(f"{api.url}/v1/topics/{cid}/events?format=ndjson") as r:
        assert r.status == 200
        async for line in r.content:
            lines.append(json.loads(line))
    assert [line["cid"] for line in lines] == [str(e.cid) for e in events]
    assert [line["seq"] for line in lines] == list(range(1, 10_001))
    assert base64.b64decode(lines[-1]["payload"]) == b"9999"
    async with api.http.get(f"{api.url}/v1/topics/{cid}/events?format=ndjson&cursor=9990"
                            "&limit=5") as r:
        tail = [json.loads(line)["seq"] async for line in r.content]
    assert tail == [9991, 9992, 9993, 9994, 9995]


async def test_resume_after_unsubscribe_gets_the_rest_then_the_end(apis: list[Api]) -> None:
    author = apis[0]
    _, topic = await author.call("POST", "/v1/topics", json={"name": "closing"})
    cid = topic["cid"]
    for i in range(3):
        await author.call("POST", f"/v1/topics/{cid}/events", json={"json": i})
    await author.call("DELETE", f"/v1/subscriptions/{cid}")
    url = f"{author.url}/v1/topics/{cid}/stream"
    status, problem = await author.call("GET", f"/v1/topics/{cid}/stream")
    assert status == 404 and problem["type"] == BASE + "not-subscribed"
    async with author.http.get(url, headers={"Last-Event-ID": "1"}) as stream:
        text = (await stream.read()).decode()
    assert re.findall(r"^id: (\d+)$", text, re.M) == ["2", "3"]
    assert text.rstrip().endswith('data: {"reason": "unsubscribed"}')


async def test_payloads_come_back_as_they_were_published(apis: list[Api]) -> None:
    """JSON and text payloads are read back as JSON and text by every reader (publish
    answer, event, history page, NDJSON, SSE) on another node; bytes stay base64."""
    author, reader, _ = apis
    _, topic = await author.call("POST", "/v1/topics", json={"name": "typed"})
    cid = topic["cid"]
    await reader.call("PUT", f"/v1/subscriptions/{cid}")
    sent = [
        {"json": {"service": "api", "n": [1, 2.5]}},
        {"text": "héllo"},
        {"base64": base64.b64encode(b"\0\1").decode()},
        {"base64": base64.b64encode(b"<b/>").decode(), "content_type": "image/svg+xml"},
        # A label that does not fit its bytes: read back as base64 only, not an error.
        {"base64": base64.b64encode(b"{not json").decode(), "content_type": "application/json"},
        {"json": [1], "content_type": "application/vnd.x+json"},
    ]
    want = [
        ("application/json", {"json": {"service": "api", "n": [1, 2.5]}}),
        ("text/plain; charset=utf-8", {"text": "héllo"}),
        (None, {}),
        ("image/svg+xml", {}),
        ("application/json", {}),
        ("application/vnd.x+json", {"json": [1]}),
    ]

    def typed(event: dict[str, object]) -> tuple[object, dict[str, object]]:
        return event["content_type"], {k: event[k] for k in ("json", "text") if k in event}

    answers = []
    for body in sent:
        status, event = await author.call("POST", f"/v1/topics/{cid}/events", json=body)
        assert status == 201, event
        answers.append(event)
    assert [typed(e) for e in answers] == want
    assert base64.b64decode(answers[0]["payload"]) == b'{"service":"api","n":[1,2.5]}'

    async def reader_has_all() -> bool:
        _, subs = await reader.call("GET", "/v1/subscriptions")
        return subs["subscriptions"][0]["position"] == len(sent)  # type: ignore[index]

    await eventually(reader_has_all, timeout=10)
    _, page = await reader.call("GET", f"/v1/topics/{cid}/events")
    assert [typed(e) for e in page["events"]] == want
    _, one = await reader.call("GET", f"/v1/events/{answers[1]['cid']}")
    assert typed(one) == want[1]
    async with reader.http.get(f"{reader.url}/v1/topics/{cid}/events?format=ndjson") as r:
        lines = (await r.text()).splitlines()
    assert [typed(json.loads(line)) for line in lines] == want
    url = f"{reader.url}/v1/topics/{cid}/stream?from=earliest"
    streamed = []
    async with reader.http.get(url) as stream:
        async for raw in stream.content:
            line = raw.decode()
            if line.startswith("data: "):
                streamed.append(typed(json.loads(line[6:])))
                if len(streamed) == len(sent):
                    break
    assert streamed == want

    for bad in ("json", "text/plain; charset", "a/b\nc", 7):
        status, problem = await author.call(
            "POST", f"/v1/topics/{cid}/events", json={"text": "x", "content_type": bad})
        assert status == 400 and problem["type"] == BASE + "invalid-field", problem


async def test_raw_upload_publishes_a_large_payload_and_refuses_one_over_the_limit(
    apis: list[Api],
) -> None:
    """``application/octet-stream``: the body is the payload, streamed, up to the node's
    limit on an event (16 MiB), past the JSON body's 2 MiB."""
    author, reader, _ = apis
    status, topic = await author.call("POST", "/v1/topics", json={"name": "big"})
    cid = topic["cid"]  # type: ignore[index]
    await reader.call("PUT", f"/v1/subscriptions/{cid}")
    payload = os.urandom(3 * 1024 * 1024)
    raw = {"Content-Type": "application/octet-stream"}
    status, event = await author.call("POST", f"/v1/topics/{cid}/events?content_type=image/png",
                                      data=io.BytesIO(payload), headers=raw)
    assert status == 201, event
    assert event["payload_size"] == len(payload)  # type: ignore[index]
    assert event["content_type"] == "image/png"  # type: ignore[index]
    event_cid = event["cid"]  # type: ignore[index]

    async def arrived() -> bool:
        status, got = await reader.call("GET", f"/v1/events/{event_cid}")
        return status == 200 and base64.b64decode(got["payload"]) == payload  # type: ignore[index]

    await eventually(arrived, timeout=30.0)

    async def endless() -> object:  # chunked, no length: refused while it streams
        for _ in range(20):
            yield bytes(1024 * 1024)

    status, problem = await author.call("POST", f"/v1/topics/{cid}/events", data=endless(),
                                        headers=raw)
    assert status == 413 and problem["type"] == BASE + "payload-too-large"  # type: ignore[index]
    status, problem = await author.call("POST", f"/v1/topics/{cid}/events?color=red",
                                        data=b"x", headers=raw)
    assert status == 400


async def test_retention_is_declared_shown_and_a_cut_position_answers_410(
        apis: list[Api]) -> None:
    author, reader, _ = apis
    status, bad = await author.call("POST", "/v1/topics",
                                    json={"name": "r", "retention": {"max_events": 0}})
    assert status == 400 and "retention.max_events" in bad["detail"]  # type: ignore[index]
    status, bad = await author.call("POST", "/v1/topics",
                                    json={"name": "r", "retention": {"max_bytes": 9}})
    assert status == 400
    status, topic = await author.call("POST", "/v1/topics",
                                      json={"name": "r", "retention": {"max_events": 2}})
    assert status == 201, topic
    assert topic["retention"] == {"max_age": None, "max_events": 2,
                                  "compact": False}  # type: ignore[index]
    cid = topic["cid"]  # type: ignore[index]
    await reader.call("PUT", f"/v1/subscriptions/{cid}")
    for i in range(5):
        await author.call("POST", f"/v1/topics/{cid}/events", json={"json": i})
    await eventually(lambda: reader.node.last_position(CID.parse(cid)) == 5, timeout=10)
    reader.node._driver.retention.sweep([CID.parse(cid)], time.time())
    _, page = await reader.call("GET", f"/v1/topics/{cid}/events")
    assert [e["seq"] for e in page["events"]] == [4, 5]  # type: ignore[index]
    status, gone = await reader.call("GET", f"/v1/topics/{cid}/events?cursor=1")
    assert status == 410, gone
    assert gone["type"] == BASE + "before-retention"  # type: ignore[index]
    assert gone["retained_from"] == 4  # type: ignore[index]
    async with reader.http.get(f"{reader.url}/v1/topics/{cid}/stream",
                               headers={"Last-Event-ID": "2", **reader.auth}) as r:
        assert r.status == 410
    # What GET shows (an unset member as null) can be sent back as it is.
    status, v2 = await author.call("PATCH", f"/v1/topics/{cid}", json={
        "retention": {"max_age": 60, "max_events": None, "compact": False}})
    assert status == 200 and v2["retention"] == {  # type: ignore[index]
        "max_age": 60, "max_events": None, "compact": False}


NDJSON = {"Content-Type": "application/x-ndjson"}


def _ndjson(lines: list[object]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def test_a_batch_publishes_every_line_in_order_and_answers_one_line_each(
        apis: list[Api]) -> None:
    """An NDJSON body publishes one event per line; the answer is NDJSON, one outcome per
    line in order, and the events follow each other in the topic as the lines do."""
    author, reader, _ = apis
    _, topic = await author.call("POST", "/v1/topics", json={"name": "bulk"})
    cid = topic["cid"]  # type: ignore[index]
    await reader.call("PUT", f"/v1/subscriptions/{cid}")
    lines: list[object] = [{"json": i} for i in range(150)]
    lines[7] = {"text": "seven", "key": "k7"}
    status, answer = await author.call("POST", f"/v1/topics/{cid}/events",
                                       data=_ndjson(lines), headers=NDJSON)
    assert status == 200, answer
    outcomes = [json.loads(line) for line in str(answer).splitlines()]
    assert len(outcomes) == 150 and all(set(o) == {"cid"} for o in outcomes)

    async def all_arrived() -> bool:
        _, subs = await reader.call("GET", "/v1/subscriptions")
        return subs["subscriptions"][0]["position"] == 150  # type: ignore[index]

    await eventually(all_arrived, timeout=20)
    status, page = await reader.call("GET", f"/v1/topics/{cid}/events?limit=1000")
    events = page["events"]  # type: ignore[index]
    assert [e["cid"] for e in events] == [o["cid"] for o in outcomes]
    assert [e["parent"] for e in events[1:]] == [o["cid"] for o in outcomes[:-1]]
    assert base64.b64decode(events[7]["payload"]) == b"seven" and events[7]["key"] == "k7"
    assert base64.b64decode(events[8]["payload"]) == b"8"


async def test_a_bad_line_refuses_the_whole_batch_and_publishes_nothing(
        apis: list[Api]) -> None:
    author = apis[0]
    _, topic = await author.call("POST", "/v1/topics", json={"name": "bulk-bad"})
    cid = topic["cid"]  # type: ignore[index]
    path = f"/v1/topics/{cid}/events"
    cases: list[tuple[bytes, int, str, str]] = [
        (_ndjson([{"json": 1}, {"json": 2, "colour": "red"}]), 400, "invalid-field", "line 2"),
        (b'{"json": 1}\n{"json": \n', 400, "invalid-json", "line 2"),
        (_ndjson([{"json": 1}, [1, 2]]), 400, "invalid-json", "line 2"),
        (_ndjson([{"json": 1}, {"json": 1, "key": "\u0007"}]), 400, "invalid-field", "line 2"),
        (_ndjson([{"base64": "!!"}]), 400, "invalid-field", "line 1"),
        (b"\n\n", 400, "bad-request", "no events"),
        (_ndjson([{"json": i} for i in range(1001)]), 413, "payload-too-large", "1000"),
    ]
    for body, status_wanted, kind, detail in cases:
        status, problem = await author.call("POST", path, data=body, headers=NDJSON)
        assert status == status_wanted, (body[:60], problem)
        assert problem["type"] == BASE + kind and detail in problem["detail"]  # type: ignore[index]
    assert author.node.last_position(CID.parse(cid)) == 0
    status, problem = await author.call("POST", path, data=_ndjson([{"json": 1}]),
                                        headers=NDJSON, auth=False)
    assert status == 401


async def test_a_refused_line_answers_its_problem_and_the_others_are_published(
        apis: list[Api]) -> None:
    """Lines of a batch fail one by one, as single requests would: a CUSTOM parent on a
    LAST_SEEN topic is refused by the node (403 publish-refused) and the rest go out."""
    author = apis[0]
    _, topic = await author.call("POST", "/v1/topics", json={"name": "bulk-mixed"})
    cid = topic["cid"]  # type: ignore[index]
    _, first = await author.call("POST", f"/v1/topics/{cid}/events", json={"json": 0})
    lines = [{"json": 1}, {"json": 2, "parent": first["cid"]}, {"json": 3}]  # type: ignore[index]
    status, answer = await author.call("POST", f"/v1/topics/{cid}/events",
                                       data=_ndjson(lines), headers=NDJSON)
    assert status == 200
    one, two, three = (json.loads(line) for line in str(answer).splitlines())
    assert "cid" in one and "cid" in three
    assert two["error"]["status"] == 403
    assert two["error"]["type"] == BASE + "publish-refused"
    assert author.node.last_position(CID.parse(cid)) == 3
