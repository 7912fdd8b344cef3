"""Which STOREs a node accepts, and the answer that waits for their commit.

:class:`StoreAdmission` runs every value of a STORE or STORE_BATCH through, in order: the
per-sender and global rate limits (values and bytes, :mod:`dht.ratelimit`), the byte quotas
of :mod:`dht.quota` (per source, and in total: new keys only, a refresh costs nothing), and
then the storage's own checks (verification against the key, the record count) in its group
commit. A refused value is answered False; what was submitted is answered once the commit is
done, through a :class:`StoreReply`.

It is apart from :mod:`dht.protocol` because it is the node's defence of its disk and its
bandwidth against senders: one policy with its own state (limiters, quotas), which the
STORE handlers of :mod:`dht.rpc_server` consult and nothing else does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from .protocol_view import ProtocolView
from .quota import Refusal, StoreQuota
from .ratelimit import KeyedLimiter, LogThrottle

__all__ = ["StoreAdmission", "StoreReply"]

log = logging.getLogger("dht.protocol")  # the protocol's own logger: its lines keep their name

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class StoreReply:
    """A STORE answered after the group commit (see ``RecordStorage.submit``)."""

    flags: asyncio.Future[list[bool]]
    single: bool


class StoreAdmission:
    """The STORE limits and quotas of one protocol. Built by
    :class:`dht.protocol.PulsarProtocol`, whose storage, book, stats and ``on_over_quota`` it
    uses."""

    def __init__(self, protocol: ProtocolView) -> None:
        config = protocol.config
        self._protocol = protocol
        self._limiter = KeyedLimiter(config.store_rate, config.store_burst,
                                     config.global_store_rate, config.global_store_burst)
        self._byte_limiter = KeyedLimiter(config.store_byte_rate, config.store_byte_burst,
                                          config.global_store_byte_rate,
                                          config.global_store_byte_burst)
        self._quota = StoreQuota(source_quota=config.source_store_quota,
                                 peer_quota=config.peer_store_quota,
                                 window=config.store_quota_window, max_bytes=config.max_bytes,
                                 measure=protocol.storage.stored_bytes,
                                 evict=lambda size: protocol.storage.make_room(size=size))
        self._throttle = LogThrottle(log)

    def note_local_bytes(self, size: int) -> None:
        """This node stored ``size`` bytes of its own records (they count toward
        ``max_bytes``, and are never refused)."""
        self._quota.added_locally(size)

    def store_items(self, sender: Address, node_id: bytes, items: list[tuple[bytes, object]],
                    *, single: bool) -> list[bool] | StoreReply:
        """Rate limits, then quotas, then the storage's own checks (verification, record
        count); refused values are answered False (a STORE with a bool, a STORE_BATCH with
        one flag per value, however many values it has)."""
        if not self._allow_stores(sender, items):
            return [False] * len(items)
        admitted = self._admit(sender, node_id, items)
        chosen = [item for item, ok in zip(items, admitted, strict=True) if ok]
        if not chosen:
            return [False] * len(items)
        committed = self._protocol.storage.submit(chosen)
        if len(chosen) == len(items):
            return StoreReply(committed, single=single)
        merged: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()

        def merge(done: asyncio.Future[list[bool]]) -> None:
            flags = iter([False] * len(chosen) if done.cancelled() else done.result())
            if not merged.done():
                merged.set_result([ok and next(flags) for ok in admitted])

        committed.add_done_callback(merge)
        return StoreReply(merged, single=single)

    def _allow_stores(self, sender: Address, items: list[tuple[bytes, object]]) -> bool:
        now = time.monotonic()
        address = (sender[0], sender[1])
        size = sum(len(v) for _, v in items if isinstance(v, bytes | bytearray))
        if (self._limiter.allow(address, len(items), now)
                and self._byte_limiter.allow(address, size, now)):
            return True
        self._protocol.stats.stores_rate_limited += len(items)
        self._throttle.log(logging.WARNING, "rate", now,
                           "refusing stores from %s: rate limit exceeded", sender)
        return False

    def _admit(self, sender: Address, node_id: bytes, items: list[tuple[bytes, object]]
               ) -> list[bool]:
        """Charge new keys to the sender's byte quota and the node's byte cap. Keys held
        already (a refresh) cost nothing; values that are not bytes are left to the
        storage to refuse; values that will fail verification are charged (to the sender's
        own budget, which is all they can waste)."""
        protocol = self._protocol
        now = time.monotonic()
        address = (sender[0], sender[1])
        peer = protocol.book.proven_peer_id(node_id, address[0], address[1]) is not None
        flags: list[bool] = []
        asked = False
        for key, value in items:
            if not isinstance(value, bytes) or key in protocol.storage:
                flags.append(True)
                continue
            refusal = self._quota.admit(address, len(value), now, peer=peer)
            if refusal is Refusal.SOURCE:
                protocol.stats.stores_over_source_quota += 1
                if not peer and not asked and protocol.on_over_quota is not None:
                    protocol.on_over_quota(node_id, address)
                    asked = True
            elif refusal is Refusal.TOTAL:
                protocol.stats.stores_over_byte_cap += 1
            flags.append(refusal is None)
        if not all(flags):
            self._throttle.log(logging.WARNING, "quota", now,
                               "refusing stores from %s: over its byte quota or the node's "
                               "byte cap", sender)
        return flags
