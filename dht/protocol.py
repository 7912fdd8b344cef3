"""The Kademlia RPC protocol, hardened: ``kademlia.protocol.KademliaProtocol`` with our own
datagram handling, verified STOREs, a batched STORE and exact neighbour answers.

What changes against the package, and why:

* **Datagrams** are decoded by :mod:`dht.wire` synchronously in ``datagram_received``:
  malformed, oversized, unknown-RPC and stray datagrams are counted, logged (throttled) and
  dropped. ``rpcudp`` instead spawns two tasks per datagram and lets a bad one raise inside
  them. Handlers are synchronous (SQLite is local), so a request is answered without creating
  any task at all; a STORE is answered from a callback once its group commit is done.
* **Address validation** (:mod:`dht.address_check`): a request from an address that has not
  answered one of our RPCs is held (only PING, whose answer is smaller than the request, is
  answered at once) and one validation PING goes there; the held requests are
  served when it answers. Contacts join the routing table only from proven addresses, and
  from requests only under the node id the address itself answered with, so neither
  answers nor hand-offs can be aimed at a forged source.
* **STORE** accepts a value only if it hashes to the key (:mod:`dht.storage`), within a per
  sender and a global rate limit (values and bytes) and the byte quotas of
  :mod:`dht.quota` (per source, and in total). Refusals are answered False and counted.
  **STORE_BATCH** (ours; stock nodes ignore it) carries several small blocks in one
  datagram, which is what makes pipelined puts cheap.
* **FIND_NODE** answers with the exact k closest contacts by XOR distance, not the package's
  bucket-walk approximation.
* **Outgoing RPCs** are explicit methods (no ``__getattr__`` magic turning a typo into a
  network call); answers must come from the address asked, and are checked against the shape
  the caller expects before the package's crawlers see them. Cancelling a caller never trips
  an ``InvalidStateError`` in the response or timeout path.
* **Background work** (pings of full buckets, cache stores) runs in tracked tasks that
  :meth:`PulsarProtocol.close` cancels, so a stopped node leaves nothing behind.
* **New contacts** are reported through ``on_new_contact`` (the record handoff lives in
  :mod:`dht.maintenance`); the package's version of that handoff scans all storage inline,
  and computes distances to ``sha1(key)`` instead of the key.
* **Contacts are not dropped at their first silence.** The package removed a contact as
  soon as one RPC to it went unanswered, so on a lossy link (3 % of datagrams lost) a
  node shed its contacts one lost datagram at a time, and a partition of a few seconds
  emptied its table for good (nothing ever refilled it). Here an unanswered RPC is a
  *miss* of the address; the contact is PINGed at once, and again after each miss, and
  only ``contact_failures`` misses in a row make it *stale* (any answer starts the count
  again). A stale contact is asked nothing but PINGs and handed to nobody; it is removed
  unless the table holds no more than ``keep_contacts`` contacts, in which case it stays,
  PINGed with backoff, until it answers or a live contact replaces it (Kademlia, section
  4.1). Removed contacts are remembered (:class:`dht.addresses.AddressMemory`) for
  :class:`dht.reconnect.Reconnector` to try again when the table runs thin.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kademlia.node import Node
from kademlia.protocol import KademliaProtocol
from kademlia.routing import RoutingTable

from .address_check import AddressCheck, Verdict
from .addresses import AddressMemory
from .config import DhtConfig
from .peers import Contact, PeerBook, closest
from .quota import Refusal, StoreQuota
from .ratelimit import KeyedLimiter, LogThrottle
from .stats import DhtStats
from .storage import RecordStorage
from .wire import (
    MSG_ID_SIZE,
    FoundValue,
    MalformedDatagram,
    Request,
    Response,
    decode_datagram,
    encode_request,
    encode_response,
    holds_bitmap,
    parse_find_node,
    parse_find_value,
    parse_holds,
    parse_store,
)

__all__ = ["PulsarProtocol", "RpcResult"]

log = logging.getLogger(__name__)

RpcResult = tuple[bool, Any]
"""``(answered, data)`` as ``rpcudp`` reports it: ``(False, None)`` on timeout."""

Address = tuple[str, int]

_MAX_SILENT = 10_000
"""Quarantined addresses remembered at most (a flood of dead contacts stays bounded)."""
_NOT_NEAR_FOR = 600.0
"""Seconds an address that ignored a FIND_NEAR (FIND_VALUE_NEAR) is asked FIND_NODE
(FIND_VALUE) instead."""
_COUNTED = frozenset({"find_near", "find_value_near", "holds"})
"""Our RPCs that stock nodes ignore (the lookups that name how many contacts to answer
with, and HOLDS): a timeout from an address that never answered one is no evidence
against it, and it is not asked again for ``_NOT_NEAR_FOR`` seconds."""
_DEPARTED_MEMORY = 10_000
"""Contacts remembered as recently gone (to recognise a restart), at most."""

_PROBE_FIRST_WAIT = 1.0
"""Seconds before the first backoff PING of a stale contact kept as one of the last (then
doubling up to ``reconnect_interval``)."""

_UNVALIDATED_OK = frozenset({"ping"})
"""Requests answered before the sender's address is proven: a PING's answer (43 bytes) is smaller
than the PING (50), so it amplifies nothing. (STUN, whose answer is the sender's address,
waits like the others.)"""


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[RpcResult]
    timer: asyncio.TimerHandle
    address: Address
    name: str
    sent_at: float


@dataclass(slots=True)
class _Misses:
    """Unanswered RPCs in a row to one address, and when the last one was counted."""

    count: int
    last: float


@dataclass(frozen=True, slots=True)
class _StoreReply:
    """A STORE answered after the group commit (see ``RecordStorage.submit``)."""

    flags: asyncio.Future[list[bool]]
    single: bool


class _RoutingTable(RoutingTable):  # type: ignore[misc]  # kademlia is untyped
    """The package's table, but the ping of a full bucket's oldest contact runs in a task the
    protocol tracks (the package fires and forgets it)."""

    protocol: PulsarProtocol

    def add_contact(self, node: Node) -> None:
        index = self.get_bucket_for(node)
        bucket = self.buckets[index]
        if bucket.add_node(node):
            return
        # Section 4.2: split if the bucket holds our own id or its depth is not 0 mod 5.
        if bucket.has_in_range(self.node) or bucket.depth() % 5 != 0:
            self.split_bucket(index)
            self.add_contact(node)
        else:
            self.protocol.spawn(self.protocol.call_ping(bucket.head()))

    def contacts(self) -> Iterator[Node]:
        for bucket in self.buckets:
            yield from bucket.nodes.values()

    def size(self) -> int:
        return sum(len(bucket.nodes) for bucket in self.buckets)

    def known_at(self, node: Node) -> Node | None:
        """The contact with ``node``'s id, if the table holds it (at any address)."""
        known: Node | None = self.buckets[self.get_bucket_for(node)].nodes.get(node.id)
        return known


