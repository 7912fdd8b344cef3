"""The simulator's DHT: blocks and heads records replicated on the k closest live nodes.

What the runtime's Kademlia does, reduced to what decides whether a fetch succeeds: a put
goes to the ``replicas`` live nodes closest to the key that the writer can reach (its
acknowledgements are how many of them there were); a get succeeds only if one of the nodes
now closest to the key and reachable holds the value. A holder that crashed takes its
copies with it until it restarts (its store is durable); a partition hides the holders on
the other side. Not modelled: lookup hops and their latency (a put or get costs one round
trip to the farthest replica asked), republishing, rate limits and quotas.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from dag import CID, PeerId
from dag.records import HeadsRecord

from .routing import IdSpace

__all__ = ["SimDht", "block_key"]


def block_key(cid: CID) -> int:
    """The Kademlia key a block is stored under (as ``dht.keys.dht_key``)."""
    return int.from_bytes(hashlib.sha1(bytes(cid)).digest(), "big")


class SimDht:
    """Per-node DHT storage, placed and found by XOR distance."""

    def __init__(self, space: IdSpace, replicas: int) -> None:
        self.space = space
        self.replicas = replicas
        self.blocks: dict[PeerId, dict[CID, bytes]] = {}
        self.records: dict[PeerId, dict[bytes, HeadsRecord]] = {}
        self.puts = 0
        self.gets = 0
        self.misses = 0

    def holders(self, key: int, usable: Callable[[PeerId], bool]) -> list[PeerId]:
        return self.space.closest(key, self.replicas, usable)

    def put_block(self, cid: CID, block: bytes, usable: Callable[[PeerId], bool]) -> list[PeerId]:
        """Store on the closest usable nodes; returns them (the acknowledgements)."""
        self.puts += 1
        chosen = self.holders(block_key(cid), usable)
        for peer in chosen:
            self.blocks.setdefault(peer, {})[cid] = block
        return chosen

    def get_block(self, cid: CID, usable: Callable[[PeerId], bool]) -> bytes | None:
        self.gets += 1
        for peer in self.holders(block_key(cid), usable):
            block = self.blocks.get(peer, {}).get(cid)
            if block is not None:
                return block
        self.misses += 1
        return None

    def put_record(
        self, record: HeadsRecord, usable: Callable[[PeerId], bool]
    ) -> list[PeerId]:
        """Store on the closest usable nodes; returns those that took it (a holder of a
        newer record of the same key refuses, as a real one does)."""
        key = int.from_bytes(hashlib.sha1(record.key).digest(), "big")
        took: list[PeerId] = []
        for peer in self.holders(key, usable):
            held = self.records.setdefault(peer, {})
            old = held.get(record.key)
            if old is None or old.seq < record.seq:
                held[record.key] = record
                took.append(peer)
        return took

    def get_record(self, key: bytes, usable: Callable[[PeerId], bool]) -> HeadsRecord | None:
        """The newest copy among the reachable closest holders."""
        hashed = int.from_bytes(hashlib.sha1(key).digest(), "big")
        best: HeadsRecord | None = None
        for peer in self.holders(hashed, usable):
            record = self.records.get(peer, {}).get(key)
            if record is not None and (best is None or record.seq > best.seq):
                best = record
        return best
