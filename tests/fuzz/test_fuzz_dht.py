"""Fuzzing the DHT's UDP side: ``dht.wire`` decoders and a live node's ``datagram_received``.

Pure decoders: any bytes give a :class:`Request`/:class:`Response` or
:class:`MalformedDatagram`, nothing else. The live node (real UDP socket, SQLite store) runs
on its own event loop in a thread for the whole module; each example sends its datagrams and
then a PING, so the node has handled them when the answer comes back, and its
``handler_errors`` (a handler that raised) must stay 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import umsgpack
from hypothesis import given
from hypothesis import strategies as st

from dag.cid import cid_of_raw
from dag.identity import Identity
from dht import DhtConfig, DhtNode, dht_key
from dht.wire import (
    MalformedDatagram,
    Request,
    decode_datagram,
    encode_request,
    parse_find_node,
    parse_find_value,
    parse_ping,
    parse_store_batch,
)

from .conftest import FUZZ
from .strategies import mutated

RPCS = ["ping", "stun", "store", "store_batch", "find_node", "find_value", "shutdown"]

msgpack_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
              st.floats(allow_nan=True), st.text(max_size=20), st.binary(max_size=40),
              st.binary(min_size=20, max_size=20), st.sampled_from(["127.0.0.1", "::1"])),
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-99, 99)),
                                            inner, max_size=3)),
    max_leaves=20,
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A request datagram with a (mostly) known RPC name and hostile arguments."""
    name = draw(st.sampled_from(RPCS))
    args = draw(st.lists(msgpack_values, max_size=4))
    if name == "store_batch" and draw(st.booleans()):
        items = draw(st.lists(st.binary(max_size=200), max_size=5))
        args = [os.urandom(20), [[dht_key(cid_of_raw(v)), v] for v in items]]
        return encode_request(os.urandom(20), name, args)  # the fast-path layout
    return b"\x00" + os.urandom(20) + umsgpack.packb([name, args])


@st.composite
def cut_batches(draw: st.DrawFn) -> bytes:
    """A well-formed STORE_BATCH (the hand-written fast path) cut anywhere."""
    # short values keep the datagram short, so cuts often land inside the framing
    items = draw(st.lists(st.one_of(st.binary(max_size=4), st.binary(min_size=256,
                                                                        max_size=260)),
                          min_size=1, max_size=3))
    ids = st.binary(min_size=20, max_size=20)  # drawn, not random: the cuts depend on them
    data = encode_request(draw(ids), "store_batch",
                          [draw(ids), [[dht_key(cid_of_raw(v)), v] for v in items]])
    # cut anywhere, or (more often) just after a bin header, where the layout is delicate
    near_headers = [i + d for i, byte in enumerate(data) if byte in (0xC4, 0xC5)
                    for d in range(1, 4) if i + d <= len(data)]
    cuts = st.integers(0, len(data))
    if near_headers:
        cuts = st.one_of(cuts, st.sampled_from(near_headers))
    return data[: draw(cuts)]


datagrams = st.one_of(
    st.binary(max_size=600),
    requests(),
    requests().flatmap(mutated),
    cut_batches(),
    st.builds(lambda body: b"\x01" + os.urandom(20) + umsgpack.packb(body), msgpack_values),
)


def _decode(data: bytes) -> object:
    try:
        return decode_datagram(data)
    except MalformedDatagram:
        return None


@FUZZ
@given(datagrams)
def test_decode_datagram(data: bytes) -> None:
    message = _decode(data)
    if isinstance(message, Request):
        assert message.name in RPCS


@FUZZ
@given(msgpack_values, st.integers(0, 5))
def test_answer_parsers(data: object, count: int) -> None:
    for parse in (parse_find_node, parse_find_value, parse_ping,
                  lambda d: parse_store_batch(d, count)):
        with contextlib.suppress(MalformedDatagram):
            parse(data)


class _LiveNode:
    """A DhtNode on its own loop in a thread, and a blocking socket to hit it with."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        config = DhtConfig(rpc_timeout=0.5, maintenance_interval=3600)
        self.node: DhtNode = self._run(DhtNode.start(Identity.generate(), config=config,
                                                     db_path=root / "fuzz.db"))
        self._run(self.node.put_many([b"\x41" + os.urandom(100) for _ in range(5)]))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(2.0)
        self.node_id = os.urandom(20)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def sync(self) -> None:
        """PING and wait for the answer, answering the node's own PINGs meanwhile (so our
        address is validated and our requests reach the handlers). UDP may lose a datagram
        on a loaded machine: three tries of 2 s."""
        for attempt in range(3):
            try:
                self._ping_once()
                return
            except TimeoutError:
                if attempt == 2:
                    raise

    def _ping_once(self) -> None:
        msg_id = os.urandom(20)
        self.sock.sendto(encode_request(msg_id, "ping", [self.node_id]), self.node.address)
        while True:
            data, addr = self.sock.recvfrom(65536)
            if data[:1] == b"\x01" and data[1:21] == msg_id:
                return
            if data[:1] == b"\x00" and len(data) > 21:
                try:
                    name = umsgpack.unpackb(data[21:])[0]
                except Exception:
                    continue
                if name == "ping":
                    self.sock.sendto(b"\x01" + data[1:21] + umsgpack.packb(self.node_id),
                                     addr)

    def close(self) -> None:
        self.sock.close()
        self._run(self.node.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_LiveNode]:
    node = _LiveNode(tmp_path_factory.mktemp("fuzz-dht"))
    node.sync()
    try:
        yield node
    finally:
        node.close()


@FUZZ
@given(st.lists(datagrams, min_size=1, max_size=5))
def test_a_live_node_survives_any_datagrams(live: _LiveNode, batch: list[bytes]) -> None:
    for data in batch:
        live.sock.sendto(data[:9000], live.node.address)
    live.sync()  # still answers, after having handled all of them
    assert live.node.stats.handler_errors == 0
