"""What a node sends is untrusted: malformed events, blocks that do not hash to their CID,
cut or oversized records and lines fail the read with ``NODE_ERROR`` instead of producing
rows. A fake node (aiohttp on loopback) sends them."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from api.logblocks import MAGIC, MEDIA_TYPE, encode_record
from dag import EventDescriptor
from dag.cid import cid_of
from dag.identity import Identity
from pulsar.tools.spark.background import BackgroundLoop
from pulsar.tools.spark.errors import PulsarcastSparkError
from pulsar.tools.spark.options import Endpoint
from pulsar.tools.spark.rest import MAX_LINE_BYTES, NodeApi, read_range
from pulsar.tools.spark.schema import ARROW_SCHEMA, parse_block

TOPIC = "bafyreifdez6wl67lsqg64rlc2r5quy2icwosfzbslh53ffnqttw6yax5ba"
ANSWERS: dict[str, bytes] = {}
"""What the fake node answers: ``page`` to a JSON page request, ``ndjson`` to NDJSON,
``blocks`` to the bulk format."""


def event(seq: int, **changes: Any) -> dict[str, Any]:
    body = {"cid": f"bafy{seq}", "topic": TOPIC, "author": "12D3KooWA",
            "publisher": "12D3KooWA", "parent": None, "created": "2026-11-23T13:18:13.011Z",
            "payload": base64.b64encode(b"p%d" % seq).decode(), "payload_size": 2,
            "seq": seq, "delivered_at": 1795439893.25}
    body.update(changes)
    return body


def ndjson(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def test_a_good_block_becomes_the_documented_batch() -> None:
    parsed = parse_block(ndjson(event(3), event(4, parent="bafy3"), event(9)), TOPIC, 2, 9)
    assert parsed.batch is not None and parsed.batch.schema.equals(ARROW_SCHEMA)
    assert parsed.batch.column("seq").to_pylist() == [3, 4] and parsed.reached_end
    assert parsed.batch.column("payload").to_pylist() == [b"p3", b"p4"]
    assert parsed.batch.column("timestamp")[0].as_py().timestamp() == 1795439893.25


@pytest.mark.parametrize("bad", [
    ndjson(event(3), event(3)),                          # a position twice
    ndjson(event(2)),                                    # not after the previous one
    ndjson(event(3, payload="!!not base64!!")),
    ndjson({**event(3), "seq": "3"}),                    # wrong JSON type
    ndjson(event(3, cid=None)),
    ndjson(event(3, author="x" * 300)),
    ndjson(event(3, created="yesterday")),
    ndjson(event(3, delivered_at=-1)),
    b"[1, 2]\n",
    b"{not json\n",
])
def test_malformed_events_fail_the_read(bad: bytes) -> None:
    with pytest.raises(PulsarcastSparkError) as info:
        parse_block(bad, TOPIC, 2, 100)
    assert info.value.code == "NODE_ERROR"


@pytest.fixture(scope="module")
def fake_node() -> Iterator[str]:
    """Answers every history request with what the test put in :data:`ANSWERS`."""
    bg = BackgroundLoop("fake-node")
    answers = ANSWERS

    async def events(request: web.Request) -> web.StreamResponse:
        form = request.query.get("format")
        if form not in ("ndjson", "blocks"):
            return web.Response(body=answers["page"], content_type="application/json")
        media = "application/x-ndjson" if form == "ndjson" else MEDIA_TYPE
        response = web.StreamResponse(headers={"Content-Type": media})
        await response.prepare(request)
        await response.write(answers[form])
        await response.write_eof()
        return response

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/v1/topics/{cid}/events", events)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = bg.run(start())
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        bg.run(runner.cleanup())
        bg.close()


def test_the_largest_payload_fits_in_a_line(fake_node: str) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB, the largest payload the API accepts
    ANSWERS["ndjson"] = ndjson(event(1, payload=base64.b64encode(big).decode()), event(2))
    batches = list(read_range(Endpoint(fake_node), TOPIC, 1, 3, "ndjson"))
    assert [p for b in batches for p in b.column("payload").to_pylist()] == [big, b"p2"]


def test_an_endless_line_is_cut_off(fake_node: str) -> None:
    ANSWERS["ndjson"] = b"{" + b" " * (MAX_LINE_BYTES + 10)
    with pytest.raises(PulsarcastSparkError, match="longer than") as info:
        list(read_range(Endpoint(fake_node), TOPIC, 1, 10, "ndjson"))
    assert info.value.code == "NODE_ERROR"


def test_a_node_answering_nonsense_is_a_node_error(fake_node: str) -> None:
    answers = ANSWERS
    answers["ndjson"] = ndjson(event(1), event(2))
    assert sum(b.num_rows
               for b in read_range(Endpoint(fake_node), TOPIC, 1, 10, "ndjson")) == 2
    for page in (b"[]", b'{"topic": 5, "events": []}', b'{"topic": "x", "events": [7]}'):
        answers["page"] = page
        api = NodeApi(Endpoint(fake_node))
        try:
            with pytest.raises(PulsarcastSparkError) as info:
                api.topic_root(TOPIC)
        finally:
            api.close()
        assert info.value.code == "NODE_ERROR", page


def _events(count: int) -> list[EventDescriptor]:
    me = Identity.from_seed(bytes(32))
    out: list[EventDescriptor] = []
    for i in range(count):
        out.append(EventDescriptor.create(me, cid_of(b"\xa0"), b"p%d" % i,
                                          parent=out[-1].cid if out else None))
    return out


def _records(events: list[EventDescriptor], first: int = 1) -> bytes:
    return b"".join(encode_record(first + i, 1795439893.25, e.cid.raw, e.block)
                    for i, e in enumerate(events))


def test_good_blocks_become_the_documented_rows(fake_node: str) -> None:
    events = _events(4)
    ANSWERS["blocks"] = MAGIC + _records(events)
    batches = list(read_range(Endpoint(fake_node), TOPIC, 1, 4))  # the 4th is beyond
    rows = [r for b in batches for r in b.to_pylist()]
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    assert [r["cid"] for r in rows] == [str(e.cid) for e in events[:3]]
    assert [r["parent"] for r in rows] == [None, str(events[0].cid), str(events[1].cid)]
    assert [r["payload"] for r in rows] == [b"p0", b"p1", b"p2"]
    assert rows[0]["author"] == str(events[0].author) and rows[0]["topic"] == TOPIC
    assert rows[0]["timestamp"].timestamp() == 1795439893.25


@pytest.mark.parametrize("answer", [
    b"not the format",
    MAGIC[:5],                                              # ends inside the header
    MAGIC + encode_record(1, 1.0, b"\x01", b"x"),           # a CID that is no CID
    MAGIC + _records(_events(2))[:-3],                      # a record cut short
    MAGIC + _records(_events(1)) + _records(_events(1)),    # a position twice
    MAGIC + encode_record(1, 1795439893.25, cid_of(b"other").raw,
                          _events(1)[0].block),             # block and CID disagree
    MAGIC + encode_record(1, 1795439893.25, cid_of(b"\xa0").raw, b"\xa0"),  # no event
    MAGIC + encode_record(1, -5.0, _events(1)[0].cid.raw, _events(1)[0].block),
])
def test_malformed_blocks_fail_the_read(fake_node: str, answer: bytes) -> None:
    ANSWERS["blocks"] = answer
    with pytest.raises(PulsarcastSparkError) as info:
        list(read_range(Endpoint(fake_node), TOPIC, 1, 10))
    assert info.value.code == "NODE_ERROR"
