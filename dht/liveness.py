"""Which contacts still answer: arrivals, misses, quarantine, staleness, probing, removal and
returns.

:class:`ContactLiveness` keeps, per address and per node id, the evidence the protocol has
gathered about its contacts, and acts on it:

* a live contact is welcomed into the routing table (:meth:`ContactLiveness.welcome`, behind
  ``PulsarProtocol.welcome_if_new``), and one that restarted elsewhere, or came back soon
  after it went silent, is recognised as a return rather than a newcomer;
* an unanswered RPC is a *miss* of its address; an address whose RPCs time out is
  *quarantined* for ``silent_for`` seconds (nothing but PINGs is sent there meanwhile);
* a contact that missed is PINGed until it answers or has missed ``contact_failures`` times
  in a row; then it is *stale*, and removed unless the table holds no more than
  ``keep_contacts`` contacts (see the protocol's docstring, "Contacts are not dropped at
  their first silence");
* removed contacts are remembered (:class:`dht.addresses.AddressMemory`) for
  :class:`dht.reconnect.Reconnector`.

It is apart from :mod:`dht.protocol` because it is one policy with its own state and its own
background work (the probes): the protocol tells it what happened (an answer, a timeout, a
datagram) and asks it what to skip; the rules for when a contact is given up live here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from kademlia.node import Node

from .addresses import AddressMemory
from .protocol_view import ProtocolView
from .ratelimit import LogThrottle
from .routing_table import node_address

__all__ = ["MAX_SILENT", "ContactLiveness"]

log = logging.getLogger("dht.protocol")  # the protocol's own logger: its lines keep their name

Address = tuple[str, int]

MAX_SILENT = 10_000
"""Quarantined addresses remembered at most (a flood of dead contacts stays bounded)."""
_DEPARTED_MEMORY = 10_000
"""Contacts remembered as recently gone (to recognise a restart), at most."""

_PROBE_FIRST_WAIT = 1.0
"""Seconds before the first backoff PING of a stale contact kept as one of the last (then
doubling up to ``reconnect_interval``)."""


@dataclass(slots=True)
class _Misses:
    """Unanswered RPCs in a row to one address, and when the last one was counted."""

    count: int
    last: float


class ContactLiveness:
    """The liveness of one protocol's contacts. Built by :class:`dht.protocol.PulsarProtocol`,
    whose routing table, book, stats and RPCs it uses."""

    def __init__(self, protocol: ProtocolView) -> None:
        self._protocol = protocol
        self._silent: dict[Address, float] = {}  # address -> monotonic end of quarantine
        self._departed: OrderedDict[bytes, float] = OrderedDict()  # id -> when removed
        # consecutive unanswered RPCs per address (see ``_count_miss``)
        self._misses: OrderedDict[Address, _Misses] = OrderedDict()
        # stale contacts still in the table: address -> node id, and their ids
        self._stale: dict[Address, bytes] = {}
        self.stale_ids: set[bytes] = set()
        """Node ids of the stale contacts still in the table (asked nothing but PINGs, and
        handed to nobody)."""
        self._probing: set[bytes] = set()  # node ids with a probe running (``_probe``)
        self.memory = AddressMemory(first_retry=_PROBE_FIRST_WAIT)
        """Addresses of contacts seen and dropped, seeds and offered addresses."""
        self._throttle = LogThrottle(log)

    # -- contacts that answer --------------------------------------------------------------

    def welcome(self, node: Node) -> None:
        """Note a live contact: refresh its place in its bucket (the package only adds
        contacts it has never seen) and report it if new.

        A known id answering from a new address while its old address had stopped
        answering is a node that restarted elsewhere: it is reported as a return (its old
        entry counts as departed), as if it had been dropped before coming back."""
        protocol = self._protocol
        if node.id == protocol.source_node.id:
            return  # someone claiming our id: never route to "ourselves"
        address = node_address(node)
        self.heard(address)
        protocol.book.saw(node.id, node.ip, node.port, time.time())
        known = protocol.router.known_at(node)
        new = known is None
        if (known is not None and node_address(known) != address
                and self.miss_count(node_address(known))):
            new = True
            self._unmark_stale(node_address(known))
            self._note_departed(node.id, time.monotonic())
        protocol.router.add_contact(node)
        if new:
            self.memory.saw(address, node.id, time.monotonic())
            if self._stale:
                self._replace_stale()
        if new and protocol.on_new_contact is not None:
            if self._returning(node.id):
                protocol.stats.returns_without_handoff += 1
            else:
                protocol.on_new_contact(node)

    def _returning(self, node_id: bytes) -> bool:
        """Whether ``node_id`` is a contact that went silent less than a republish interval
        ago. Such a node restarted (a node's Kademlia id is its identity's, kept on disk
        with its record store), so it still holds what it held; a hand-off would resend
        every record it is close to (under churn that was the largest share of the DHT's
        bytes). What was stored while it was away is at the other replicas, which serve
        gets, and reaches it with the hourly republish. A node away for longer, or never
        seen, gets the hand-off as Kademlia prescribes."""
        gone_at = self._departed.pop(node_id, None)
        config = self._protocol.config
        window = min(config.returning_window, config.republish_interval)
        return gone_at is not None and time.monotonic() - gone_at < window

    def spoke(self, address: Address) -> None:
        """A datagram, any datagram, came from ``address``: its quarantine is over."""
        if self._silent:
            self._silent.pop((address[0], address[1]), None)

    def heard(self, address: Address) -> None:
        """``address`` answered (or a proven contact spoke from it): its misses, its
        quarantine and its staleness are over."""
        if self._misses:
            self._misses.pop(address, None)
        if self._silent:
            self._silent.pop(address, None)
        if self._stale and address in self._stale:
            self._unmark_stale(address)
            self._protocol.stats.contacts_revived += 1

    # -- contacts that stop answering ------------------------------------------------------

    def skips(self, address: Address) -> bool:
        """Whether RPCs other than PING to ``address`` are not sent (and answered "no
        answer" at once): the address is quarantined, or a stale contact's."""
        if self._silent and self._is_silent(address):
            return True
        return bool(self._stale) and (address[0], address[1]) in self._stale

    def _is_silent(self, address: Address) -> bool:
        until = self._silent.get((address[0], address[1]))
        if until is None:
            return False
        if until <= time.monotonic():
            del self._silent[(address[0], address[1])]
            return False
        return True

    def missed(self, address: Address, sent_at: float) -> None:
        """An RPC sent to ``address`` at ``sent_at`` timed out, and the silence is evidence
        against it: count the miss, and quarantine the address for ``silent_for`` seconds
        (if that is not 0)."""
        self._count_miss(address, sent_at)
        silent_for = self._protocol.config.silent_for
        if silent_for > 0:
            now = time.monotonic()
            if len(self._silent) >= MAX_SILENT:
                self._silent = {a: t for a, t in self._silent.items() if t > now}
            if len(self._silent) < MAX_SILENT:
                self._silent[address] = now + silent_for

    def _count_miss(self, address: Address, sent_at: float) -> None:
        """An RPC sent to ``address`` at ``sent_at`` went unanswered. It counts as a new
        miss only if it was sent after the previous miss was counted: RPCs in flight
        together when a link goes down are one miss, not one each (a put to a node has
        several STOREs in flight; a partition would otherwise count five misses at once)."""
        now = time.monotonic()
        misses = self._misses.get(address)
        if misses is None:
            self._misses[address] = _Misses(1, now)
            while len(self._misses) > MAX_SILENT:
                old, _ = self._misses.popitem(last=False)
                self._unmark_stale(old)
        elif sent_at >= misses.last:
            misses.count += 1
            misses.last = now
            self._misses.move_to_end(address)

    def miss_count(self, address: Address) -> int:
        """Unanswered RPCs in a row to ``address`` (0 once anything answered from there)."""
        misses = self._misses.get((address[0], address[1]))
        return 0 if misses is None else misses.count

    def _unmark_stale(self, address: Address) -> None:
        node_id = self._stale.pop(address, None)
        if node_id is not None:
            self.stale_ids.discard(node_id)

    def suspect(self, node: Node) -> None:
        """An RPC to the contact ``node`` went unanswered (or was not sent: its address is
        quarantined or stale). One miss is no proof of death on a lossy link: the contact
        is PINGed (``_probe``) until it answers or has missed ``contact_failures`` times in
        a row; then it is stale, and removed unless it is one of the table's last
        ``keep_contacts``."""
        address = node_address(node)
        known = self._protocol.router.known_at(node)
        if known is None or node_address(known) != address:
            return  # not (or no longer) a contact at that address: a lookup's stranger
        if self.miss_count(address) == 0:
            return  # no evidence: a stock node ignoring our RPC, or heard from since
        if node.id not in self._probing and self._protocol.spawn(self._probe(known)) is not None:
            self._probing.add(node.id)

    async def _probe(self, node: Node) -> None:
        """PING a suspect contact until it answers or goes stale; a stale one kept as one
        of the table's last is PINGed on, with backoff (up to ``reconnect_interval``)."""
        address = node_address(node)
        wait = _PROBE_FIRST_WAIT
        config = self._protocol.config
        try:
            while self._still_suspect(node):
                if self.miss_count(address) >= config.contact_failures:
                    self._mark_stale(node)
                    if self._retire(node):
                        return
                    # Kept as one of the table's last: PING it on, with backoff.
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, config.reconnect_interval)
                    if not self._still_suspect(node):
                        return
                await self._ping_contact(node)
        finally:
            self._probing.discard(node.id)

    def _still_suspect(self, node: Node) -> bool:
        """Whether ``node`` is still a contact at its address that has missed RPCs."""
        if self._protocol.closed:
            return False
        known = self._protocol.router.known_at(node)
        return (known is not None and node_address(known) == node_address(node)
                and self.miss_count(node_address(node)) > 0)

    async def _ping_contact(self, node: Node) -> None:
        protocol = self._protocol
        address = node_address(node)
        protocol.stats.contact_probes += 1
        ok, data = await protocol.ping(address, protocol.source_node.id)
        if not ok or protocol.closed:
            return  # a timeout counted one more miss (``RpcClient._expire``)
        if data == node.id:
            self.welcome(node)
        elif isinstance(data, bytes) and len(data) == len(node.id):
            # Someone else answers there now: our contact is gone from that address, and
            # the one who answered (a live node, proven by this round trip) replaces it.
            self._remove_contact(node)
            self.welcome(Node(data, address[0], address[1]))

    def _mark_stale(self, node: Node) -> None:
        address = node_address(node)
        if address not in self._stale:
            self._protocol.stats.contacts_stale += 1
            self._stale[address] = node.id
            self.stale_ids.add(node.id)

    def _retire(self, node: Node) -> bool:
        """Remove the stale contact ``node``, unless the table holds no more than
        ``keep_contacts`` contacts: then it is kept as a way back into the network (a node
        whose own link is down would otherwise void its table). Returns whether it is
        gone."""
        known = self._protocol.router.known_at(node)
        if known is None or node_address(known) != node_address(node):
            self._unmark_stale(node_address(node))
            return True
        if self._protocol.router.size() <= self._protocol.config.keep_contacts:
            return False
        self._remove_contact(node)
        return True

    def _remove_contact(self, node: Node) -> None:
        protocol = self._protocol
        now = time.monotonic()
        address = node_address(node)
        self._throttle.log(logging.INFO, "silent", now,
                           "no response from %s (%d RPCs in a row), removing it from the "
                           "routing table", node, self.miss_count(address))
        protocol.router.remove_contact(node)
        protocol.stats.contacts_dropped += 1
        self._unmark_stale(address)
        self._note_departed(node.id, now)
        self.memory.dropped(address, node.id, now, protocol.config.reconnect_interval)

    def _note_departed(self, node_id: bytes, now: float) -> None:
        self._departed[node_id] = now
        self._departed.move_to_end(node_id)
        while len(self._departed) > _DEPARTED_MEMORY:
            self._departed.popitem(last=False)

    def _replace_stale(self) -> None:
        """A live contact arrived: stale contacts kept as the table's last may go now, as
        long as more than ``keep_contacts`` remain (a live one replaces a stale one)."""
        for address, node_id in list(self._stale.items()):
            if self._protocol.router.size() <= self._protocol.config.keep_contacts:
                return
            self._retire(Node(node_id, address[0], address[1]))

    def stale_count(self) -> int:
        """Stale contacts the routing table still holds."""
        return len(self._stale)
