"""The DHT datagram vectors (dht.json): every datagram has the documented layout, decodes
to the recorded request or answer and encodes back to the same bytes; a fresh node fed
the requester's datagrams answers exactly the recorded datagrams; the caller's parsers
read the answers; every RPC the node answers has a vector."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dag import CID
from dht import wire
from dht.wire import (
    FoundValue,
    Request,
    Response,
    decode_datagram,
    encode_request,
    encode_response,
    parse_find_node,
    parse_find_value,
    parse_holds,
    parse_ping,
    parse_store,
    parse_store_batch,
)

from .generate import HERE, from_msgpack_readable, msgpack_readable, replay_dht, world

DATA: dict[str, Any] = json.loads((HERE / "dht.json").read_text())
VECTORS: list[dict[str, Any]] = DATA["vectors"]
WORLD = world()


def check_datagrams(vector: dict[str, Any]) -> None:
    """Raise AssertionError unless every datagram of ``vector`` is what it says it is."""
    for item in vector["datagrams"]:
        data = bytes.fromhex(item["hex"])
        decoded = item["decoded"]
        assert data[:1] == (b"\x00" if decoded["type"] == "request" else b"\x01")
        assert data[1:21].hex() == decoded["msg_id"]
        try:
            message = decode_datagram(data)
        except wire.MalformedDatagram as exc:
            raise AssertionError(f"{vector['name']}: {exc}") from None
        if isinstance(message, Request):
            assert len(data) <= wire.MAX_REQUEST_DATAGRAM
            assert message.name == decoded["name"]
            assert msgpack_readable(list(message.args)) == decoded["args"]
            args = from_msgpack_readable(decoded["args"])
            assert encode_request(message.msg_id, message.name, args) == data
        else:
            assert isinstance(message, Response)
            assert len(data) <= wire.MAX_RESPONSE_DATAGRAM
            assert msgpack_readable(message.data) == decoded["answer"]
            assert encode_response(message.msg_id, from_msgpack_readable(decoded["answer"])) == data


async def check_replay(vector: dict[str, Any]) -> None:
    """Raise AssertionError unless a fresh node answers the requester's datagrams with
    exactly the recorded ones."""
    got = await replay_dht(WORLD, vector)
    assert got == [item["hex"] for item in vector["datagrams"]], vector["name"]


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
def test_datagrams_decode_to_what_is_recorded_and_encode_back(vector: dict[str, Any]) -> None:
    check_datagrams(vector)


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
async def test_a_node_answers_exactly_the_recorded_datagrams(vector: dict[str, Any]) -> None:
    await check_replay(vector)


def _pairs(vector: dict[str, Any]) -> list[tuple[Request, Any]]:
    """Each requester request with the node's answer to it (matched by message id)."""
    messages = [decode_datagram(bytes.fromhex(item["hex"])) for item in vector["datagrams"]]
    pairs = []
    for n, item in enumerate(vector["datagrams"]):
        request = messages[n]
        if item["from"] != "requester" or not isinstance(request, Request):
            continue
        answers = [m for m in messages[n + 1:]
                   if isinstance(m, Response) and m.msg_id == request.msg_id]
        assert len(answers) == 1, f"{vector['name']}: one answer per request"
        pairs.append((request, answers[0].data))
    return pairs


def test_the_callers_parsers_read_the_answers() -> None:
    node_id = bytes.fromhex(DATA["node"]["identity"]["kademlia_id"])
    requester = DATA["requester"]["address"]
    topic = CID.parse(json.loads((HERE / "messages.json").read_text())["blocks"]["topic"]["cid"])
    seen = set()
    for vector in VECTORS:
        for request, answer in _pairs(vector):
            seen.add(request.name)
            match request.name:
                case "ping":
                    assert parse_ping(answer) == node_id
                case "stun":
                    assert answer == requester
                case "store":
                    assert parse_store(answer) is ("refused" not in vector["name"])
                case "store_batch":
                    items = request.args[1]
                    assert isinstance(items, list)
                    assert parse_store_batch(answer, len(items)) == [True] * len(items)
                case "find_node" | "find_near":
                    contacts = parse_find_node(answer)
                    assert len(contacts) == len(answer) > 0
                    key = int.from_bytes(request.args[1], "big")  # type: ignore[arg-type]
                    distances = [int.from_bytes(c[0], "big") ^ key for c in contacts]
                    assert distances == sorted(distances), "nearest first"
                    if request.name == "find_near":
                        assert len(contacts) <= request.args[2]  # type: ignore[operator]
                case "find_value" | "find_value_near":
                    found = parse_find_value(answer)
                    assert isinstance(found, FoundValue) == ("not found" not in vector["name"])
                    if isinstance(found, FoundValue) and request.name == "find_value":
                        assert topic.verifies(found.value)
                case "holds":
                    keys = request.args[1]
                    assert isinstance(keys, list)
                    assert parse_holds(answer, len(keys)) == [True, False, True]
                case _:
                    raise AssertionError(f"no check for {request.name}")
    assert seen == set(wire._SIGNATURES), "every RPC the node answers has a vector"


def _order(vector: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(i["from"], i["decoded"]["type"], i["decoded"].get("name"))
            for i in vector["datagrams"]]


def test_an_unvalidated_request_waits_for_a_ping_round_trip() -> None:
    (vector,) = [v for v in VECTORS if v["name"].startswith("find_node, from an address")]
    assert _order(vector) == [("requester", "request", "find_node"), ("node", "request", "ping"),
                              ("requester", "response", None), ("node", "response", None)]
    (vector,) = [v for v in VECTORS if v["name"].startswith("ping, from an address")]
    assert _order(vector) == [("requester", "request", "ping"), ("node", "request", "ping"),
                              ("node", "response", None), ("requester", "response", None)]


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
async def test_a_changed_byte_fails_the_checks(vector: dict[str, Any]) -> None:
    for index, item in enumerate(vector["datagrams"]):
        data = bytes.fromhex(item["hex"])
        for position in (0, 5, len(data) - 1):
            changed = json.loads(json.dumps(vector))
            mutated = bytearray(data)
            mutated[position] ^= 0x01
            changed["datagrams"][index]["hex"] = mutated.hex()
            with pytest.raises(AssertionError):
                check_datagrams(changed)
            if item["from"] == "node":  # what the node sends is pinned too
                with pytest.raises(AssertionError):
                    await check_replay(changed)
