"""The RPCs a node sends: requests out, answers matched to them, timeouts, checked answers.

:class:`RpcClient` sends every RPC of :class:`dht.protocol.PulsarProtocol` as an explicit
method (no ``__getattr__`` magic turning a typo into a network call) and keeps the table of
outstanding ones. An answer must come from the address asked; it proves that address
(:meth:`dht.rpc_server.RpcServer.answered`), and is checked against the shape the caller
expects before the package's crawlers see it. A timeout is a miss of the address
(:mod:`dht.liveness`) unless the RPC is one stock nodes ignore and the address never
answered one: STORE_BATCH, FIND_NEAR, FIND_VALUE_NEAR and HOLDS are ours, and an address
that lets one of the last three time out is asked the stock RPC instead for a while.
Cancelling a caller never trips an ``InvalidStateError`` in the response or timeout path.

It is apart from :mod:`dht.protocol` because it is the asking half of the endpoint, with
state of its own (outstanding RPCs, and which addresses speak our RPCs): the protocol hands
it the answers it receives, and keeps the public names (``ping``, ``call_find_node``, ...)
the package's crawlers and ours call.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kademlia.node import Node

from .liveness import MAX_SILENT, ContactLiveness
from .protocol_view import ProtocolView, RpcResult
from .routing_table import node_address
from .rpc_server import RpcServer
from .wire import (
    MSG_ID_SIZE,
    FoundValue,
    MalformedDatagram,
    Response,
    encode_request,
    parse_find_node,
    parse_find_value,
    parse_holds,
    parse_store,
)

__all__ = ["RpcClient"]

Address = tuple[str, int]

_NOT_NEAR_FOR = 600.0
"""Seconds an address that ignored a FIND_NEAR (FIND_VALUE_NEAR) is asked FIND_NODE
(FIND_VALUE) instead."""
_COUNTED = frozenset({"find_near", "find_value_near", "holds"})
"""Our RPCs that stock nodes ignore (the lookups that name how many contacts to answer
with, and HOLDS): a timeout from an address that never answered one is no evidence
against it, and it is not asked again for ``_NOT_NEAR_FOR`` seconds."""


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[RpcResult]
    timer: asyncio.TimerHandle
    address: Address
    name: str
    sent_at: float


class RpcClient:
    """Sends the RPCs of one protocol. Built by :class:`dht.protocol.PulsarProtocol`, whose
    socket and stats it uses; ``drop`` counts and logs a datagram dropped as a bad answer."""

    def __init__(self, protocol: ProtocolView, server: RpcServer, liveness: ContactLiveness,
                 drop: Callable[[Address, str], None]) -> None:
        self._protocol = protocol
        self._server = server
        self._liveness = liveness
        self._drop = drop
        self._pending: dict[bytes, _Pending] = {}
        self._batching: set[Address] = set()  # addresses that have answered a STORE_BATCH
        # addresses that have answered a FIND_NEAR / FIND_VALUE_NEAR, by RPC
        self._near: dict[str, set[Address]] = {name: set() for name in _COUNTED}
        # addresses that let one time out without ever answering one, until when they get
        # the stock RPC instead (a stock node, an older one of ours, or one that was down)
        self._not_near: dict[str, OrderedDict[Address, float]] = {
            name: OrderedDict() for name in _COUNTED}

    # -- answers and timeouts ----------------------------------------------------------------

    def accept_response(self, response: Response, addr: Address) -> None:
        """An answer arrived from ``addr``: complete the RPC it answers, if any."""
        pending = self._pending.get(response.msg_id)
        if pending is None:
            self._drop(addr, "response to no request of ours (late, or forged)")
            return
        if (addr[0], addr[1]) != (pending.address[0], pending.address[1]):
            self._drop(addr, f"response for a request sent to {pending.address}")
            return
        del self._pending[response.msg_id]
        pending.timer.cancel()
        address = (addr[0], addr[1])
        self._liveness.heard(address)
        if pending.name == "store_batch" and len(self._batching) < MAX_SILENT:
            self._batching.add(address)
        elif pending.name in _COUNTED and len(self._near[pending.name]) < MAX_SILENT:
            self._near[pending.name].add(address)
        # It echoed our random message id from the address we asked: it receives there.
        data = response.data
        answered_id = (data if pending.name == "ping" and isinstance(data, bytes)
                       and len(data) == len(self._protocol.source_node.id) else None)
        held = self._server.answered(address, answered_id)
        if not pending.future.done():  # the caller may have given up (cancelled)
            pending.future.set_result((True, data))
        for request in held:
            self._server.accept(request, addr)

    def _expire(self, msg_id: bytes) -> None:
        pending = self._pending.pop(msg_id, None)
        if pending is None:
            return
        # A stock kademlia node ignores STORE_BATCH and FIND_NEAR (it does not know them):
        # its silence there says nothing about whether it is up, unless it has answered
        # one before.
        address = (pending.address[0], pending.address[1])
        if pending.name in _COUNTED and address not in self._near[pending.name]:
            ignored = self._not_near[pending.name]
            ignored[address] = time.monotonic() + _NOT_NEAR_FOR
            while len(ignored) > MAX_SILENT:
                ignored.popitem(last=False)
        evidence = ((pending.name != "store_batch" or address in self._batching)
                    and (pending.name not in _COUNTED or address in self._near[pending.name]))
        if evidence:
            self._liveness.missed(address, pending.sent_at)
        if not pending.future.done():
            pending.future.set_result((False, None))

    def close(self) -> None:
        """Answer every outstanding RPC with "no answer"."""
        for pending in self._pending.values():
            pending.timer.cancel()
            if not pending.future.done():
                pending.future.set_result((False, None))
        self._pending.clear()

    def _request(self, address: Address, name: str, args: Sequence[object]
                 ) -> asyncio.Future[RpcResult]:
        protocol = self._protocol
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RpcResult] = loop.create_future()
        if protocol.closed or protocol.transport is None:
            future.set_result((False, None))
            return future
        if name != "ping" and self._liveness.skips(address):
            protocol.stats.rpcs_skipped += 1
            future.set_result((False, None))
            return future
        msg_id = os.urandom(MSG_ID_SIZE)
        datagram = encode_request(msg_id, name, args)  # ValueError if over the RPC limit
        timer = loop.call_later(protocol.config.rpc_timeout, self._expire, msg_id)
        self._pending[msg_id] = _Pending(future, timer, address, name, time.monotonic())
        protocol.transport.sendto(datagram, address)
        protocol.stats.count_sent(name, len(datagram))
        return future

    # -- outgoing RPCs (names as on the wire) --------------------------------------------

    def ping(self, address: Address, node_id: bytes) -> asyncio.Future[RpcResult]:
        return self._request(address, "ping", (node_id,))

    def store(self, address: Address, node_id: bytes, key: bytes, value: bytes
              ) -> asyncio.Future[RpcResult]:
        return self._request(address, "store", (node_id, key, value))

    def store_batch(self, address: Address, node_id: bytes,
                    items: Sequence[tuple[bytes, bytes]]) -> asyncio.Future[RpcResult]:
        return self._request(address, "store_batch", (node_id, [list(i) for i in items]))

    def find_node(self, address: Address, node_id: bytes, key: bytes
                  ) -> asyncio.Future[RpcResult]:
        return self._request(address, "find_node", (node_id, key))

    def find_near(self, address: Address, node_id: bytes, key: bytes, count: int
                  ) -> asyncio.Future[RpcResult]:
        return self._request(address, "find_near", (node_id, key, count))

    def find_value(self, address: Address, node_id: bytes, key: bytes
                   ) -> asyncio.Future[RpcResult]:
        return self._request(address, "find_value", (node_id, key))

    def find_value_near(self, address: Address, node_id: bytes, key: bytes, count: int
                        ) -> asyncio.Future[RpcResult]:
        return self._request(address, "find_value_near", (node_id, key, count))

    # -- calls with checked answers (used by the package's crawlers and by ours) --------

    async def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> RpcResult:
        protocol = self._protocol
        ok, data = await self.find_node(node_address(node_to_ask), protocol.source_node.id,
                                        node_to_find.id)
        if ok:
            try:
                data = parse_find_node(data)
            except MalformedDatagram as exc:
                self._drop(node_address(node_to_ask), f"FIND_NODE answer: {exc}")
                ok, data = False, None
        return protocol.handle_call_response((ok, data), node_to_ask)

    async def call_find_near(self, node_to_ask: Node, node_to_find: Node, count: int
                             ) -> RpcResult:
        """FIND_NODE answered with only the ``count`` closest contacts (a put needs the r
        closest, not k: answers of k = 20 contacts were most of the DHT's bytes). Only
        ours know FIND_NEAR: an address that lets one time out without ever having
        answered one is asked FIND_NODE at once, and for the next ``_NOT_NEAR_FOR``
        seconds only FIND_NODE (one timeout is the price of a stock node; a timeout of
        FIND_NEAR alone never marks a node silent or drops it)."""
        protocol = self._protocol
        address = node_address(node_to_ask)
        if not self._may_count(address, "find_near"):
            return await self.call_find_node(node_to_ask, node_to_find)
        ok, data = await self.find_near(address, protocol.source_node.id, node_to_find.id,
                                        count)
        if not ok and (address[0], address[1]) not in self._near["find_near"]:
            # Never answered one: a stock node (or an older one of ours) ignores FIND_NEAR;
            # ask FIND_NODE before concluding anything about it.
            return await self.call_find_node(node_to_ask, node_to_find)
        if ok:
            try:
                data = parse_find_node(data)
            except MalformedDatagram as exc:
                self._drop(address, f"FIND_NEAR answer: {exc}")
                ok, data = False, None
        return protocol.handle_call_response((ok, data), node_to_ask)

    def _may_count(self, address: Address, name: str) -> bool:
        """Whether to send ``name`` (one of ``_COUNTED``) to ``address``: not while it is
        remembered as ignoring it."""
        ignored = self._not_near[name]
        until = ignored.get((address[0], address[1]))
        if until is None:
            return True
        if until > time.monotonic():
            return False
        del ignored[(address[0], address[1])]
        return True

    async def call_find_value(self, node_to_ask: Node, node_to_find: Node,
                              count: int | None = None) -> RpcResult:
        """FIND_VALUE; with ``count``, FIND_VALUE_NEAR: a miss is answered with only the
        ``count`` closest contacts (a value lives at the r closest nodes of its key, so a
        walk needs no more, and answers of k = 20 contacts were most of its bytes). Stock
        nodes are handled as for FIND_NEAR (:meth:`call_find_near`)."""
        protocol = self._protocol
        address = node_address(node_to_ask)
        if count is None or not self._may_count(address, "find_value_near"):
            ok, data = await self.find_value(address, protocol.source_node.id, node_to_find.id)
        else:
            ok, data = await self.find_value_near(address, protocol.source_node.id,
                                                  node_to_find.id, count)
            if not ok and (address[0], address[1]) not in self._near["find_value_near"]:
                return await self.call_find_value(node_to_ask, node_to_find)
        if ok:
            try:
                parsed = parse_find_value(data)
            except MalformedDatagram as exc:
                self._drop(node_address(node_to_ask), f"FIND_VALUE answer: {exc}")
                ok, data = False, None
            else:
                # keep the package's shapes, which its ValueSpiderCrawl understands
                data = {"value": parsed.value} if isinstance(parsed, FoundValue) else parsed
        return protocol.handle_call_response((ok, data), node_to_ask)

    async def call_holds(self, node_to_ask: Node, keys: Sequence[bytes]) -> list[bool] | None:
        """Which of ``keys`` (at most ``MAX_HOLDS_KEYS``) ``node_to_ask`` holds; None when it
        does not answer, or is remembered as not speaking HOLDS (a stock node ignores it:
        such a timeout marks nobody silent, see ``_COUNTED``)."""
        protocol = self._protocol
        address = node_address(node_to_ask)
        if not self._may_count(address, "holds"):
            return None
        ok, data = await self._request(address, "holds", (protocol.source_node.id, list(keys)))
        if not ok:
            if (address[0], address[1]) in self._near["holds"]:
                protocol.handle_call_response((False, None), node_to_ask)
            return None
        try:
            flags = parse_holds(data, len(keys))
        except MalformedDatagram as exc:
            self._drop(address, f"HOLDS answer: {exc}")
            return None
        protocol.handle_call_response((True, data), node_to_ask)
        return flags

    async def call_ping(self, node_to_ask: Node) -> RpcResult:
        protocol = self._protocol
        ok, data = await self.ping(node_address(node_to_ask), protocol.source_node.id)
        if ok and data != node_to_ask.id:
            # Whoever answers there is not the node we know under that address any more.
            ok, data = False, None
        return protocol.handle_call_response((ok, data), node_to_ask)

    async def call_store(self, node_to_ask: Node, key: bytes, value: bytes) -> RpcResult:
        protocol = self._protocol
        ok, data = await self.store(node_address(node_to_ask), protocol.source_node.id, key,
                                    value)
        return protocol.handle_call_response((ok, ok and parse_store(data)), node_to_ask)
