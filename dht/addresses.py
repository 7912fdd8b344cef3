"""Where DHT peers were: the addresses a node can try when its routing table runs thin.

The routing table is not persisted and holds only contacts that answer; a node whose link
went down for a while, or whose contacts all left, needs somewhere to start again. This is
that somewhere: the addresses of contacts it has had (added, or dropped as stale), the
bootstrap seeds it was given, and addresses offered from elsewhere (the transport's peers,
:meth:`dht.node.DhtNode.offer_contact`). Each has a backoff: a PING that goes unanswered
doubles the wait before the next (from ``first_retry`` up to a cap the caller chooses), an
answer resets it.

Bounded: ``capacity`` contact addresses (least recently added or dropped evicted) and
``offered_capacity`` seeds and offered addresses (least recently offered evicted). Pure
state: the caller passes ``now`` (monotonic seconds) and sends the PINGs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AddressMemory"]

Address = tuple[str, int]


@dataclass(slots=True)
class _Entry:
    node_id: bytes | None
    failures: int = 0
    next_try: float = 0.0


class AddressMemory:
    """Remembered peer addresses with a retry backoff each (see the module docstring)."""

    def __init__(self, *, capacity: int = 256, offered_capacity: int = 64,
                 first_retry: float = 1.0) -> None:
        self.capacity = capacity
        self.offered_capacity = offered_capacity
        self.first_retry = first_retry
        self._contacts: OrderedDict[Address, _Entry] = OrderedDict()
        self._offered: OrderedDict[Address, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._contacts.keys() | self._offered.keys())

    def __contains__(self, address: object) -> bool:
        return address in self._contacts or address in self._offered

    def saw(self, address: Address, node_id: bytes, now: float) -> None:
        """A contact at ``address`` joined the routing table: remember it, due at once."""
        self._put(self._contacts, self.capacity, address, _Entry(node_id, 0, now))

    def dropped(self, address: Address, node_id: bytes, now: float, wait: float) -> None:
        """The contact at ``address`` was dropped as stale: remembered, not tried for
        ``wait`` seconds (it has just failed several times)."""
        self._put(self._contacts, self.capacity, address, _Entry(node_id, 1, now + wait))

    def offer(self, address: Address, now: float) -> None:
        """A seed or an address learned elsewhere; an address offered again keeps its
        backoff (offering is cheap, and callers may repeat it)."""
        entry = self._offered.get(address)
        if entry is None:
            entry = _Entry(None, 0, now)
        self._put(self._offered, self.offered_capacity, address, entry)

    def may_try(self, address: Address, now: float) -> bool:
        """Whether ``address`` is not waiting out a backoff (unknown addresses may)."""
        return all(entry.next_try <= now for entry in self._entries(address))

    def due(self, now: float, limit: int, skip: Callable[[Address], bool]) -> list[Address]:
        """Up to ``limit`` addresses to PING now: offered ones first, then contacts, most
        recent first; each one returned waits ``first_retry`` before it is due again
        (then :meth:`answered` or :meth:`failed` says what came of it)."""
        chosen: list[Address] = []
        for table in (self._offered, self._contacts):
            for address in reversed(table):
                if len(chosen) >= limit:
                    return chosen
                if address in chosen or skip(address) or not self.may_try(address, now):
                    continue
                chosen.append(address)
        for address in chosen:
            for entry in self._entries(address):
                entry.next_try = now + self.first_retry
        return chosen

    def tried(self, address: Address, now: float) -> None:
        """A PING to ``address`` left outside :meth:`due` (an offer): not again at once."""
        for entry in self._entries(address):
            entry.next_try = max(entry.next_try, now + self.first_retry)

    def answered(self, address: Address, node_id: bytes, now: float) -> None:
        for entry in self._entries(address):
            entry.failures = 0
            entry.next_try = now
            entry.node_id = node_id

    def failed(self, address: Address, now: float, cap: float) -> None:
        """A PING to ``address`` went unanswered: wait twice as long before the next (at
        most ``cap`` seconds)."""
        for entry in self._entries(address):
            entry.failures += 1
            wait = self.first_retry * 2.0 ** min(entry.failures, 30)
            entry.next_try = now + min(wait, cap)

    def _entries(self, address: Address) -> list[_Entry]:
        return [entry for table in (self._contacts, self._offered)
                if (entry := table.get(address)) is not None]

    @staticmethod
    def _put(table: OrderedDict[Address, _Entry], capacity: int, address: Address,
             entry: _Entry) -> None:
        table[address] = entry
        table.move_to_end(address)
        while len(table) > capacity:
            table.popitem(last=False)
