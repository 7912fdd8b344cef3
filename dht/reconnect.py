"""Finding the way back into the network when the routing table runs thin.

Kademlia refills a routing table from the traffic that passes through it: every node that
answers or asks something is a contact. A node whose table has emptied sees no traffic and
asks nobody, so nothing ever refills it: on a lossy link (issue #28) the network's first
node, started without bootstrap seeds, fell to no contact during a 15 s partition and was
still alone a minute after it healed, refusing every publish.

:class:`Reconnector` runs while the node runs. Once a second it checks whether the table
holds fewer than ``min_contacts`` live (not stale) contacts; if so it PINGs a few of the
addresses the node remembers (:class:`dht.addresses.AddressMemory`: contacts it had, seeds
it bootstrapped from, addresses offered with :meth:`offer`), each with its own backoff (1 s
doubling, up to ``reconnect_interval`` while no contact is live and ten times that while
some is), and walks toward its own id through those that answered: a bootstrap retry,
also for a node that had no seeds. Nodes that answer join the table as usual, as do nodes
that contact us.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kademlia.node import Node

from .config import DhtConfig
from .lookup import crawl
from .maintenance import Maintainer
from .protocol import PulsarProtocol
from .stats import DhtStats

__all__ = ["Reconnector"]

log = logging.getLogger(__name__)

Address = tuple[str, int]

CHECK_INTERVAL = 1.0
"""Seconds between two looks at the routing table."""
PER_ROUND = 8
"""Remembered addresses PINGed at most per round."""
SLOW_FACTOR = 10.0
"""While some contact is live, remembered addresses wait up to this many times
``reconnect_interval`` between two PINGs (a network smaller than ``min_contacts`` is always
"thin", and its departed nodes must not be PINGed every few seconds forever)."""


class Reconnector:
    """Keeps a node in the network (see the module docstring)."""

    def __init__(self, protocol: PulsarProtocol, maintainer: Maintainer, config: DhtConfig,
                 stats: DhtStats, clock: Callable[[], float] = time.monotonic) -> None:
        self._protocol = protocol
        self._maintainer = maintainer
        self._config = config
        self._stats = stats
        self._clock = clock
        self._memory = protocol.memory

    def start(self) -> None:
        self._protocol.spawn(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            if self.thin():
                try:
                    await self.round()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("DHT reconnect round failed")

    def thin(self) -> bool:
        """Whether the table holds fewer live contacts than ``min_contacts``."""
        return self._protocol.live_count() < self._config.min_contacts

    def offer(self, address: Address) -> bool:
        """Remember ``address`` and PING it now, unless a live contact is there already or
        it was tried within its backoff. Returns whether a PING was sent."""
        now = self._clock()
        self._memory.offer(address, now)
        if address in self._table_addresses() or not self._memory.may_try(address, now):
            return False
        self._memory.tried(address, now)
        return self._protocol.spawn(self._ping(address)) is not None

    async def round(self) -> int:
        """PING the remembered addresses that are due (at most ``PER_ROUND``), then walk
        toward our own id through those that answered. Returns how many answered."""
        protocol = self._protocol
        now = self._clock()
        in_table = self._table_addresses()
        due = self._memory.due(now, PER_ROUND, lambda a: a in in_table)
        if not due:
            return 0
        # The contacts met now are the network this node rejoins: they hold their records
        # already (no hand-off); what this node put while alone is placed once it is back.
        self._maintainer.joining()
        try:
            answered = [node for node in await asyncio.gather(*(self._ping(a) for a in due))
                        if node is not None]
            if answered and not protocol.closed:
                found = await crawl(protocol, protocol.source_node.id,
                                    ksize=self._config.ksize, alpha=self._config.alpha,
                                    seeds=answered)
                log.info("rejoined the DHT through %d remembered address(es): %d contacts",
                         len(answered), len(found))
        finally:
            self._maintainer.joined()
        return len(answered)

    async def _ping(self, address: Address) -> Node | None:
        protocol = self._protocol
        self._stats.reconnect_pings += 1
        ok, data = await protocol.ping(address, protocol.source_node.id)
        now = self._clock()
        if (ok and isinstance(data, bytes) and len(data) == len(protocol.source_node.id)
                and data != protocol.source_node.id):
            self._memory.answered(address, data, now)
            node = Node(data, address[0], address[1])
            protocol.welcome_if_new(node)  # proven: it answered our PING from there
            self._stats.reconnected += 1
            return node
        if not protocol.closed:
            cap = self._config.reconnect_interval
            if protocol.live_count() > 0:
                cap *= SLOW_FACTOR
            self._memory.failed(address, now, cap)
        return None

    def _table_addresses(self) -> set[Address]:
        return {(n.ip, n.port) for n in self._protocol.router.contacts()}
