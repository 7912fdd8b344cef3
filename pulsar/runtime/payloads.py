"""Event payloads: inline bytes, or a chunk tree stored in the DHT.

A payload up to ``inline_limit`` travels inside its event. A larger one is cut into a
chunk tree (:mod:`dag.chunks`) and the event names its root; the tree is either stored in
the DHT at the write quorum before the event exists (readers pull it from there), or, with
fragments enabled, pushed down the tree behind the event as FRAGMENTs while its DHT copy
(for history and repair) is written alongside. Either way an acknowledged publish promises
that a reader can fetch the payload after its publisher is gone, so a chunk tree the DHT
did not take at the quorum fails the publish.

On the reading side, :meth:`Payloads.payload_of` reassembles a chunk tree from the blocks
held here and the DHT, and a delivered event whose payload did not arrive with it has its
chunk tree fetched and kept (:meth:`Payloads.keep`): every subscriber holds what it
delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from dag import CID, BlockStore, EventDescriptor, check_content_type, check_event_key
from dag.chunks import assemble, split
from dht import DhtNode

from .errors import NotPersisted, NotRecorded, PayloadTooLarge
from .node_config import NodeConfig
from .writes import WriteBehind

__all__ = ["Payloads"]

# The node's logger: these lines are the node's, and operators filter them by that name.
log = logging.getLogger("pulsar.node")


class Payloads:
    """Stores the chunk trees of this node's large publishes and reads those of the
    events it delivers. ``spawn`` runs a background task in the node's task set (so that
    stopping the node cancels a DHT write still under way)."""

    __slots__ = ("_config", "_dht", "_spawn", "_store", "_writes")

    def __init__(
        self,
        config: NodeConfig,
        store: BlockStore,
        dht: DhtNode,
        writes: WriteBehind,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    ) -> None:
        self._config = config
        self._store = store
        self._dht = dht
        self._writes = writes
        self._spawn = spawn

    def check(self, payload: object, content_type: str | None,
              key: str | None = None) -> None:
        """Refuse at once, before anything is stored or sent, a payload that is not bytes
        or is over the node's limit, and a content type or key the schema refuses."""
        if not isinstance(payload, bytes):
            raise TypeError("payload must be bytes")
        limit = self._config.core.fragments.max_event_size
        if len(payload) > limit:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes is over this node's limit of {limit} bytes "
                "(core.fragments.max_event_size)"
            )
        check_content_type(content_type)
        check_event_key(key)

    async def publish(
        self, payload: bytes, send: Callable[[bytes | CID], Awaitable[EventDescriptor]]
    ) -> EventDescriptor:
        """Store ``payload``'s chunk tree if it needs one, then ``send`` the event's body
        (the payload itself, or the tree's root) to the core and return the event once the
        tree is stored as an acknowledgement promises. Raises :class:`NotPersisted` when
        the tree was refused before the event existed, :class:`NotRecorded` when the event
        went out but its fragments' DHT copy did not reach the quorum."""
        body: bytes | CID = payload
        chunks: asyncio.Task[Any] | None = None
        config = self._config
        fragments = config.core.fragments
        if len(payload) > config.inline_limit:
            if (fragments.enabled and len(payload) > fragments.threshold
                    and config.protocol == "pulsarcast"):
                # Travels the tree as fragments: the core reads the chunk tree from the local
                # store (written now, before the command), and the DHT copy (for history and
                # repair) is written alongside, not before, the tree push.
                body, blocks = split(payload)
                self._store.put_many(blocks, pinned=True)
                quorum = max(1, config.core.min_acks)
                chunks = self._spawn(self._dht.put_chunks(blocks, quorum=quorum))
            else:
                # Pulled from the DHT by readers: stored at the write quorum before the
                # event exists, so a refusal here is a clean failure (nothing went out).
                body, blocks = split(payload)
                self._store.put_many(blocks, pinned=True)
                quorum = max(1, config.core.min_acks)
                results = await self._dht.put_chunks(blocks, quorum=quorum)
                if config.core.min_acks and any(r.acks < quorum for r in results):
                    raise NotPersisted(
                        f"the payload's chunk tree was stored on fewer than {quorum} DHT "
                        "node(s) (min_acks); not published — is the node connected to its "
                        "network?")
        try:
            event = await send(body)
        finally:
            stored = None if chunks is None else await asyncio.gather(
                chunks, return_exceptions=True)
        if stored is not None:
            # The payload is part of what an acknowledgement promises: a reader of the
            # event must be able to fetch its chunk tree after this node is gone.
            quorum = max(1, config.core.min_acks) if config.core.min_acks else 0
            result = stored[0]
            short = (str(result) if isinstance(result, BaseException) else
                     f"{sum(r.acks < quorum for r in result)} of its {len(result)} blocks "
                     f"on fewer than {quorum} DHT node(s)")
            if isinstance(result, BaseException) or any(r.acks < quorum for r in result):
                log.warning("chunk tree %s not stored in the DHT: %s", body, short)
                raise NotRecorded(
                    f"event {event.cid} went out, but its payload's chunk tree was not stored "
                    f"at the write quorum ({short}): it may still be delivered, but this "
                    "publish is not acknowledged")
        return event

    async def payload_of(self, event: EventDescriptor) -> bytes:
        """The event's payload, reassembling (and verifying) a chunk tree if needed: from
        the blocks held here (a large event's fragments, written as they arrived), the
        others from the DHT."""
        if isinstance(event.payload, bytes):
            return event.payload

        async def fetch(cid: CID) -> bytes:
            local = self._writes.local_block(cid)
            if local is not None:
                return local
            block = await self._dht.get(cid)
            self._writes.store_block(cid, block)  # kept: this node now serves it as a replica
            return block

        return await assemble(event.payload, fetch)

    async def keep(self, event: EventDescriptor) -> None:
        """Fetch and keep the chunk tree of a delivered event that arrived without it
        (backfill, or fragments given up): every subscriber holds what it delivered, so
        the payload outlives its publisher as the event does."""
        try:
            await self.payload_of(event)
        except Exception as exc:  # the DHT may have it later; readers fetch it then
            log.info("payload of %s not kept: %s", event.cid, exc)
