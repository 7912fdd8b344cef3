"""Address validation: nothing big goes to an address before it has proved it receives there.

UDP source addresses are free to forge. A node that answers a 50-byte request with an 8 KiB
value, or that greets every new node id with a hand-off of the records it should hold, is an
amplifier aimed wherever the forger points it (measured before this module: 100 PINGs with
random node ids, 5 KB, drew 890 STOREs, 5.9 MB, to their source). QUIC's answer (RFC 9000,
section 8) is to send an unvalidated address at most three times what it sent, until a round
trip proves the address. Here the round trip is one of our own RPCs: an answer that arrives
from exactly the address we asked, echoing the 20 random bytes of our message id, can only
come from someone who received our datagram there. Stock ``kademlia`` nodes answer PINGs, so
they validate without knowing about any of this.

The rules, as one table (state of an address -> what its requests get):

=============  =========================================================================
unknown        PING is answered (its answer is smaller than the request); any other
               request is *held* and one validation PING is sent to the address
validating     requests are held (at most ``max_held`` per address, ``max_held_bytes``
               in all; beyond that they are dropped silently)
proven         everything is served; the address may get hand-offs and join the routing
               table. Any answer to our own RPCs from it keeps it proven
failed         (the validation PING went unanswered) held requests are dropped; no other
               validation PING goes there for ``retry_after`` seconds, so a forger
               gets at most one small datagram per address per ``retry_after``
=============  =========================================================================

Bytes sent to an address that never answers are thus one answer per PING (smaller than
the PING) plus one validation PING (about the size of a request) per ``retry_after``:
under 3x what it was sent, whatever the requests were. Contacts only enter the routing table
from proven addresses, so hand-offs (:mod:`dht.maintenance`), bucket pings and lookups only
ever reach addresses that answered us.

Pure state: the caller passes ``now`` (monotonic seconds) and does the I/O.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["AddressCheck", "Held", "Verdict"]

Address = tuple[str, int]
T = TypeVar("T")


class Verdict(enum.Enum):
    """What to do with a request from an address that is not proven."""

    VALIDATE = "validate"
    """Held; send the validation PING now (the first request from this address)."""
    HELD = "held"
    """Held; a validation is already under way."""
    DROPPED = "dropped"
    """Not held (the address failed recently, or the hold is full): drop it silently."""


@dataclass(slots=True)
class Held(Generic[T]):
    """Requests of one address waiting for its validation."""

    items: deque[tuple[T, int]] = field(default_factory=deque)
    failed_until: float = 0.0
    """While in the future, the address failed validation: drop without asking again."""
    validating: bool = False
    last_attempt: float = float("-inf")


class AddressCheck(Generic[T]):
    """Which addresses have proved they receive, and what waits for those that have not.

    Memory is bounded: at most ``max_addresses`` proofs (least recently refreshed evicted)
    and ``max_addresses`` pending or failed addresses, and ``max_held_bytes`` of held
    requests in all.
    """

    def __init__(self, *, proof_ttl: float = 3600.0, retry_after: float = 30.0,
                 max_held: int = 32, max_held_bytes: int = 1 << 20,
                 max_addresses: int = 65536) -> None:
        self.proof_ttl = proof_ttl
        self.retry_after = retry_after
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self.max_addresses = max_addresses
        # address -> (proven at, the node id it last answered a PING with, if any)
        self._proven: OrderedDict[Address, tuple[float, bytes | None]] = OrderedDict()
        self._pending: OrderedDict[Address, Held[T]] = OrderedDict()
        self._held_bytes = 0

    @property
    def held_bytes(self) -> int:
        return self._held_bytes

    def is_proven(self, addr: Address, now: float) -> bool:
        entry = self._proven.get(addr)
        if entry is None:
            return False
        if now - entry[0] > self.proof_ttl:
            del self._proven[addr]
            return False
        return True

    def identity(self, addr: Address, now: float) -> bytes | None:
        """The node id ``addr`` answered a PING with, while its proof lasts.

        Requests carry a node id anyone can write; only this one was answered from the
        address. A forger using a live node's address with made-up ids therefore never gets
        those ids into the routing table (nor hand-offs for them)."""
        entry = self._proven.get(addr)
        if entry is None or not self.is_proven(addr, now):
            return None
        return entry[1]

    def prove(self, addr: Address, now: float, node_id: bytes | None = None) -> list[T]:
        """``addr`` answered one of our RPCs (a PING, with ``node_id``): it is proven
        (again). Returns the requests that were held for it, oldest first, to serve now."""
        previous = self._proven.get(addr)
        if node_id is None and previous is not None:
            node_id = previous[1]
        self._proven[addr] = (now, node_id)
        self._proven.move_to_end(addr)
        while len(self._proven) > self.max_addresses:
            self._proven.popitem(last=False)
        held = self._pending.get(addr)
        if held is None:
            return []
        held.validating = False
        items = [item for item, _ in held.items]
        self._held_bytes -= sum(size for _, size in held.items)
        held.items.clear()
        return items

    def forget(self, addr: Address) -> None:
        """Drop the proof of ``addr`` (it answered as someone else, or went away)."""
        self._proven.pop(addr, None)

    def hold(self, addr: Address, item: T, size: int, now: float) -> Verdict:
        """A request of ``size`` bytes from the unproven ``addr``: hold it or drop it."""
        held = self._pending.get(addr)
        if held is None:
            held = self._new_pending(addr)
        if held.failed_until > now:
            return Verdict.DROPPED
        verdict = Verdict.HELD
        if not held.validating:
            held.validating = True
            held.last_attempt = now
            verdict = Verdict.VALIDATE
        if len(held.items) >= self.max_held or self._held_bytes + size > self.max_held_bytes:
            return Verdict.VALIDATE if verdict is Verdict.VALIDATE else Verdict.DROPPED
        held.items.append((item, size))
        self._held_bytes += size
        return verdict

    def start(self, addr: Address, now: float) -> bool:
        """Whether to send a validation PING to ``addr`` now (nothing held): for a new
        address or to learn the node id a proven one answers with. At most one is under
        way per address, and at most one is sent per ``retry_after``."""
        held = self._pending.get(addr)
        if held is None:
            held = self._new_pending(addr)
        if held.validating or held.failed_until > now or now - held.last_attempt < self.retry_after:
            return False
        held.validating = True
        held.last_attempt = now
        return True

    def failed(self, addr: Address, now: float) -> int:
        """The validation PING to ``addr`` went unanswered; returns how many held requests
        are dropped."""
        held = self._pending.get(addr)
        if held is None:
            return 0
        dropped = len(held.items)
        self._held_bytes -= sum(size for _, size in held.items)
        held.items.clear()
        held.validating = False
        held.failed_until = now + self.retry_after
        return dropped

    def _new_pending(self, addr: Address) -> Held[T]:
        held: Held[T] = Held()
        self._pending[addr] = held
        while len(self._pending) > self.max_addresses:
            _, old = self._pending.popitem(last=False)
            self._held_bytes -= sum(size for _, size in old.items)
        return held
