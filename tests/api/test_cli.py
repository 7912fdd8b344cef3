"""The REST client subcommands of ``pulsarcast`` against real nodes on loopback.

``main`` runs in a worker thread (it calls ``asyncio.run`` itself, and the test's loop must
keep serving the nodes meanwhile); capsys captures what it prints."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from dag import CID
from pulsar.tools.cli import main
from tests.waiting import eventually

from .conftest import Api


async def run(api: Api, capsys: pytest.CaptureFixture[str], *argv: str,
              token: str | None = None) -> tuple[int, str, str]:
    args = [*argv, "--url", api.url, f"--token={token or api.server.token}"]
    code = await asyncio.to_thread(main, args)
    out, err = capsys.readouterr()
    return code, out, err


async def test_topic_publish_and_replay(apis: list[Api], capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    api = apis[0]
    code, out, _ = await run(api, capsys, "topic", "create", "news", "--json")
    assert code == 0
    topic = json.loads(out)
    cid = topic["cid"]
    code, out, _ = await run(api, capsys, "topic", "show", cid)
    assert code == 0 and cid in out and "news" in out and "anyone" in out

    code, out, _ = await run(api, capsys, "publish", cid, "--text", "hello")
    assert code == 0 and out.startswith("published ") and "(5 bytes)" in out
    code, out, _ = await run(api, capsys, "publish", cid, "--json", '{"n": 1}', "-q")
    assert code == 0 and out.strip().startswith("b")
    blob = tmp_path / "blob"
    blob.write_bytes(b"\xff\x00")
    code, _, _ = await run(api, capsys, "publish", cid, "--file", str(blob),
                           "--content-type", "image/x-blob")
    assert code == 0

    code, out, _ = await run(api, capsys, "replay", cid)
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [e["seq"] for e in events] == [1, 2, 3]
    assert [e["payload_size"] for e in events] == [5, 7, 2]
    # Read back as published: text as text, JSON as JSON, bytes with the given media type.
    assert [e["content_type"] for e in events] == [
        "text/plain; charset=utf-8", "application/json", "image/x-blob"]
    assert events[0]["text"] == "hello" and events[1]["json"] == {"n": 1}
    assert "json" not in events[2] and "text" not in events[2]
    code, out, _ = await run(api, capsys, "replay", cid, "--limit", "1", "--since", "0")
    assert code == 0 and len(out.splitlines()) == 1
    # From the network, through a node that never followed the topic (once the author's
    # heads record, written half a second after a publish, names the last event).

    async def found_all() -> bool:
        code, out, _ = await run(apis[2], capsys, "replay", cid, "--network")
        return code == 0 and len(out.splitlines()) == 3

    await eventually(found_all, timeout=10)
    code, out, _ = await run(apis[2], capsys, "replay", cid, "--network")
    network = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [e["cid"] for e in network] == [e["cid"] for e in events]
    # Without --network, a node that does not follow the topic walks the network too,
    # and says so, rather than print nothing.
    code, out, err = await run(apis[2], capsys, "replay", cid)
    assert code == 0 and [json.loads(line)["cid"] for line in out.splitlines()] == [
        e["cid"] for e in events]
    assert "does not follow" in err
    code, out, _ = await run(apis[2], capsys, "replay", cid, "--network",
                             "--since", events[0]["cid"])
    assert code == 0 and [json.loads(line)["cid"] for line in out.splitlines()] == [
        e["cid"] for e in events[1:]]

    code, out, _ = await run(api, capsys, "topic", "update", cid, "--name", "news-2")
    assert code == 0 and "news-2" in out and f"parent:             {cid}" in out
    code, out, _ = await run(api, capsys, "peers")
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = await run(api, capsys, "peers", "--json")
    assert {json.loads(line)["port"] for line in out.splitlines()} == {
        a.node.address[1] for a in apis[1:]}


async def test_subscribe_no_follow_then_follow_until_unsubscribed(
        apis: list[Api], capsys: pytest.CaptureFixture[str]) -> None:
    author, reader, _ = apis
    cid = (await author.call("POST", "/v1/topics", json={"name": "tail"}))[1]["cid"]  # type: ignore[index]
    code, out, err = await run(reader, capsys, "subscribe", cid, "--no-follow")
    assert code == 0 and out == "" and "subscribed to" in err
    for text in ("one", "two"):
        await author.call("POST", f"/v1/topics/{cid}/events", json={"text": text})

    async def reader_has_both() -> bool:
        return reader.node.last_position(reader.node.subscribed()[0]) == 2

    await eventually(reader_has_both, timeout=10)
    code, out, _ = await run(reader, capsys, "subscribe", cid, "--no-follow", "--from",
                             "earliest")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].startswith("#1 ") and lines[0].endswith(" one") and lines[1].endswith(" two")
    code, out, _ = await run(reader, capsys, "subscribe", cid, "--no-follow", "--from", "1",
                             "--json")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [2]

    # Following: prints as events arrive, returns once the node unsubscribes.
    argv = ["subscribe", cid, "--from", "1", "--url", reader.url,
            f"--token={reader.server.token}"]
    follow = asyncio.ensure_future(asyncio.to_thread(main, argv))
    printed: list[str] = []

    def shown(count: int) -> bool:
        printed.extend(capsys.readouterr().out.splitlines())
        return len(printed) >= count

    await eventually(lambda: shown(1), timeout=10)
    await author.call("POST", f"/v1/topics/{cid}/events", json={"text": "three"})
    await eventually(lambda: shown(2), timeout=10)
    await reader.call("DELETE", f"/v1/subscriptions/{cid}")
    assert await asyncio.wait_for(follow, 10) == 0
    shown(0)
    assert [line.split()[0] for line in printed] == ["#2", "#3"]
    assert printed[1].endswith(" three")


async def test_errors_are_one_line_and_nonzero(apis: list[Api],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    api = apis[0]
    code, out, err = await run(api, capsys, "topic", "create", "x", token="not-the-token-at-all")
    assert code == 1 and out == ""
    assert "unauthorized (401)" in err and "--token" in err and "Traceback" not in err
    code, _, err = await run(api, capsys, "topic", "show", "not-a-cid")
    assert code == 1 and "invalid-cid (400)" in err
    code, _, err = await run(api, capsys, "publish", "x", "--json", "{nope")
    assert code == 2 and "not JSON" in err

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = await asyncio.to_thread(main, ["peers", "--url", f"http://127.0.0.1:{port}"])
    _, err = capsys.readouterr()
    assert code == 1 and "cannot reach the node" in err and "Traceback" not in err


async def test_topic_create_prints_the_cid_alone_when_piped(
        apis: list[Api], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await run(apis[0], capsys, "topic", "create", "piped")
    assert code == 0 and out.count("\n") == 1 and out.startswith("b")  # captured: no TTY
    code, shown, _ = await run(apis[0], capsys, "topic", "show", out.strip())
    assert code == 0 and "piped" in shown


async def test_doctor_says_what_is_wrong(apis: list[Api],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    api = apis[0]
    code, out, _ = await run(api, capsys, "doctor")
    lines = out.splitlines()
    assert code == 0, out
    assert [line.split()[:2] for line in lines] == [
        ["ok", "reachable"], ["ok", "peers"], ["ok", "trees"], ["ok", "consumers"],
        ["ok", "token"]]
    assert str(api.node.peer_id) in lines[0] and "2 DHT contact(s)" in lines[1]
    assert lines[3].endswith("consumers none on the 0 followed topic(s)")

    code, out, _ = await run(api, capsys, "doctor", "--json", token="pct_wrong-token-0000")
    checks = {f["check"]: f for f in map(json.loads, out.splitlines())}
    assert code == 1 and checks["token"]["verdict"] == "FAIL"
    assert "api-token" in checks["token"]["detail"]

    code = await asyncio.to_thread(main, ["doctor", "--url", api.url])  # no token
    out, _ = capsys.readouterr()
    assert code == 0 and out.splitlines()[-1].startswith("warn token")

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = await asyncio.to_thread(main, ["doctor", "--url", f"http://127.0.0.1:{port}"])
    out, err = capsys.readouterr()
    assert code == 1 and out.startswith("FAIL reachable") and "make run" in out
    assert "Traceback" not in err


async def test_doctor_reports_consumers_an_operator_should_look_at(
        apis: list[Api], capsys: pytest.CaptureFixture[str]) -> None:
    author, reader, _ = apis
    jobs = (await author.call("POST", "/v1/topics", json={"name": "jobs"}))[1]["cid"]  # type: ignore[index]
    ticks = (await author.call("POST", "/v1/topics", json={  # type: ignore[index]
        "name": "ticks", "retention": {"max_events": 3}}))[1]["cid"]
    for cid in (jobs, ticks):
        await reader.call("PUT", f"/v1/subscriptions/{cid}")
    consumers = reader.node.consumers
    await consumers.add(CID.parse(ticks), {"name": "late"})
    for cid in (jobs, ticks):
        for i in range(5):
            await author.call("POST", f"/v1/topics/{cid}/events", json={"json": i})
    for cid in (jobs, ticks):
        await eventually(lambda c=cid: reader.node.last_position(CID.parse(c)) == 5,
                         timeout=10)
    code, out, _ = await run(reader, capsys, "doctor")
    assert code == 0 and "ok   consumers 1 on 1 of 2 followed topic(s)" in out, out

    topic = CID.parse(jobs)
    await consumers.add(topic, {"name": "fine", "ack_policy": "all"})
    fetched = await consumers.fetch(topic, "fine", 10)
    await consumers.ack(topic, "fine", [fetched[-1].id])
    await consumers.add(topic, {"name": "poison", "max_deliver": 1, "ack_wait": 0.2})
    assert [m.id for m in await consumers.fetch(topic, "poison", 1)] == [1]
    await consumers.add(topic, {"name": "stuck", "max_ack_pending": 2, "ack_wait": 600})
    assert len(await consumers.fetch(topic, "stuck", 10)) == 2
    await consumers.add(topic, {"name": "idle"})

    async def set_aside() -> bool:  # its ack_wait passes, and it is not delivered again
        return (await consumers.info(topic, "poison")).num_max_deliver_reached == 1

    await eventually(set_aside, timeout=10)
    reader.node._driver.retention.sweep([CID.parse(ticks)], time.time())  # keeps 3..5

    code, out, _ = await run(reader, capsys, "doctor", "--max-pending", "4")
    lines = out.splitlines()
    assert code == 0, out  # warnings: the node works, applications on it do not keep up
    assert lines[3] == "warn consumers 5 on 2 of 2 followed topic(s); 4 to look at (below)"
    listed = {line.split()[2]: line for line in lines if line.startswith("ok   consumers b")}
    assert set(listed) == {f"{jobs}:", f"{ticks}:"}
    assert "fine (0 pending, 0 unacknowledged), idle (5 pending" in listed[f"{jobs}:"]
    warned = {line.split()[2]: line for line in lines[4:] if line.startswith("warn")}
    assert set(warned) == {"idle", "poison", "stuck", "late"}
    assert f"idle of {jobs}: far behind: 5 log entries" in warned["idle"]
    assert "1 message(s) set aside after max_deliver (1)" in warned["poison"]
    assert "2 unacknowledged, its max_ack_pending" in warned["stuck"]
    assert f"late of {ticks}: skipped 2 log position(s) (last 1-2)" in warned["late"]
    assert lines[-1].startswith("ok   token")
    code, out, _ = await run(reader, capsys, "doctor", "--json")  # the default: 10,000
    checks = [json.loads(line) for line in out.splitlines()]
    assert {c["detail"].split()[0] for c in checks
            if c["check"] == "consumers" and c["verdict"] == "warn"} == {
        "5", "poison", "stuck", "late"}


async def test_topic_retention_from_the_command_line(
        apis: list[Api], capsys: pytest.CaptureFixture[str]) -> None:
    api = apis[0]
    code, out, _ = await run(api, capsys, "topic", "create", "ticks", "--max-events", "3",
                             "--max-age", "60", "--json")
    assert code == 0
    topic = json.loads(out)
    assert topic["retention"] == {"max_age": 60, "max_events": 3, "compact": False}
    code, shown, _ = await run(api, capsys, "topic", "show", topic["cid"])
    assert code == 0 and "the newest 3 events and 60 s" in shown
    code, shown, _ = await run(api, capsys, "topic", "update", topic["cid"], "--compact")
    assert code == 0 and "the newest event of each key" in shown
    code, out, _ = await run(api, capsys, "publish", topic["cid"], "--text", "v", "--key",
                             "user/1", "--quiet")
    assert code == 0
    async with api.http.get(f"{api.url}/v1/events/{out.strip()}") as r:
        assert r.status == 200 and (await r.json())["key"] == "user/1"
    code, shown, _ = await run(api, capsys, "topic", "update", topic["cid"], "--keep-all")
    assert code == 0 and "retention:" in shown and "everything" in shown
    with pytest.raises(SystemExit) as usage:  # argparse: a usage error, exit status 2
        await run(api, capsys, "topic", "create", "bad", "--max-events", "0")
    assert usage.value.code == 2 and "positive" in capsys.readouterr().err


async def test_publish_lines_sends_each_line_as_an_event_in_batches(
        apis: list[Api], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``publish --lines``: one text event a line (empty lines skipped, CRLF trimmed), in
    batches of 1,000, in line order; ``-q`` prints the CIDs, one a line."""
    api = apis[0]
    code, out, _ = await run(api, capsys, "topic", "create", "lines", "--json")
    cid = json.loads(out)["cid"]
    source = tmp_path / "lines.txt"
    texts = [f"line {i}" for i in range(2100)]
    source.write_text("\r\n".join(texts[:1000]) + "\r\n\n" + "\n".join(texts[1000:]) + "\n")
    code, out, err = await run(api, capsys, "publish", cid, "--lines", str(source))
    assert code == 0, err
    assert out.strip() == "published 2100 event(s) from 2101 line(s)"  # one empty
    assert "published 1000 event(s)" in err and "published 2000 event(s)" in err
    log = api.node.log_entries(CID.parse(cid), limit=5000)
    assert [bytes(e.event.payload).decode() for e in log] == texts

    source.write_text("a\nb\n")
    code, out, _ = await run(api, capsys, "publish", cid, "--lines", str(source), "-q")
    assert code == 0 and len(out.split()) == 2 and all(c.startswith("b") for c in out.split())
    code, _, err = await run(api, capsys, "publish", cid, "--lines", str(source), "--key", "")
    assert code != 0 and "line 1" in err
    code, _, err = await run(api, capsys, "publish", cid, "--lines", str(tmp_path / "none"))
    assert code == 2 and "cannot read" in err


def test_doctor_names_a_group_member_alone_or_handling_twice() -> None:
    from pulsar.tools.doctor import consumer_problems

    info: dict[str, Any] = {
        "config": {"max_deliver": -1, "max_ack_pending": 1000, "ack_wait": 30.0},
        "num_max_deliver_reached": 0, "num_ack_pending": 0, "num_skipped": 0,
        "num_pending": 0, "group": {"name": "crew", "ready": True, "duplicates": 0,
                                    "num_watched": 0, "taken_over": 0,
                                    "members": [{"name": "w1"}, {"name": "w2"}]}}
    assert consumer_problems(info) == []
    info["group"]["members"] = [{"name": "w1"}]
    assert [p.split(":")[0] for p in consumer_problems(info)] == ["alone in group crew"]
    info["group"]["ready"] = False  # still joining: alone for now is expected
    assert consumer_problems(info) == []
    info["group"] |= {"ready": True, "members": [{"name": "w1"}, {"name": "w2"}],
                      "duplicates": 3}
    assert consumer_problems(info) == [
        "3 event(s) of group crew also handled by another member since its node started: "
        "members died, restarted or did not hear each other (a partition)"]
