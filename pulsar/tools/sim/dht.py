"""The simulator's DHT: blocks and heads records replicated on the k closest live nodes.

What the runtime's Kademlia does, reduced to what decides whether a fetch succeeds: a put
goes to the ``replicas`` live nodes closest to the key that the writer can reach (its
acknowledgements are how many of them there were); a get succeeds only if one of the nodes
now closest to the key and reachable holds the value. A holder that crashed takes its
copies with it until it restarts (its store is durable); a partition hides the holders on
the other side.

Datagrams are lost like the pub-sub's messages (``lost``: one draw per datagram, the
network's loss rate): a STORE that is lost stores nothing, an answer that is lost is no
acknowledgement; a get asks the holders ``ALPHA`` at a time, closest first, and a round in
which every request or answer was lost costs the caller one RPC timeout (``stalls``) before
the next round. Not modelled: lookup hops and their latency (a put or get costs one round
trip to the farthest replica asked, plus its stalls), republishing, rate limits and quotas.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Final

from dag import CID, PeerId
from dag.records import HeadsRecord

from .routing import IdSpace

__all__ = ["ALPHA", "SimDht", "block_key"]

ALPHA: Final = 3
"""Holders a get asks at once (Kademlia's alpha, as ``dht.config.DhtConfig.alpha``)."""

Lost = Callable[[], bool]
"""One draw: whether a datagram is lost."""


def _never() -> bool:
    return False


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

    def put_block(self, cid: CID, block: bytes, usable: Callable[[PeerId], bool],
                  lost: Lost = _never) -> tuple[list[PeerId], bool]:
        """Store on the closest usable nodes. Returns those that acknowledged, and whether
        a STORE or its answer was lost (the writer then waits out an RPC timeout)."""
        self.puts += 1
        acked: list[PeerId] = []
        any_lost = False
        for peer in self.holders(block_key(cid), usable):
            if lost():
                any_lost = True
                continue
            self.blocks.setdefault(peer, {})[cid] = block
            if lost():
                any_lost = True
                continue
            acked.append(peer)
        return acked, any_lost

    def get_block(self, cid: CID, usable: Callable[[PeerId], bool],
                  lost: Lost = _never) -> tuple[bytes | None, int]:
        """The block from the first holder whose answer arrives, and the rounds stalled."""
        self.gets += 1
        rounds = _Rounds(self.holders(block_key(cid), usable), lost)
        for peer in rounds:
            block = self.blocks.get(peer, {}).get(cid)
            if block is not None:
                return block, rounds.stalls
        self.misses += 1
        return None, rounds.stalls

    def put_record(
        self, record: HeadsRecord, usable: Callable[[PeerId], bool], lost: Lost = _never,
    ) -> tuple[list[PeerId], bool]:
        """Store on the closest usable nodes; returns those that took it and answered (a
        holder of a newer record of the same key refuses, as a real one does), and whether
        a datagram was lost."""
        key = int.from_bytes(hashlib.sha1(record.key).digest(), "big")
        took: list[PeerId] = []
        any_lost = False
        for peer in self.holders(key, usable):
            if lost():
                any_lost = True
                continue
            held = self.records.setdefault(peer, {})
            old = held.get(record.key)
            if old is None or old.seq < record.seq:
                held[record.key] = record
                if lost():
                    any_lost = True
                    continue
                took.append(peer)
        return took, any_lost

    def get_record(self, key: bytes, usable: Callable[[PeerId], bool],
                   lost: Lost = _never) -> tuple[HeadsRecord | None, int]:
        """The newest copy among the closest holders whose answers arrive (every holder is
        asked, ``ALPHA`` at a time), and the rounds in which no answer arrived."""
        hashed = int.from_bytes(hashlib.sha1(key).digest(), "big")
        best: HeadsRecord | None = None
        rounds = _Rounds(self.holders(hashed, usable), lost)
        for peer in rounds:
            record = self.records.get(peer, {}).get(key)
            if record is not None and (best is None or record.seq > best.seq):
                best = record
        return best, rounds.stalls


class _Rounds:
    """The holders a get asks, ``ALPHA`` at a time, closest first: iterating yields those
    whose request and answer both arrived; ``stalls`` counts the rounds in which none did
    (each costs the caller an RPC timeout). Lazy, so a get that stops at its first answer
    draws no more losses than it needs."""

    def __init__(self, holders: list[PeerId], lost: Lost) -> None:
        self._holders = holders
        self._lost = lost
        self.stalls = 0

    def __iter__(self) -> Iterator[PeerId]:
        holders, lost = self._holders, self._lost
        for start in range(0, len(holders), ALPHA):
            answered = False
            for peer in holders[start:start + ALPHA]:
                if lost() or lost():
                    continue
                answered = True
                yield peer
            if not answered:
                self.stalls += 1
