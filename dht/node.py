"""``DhtNode``: the DHT as the rest of pulsarcast sees it.

One object per node: it owns a :class:`~dht.server.PulsarServer` (UDP, the ``kademlia``
wire protocol), the node's records in its SQLite store, the replication pipeline and the
maintenance loop. Its public surface is content-addressed (``put`` returns a CID, ``get``
takes one and returns only a block that hashes to it) plus the local routing queries the
tree layer needs (:meth:`DhtNode.closest_known_peers`), which never touch the network.

The Kademlia node id is ``sha1(peer id)`` (:meth:`dag.identity.PeerId.kademlia_id`), never
random, so the id a peer routes by is tied to the key it proves in the transport handshake.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Self

from kademlia.node import Node

from dag.chunks import MAX_PAYLOAD_SIZE, assemble, split
from dag.cid import CID, DAG_CBOR, RAW, cid_of, cid_of_raw
from dag.identity import Identity, PeerId
from dag.records import HeadsRecord, heads_record_key
from dag.store import BlockStore

from .config import DhtConfig
from .errors import BlockNotFound, DhtError, NotStarted
from .keys import check_block_size, check_fetchable, dht_key, parse_record
from .lookup import NeighbourhoodCache, find_closest, find_value
from .maintenance import Maintainer, MaintenanceReport
from .peers import Contact, HasKademliaId, PeerBook, kademlia_key
from .reconnect import Reconnector
from .records import find_record
from .replication import PutResult, Replicator
from .server import PulsarServer
from .stats import DhtStats
from .storage import RecordStorage

__all__ = ["DhtNode", "PeerProver"]

log = logging.getLogger(__name__)

PeerProver = Callable[[str, int], Awaitable[PeerId]]
"""Dials ``(host, port)`` and returns the peer id the remote side proved (the transport's
authenticated handshake). Plugged in with :meth:`DhtNode.set_prover`."""


LOCATE_WIDTH = 3
"""Contacts a :meth:`DhtNode.locate` crawl keeps and asks each peer for."""


class DhtNode:
    """A running DHT node. Create with ``await DhtNode.start(...)``; end with ``stop()``."""

    def __init__(self, identity: Identity, server: PulsarServer, store: BlockStore,
                 owns_store: bool, config: DhtConfig) -> None:
        self._identity = identity
        self._server = server
        self._protocol = server.protocol
        self._store = store
        self._owns_store = owns_store
        self._config = config
        self._storage = server.storage
        self._cache = NeighbourhoodCache(config.neighbourhood_ttl, config.replication)
        self._replicator = Replicator(self._protocol, config, server.stats, self._cache)
        self._maintainer = Maintainer(self._protocol, self._storage, self._replicator, config,
                                      server.stats)
        self._reconnector = Reconnector(self._protocol, self._maintainer, config, server.stats)
        self._prover: PeerProver | None = None
        self._stopped = False
        self._stopping: asyncio.Future[None] | None = None
        self._identify_tried: dict[tuple[str, int], float] = {}
        self._protocol.on_over_quota = self._prove_heavy_source

    @classmethod
    async def start(
        cls,
        identity: Identity,
        host: str = "127.0.0.1",
        port: int = 0,
        bootstrap: Iterable[tuple[str, int]] = (),
        db_path: str | os.PathLike[str] | None = None,
        *,
        store: BlockStore | None = None,
        config: DhtConfig | None = None,
    ) -> DhtNode:
        """Listen on ``host:port`` (0: any free port), join through ``bootstrap`` peers, and
        start maintenance. Records live in ``store`` (shared with the rest of the node) or in
        a store this node opens at ``db_path`` and closes on :meth:`stop`.

        A node whose bootstrap peers do not answer still starts (and logs it): peers may
        find it later, and :meth:`bootstrap` can be retried."""
        if (store is None) == (db_path is None):
            raise ValueError("pass exactly one of db_path= or store=")
        config = config or DhtConfig()
        owns_store = store is None
        if store is None:
            assert db_path is not None  # exactly one of the two was passed (checked above)
            block_store = BlockStore(db_path)
        else:
            block_store = store
        stats = DhtStats()
        storage = RecordStorage(block_store, max_records=config.max_records, stats=stats,
                                commit_delay=config.commit_delay,
                                commit_batch=config.commit_batch)
        server = PulsarServer(identity.peer_id.kademlia_id(), storage, config, PeerBook(), stats)
        try:
            await server.listen(port, interface=host)
        except BaseException:
            if owns_store:
                block_store.close()
            raise
        node = cls(identity, server, block_store, owns_store, config)
        try:
            await node.bootstrap(bootstrap)
            node._maintainer.start()
            node._reconnector.start()
        except BaseException:
            await node.stop()
            raise
        log.info("DHT node %s (id %s) listening on %s:%d", identity.peer_id,
                 node.node_id.hex(), *node.address)
        return node

    async def stop(self) -> None:
        """Stop answering, cancel background work, close the socket (and the store if this
        node opened it). Safe to call twice, also concurrently (the second call returns
        once the first is done).

        Nothing of the node is left pending: its background tasks are cancelled and
        awaited, every RPC still out is answered "no answer", and the stores still queued
        are settled as unacknowledged, so a ``put`` that was waiting for them returns (with
        the acknowledgements it got) instead of waiting forever."""
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
            return
        self._stopped = True
        self._stopping = asyncio.get_running_loop().create_future()
        try:
            await self._server.aclose()
            self._replicator.close()
            self._storage.close()  # commit what was received (unacknowledged) before the stop
            if self._owns_store:
                self._store.close()
        finally:
            self._stopping.set_result(None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # -- who and where --------------------------------------------------------------------

    @property
    def peer_id(self) -> PeerId:
        return self._identity.peer_id

    @property
    def node_id(self) -> bytes:
        """The 20-byte Kademlia id: sha1 of the peer id bytes."""
        return self._server.node.id  # type: ignore[no-any-return]  # kademlia is untyped

    @property
    def address(self) -> tuple[str, int]:
        """The ``(host, port)`` the UDP socket is bound to (the real port if 0 was asked)."""
        sockname = self._server.transport.get_extra_info("sockname")
        return sockname[0], sockname[1]

    @property
    def stats(self) -> DhtStats:
        return self._server.stats

    @property
    def peers(self) -> PeerBook:
        return self._server.book

    @property
    def config(self) -> DhtConfig:
        return self._config

    @property
    def server(self) -> PulsarServer:
        """The underlying ``kademlia.network.Server`` (for interoperability; its ``get``
        does not verify values: use :meth:`get`)."""
        return self._server

    @property
    def records(self) -> RecordStorage:
        """The records this node holds for the network."""
        return self._storage

    async def bootstrap(self, addrs: Iterable[tuple[str, int]]) -> int:
        """Join through ``addrs`` (host names are resolved first); returns how many contacts
        the routing table holds afterwards."""
        self._check_running()
        resolved = [await _resolve(host, port) for host, port in addrs]
        now = time.monotonic()
        for address in resolved:  # seeds are tried again whenever the table runs thin
            self._protocol.memory.offer(address, now)
        if resolved:
            self._maintainer.joining()
            try:
                found = await self._server.bootstrap(resolved)
            finally:
                self._maintainer.joined()
            if not found:
                log.warning("no bootstrap peer of %s answered", resolved)
        return sum(1 for _ in self._protocol.router.contacts())

    def offer_contact(self, address: tuple[str, int]) -> bool:
        """An address where a DHT node probably listens, learned elsewhere: a peer that
        connected over the transport (same port number for TCP and UDP), a configured seed.

        It is remembered (bounded) among the addresses tried again, with backoff, whenever
        the routing table runs thin, and PINGed now unless a contact is there already or
        it was tried within its backoff; the node that answers (with its id, from that
        very address) joins the routing table as any contact does. Cheap and safe to call
        often. Returns whether a PING was sent. ``address`` must be a literal IP and a
        port (raises ``ValueError`` otherwise: a host name would make the send resolve it,
        blocking the event loop)."""
        self._check_running()
        host, port = address
        ipaddress.ip_address(host)
        if not 0 < port < 65536:
            raise ValueError(f"not a port: {port}")
        if (host, port) == self.address:
            return False
        return self._reconnector.offer((host, port))

    def routing_size(self) -> tuple[int, int]:
        """``(contacts, stale)``: how many contacts the routing table holds, and how many
        of them are stale (kept as a way back into the network, asked nothing but PINGs,
        left out of :meth:`closest_known_peers`)."""
        return self._protocol.router.size(), self._protocol.stale_count()

    # -- blocks ---------------------------------------------------------------------------

    async def put(self, block: bytes, *, codec: int = DAG_CBOR) -> CID:
        """Store one block (at most one RPC, see :data:`dht.keys.MAX_BLOCK_SIZE`) here and at
        the k closest nodes; returns its CID. ``put_many`` reports acknowledgements."""
        (result,) = await self.put_many([block], codec=codec)
        return result.cid

    async def put_many(self, blocks: Iterable[bytes], *, codec: int = DAG_CBOR,
                       quorum: int | None = None) -> list[PutResult]:
        """Store many blocks, pipelined (``put_concurrency`` keys in flight, small blocks
        batched per datagram). Each is stored here first, so it is served at once. With
        ``quorum``, each block's put returns once that many of its k closest nodes
        acknowledged (``acks`` counts those); the other replicas are written in the
        background. Without, it waits for every replica."""
        items = []
        for block in blocks:
            check_block_size(block)
            items.append((_cid_for(block, codec), block))
        return await self._put_blocks(items, quorum)

    async def put_large(self, payload: bytes) -> CID:
        """Store a payload of any size (up to ``dag.chunks.MAX_PAYLOAD_SIZE``) as a chunk
        tree; returns the root CID to pass to :meth:`get_large`."""
        root, blocks = split(payload)
        await self._put_blocks(blocks)
        return root

    async def put_chunks(self, items: Sequence[tuple[CID, bytes]], *,
                         quorum: int | None = None) -> list[PutResult]:
        """Store the blocks of a chunk tree already split (``dag.chunks.split``): a node
        that pushes the same blocks down its trees stores exactly those. Each must match
        its CID."""
        for cid, block in items:
            check_block_size(block)
            if not cid.verifies(block):
                raise ValueError(f"block does not match {cid}")
        return await self._put_blocks(items, quorum)

    async def _put_blocks(self, items: Sequence[tuple[CID, bytes]],
                          quorum: int | None = None) -> list[PutResult]:
        self._check_running()
        records = [(dht_key(cid), block) for cid, block in items]
        self._storage.offer_many(records)
        self._protocol.note_local_bytes(sum(len(block) for _, block in records))
        self.stats.block_puts += len(records)
        replicated = await self._replicator.replicate_many(records, quorum)
        return [PutResult(cid, r.acks, r.targets)
                for (cid, _), r in zip(items, replicated, strict=True)]

    async def get(self, cid: CID, *, timeout: float | None = None) -> bytes:
        """The block for ``cid``, from this node or the network, verified against the CID.

        Values that do not hash to the CID are discarded (never returned nor stored) and
        other holders are asked. Raises :class:`~dht.errors.BlockNotFound` when no holder
        answers with a matching block within ``timeout`` (default ``config.get_timeout``)."""
        self._check_running()
        check_fetchable(cid)
        local = self._store.get(cid)
        if local is not None and cid.verifies(local):
            return local
        key = dht_key(cid)
        held = self._storage.get(key)
        if held is not None and cid.verifies(held):
            return held
        self.stats.block_gets += 1
        try:
            async with asyncio.timeout(timeout or self._config.get_timeout):
                return await find_value(
                    self._protocol, cid, key, ksize=self._config.ksize,
                    alpha=self._config.alpha, stats=self.stats,
                    count=self._config.replication,
                    # Kademlia 2.3: the closest peer that lacked it gets a (verified) copy.
                    on_found=lambda node, block: self._replicator.batcher.store(
                        node, key, block),
                )
        except TimeoutError:
            raise BlockNotFound(cid, timed_out=True) from None

    async def get_large(self, root: CID, *, max_size: int = MAX_PAYLOAD_SIZE,
                        timeout: float | None = None) -> bytes:
        """The payload of a chunk tree stored with :meth:`put_large`, every block verified.
        ``timeout`` bounds each block's lookup."""
        async def fetch(cid: CID) -> bytes:
            return await self.get(cid, timeout=timeout)

        return await assemble(root, fetch, max_size=max_size)

    # -- heads records (mutable, signed: see dht.records) ----------------------------------

    async def put_record(self, record: HeadsRecord, *, quorum: int | None = None) -> int:
        """Store ``record`` here and at the k closest nodes of its key; returns how many of
        them acknowledged (a holder of a newer record refuses it). Refused here too when
        this node already holds a newer one. With ``quorum``, returns once that many
        acknowledged, as :meth:`put_many` does; the other stores go on behind."""
        self._check_running()
        if not self._storage.offer(record.key, record.block):
            return 0
        self._protocol.note_local_bytes(len(record.block))
        self.stats.record_puts += 1
        replicated = await self._replicator.replicate(record.key, record.block, quorum)
        return replicated.acks

    async def get_record(self, topic: CID, publisher: PeerId, *,
                         timeout: float | None = None) -> HeadsRecord | None:
        """The newest valid heads record of ``publisher`` for ``topic`` that this node or
        the k nodes closest to its key hold (see :func:`dht.records.find_record`); None if
        none has one. A timeout returns what was found so far: the local copy, if any."""
        self._check_running()
        key = heads_record_key(topic, publisher)
        local = parse_record(key, self._storage.get(key))
        self.stats.record_gets += 1
        try:
            async with asyncio.timeout(timeout or self._config.get_timeout):
                # A record is put at the ``replication`` closest nodes of its key (the
                # walk asks them all: it wants the newest, not the first).
                found = await find_record(self._protocol, topic, publisher,
                                          ksize=self._config.replication,
                                          alpha=self._config.alpha,
                                          stats=self.stats)
        except TimeoutError:
            found = None
        if found is None or (local is not None and local.seq >= found.seq):
            return local
        self._storage.offer(key, found.block)  # keep the newest we saw: we may be asked
        return found

    # -- routing queries for the tree layer ----------------------------------------------

    def closest_known_peers(self, key: bytes | HasKademliaId, k: int | None = None
                            ) -> list[Contact]:
        """The ``k`` (default ksize) contacts of our k-buckets nearest ``key`` — a 20-byte
        Kademlia key or a peer id — by exact XOR distance, nearest first. Local only: no
        network traffic. Each contact carries its address, and its peer id once proven."""
        return self._protocol.closest_contacts(kademlia_key(key), k or self._config.ksize)

    async def locate(self, peer: bytes | HasKademliaId) -> tuple[str, int] | None:
        """The address of one node: from our k-buckets, else by a FIND_NODE crawl for its
        id (a peer learned from gossip — an overlay walk, a shuffle sample, a tree
        redirect — is often not in them). None when the crawl does not meet it. The
        address is a hint: the transport's handshake proves who answers there."""
        key = kademlia_key(peer)
        for contact in self.closest_known_peers(key, 1):
            if contact.node_id == key:
                return contact.address
        self._check_running()
        self.stats.locates += 1
        # The node with that id is the closest there is to it: a crawl that keeps only the
        # few closest (FIND_NEAR answers of 3 contacts, not k) finds it at a fraction of the
        # bytes (the testbed's overlay and relay hand-overs cost 4.7 MiB of answers at k).
        found = await find_closest(self._protocol, key, ksize=LOCATE_WIDTH,
                                   alpha=self._config.alpha, stats=self.stats)
        for node in found:
            if node.id == key and node.ip is not None and node.port is not None:
                return (node.ip, node.port)
        return None

    def record_proof(self, peer_id: PeerId, host: str, port: int, *,
                     expected_node_id: bytes | None = None) -> Contact:
        """The transport proved that ``peer_id`` is at ``host:port`` (same port number for
        TCP and UDP). Notes the proof and adds the peer to the routing table. Raises
        :class:`~dht.errors.PeerIdMismatch` if it contradicts ``expected_node_id``."""
        node_id = self.peers.record_proof(peer_id, host, port, time.time(),
                                          expected_node_id=expected_node_id)
        self._protocol.note_proven((host, port), node_id)  # a handshake is a round trip
        self._protocol.welcome_if_new(Node(node_id, host, port))
        return self.peers.contact(node_id, host, port)

    def set_prover(self, prover: PeerProver | None) -> None:
        """Plug in the transport's handshake, used by :meth:`identify`."""
        self._prover = prover

    async def identify(self, contact: Contact) -> PeerId:
        """The proven peer id of ``contact``, running the prover if not proven yet."""
        proven = contact.peer_id or self.peers.proven_peer_id(contact.node_id, contact.host,
                                                              contact.port)
        if proven is not None:
            return proven
        if self._prover is None:
            raise DhtError("no prover is plugged in to identify contacts (see set_prover)")
        peer_id = await self._prover(contact.host, contact.port)
        self.record_proof(peer_id, contact.host, contact.port,
                          expected_node_id=contact.node_id)
        return peer_id

    def _prove_heavy_source(self, node_id: bytes, address: tuple[str, int]) -> None:
        """A source that is not a proven peer used up its byte quota (``dht.quota``). A
        pulsarcast publisher storing its events is one: if a prover is plugged in, ask it
        to prove its identity (the transport handshake, as :meth:`identify` does); once
        proven it has ``peer_store_quota``. At most once per address per quota window."""
        if self._prover is None or self._stopped:
            return
        now = time.monotonic()
        tried = self._identify_tried.get(address)
        if tried is not None and now - tried < self._config.store_quota_window:
            return
        if len(self._identify_tried) >= 4096:
            self._identify_tried.clear()
        self._identify_tried[address] = now
        self._protocol.spawn(self._identify_quietly(Contact(node_id, *address)))

    async def _identify_quietly(self, contact: Contact) -> None:
        try:
            peer_id = await self.identify(contact)
        except Exception as exc:  # an unreachable or lying source keeps the small quota
            log.info("%s:%d used up its DHT store quota and did not prove an identity: %s",
                     contact.host, contact.port, exc)
        else:
            log.info("%s:%d proved to be %s: its DHT store quota is now a peer's",
                     contact.host, contact.port, peer_id)

    # -- upkeep ---------------------------------------------------------------------------

    async def maintain(self, now: float | None = None) -> MaintenanceReport:
        """Run one maintenance pass now (republish, expiry, bucket refresh)."""
        self._check_running()
        return await self._maintainer.tick(now)

    def _check_running(self) -> None:
        if self._stopped:
            raise NotStarted("this DHT node has been stopped")


def _cid_for(block: bytes, codec: int) -> CID:
    if codec == DAG_CBOR:
        return cid_of(block)
    if codec == RAW:
        return cid_of_raw(block)
    raise ValueError(f"put() writes dag-cbor (0x71) or raw (0x55) blocks, not 0x{codec:x}")


async def _resolve(host: str, port: int) -> tuple[str, int]:
    """Literal IPs pass through; names are resolved once (the package needs IPs)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"cannot resolve {host}")
    address = infos[0][4]
    return str(address[0]), int(address[1])
