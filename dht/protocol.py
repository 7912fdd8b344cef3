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

Where the code lives: this module is the endpoint itself (datagrams in, the routing table's
entry points, local queries, background tasks, shutdown) and keeps every public name the
package and the rest of the DHT call; the work is done by :mod:`dht.rpc_server` (requests
answered: address validation, handlers), :mod:`dht.store_admission` (which STOREs are
accepted), :mod:`dht.rpc_client` (RPCs sent, answers matched and checked),
:mod:`dht.liveness` (which contacts still answer) and :mod:`dht.routing_table` (the
package's table, adapted).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

from kademlia.node import Node
from kademlia.protocol import KademliaProtocol

from .config import DhtConfig
from .liveness import ContactLiveness
from .peers import Contact, PeerBook, closest
from .protocol_view import RpcResult
from .ratelimit import LogThrottle
from .routing_table import PulsarRoutingTable
from .rpc_client import RpcClient
from .rpc_server import RpcServer
from .stats import DhtStats
from .storage import RecordStorage
from .store_admission import StoreAdmission, StoreReply
from .wire import MalformedDatagram, Response, decode_datagram

__all__ = ["PulsarProtocol", "RpcResult"]

log = logging.getLogger(__name__)

Address = tuple[str, int]


class PulsarProtocol(KademliaProtocol):  # type: ignore[misc]  # kademlia is untyped
    """One node's UDP endpoint. Built by :class:`dht.server.PulsarServer`."""

    storage: RecordStorage
    router: PulsarRoutingTable

    def __init__(self, source_node: Node, storage: RecordStorage, config: DhtConfig,
                 book: PeerBook, stats: DhtStats) -> None:
        super().__init__(source_node, storage, config.ksize)
        self.router = PulsarRoutingTable(self, config.ksize, source_node)
        self.config = config
        self.book = book
        self.stats = stats
        self.on_new_contact: Callable[[Node], None] | None = None
        self.on_over_quota: Callable[[bytes, Address], None] | None = None
        """Told ``(node id, address)`` when a source that is not a proven peer used up its
        byte quota (``DhtNode`` then asks the transport to prove who it is)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._throttle = LogThrottle(log)
        self._liveness = ContactLiveness(self)
        self.memory = self._liveness.memory
        """Addresses of contacts seen and dropped, seeds and offered addresses."""
        self._admission = StoreAdmission(self)
        self._server = RpcServer(self, self._admission)
        self._client = RpcClient(self, self._server, self._liveness, self._drop)

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
        self._liveness.spoke(addr)
        try:
            message = decode_datagram(data)
        except MalformedDatagram as exc:
            self._drop(addr, str(exc))
            return
        if isinstance(message, Response):
            self._client.accept_response(message, addr)
        else:
            self._server.receive(message, addr, len(data))

    def note_local_bytes(self, size: int) -> None:
        """This node stored ``size`` bytes of its own records (they count toward
        ``max_bytes``, and are never refused)."""
        self._admission.note_local_bytes(size)

    def note_proven(self, address: Address, node_id: bytes) -> None:
        """Another channel (the transport's handshake) proved ``node_id`` at ``address``."""
        self._server.note_proven(address, node_id)

    def _drop(self, addr: Address, reason: str) -> None:
        self.stats.datagrams_dropped += 1
        self._throttle.log(logging.WARNING, "drop", time.monotonic(),
                           "dropped a datagram from %s: %s", addr, reason)

    # -- outgoing RPCs (names as on the wire; sent by :class:`dht.rpc_client.RpcClient`) --

    def ping(self, address: Address, node_id: bytes) -> asyncio.Future[RpcResult]:
        return self._client.ping(address, node_id)

    def store(self, address: Address, node_id: bytes, key: bytes, value: bytes
              ) -> asyncio.Future[RpcResult]:
        return self._client.store(address, node_id, key, value)

    def store_batch(self, address: Address, node_id: bytes,
                    items: Sequence[tuple[bytes, bytes]]) -> asyncio.Future[RpcResult]:
        return self._client.store_batch(address, node_id, items)

    def find_node(self, address: Address, node_id: bytes, key: bytes
                  ) -> asyncio.Future[RpcResult]:
        return self._client.find_node(address, node_id, key)

    def find_near(self, address: Address, node_id: bytes, key: bytes, count: int
                  ) -> asyncio.Future[RpcResult]:
        return self._client.find_near(address, node_id, key, count)

    def find_value(self, address: Address, node_id: bytes, key: bytes
                   ) -> asyncio.Future[RpcResult]:
        return self._client.find_value(address, node_id, key)

    def find_value_near(self, address: Address, node_id: bytes, key: bytes, count: int
                        ) -> asyncio.Future[RpcResult]:
        return self._client.find_value_near(address, node_id, key, count)

    # -- calls with checked answers (used by the package's crawlers and by ours) --------

    async def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> RpcResult:
        return await self._client.call_find_node(node_to_ask, node_to_find)

    async def call_find_near(self, node_to_ask: Node, node_to_find: Node, count: int
                             ) -> RpcResult:
        """FIND_NODE answered with only the ``count`` closest contacts: see
        :meth:`dht.rpc_client.RpcClient.call_find_near`."""
        return await self._client.call_find_near(node_to_ask, node_to_find, count)

    async def call_find_value(self, node_to_ask: Node, node_to_find: Node,
                              count: int | None = None) -> RpcResult:
        """FIND_VALUE; with ``count``, FIND_VALUE_NEAR: see
        :meth:`dht.rpc_client.RpcClient.call_find_value`."""
        return await self._client.call_find_value(node_to_ask, node_to_find, count)

    async def call_holds(self, node_to_ask: Node, keys: Sequence[bytes]) -> list[bool] | None:
        """Which of ``keys`` ``node_to_ask`` holds, or None: see
        :meth:`dht.rpc_client.RpcClient.call_holds`."""
        return await self._client.call_holds(node_to_ask, keys)

    async def call_ping(self, node_to_ask: Node) -> RpcResult:
        return await self._client.call_ping(node_to_ask)

    async def call_store(self, node_to_ask: Node, key: bytes, value: bytes) -> RpcResult:
        return await self._client.call_store(node_to_ask, key, value)

    def handle_call_response(self, result: RpcResult, node: Node) -> RpcResult:
        """An answer keeps a contact fresh; silence makes it suspect (unless we are the
        ones shutting down, which is no evidence against the peer): see
        :meth:`dht.liveness.ContactLiveness.suspect`."""
        if result[0]:
            self.welcome_if_new(node)
        elif not self._closed:
            self._liveness.suspect(node)
        return result

    # -- contacts (kept by :class:`dht.liveness.ContactLiveness`) -------------------------

    def welcome_if_new(self, node: Node) -> None:
        """Note a live contact: refresh its place in its bucket and report it if new (see
        :meth:`dht.liveness.ContactLiveness.welcome`)."""
        self._liveness.welcome(node)

    def miss_count(self, address: Address) -> int:
        """Unanswered RPCs in a row to ``address`` (0 once anything answered from there)."""
        return self._liveness.miss_count(address)

    def stale_count(self) -> int:
        """Stale contacts the routing table still holds."""
        return self._liveness.stale_count()

    # -- handlers (answered by :class:`dht.rpc_server.RpcServer`) -------------------------

    def rpc_ping(self, sender: Address, node_id: bytes) -> bytes:
        return self._server.rpc_ping(sender, node_id)

    def rpc_store(self, sender: Address, node_id: bytes, key: bytes, value: object
                  ) -> bool | StoreReply:
        return self._server.rpc_store(sender, node_id, key, value)

    def rpc_store_batch(self, sender: Address, node_id: bytes,
                        items: list[tuple[bytes, object]]) -> list[bool] | StoreReply:
        return self._server.rpc_store_batch(sender, node_id, items)

    def rpc_find_node(self, sender: Address, node_id: bytes, key: bytes
                      ) -> list[tuple[bytes, str, int]]:
        return self._server.rpc_find_node(sender, node_id, key)

    def rpc_find_near(self, sender: Address, node_id: bytes, key: bytes, count: int
                      ) -> list[tuple[bytes, str, int]]:
        return self._server.rpc_find_near(sender, node_id, key, count)

    def rpc_find_value(self, sender: Address, node_id: bytes, key: bytes) -> object:
        return self._server.rpc_find_value(sender, node_id, key)

    def rpc_find_value_near(self, sender: Address, node_id: bytes, key: bytes, count: int
                            ) -> object:
        return self._server.rpc_find_value_near(sender, node_id, key, count)

    def rpc_holds(self, sender: Address, node_id: bytes, keys: list[bytes]) -> bytes:
        """Which of ``keys`` this node holds as records, as a bitmap: see
        :meth:`dht.rpc_server.RpcServer.rpc_holds`."""
        return self._server.rpc_holds(sender, node_id, keys)

    # -- local queries --------------------------------------------------------------------

    def closest_contacts(self, key: bytes, k: int, *, exclude: bytes | None = None
                         ) -> list[Contact]:
        """The ``k`` known contacts nearest ``key`` (exact XOR order), never ourselves."""
        stale = self._liveness.stale_ids
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
        stale = self._liveness.stale_ids
        if stale:
            candidates: Iterator[Node] = (n for n in self.router.contacts()
                                          if n.id != me and n.id not in stale)
        else:
            candidates = (n for n in self.router.contacts() if n.id != me)
        return heapq.nsmallest(k, candidates, key=lambda n: n.long_id ^ target)

    def live_count(self) -> int:
        """Contacts in the routing table that are not stale."""
        stale = self._liveness.stale_ids
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
        self._client.close()
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

