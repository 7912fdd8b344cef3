"""``kademlia.network.Server`` wired to our protocol, storage and upkeep.

Subclassed rather than forked, so the package's bootstrap, ``set``/``get`` and crawlers keep
working (a stock client on our node behaves as the package documents). Only what is unsafe
or replaced changes: the refresh/republish loop (``dht.maintenance`` owns it), bootstrap
pings (the package trusts whatever the peer answers as a node id), and shutdown (ours
awaits the protocol's tasks).
"""

from __future__ import annotations

import asyncio
import logging

from kademlia.network import Server
from kademlia.node import Node

from .config import DhtConfig
from .lookup import crawl
from .peers import PeerBook
from .protocol import PulsarProtocol
from .stats import DhtStats
from .storage import RecordStorage
from .wire import MalformedDatagram, parse_ping

__all__ = ["PulsarServer"]

log = logging.getLogger(__name__)


class PulsarServer(Server):  # type: ignore[misc]  # kademlia is untyped
    """One node's Kademlia server. Build through :meth:`dht.node.DhtNode.start`."""

    protocol: PulsarProtocol
    storage: RecordStorage

    def __init__(self, node_id: bytes, storage: RecordStorage, config: DhtConfig,
                 book: PeerBook, stats: DhtStats) -> None:
        super().__init__(ksize=config.ksize, alpha=config.alpha, node_id=node_id,
                         storage=storage)
        # Server.__init__ says `storage or ForgetfulStorage()`, and an empty storage is falsy.
        self.storage = storage
        self.config = config
        self.book = book
        self.stats = stats

    def _create_protocol(self) -> PulsarProtocol:
        return PulsarProtocol(self.node, self.storage, self.config, self.book, self.stats)

    def refresh_table(self, interval: int = 3600) -> None:
        """Replaced by :class:`dht.maintenance.Maintainer` (the package's version also
        republishes through ``set_digest``, which resets record ages)."""

    async def bootstrap(self, addrs: list[tuple[str, int]]) -> list[Node]:
        """Ping the seeds, then walk toward our own id from those that answered (the
        package's crawl waits out every dead contact a seed names, round after round)."""
        answered = await asyncio.gather(*(self.bootstrap_node(addr) for addr in addrs))
        seeds = [node for node in answered if node is not None]
        if not seeds:
            return []
        return await crawl(self.protocol, self.node.id, ksize=self.ksize, alpha=self.alpha,
                           seeds=seeds)

    async def bootstrap_node(self, addr: tuple[str, int]) -> Node | None:
        ok, data = await self.protocol.ping(addr, self.node.id)
        if not ok:
            log.warning("bootstrap peer %s:%s did not answer", *addr)
            return None
        try:
            return Node(parse_ping(data), addr[0], addr[1])
        except MalformedDatagram:
            log.warning("bootstrap peer %s:%s answered PING with garbage", *addr)
            return None

    async def aclose(self) -> None:
        if self.protocol is not None:
            await self.protocol.close()
        super().stop()
