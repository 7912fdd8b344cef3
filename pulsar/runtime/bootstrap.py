"""Getting a node onto the network: one port number, and a bootstrap that does not give up.

The DHT (UDP) and the transport (TCP) listen on the same port number, so a peer known by
one address is reachable by both. A node whose seeds do not answer when it starts (they
may simply not be up yet) must not stay alone: it bootstraps again in the background.
"""

from __future__ import annotations

import asyncio
import logging

from dag import BlockStore, Identity
from dht import DhtNode

from ..net.transport import Transport
from .driver import Driver
from .node_config import NodeConfig
from .routing import DhtRouting

__all__ = ["listen_both", "retry_bootstrap"]

# The node's logger: these lines are the node's, and operators filter them by that name.
log = logging.getLogger("pulsar.node")


async def listen_both(
    identity: Identity, config: NodeConfig, store: BlockStore, transport: Transport
) -> DhtNode:
    """Bind UDP (DHT) and TCP (transport) on one port number. With port 0 the number the
    OS gives the UDP socket may be taken for TCP; then both are retried on a new one."""
    attempts = 1 if config.port else 20
    for attempt in range(attempts):
        dht = await DhtNode.start(
            identity, config.host, config.port, (), store=store, config=config.dht
        )
        try:
            await transport.listen(config.host, dht.address[1])
            return dht
        except OSError as exc:
            await dht.stop()
            if attempt == attempts - 1:
                raise
            log.debug("TCP port %d busy (%s); trying another", dht.address[1], exc)
    raise AssertionError("unreachable")


async def retry_bootstrap(
    driver: Driver, dht: DhtNode, routing: DhtRouting, config: NodeConfig
) -> None:
    """Bootstrap again with exponential backoff (1 s doubling to 60 s) while the routing
    table is empty and the node runs (``driver``); once contacts exist, rejoin every tree
    through them."""
    delay = 1.0
    while not driver.stopped:
        await asyncio.sleep(delay)
        try:
            contacts = await dht.bootstrap(config.bootstrap)
        except Exception as exc:  # a resolver error, a socket error: try again later
            log.info("bootstrap retry failed: %s", exc)
            contacts = 0
        if contacts:
            await routing.prove_known(config.prove_timeout)
            log.info("bootstrapped on retry: %d contacts", contacts)
            return
        delay = min(delay * 2, 60.0)