class PulsarProtocol(KademliaProtocol):  # type: ignore[misc]  # kademlia is untyped
    """One node's UDP endpoint. Built by :class:`dht.server.PulsarServer`."""

    storage: RecordStorage
    router: _RoutingTable

    def __init__(self, source_node: Node, storage: RecordStorage, config: DhtConfig,
                 book: PeerBook, stats: DhtStats) -> None:
        super().__init__(source_node, storage, config.ksize)
        self.router = _RoutingTable(self, config.ksize, source_node)
        self.config = config
        self.book = book
        self.stats = stats
        self.on_new_contact: Callable[[Node], None] | None = None
        self.on_over_quota: Callable[[bytes, Address], None] | None = None
        """Told ``(node id, address)`` when a source that is not a proven peer used up its
        byte quota (``DhtNode`` then asks the transport to prove who it is)."""
        self._pending: dict[bytes, _Pending] = {}
        self._silent: dict[Address, float] = {}  # address -> monotonic end of quarantine
        self._departed: OrderedDict[bytes, float] = OrderedDict()  # id -> when removed
        self._batching: set[Address] = set()  # addresses that have answered a STORE_BATCH
        # addresses that have answered a FIND_NEAR / FIND_VALUE_NEAR, by RPC
        self._near: dict[str, set[Address]] = {name: set() for name in _COUNTED}
        # addresses that let one time out without ever answering one, until when they get
        # the stock RPC instead (a stock node, an older one of ours, or one that was down)
        self._not_near: dict[str, OrderedDict[Address, float]] = {
            name: OrderedDict() for name in _COUNTED}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        # consecutive unanswered RPCs per address (see ``_count_miss``)
        self._misses: OrderedDict[Address, _Misses] = OrderedDict()
        # stale contacts still in the table: address -> node id, and their ids
        self._stale: dict[Address, bytes] = {}
        self._stale_ids: set[bytes] = set()
        self._probing: set[bytes] = set()  # node ids with a probe running (``_probe``)
        self.memory = AddressMemory(first_retry=_PROBE_FIRST_WAIT)
        """Addresses of contacts seen and dropped, seeds and offered addresses."""
        self._limiter = KeyedLimiter(config.store_rate, config.store_burst,
                                     config.global_store_rate, config.global_store_burst)
        self._byte_limiter = KeyedLimiter(config.store_byte_rate, config.store_byte_burst,
                                          config.global_store_byte_rate,
                                          config.global_store_byte_burst)
        self._check: AddressCheck[Request] = AddressCheck(
            proof_ttl=config.address_proof_ttl, retry_after=config.address_retry_after)
        self._quota = StoreQuota(source_quota=config.source_store_quota,
                                 peer_quota=config.peer_store_quota,
                                 window=config.store_quota_window, max_bytes=config.max_bytes,
                                 measure=storage.stored_bytes)
        self._throttle = LogThrottle(log)
        self._handlers: dict[str, Callable[..., object]] = {
            "ping": self.rpc_ping,
            "stun": self.rpc_stun,
            "store": self.rpc_store,
            "store_batch": self.rpc_store_batch,
            "find_node": self.rpc_find_node,
            "find_near": self.rpc_find_near,
            "find_value": self.rpc_find_value,
            "find_value_near": self.rpc_find_value_near,
            "holds": self.rpc_holds,
        }

    def __getattr__(self, name: str) -> Any:
        # rpcudp turns every unknown attribute into a remote call; we name our RPCs instead.
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- transport ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                with contextlib.suppress(OSError):  # the kernel may refuse; defaults work
                    sock.setsockopt(socket.SOL_SOCKET, option, self.config.socket_buffer)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (e.g. port unreachable) on an unconnected socket: nothing to do, the
        # RPC they belong to will time out.
        log.debug("UDP error: %s", exc)

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.stats.bytes_received += len(data)
        if self._silent:
            self._silent.pop((addr[0], addr[1]), None)
        try:
            message = decode_datagram(data)
        except MalformedDatagram as exc:
            self._drop(addr, str(exc))
            return
        if isinstance(message, Response):
            self._accept_response(message, addr)
        elif message.name in _UNVALIDATED_OK:
            self._accept_request(message, addr)
        else:
            self._accept_checked(message, addr, len(data))

    def _accept_checked(self, request: Request, addr: Address, size: int) -> None:
        """Serve ``request`` if ``addr`` is proven; hold it and validate the address if not."""
        now = time.monotonic()
        address = (addr[0], addr[1])
        if self._check.is_proven(address, now):
            self._accept_request(request, addr)
            return
        verdict = self._check.hold(address, request, size, now)
        if verdict is Verdict.DROPPED:
            self.stats.requests_unvalidated_dropped += 1
            return
        self.stats.requests_held += 1
        if verdict is Verdict.VALIDATE:
            self._validate(address)

    def _validate(self, address: Address) -> None:
        """Send the validation PING to ``address``; its answer proves the address (see
        ``_accept_response``) and brings in the node id it answers with."""
        self.stats.validations_sent += 1
        answer = self.ping(address, self.source_node.id)
        answer.add_done_callback(lambda done: self._validated(address, done))

    def _validated(self, address: Address, done: asyncio.Future[RpcResult]) -> None:
        ok, data = (False, None) if done.cancelled() else done.result()
        if not ok:
            self.stats.validations_failed += 1
            self.stats.requests_unvalidated_dropped += self._check.failed(address,
                                                                          time.monotonic())
            return
        if isinstance(data, bytes) and len(data) == len(self.source_node.id):
            self.welcome_if_new(Node(data, address[0], address[1]))

    def note_local_bytes(self, size: int) -> None:
        """This node stored ``size`` bytes of its own records (they count toward
        ``max_bytes``, and are never refused)."""
        self._quota.added_locally(size)

    def note_proven(self, address: Address, node_id: bytes) -> None:
        """Another channel (the transport's handshake) proved ``node_id`` at ``address``."""
        for request in self._check.prove((address[0], address[1]), time.monotonic(), node_id):
            self._accept_request(request, address)

    def _drop(self, addr: Address, reason: str) -> None:
        self.stats.datagrams_dropped += 1
        self._throttle.log(logging.WARNING, "drop", time.monotonic(),
                           "dropped a datagram from %s: %s", addr, reason)

    def _accept_request(self, request: Request, addr: Address) -> None:
        try:
            result = self._handlers[request.name](addr, *request.args)
        except Exception:
            self.stats.handler_errors += 1
            log.exception("RPC %s from %s failed", request.name, addr)
            return
        if isinstance(result, _StoreReply):
            result.flags.add_done_callback(
                lambda done: self._answer_store(request, addr, done, result.single))
        else:
            self._answer(request, addr, result)

    def _answer(self, request: Request, addr: Address, result: object) -> None:
        if self._closed or self.transport is None:
            return
        try:
            datagram = encode_response(request.msg_id, result)
            self.transport.sendto(datagram, addr)
            self.stats.count_sent(request.name + "+answer", len(datagram))
        except Exception:  # pragma: no cover - an unpackable result would be our bug
            self.stats.handler_errors += 1
            log.exception("could not answer RPC %s from %s", request.name, addr)

    def _answer_store(self, request: Request, addr: Address,
                      done: asyncio.Future[list[bool]], single: bool) -> None:
        flags = [False] if done.cancelled() else done.result()
        accepted = sum(flags)
        self.stats.stores_accepted += accepted
        if accepted < len(flags):
            self._throttle.log(logging.WARNING, "refused", time.monotonic(),
                               "refused %d of %d values stored by %s (not matching their "
                               "key, over quota, or not committed)",
                               len(flags) - accepted, len(flags), addr)
        self._answer(request, addr, flags[0] if single else flags)

    def _accept_response(self, response: Response, addr: Address) -> None:
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
        self._heard(address)
        if pending.name == "store_batch" and len(self._batching) < _MAX_SILENT:
            self._batching.add(address)
        elif pending.name in _COUNTED and len(self._near[pending.name]) < _MAX_SILENT:
            self._near[pending.name].add(address)
        # It echoed our random message id from the address we asked: it receives there.
        data = response.data
        answered_id = (data if pending.name == "ping" and isinstance(data, bytes)
                       and len(data) == len(self.source_node.id) else None)
        held = self._check.prove(address, time.monotonic(), answered_id)
        if not pending.future.done():  # the caller may have given up (cancelled)
            pending.future.set_result((True, data))
        for request in held:
            self._accept_request(request, addr)

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
            while len(ignored) > _MAX_SILENT:
                ignored.popitem(last=False)
        evidence = ((pending.name != "store_batch" or address in self._batching)
                    and (pending.name not in _COUNTED or address in self._near[pending.name]))
        if evidence:
            self._count_miss(address, pending.sent_at)
        if self.config.silent_for > 0 and evidence:
            now = time.monotonic()
            if len(self._silent) >= _MAX_SILENT:
                self._silent = {a: t for a, t in self._silent.items() if t > now}
            if len(self._silent) < _MAX_SILENT:
                self._silent[address] = now + self.config.silent_for
        if not pending.future.done():
            pending.future.set_result((False, None))

    def _is_silent(self, address: Address) -> bool:
        until = self._silent.get((address[0], address[1]))
        if until is None:
            return False
        if until <= time.monotonic():
            del self._silent[(address[0], address[1])]
            return False
        return True

    def _request(self, address: Address, name: str, args: Sequence[object]
                 ) -> asyncio.Future[RpcResult]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RpcResult] = loop.create_future()
        if self._closed or self.transport is None:
            future.set_result((False, None))
            return future
        if name != "ping" and (
            (self._silent and self._is_silent(address))
            or (self._stale and (address[0], address[1]) in self._stale)
        ):
            self.stats.rpcs_skipped += 1
            future.set_result((False, None))
            return future
        msg_id = os.urandom(MSG_ID_SIZE)
        datagram = encode_request(msg_id, name, args)  # ValueError if over the RPC limit
        timer = loop.call_later(self.config.rpc_timeout, self._expire, msg_id)
        self._pending[msg_id] = _Pending(future, timer, address, name, time.monotonic())
        self.transport.sendto(datagram, address)
        self.stats.count_sent(name, len(datagram))
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
        ok, data = await self.find_node(_address(node_to_ask), self.source_node.id,
                                        node_to_find.id)
        if ok:
            try:
                data = parse_find_node(data)
            except MalformedDatagram as exc:
                self._drop(_address(node_to_ask), f"FIND_NODE answer: {exc}")
                ok, data = False, None
        return self.handle_call_response((ok, data), node_to_ask)

    async def call_find_near(self, node_to_ask: Node, node_to_find: Node, count: int
                             ) -> RpcResult:
        """FIND_NODE answered with only the ``count`` closest contacts (a put needs the r
        closest, not k: answers of k = 20 contacts were most of the DHT's bytes). Only
        ours know FIND_NEAR: an address that lets one time out without ever having
        answered one is asked FIND_NODE at once, and for the next ``_NOT_NEAR_FOR``
        seconds only FIND_NODE (one timeout is the price of a stock node; a timeout of
        FIND_NEAR alone never marks a node silent or drops it)."""
        address = _address(node_to_ask)
        if not self._may_count(address, "find_near"):
            return await self.call_find_node(node_to_ask, node_to_find)
        ok, data = await self.find_near(address, self.source_node.id, node_to_find.id, count)
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
        return self.handle_call_response((ok, data), node_to_ask)

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
        address = _address(node_to_ask)
        if count is None or not self._may_count(address, "find_value_near"):
            ok, data = await self.find_value(address, self.source_node.id, node_to_find.id)
        else:
            ok, data = await self.find_value_near(address, self.source_node.id,
                                                  node_to_find.id, count)
            if not ok and (address[0], address[1]) not in self._near["find_value_near"]:
                return await self.call_find_value(node_to_ask, node_to_find)
        if ok:
            try:
                parsed = parse_find_value(data)
            except MalformedDatagram as exc:
                self._drop(_address(node_to_ask), f"FIND_VALUE answer: {exc}")
                ok, data = False, None
            else:
                # keep the package's shapes, which its ValueSpiderCrawl understands
                data = {"value": parsed.value} if isinstance(parsed, FoundValue) else parsed
        return self.handle_call_response((ok, data), node_to_ask)

    async def call_holds(self, node_to_ask: Node, keys: Sequence[bytes]) -> list[bool] | None:
        """Which of ``keys`` (at most ``MAX_HOLDS_KEYS``) ``node_to_ask`` holds; None when it
        does not answer, or is remembered as not speaking HOLDS (a stock node ignores it:
        such a timeout marks nobody silent, see ``_COUNTED``)."""
        address = _address(node_to_ask)
        if not self._may_count(address, "holds"):
            return None
        ok, data = await self._request(address, "holds", (self.source_node.id, list(keys)))
        if not ok:
            if (address[0], address[1]) in self._near["holds"]:
                self.handle_call_response((False, None), node_to_ask)
            return None
        try:
            flags = parse_holds(data, len(keys))
        except MalformedDatagram as exc:
            self._drop(address, f"HOLDS answer: {exc}")
            return None
        self.handle_call_response((True, data), node_to_ask)
        return flags

    async def call_ping(self, node_to_ask: Node) -> RpcResult:
        ok, data = await self.ping(_address(node_to_ask), self.source_node.id)
        if ok and data != node_to_ask.id:
            # Whoever answers there is not the node we know under that address any more.
            ok, data = False, None
        return self.handle_call_response((ok, data), node_to_ask)

    async def call_store(self, node_to_ask: Node, key: bytes, value: bytes) -> RpcResult:
        ok, data = await self.store(_address(node_to_ask), self.source_node.id, key, value)
        return self.handle_call_response((ok, ok and parse_store(data)), node_to_ask)

    def handle_call_response(self, result: RpcResult, node: Node) -> RpcResult:
        """An answer keeps a contact fresh; silence makes it suspect (unless we are the
        ones shutting down, which is no evidence against the peer): see ``_suspect``."""
        if result[0]:
            self.welcome_if_new(node)
        elif not self._closed:
            self._suspect(node)
        return result

    # -- contacts that stop answering ------------------------------------------------------

    def _count_miss(self, address: Address, sent_at: float) -> None:
        """An RPC sent to ``address`` at ``sent_at`` went unanswered. It counts as a new
        miss only if it was sent after the previous miss was counted: RPCs in flight
        together when a link goes down are one miss, not one each (a put to a node has
        several STOREs in flight; a partition would otherwise count five misses at once)."""
        now = time.monotonic()
        misses = self._misses.get(address)
        if misses is None:
            self._misses[address] = _Misses(1, now)
            while len(self._misses) > _MAX_SILENT:
                old, _ = self._misses.popitem(last=False)
                self._unmark_stale(old)
        elif sent_at >= misses.last:
            misses.count += 1
            misses.last = now
            self._misses.move_to_end(address)

    def miss_count(self, address: Address) -> int:
        """Unanswered RPCs in a row to ``address`` (0 once anything answered from there)."""
        misses = self._misses.get((address[0], address[1]))
        return 0 if misses is None else misses.count

    def _heard(self, address: Address) -> None:
        """``address`` answered (or a proven contact spoke from it): its misses, its
        quarantine and its staleness are over."""
        if self._misses:
            self._misses.pop(address, None)
        if self._silent:
            self._silent.pop(address, None)
        if self._stale and address in self._stale:
            self._unmark_stale(address)
            self.stats.contacts_revived += 1

    def _unmark_stale(self, address: Address) -> None:
        node_id = self._stale.pop(address, None)
        if node_id is not None:
            self._stale_ids.discard(node_id)

    def _suspect(self, node: Node) -> None:
        """An RPC to the contact ``node`` went unanswered (or was not sent: its address is
        quarantined or stale). One miss is no proof of death on a lossy link: the contact
        is PINGed (``_probe``) until it answers or has missed ``contact_failures`` times in
        a row; then it is stale, and removed unless it is one of the table's last
        ``keep_contacts``."""
        address = _address(node)
        known = self.router.known_at(node)
        if known is None or _address(known) != address:
            return  # not (or no longer) a contact at that address: a lookup's stranger
        if self.miss_count(address) == 0:
            return  # no evidence: a stock node ignoring our RPC, or heard from since
        if node.id not in self._probing and self.spawn(self._probe(known)) is not None:
            self._probing.add(node.id)

    async def _probe(self, node: Node) -> None:
        """PING a suspect contact until it answers or goes stale; a stale one kept as one
        of the table's last is PINGed on, with backoff (up to ``reconnect_interval``)."""
        address = _address(node)
        wait = _PROBE_FIRST_WAIT
        try:
            while self._still_suspect(node):
                if self.miss_count(address) >= self.config.contact_failures:
                    self._mark_stale(node)
                    if self._retire(node):
                        return
                    # Kept as one of the table's last: PING it on, with backoff.
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, self.config.reconnect_interval)
                    if not self._still_suspect(node):
                        return
                await self._ping_contact(node)
        finally:
            self._probing.discard(node.id)

    def _still_suspect(self, node: Node) -> bool:
        """Whether ``node`` is still a contact at its address that has missed RPCs."""
        if self._closed:
            return False
        known = self.router.known_at(node)
        return (known is not None and _address(known) == _address(node)
                and self.miss_count(_address(node)) > 0)

    async def _ping_contact(self, node: Node) -> None:
        address = _address(node)
        self.stats.contact_probes += 1
        ok, data = await self.ping(address, self.source_node.id)
        if not ok or self._closed:
            return  # a timeout counted one more miss (``_expire``)
        if data == node.id:
            self.welcome_if_new(node)
        elif isinstance(data, bytes) and len(data) == len(node.id):
            # Someone else answers there now: our contact is gone from that address, and
            # the one who answered (a live node, proven by this round trip) replaces it.
            self._remove_contact(node)
            self.welcome_if_new(Node(data, address[0], address[1]))

    def _mark_stale(self, node: Node) -> None:
        address = _address(node)
        if address not in self._stale:
            self.stats.contacts_stale += 1
            self._stale[address] = node.id
            self._stale_ids.add(node.id)

    def _retire(self, node: Node) -> bool:
        """Remove the stale contact ``node``, unless the table holds no more than
        ``keep_contacts`` contacts: then it is kept as a way back into the network (a node
        whose own link is down would otherwise void its table). Returns whether it is
        gone."""
        known = self.router.known_at(node)
        if known is None or _address(known) != _address(node):
            self._unmark_stale(_address(node))
            return True
        if self.router.size() <= self.config.keep_contacts:
            return False
        self._remove_contact(node)
        return True

    def _remove_contact(self, node: Node) -> None:
        now = time.monotonic()
        address = _address(node)
        self._throttle.log(logging.INFO, "silent", now,
                           "no response from %s (%d RPCs in a row), removing it from the "
                           "routing table", node, self.miss_count(address))
        self.router.remove_contact(node)
        self.stats.contacts_dropped += 1
        self._unmark_stale(address)
        self._note_departed(node.id, now)
        self.memory.dropped(address, node.id, now, self.config.reconnect_interval)

    def _note_departed(self, node_id: bytes, now: float) -> None:
        self._departed[node_id] = now
        self._departed.move_to_end(node_id)
        while len(self._departed) > _DEPARTED_MEMORY:
            self._departed.popitem(last=False)

    def _replace_stale(self) -> None:
        """A live contact arrived: stale contacts kept as the table's last may go now, as
        long as more than ``keep_contacts`` remain (a live one replaces a stale one)."""
        for address, node_id in list(self._stale.items()):
            if self.router.size() <= self.config.keep_contacts:
                return
            self._retire(Node(node_id, address[0], address[1]))

    def stale_count(self) -> int:
        """Stale contacts the routing table still holds."""
        return len(self._stale)

    # -- handlers -------------------------------------------------------------------------

    def welcome_if_new(self, node: Node) -> None:
        """Note a live contact: refresh its place in its bucket (the package only adds
        contacts it has never seen) and report it if new.

        A known id answering from a new address while its old address had stopped
        answering is a node that restarted elsewhere: it is reported as a return (its old
        entry counts as departed), as if it had been dropped before coming back."""
        if node.id == self.source_node.id:
            return  # someone claiming our id: never route to "ourselves"
        address = _address(node)
        self._heard(address)
        self.book.saw(node.id, node.ip, node.port, time.time())
        known = self.router.known_at(node)
        new = known is None
        if known is not None and _address(known) != address and self.miss_count(_address(known)):
            new = True
            self._unmark_stale(_address(known))
            self._note_departed(node.id, time.monotonic())
        self.router.add_contact(node)
        if new:
            self.memory.saw(address, node.id, time.monotonic())
            if self._stale:
                self._replace_stale()
        if new and self.on_new_contact is not None:
            if self._returning(node.id):
                self.stats.returns_without_handoff += 1
            else:
                self.on_new_contact(node)

    def _returning(self, node_id: bytes) -> bool:
        """Whether ``node_id`` is a contact that went silent less than a republish interval
        ago. Such a node restarted (a node's Kademlia id is its identity's, kept on disk
        with its record store), so it still holds what it held; a hand-off would resend
        every record it is close to (under churn that was the largest share of the DHT's
        bytes). What was stored while it was away is at the other replicas, which serve
        gets, and reaches it with the hourly republish. A node away for longer, or never
        seen, gets the hand-off as Kademlia prescribes."""
        gone_at = self._departed.pop(node_id, None)
        window = min(self.config.returning_window, self.config.republish_interval)
        return gone_at is not None and time.monotonic() - gone_at < window

    def _sender(self, sender: Address, node_id: bytes) -> Node:
        """The node a request comes from. It joins the routing table only if its address
        answered our PING with this very id (or it is there already at this address);
        otherwise a validation PING (at most one per address per ``address_retry_after``)
        finds out who answers there."""
        node = Node(node_id, sender[0], sender[1])
        address = (sender[0], sender[1])
        now = time.monotonic()
        if self._check.identity(address, now) == node_id or self._known_at(node, address):
            self.welcome_if_new(node)
        elif self._check.start(address, now):
            self._validate(address)
        return node

    def _known_at(self, node: Node, address: Address) -> bool:
        bucket = self.router.buckets[self.router.get_bucket_for(node)]
        known = bucket.nodes.get(node.id)
        return known is not None and (known.ip, known.port) == address

    def rpc_ping(self, sender: Address, node_id: bytes) -> bytes:
        self._sender(sender, node_id)
        return self.source_node.id  # type: ignore[no-any-return]  # kademlia is untyped

    def rpc_store(self, sender: Address, node_id: bytes, key: bytes, value: object
                  ) -> bool | _StoreReply:
        self._sender(sender, node_id)
        flags = self._store_items(sender, node_id, [(key, value)], single=True)
        return flags if isinstance(flags, _StoreReply) else flags[0]

    def rpc_store_batch(self, sender: Address, node_id: bytes,
                        items: list[tuple[bytes, object]]) -> list[bool] | _StoreReply:
        self._sender(sender, node_id)
        return self._store_items(sender, node_id, items, single=False)

    def _store_items(self, sender: Address, node_id: bytes, items: list[tuple[bytes, object]],
                     *, single: bool) -> list[bool] | _StoreReply:
        """Rate limits, then quotas, then the storage's own checks (verification, record
        count); refused values are answered False (a STORE with a bool, a STORE_BATCH with
        one flag per value, however many values it has)."""
        if not self._allow_stores(sender, items):
            return [False] * len(items)
        admitted = self._admit(sender, node_id, items)
        chosen = [item for item, ok in zip(items, admitted, strict=True) if ok]
        if not chosen:
            return [False] * len(items)
        committed = self.storage.submit(chosen)
        if len(chosen) == len(items):
            return _StoreReply(committed, single=single)
        merged: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()

        def merge(done: asyncio.Future[list[bool]]) -> None:
            flags = iter([False] * len(chosen) if done.cancelled() else done.result())
            if not merged.done():
                merged.set_result([ok and next(flags) for ok in admitted])

        committed.add_done_callback(merge)
        return _StoreReply(merged, single=single)

    def _allow_stores(self, sender: Address, items: list[tuple[bytes, object]]) -> bool:
        now = time.monotonic()
        address = (sender[0], sender[1])
        size = sum(len(v) for _, v in items if isinstance(v, bytes | bytearray))
        if (self._limiter.allow(address, len(items), now)
                and self._byte_limiter.allow(address, size, now)):
            return True
        self.stats.stores_rate_limited += len(items)
        self._throttle.log(logging.WARNING, "rate", now,
                           "refusing stores from %s: rate limit exceeded", sender)
        return False

    def _admit(self, sender: Address, node_id: bytes, items: list[tuple[bytes, object]]
               ) -> list[bool]:
        """Charge new keys to the sender's byte quota and the node's byte cap. Keys held
        already (a refresh) cost nothing; values that are not bytes are left to the
        storage to refuse; values that will fail verification are charged (to the sender's
        own budget, which is all they can waste)."""
        now = time.monotonic()
        address = (sender[0], sender[1])
        peer = self.book.proven_peer_id(node_id, address[0], address[1]) is not None
        flags: list[bool] = []
        asked = False
        for key, value in items:
            if not isinstance(value, bytes) or key in self.storage:
                flags.append(True)
                continue
            refusal = self._quota.admit(address, len(value), now, peer=peer)
            if refusal is Refusal.SOURCE:
                self.stats.stores_over_source_quota += 1
                if not peer and not asked and self.on_over_quota is not None:
                    self.on_over_quota(node_id, address)
                    asked = True
            elif refusal is Refusal.TOTAL:
                self.stats.stores_over_byte_cap += 1
            flags.append(refusal is None)
        if not all(flags):
            self._throttle.log(logging.WARNING, "quota", now,
                               "refusing stores from %s: over its byte quota or the node's "
                               "byte cap", sender)
        return flags

    def rpc_find_node(self, sender: Address, node_id: bytes, key: bytes
                      ) -> list[tuple[bytes, str, int]]:
        self._sender(sender, node_id)
        return [(c.node_id, c.host, c.port)
                for c in self.closest_contacts(key, self.router.ksize, exclude=node_id)]

    def rpc_find_near(self, sender: Address, node_id: bytes, key: bytes, count: int
                      ) -> list[tuple[bytes, str, int]]:
        self._sender(sender, node_id)
        return [(c.node_id, c.host, c.port) for c in
                self.closest_contacts(key, min(count, self.router.ksize), exclude=node_id)]

    def rpc_find_value(self, sender: Address, node_id: bytes, key: bytes) -> object:
        value = self._serve(key)
        if value is None:
            return self.rpc_find_node(sender, node_id, key)
        self._sender(sender, node_id)
        return {"value": value}

    def rpc_find_value_near(self, sender: Address, node_id: bytes, key: bytes, count: int
                            ) -> object:
        value = self._serve(key)
        if value is None:
            return self.rpc_find_near(sender, node_id, key, count)
        self._sender(sender, node_id)
        return {"value": value}

    def _serve(self, key: bytes) -> bytes | None:
        """The value a FIND_VALUE gets: a record held for the network, else one of the
        node's own blocks (``RecordStorage.local_block``): the events it delivered or
        published count as replicas it serves. The reader verifies either against the
        CID, so nothing new is trusted."""
        value = self.storage.get(key)
        if value is None:
            value = self.storage.local_block(key)
            if value is not None:
                self.stats.local_blocks_served += 1
        return value

    def rpc_holds(self, sender: Address, node_id: bytes, keys: list[bytes]) -> bytes:
        """Which of ``keys`` this node holds as records (which it keeps and republishes;
        its own blocks, served all the same, do not count), as a bitmap: how a node
        auditing its own blocks learns whether their closest nodes hold them without
        fetching the values (``Maintainer.audit``)."""
        self._sender(sender, node_id)
        held = self.storage.holds_many(keys)
        return holds_bitmap([key in held for key in keys])

    # -- local queries --------------------------------------------------------------------

    def closest_contacts(self, key: bytes, k: int, *, exclude: bytes | None = None
                         ) -> list[Contact]:
        """The ``k`` known contacts nearest ``key`` (exact XOR order), never ourselves."""
        stale = self._stale_ids
        contacts = (
            self.book.contact(n.id, n.ip, n.port)
            for n in self.router.contacts()
            if n.id != exclude and n.id != self.source_node.id and n.id not in stale
        )
        return closest(key, contacts, k)

    def closest_nodes(self, key: bytes, k: int) -> list[Node]:
        """Like :meth:`closest_contacts`, as the package's ``Node`` objects (hot path of
        every store and lookup: no conversion). Stale contacts are left out."""
        target = int.from_bytes(key, "big")
        me = self.source_node.id
        if self._stale_ids:
            stale = self._stale_ids
            candidates: Iterator[Node] = (n for n in self.router.contacts()
                                          if n.id != me and n.id not in stale)
        else:
            candidates = (n for n in self.router.contacts() if n.id != me)
        return heapq.nsmallest(k, candidates, key=lambda n: n.long_id ^ target)

    def live_count(self) -> int:
        """Contacts in the routing table that are not stale."""
        stale = self._stale_ids
        return sum(1 for n in self.router.contacts() if n.id not in stale)

    # -- lifecycle ------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        """Run background work the protocol owns; errors are logged, never lost."""
        if self._closed:
            coro.close()
            return None
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background DHT task failed", exc_info=task.exception())

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Answer every outstanding RPC with "no answer", cancel background tasks, close the
        socket."""
        self._closed = True
        for pending in self._pending.values():
            pending.timer.cancel()
            if not pending.future.done():
                pending.future.set_result((False, None))
        self._pending.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.transport is not None:
            self.transport.close()
            # close() only schedules the socket's release; a node started on the same port
            # right after stop() would get EADDRINUSE. Wait until it is really closed.
            await self._lost

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._lost.done():
            self._lost.set_result(None)


def _address(node: Node) -> Address:
    return node.ip, node.port
