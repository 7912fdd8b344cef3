"""What the parts of the endpoint see of the protocol that builds them.

:class:`dht.protocol.PulsarProtocol` builds its parts (:mod:`dht.liveness`,
:mod:`dht.routing_table`, :mod:`dht.rpc_client`, :mod:`dht.rpc_server`,
:mod:`dht.store_admission`) and hands each of them itself. They are handed it as a
:class:`ProtocolView`, the few things they read or call of it, rather than as its class, so
none of them imports the module that imports them. The routing table is one of those
parts, so the view names it by what they use of it too (:class:`RouterView`).

:data:`RpcResult` is here because the asking half (:mod:`dht.rpc_client`) and the answering
half (:mod:`dht.rpc_server`) both use it, and the first imports the second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from kademlia.node import Node
from kademlia.routing import KBucket

from .config import DhtConfig
from .peers import Contact, PeerBook
from .stats import DhtStats
from .storage import RecordStorage

__all__ = ["ProtocolView", "RouterView", "RpcResult"]

RpcResult = tuple[bool, Any]
"""``(answered, data)`` as ``rpcudp`` reports it: ``(False, None)`` on timeout."""

Address = tuple[str, int]


class RouterView(Protocol):
    """What the parts read or call of the protocol's routing table
    (:class:`dht.routing_table.PulsarRoutingTable`)."""

    @property
    def ksize(self) -> int: ...
    @property
    def buckets(self) -> list[KBucket]: ...

    def get_bucket_for(self, node: Node) -> int: ...
    def add_contact(self, node: Node) -> None: ...
    def remove_contact(self, node: Node) -> None: ...
    def size(self) -> int: ...
    def known_at(self, node: Node) -> Node | None: ...


class ProtocolView(Protocol):
    """What the parts of :class:`dht.protocol.PulsarProtocol` read or call of it."""

    @property
    def source_node(self) -> Node: ...
    @property
    def config(self) -> DhtConfig: ...
    @property
    def book(self) -> PeerBook: ...
    @property
    def stats(self) -> DhtStats: ...
    @property
    def storage(self) -> RecordStorage: ...
    @property
    def router(self) -> RouterView: ...
    @property
    def transport(self) -> asyncio.DatagramTransport | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def on_new_contact(self) -> Callable[[Node], None] | None: ...
    @property
    def on_over_quota(self) -> Callable[[bytes, Address], None] | None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None: ...
    def ping(self, address: Address, node_id: bytes) -> asyncio.Future[RpcResult]: ...
    async def call_ping(self, node_to_ask: Node) -> RpcResult: ...
    def handle_call_response(self, result: RpcResult, node: Node) -> RpcResult: ...
    def welcome_if_new(self, node: Node) -> None: ...
    def closest_contacts(self, key: bytes, k: int, *, exclude: bytes | None = None
                         ) -> list[Contact]: ...
    def rpc_stun(self, sender: Address) -> Address: ...
