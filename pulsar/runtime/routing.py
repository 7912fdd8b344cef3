"""The core's routing view, served from the DHT's k-buckets.

The core needs peers it can address by peer id; the k-buckets know node ids and addresses.
A contact is usable once the transport handshake has proven which peer id it belongs to
(the Kademlia id is sha1 of that peer id, so the proof also checks the id the contact uses
in the DHT). Unproven contacts are proven in the background, a bounded number at a time,
so routing knowledge fills in without ever blocking the core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from dag import PeerId
from dht import Contact, DhtNode

__all__ = ["DhtRouting"]

log = logging.getLogger("pulsar.routing")


class DhtRouting:
    def __init__(self, dht: DhtNode, *, concurrency: int = 8) -> None:
        self._dht = dht
        self._proving: set[bytes] = set()
        self._failed: set[bytes] = set()
        self._semaphore = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    def closest_peers(self, key: bytes, count: int) -> Sequence[PeerId]:
        proven: list[PeerId] = []
        for contact in self._dht.closest_known_peers(key, count):
            peer = contact.peer_id or self._dht.peers.proven_peer_id(
                contact.node_id, contact.host, contact.port
            )
            if peer is not None:
                proven.append(peer)
            else:
                self.prove_later(contact)
        return proven

    def prove_later(self, contact: Contact) -> None:
        if contact.node_id in self._proving or contact.node_id in self._failed:
            return
        self._proving.add(contact.node_id)
        task = asyncio.get_running_loop().create_task(self._prove(contact))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def prove_known(self, timeout: float) -> int:
        """Prove every contact currently in the k-buckets; return how many are proven."""
        contacts = self._dht.closest_known_peers(self._dht.node_id, 10_000)
        for contact in contacts:
            if contact.peer_id is None:
                self.prove_later(contact)
        pending = list(self._tasks)
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        return sum(
            1
            for c in self._dht.closest_known_peers(self._dht.node_id, 10_000)
            if c.peer_id is not None or self._dht.peers.proven_peer_id(c.node_id, c.host, c.port)
        )

    async def _prove(self, contact: Contact) -> None:
        try:
            async with self._semaphore:
                await self._dht.identify(contact)
        except (TimeoutError, OSError, ValueError) as exc:
            log.debug("could not prove %s:%d: %s", contact.host, contact.port, exc)
            self._failed.add(contact.node_id)
        except Exception:  # a prover bug must not kill routing
            log.exception("proving %s:%d failed", contact.host, contact.port)
            self._failed.add(contact.node_id)
        finally:
            self._proving.discard(contact.node_id)

    def forget_failures(self) -> None:
        """Contacts that could not be proven may be reachable now."""
        self._failed.clear()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
