"""The RPCs a node answers: the address check in front of them, the handlers, the answers.

:class:`RpcServer` takes every decoded request :class:`dht.protocol.PulsarProtocol` receives.
A request from an address that has not answered one of our RPCs is held
(:mod:`dht.address_check`; only PING, whose answer is smaller than the request, is answered
at once) and one validation PING goes there; the held requests are served when it answers.
The sender of a request joins the routing table only under the node id its address itself
answered with. Handlers are synchronous (SQLite is local), so a request is answered without
creating any task; a STORE is answered from a callback once its group commit is done
(:mod:`dht.store_admission` decides what is committed). FIND_NODE answers with the exact k
closest contacts by XOR distance, and FIND_VALUE with a record or one of the node's own
blocks.

It is apart from :mod:`dht.protocol` because it is the serving half of the endpoint, with
state of its own (the held requests): the protocol routes requests here and answers to
:mod:`dht.rpc_client`, which sends the RPCs we ask.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kademlia.node import Node

from .address_check import AddressCheck, Verdict
from .protocol_view import ProtocolView, RpcResult
from .ratelimit import LogThrottle
from .store_admission import StoreAdmission, StoreReply
from .wire import Request, encode_response, holds_bitmap

__all__ = ["RpcServer"]

log = logging.getLogger("dht.protocol")  # the protocol's own logger: its lines keep their name

Address = tuple[str, int]

_UNVALIDATED_OK = frozenset({"ping"})
"""Requests answered before the sender's address is proven: a PING's answer (43 bytes) is smaller
than the PING (50), so it amplifies nothing. (STUN, whose answer is the sender's address,
waits like the others.)"""


class RpcServer:
    """Answers the requests one protocol receives. Built by
    :class:`dht.protocol.PulsarProtocol`, whose socket, table, storage and stats it uses."""

    def __init__(self, protocol: ProtocolView, admission: StoreAdmission) -> None:
        config = protocol.config
        self._protocol = protocol
        self._admission = admission
        self._check: AddressCheck[Request] = AddressCheck(
            proof_ttl=config.address_proof_ttl, retry_after=config.address_retry_after)
        self._throttle = LogThrottle(log)
        self._handlers: dict[str, Callable[..., object]] = {
            "ping": self.rpc_ping,
            "stun": protocol.rpc_stun,  # the package's: the sender's address
            "store": self.rpc_store,
            "store_batch": self.rpc_store_batch,
            "find_node": self.rpc_find_node,
            "find_near": self.rpc_find_near,
            "find_value": self.rpc_find_value,
            "find_value_near": self.rpc_find_value_near,
            "holds": self.rpc_holds,
        }

    # -- requests in, answers out ----------------------------------------------------------

    def receive(self, request: Request, addr: Address, size: int) -> None:
        """A request of ``size`` bytes arrived from ``addr``: serve it now, or once the
        address is proven."""
        if request.name in _UNVALIDATED_OK:
            self.accept(request, addr)
        else:
            self._accept_checked(request, addr, size)

    def _accept_checked(self, request: Request, addr: Address, size: int) -> None:
        """Serve ``request`` if ``addr`` is proven; hold it and validate the address if not."""
        stats = self._protocol.stats
        now = time.monotonic()
        address = (addr[0], addr[1])
        if self._check.is_proven(address, now):
            self.accept(request, addr)
            return
        verdict = self._check.hold(address, request, size, now)
        if verdict is Verdict.DROPPED:
            stats.requests_unvalidated_dropped += 1
            return
        stats.requests_held += 1
        if verdict is Verdict.VALIDATE:
            self._validate(address)

    def _validate(self, address: Address) -> None:
        """Send the validation PING to ``address``; its answer proves the address (see
        ``RpcClient.accept_response``) and brings in the node id it answers with."""
        protocol = self._protocol
        protocol.stats.validations_sent += 1
        answer = protocol.ping(address, protocol.source_node.id)
        answer.add_done_callback(lambda done: self._validated(address, done))

    def _validated(self, address: Address, done: asyncio.Future[RpcResult]) -> None:
        protocol = self._protocol
        ok, data = (False, None) if done.cancelled() else done.result()
        if not ok:
            protocol.stats.validations_failed += 1
            protocol.stats.requests_unvalidated_dropped += self._check.failed(
                address, time.monotonic())
            return
        if isinstance(data, bytes) and len(data) == len(protocol.source_node.id):
            protocol.welcome_if_new(Node(data, address[0], address[1]))

    def note_proven(self, address: Address, node_id: bytes) -> None:
        """Another channel (the transport's handshake) proved ``node_id`` at ``address``."""
        for request in self._check.prove((address[0], address[1]), time.monotonic(), node_id):
            self.accept(request, address)

    def answered(self, address: Address, node_id: bytes | None) -> list[Request]:
        """``address`` answered one of our RPCs (echoing its random message id, so it
        receives there; ``node_id`` is who a PING's answer said it is): it is proven. Returns
        the requests held for it, for the caller to serve (:meth:`accept`)."""
        return self._check.prove(address, time.monotonic(), node_id)

    def accept(self, request: Request, addr: Address) -> None:
        """Run the handler of ``request`` and answer it (a STORE once it is committed)."""
        try:
            result = self._handlers[request.name](addr, *request.args)
        except Exception:
            self._protocol.stats.handler_errors += 1
            log.exception("RPC %s from %s failed", request.name, addr)
            return
        if isinstance(result, StoreReply):
            result.flags.add_done_callback(
                lambda done: self._answer_store(request, addr, done, result.single))
        else:
            self._answer(request, addr, result)

    def _answer(self, request: Request, addr: Address, result: object) -> None:
        protocol = self._protocol
        if protocol.closed or protocol.transport is None:
            return
        try:
            datagram = encode_response(request.msg_id, result)
            protocol.transport.sendto(datagram, addr)
            protocol.stats.count_sent(request.name + "+answer", len(datagram))
        except Exception:  # pragma: no cover - an unpackable result would be our bug
            protocol.stats.handler_errors += 1
            log.exception("could not answer RPC %s from %s", request.name, addr)

    def _answer_store(self, request: Request, addr: Address,
                      done: asyncio.Future[list[bool]], single: bool) -> None:
        flags = [False] if done.cancelled() else done.result()
        accepted = sum(flags)
        self._protocol.stats.stores_accepted += accepted
        if accepted < len(flags):
            self._throttle.log(logging.WARNING, "refused", time.monotonic(),
                               "refused %d of %d values stored by %s (not matching their "
                               "key, over quota, or not committed)",
                               len(flags) - accepted, len(flags), addr)
        self._answer(request, addr, flags[0] if single else flags)

    # -- handlers ---------------------------------------------------------------------------

    def _sender(self, sender: Address, node_id: bytes) -> Node:
        """The node a request comes from. It joins the routing table only if its address
        answered our PING with this very id (or it is there already at this address);
        otherwise a validation PING (at most one per address per ``address_retry_after``)
        finds out who answers there."""
        node = Node(node_id, sender[0], sender[1])
        address = (sender[0], sender[1])
        now = time.monotonic()
        if self._check.identity(address, now) == node_id or self._known_at(node, address):
            self._protocol.welcome_if_new(node)
        elif self._check.start(address, now):
            self._validate(address)
        return node

    def _known_at(self, node: Node, address: Address) -> bool:
        router = self._protocol.router
        bucket = router.buckets[router.get_bucket_for(node)]
        known = bucket.nodes.get(node.id)
        return known is not None and (known.ip, known.port) == address

    def rpc_ping(self, sender: Address, node_id: bytes) -> bytes:
        self._sender(sender, node_id)
        return self._protocol.source_node.id  # type: ignore[no-any-return]  # kademlia is untyped

    def rpc_store(self, sender: Address, node_id: bytes, key: bytes, value: object
                  ) -> bool | StoreReply:
        self._sender(sender, node_id)
        flags = self._admission.store_items(sender, node_id, [(key, value)], single=True)
        return flags if isinstance(flags, StoreReply) else flags[0]

    def rpc_store_batch(self, sender: Address, node_id: bytes,
                        items: list[tuple[bytes, object]]) -> list[bool] | StoreReply:
        self._sender(sender, node_id)
        return self._admission.store_items(sender, node_id, items, single=False)

    def rpc_find_node(self, sender: Address, node_id: bytes, key: bytes
                      ) -> list[tuple[bytes, str, int]]:
        self._sender(sender, node_id)
        protocol = self._protocol
        return [(c.node_id, c.host, c.port)
                for c in protocol.closest_contacts(key, protocol.router.ksize, exclude=node_id)]

    def rpc_find_near(self, sender: Address, node_id: bytes, key: bytes, count: int
                      ) -> list[tuple[bytes, str, int]]:
        self._sender(sender, node_id)
        protocol = self._protocol
        return [(c.node_id, c.host, c.port) for c in
                protocol.closest_contacts(key, min(count, protocol.router.ksize),
                                          exclude=node_id)]

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
        storage = self._protocol.storage
        value = storage.get(key)
        if value is None:
            value = storage.local_block(key)
            if value is not None:
                self._protocol.stats.local_blocks_served += 1
        return value

    def rpc_holds(self, sender: Address, node_id: bytes, keys: list[bytes]) -> bytes:
        """Which of ``keys`` this node holds as records (which it keeps and republishes;
        its own blocks, served all the same, do not count), as a bitmap: how a node
        auditing its own blocks learns whether their closest nodes hold them without
        fetching the values (``Maintainer.audit``)."""
        self._sender(sender, node_id)
        held = self._protocol.storage.holds_many(keys)
        return holds_bitmap([key in held for key in keys])
