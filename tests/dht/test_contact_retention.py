"""Issue #28: on a lossy link a node shed its DHT contacts one lost datagram at a time (the
package removes a contact at its first unanswered RPC), and a node whose table emptied
never found its way back. Real nodes on loopback UDP; loss is made by dropping datagrams
in front of a node's protocol."""

from __future__ import annotations

import asyncio
import os

import pytest
from kademlia.node import Node

from dag.identity import Identity
from dht import DhtConfig, DhtNode
from dht.addresses import AddressMemory
from tests.waiting import eventually

from .conftest import Network
from .lossy import Deaf

pytestmark = pytest.mark.slow

TIMEOUT = 0.3
LOSSY = DhtConfig(rpc_timeout=TIMEOUT, get_timeout=5.0, maintenance_interval=3600.0,
                  contact_failures=3, keep_contacts=0, min_contacts=0,
                  reconnect_interval=0.5)
"""Short RPC timeouts; no floor and no reconnecting unless a test asks for them."""


def contact_ids(node: DhtNode) -> set[bytes]:
    """Every contact of ``node``'s routing table, stale ones included."""
    return {n.id for n in node.server.protocol.router.contacts()}


async def ask(asker: DhtNode, target: DhtNode) -> bool:
    """One FIND_NODE from ``asker`` to ``target``, as lookups send it; whether answered."""
    ok, _ = await asker.server.protocol.call_find_node(Node(target.node_id, *target.address),
                                                       Node(os.urandom(20)))
    return bool(ok)


@pytest.mark.parametrize("lost", [1, 2])
async def test_a_contact_that_misses_one_or_two_rpcs_stays(
        network: Network, monkeypatch: pytest.MonkeyPatch, lost: int) -> None:
    a = await network.add(config=LOSSY)
    b = await network.add(config=LOSSY)
    assert b.node_id in contact_ids(a)
    deaf = Deaf(b, monkeypatch)
    deaf.drop_next = lost  # the FIND_NODE, and with 2 the first probe PING, are lost
    assert not await ask(a, b)
    protocol = a.server.protocol
    await eventually(lambda: protocol.miss_count(b.address) == 0, timeout=lost * TIMEOUT + 3,
                     what="a probe answered")
    assert deaf.dropped == lost
    assert b.node_id in contact_ids(a)
    assert a.closest_known_peers(b.node_id, 1)[0].node_id == b.node_id
    assert a.stats.contact_probes == lost
    assert a.stats.contacts_stale == a.stats.contacts_dropped == 0
    assert await ask(a, b)  # asked as any contact again


async def test_rpcs_lost_together_are_one_miss(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five FIND_NODEs lost to the same outage count once, not five times: the contact is
    probed, answers, and stays."""
    a = await network.add(config=LOSSY)
    b = await network.add(config=LOSSY)
    deaf = Deaf(b, monkeypatch)
    deaf.drop_next = 5
    assert not any(await asyncio.gather(*(ask(a, b) for _ in range(5))))
    protocol = a.server.protocol
    assert protocol.miss_count(b.address) == 1
    await eventually(lambda: protocol.miss_count(b.address) == 0, timeout=3)
    assert b.node_id in contact_ids(a)
    assert a.stats.contacts_stale == 0


async def test_a_contact_that_misses_n_rpcs_in_a_row_goes(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    a = await network.add(config=LOSSY)
    b = await network.add(config=LOSSY)
    Deaf(b, monkeypatch).down = True
    assert not await ask(a, b)
    protocol = a.server.protocol
    assert protocol.miss_count(b.address) == 1
    assert b.node_id in contact_ids(a)  # one miss: still a contact, being probed
    await eventually(lambda: b.node_id not in contact_ids(a),
                     timeout=LOSSY.contact_failures * TIMEOUT + 3, what="b dropped")
    # the FIND_NODE, then two probe PINGs: three misses in a row
    assert a.stats.contact_probes == LOSSY.contact_failures - 1
    assert a.stats.contacts_stale == a.stats.contacts_dropped == 1
    assert a.closest_known_peers(b.node_id) == []
    assert b.address in protocol.memory  # remembered, to be tried if the table runs thin


async def test_the_last_contacts_stay_until_live_ones_replace_them(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the last ``keep_contacts``: a node whose own link is down must not void its
    table. Stale, they are asked nothing and handed to nobody; a live newcomer replaces
    one; one that answers again is a contact as before."""
    config = DhtConfig(rpc_timeout=TIMEOUT, get_timeout=5.0, maintenance_interval=3600.0,
                       contact_failures=3, keep_contacts=2, min_contacts=0,
                       reconnect_interval=0.5)
    a = await network.add(config=config)
    b = await network.add(config=config)
    c = await network.add(config=config)
    await eventually(lambda: contact_ids(a) == {b.node_id, c.node_id})
    deaf_b, deaf_c = Deaf(b, monkeypatch), Deaf(c, monkeypatch)
    deaf_b.down = deaf_c.down = True
    assert not any(await asyncio.gather(ask(a, b), ask(a, c)))
    protocol = a.server.protocol
    await eventually(lambda: a.routing_size() == (2, 2), timeout=3 * TIMEOUT + 3,
                     what="both stale")
    assert a.stats.contacts_dropped == 0
    assert contact_ids(a) == {b.node_id, c.node_id}  # kept: the only way back
    assert a.closest_known_peers(a.node_id) == []  # but offered to nobody
    skipped = a.stats.rpcs_skipped
    assert not await ask(a, b)  # and asked nothing but PINGs
    assert a.stats.rpcs_skipped == skipped + 1
    probes = a.stats.contact_probes
    await eventually(lambda: a.stats.contact_probes >= probes + 2, timeout=5,
                     what="stale contacts PINGed on")

    # A live node arrives (it bootstraps through A): it takes the place of one of them.
    d = await network.add(config=config, bootstrap=[a.address])
    await eventually(lambda: d.node_id in contact_ids(a))
    assert a.stats.contacts_dropped == 1
    assert a.routing_size() == (2, 1)
    (kept,) = contact_ids(a) - {d.node_id}
    back, deaf = (b, deaf_b) if kept == b.node_id else (c, deaf_c)

    # The one kept comes back: its next backoff PING is answered, and it is live again.
    deaf.down = False
    await eventually(lambda: a.routing_size() == (2, 0), timeout=5, what="revived")
    assert a.stats.contacts_revived == 1
    assert {p.node_id for p in a.closest_known_peers(a.node_id)} == {back.node_id, d.node_id}
    assert protocol.miss_count(back.address) == 0
    assert await ask(a, back)


async def test_a_node_whose_table_emptied_finds_its_peers_again(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    """No floor: a partition of A empties its table. Once it heals, A PINGs the addresses
    it remembers (the contacts it dropped, no bootstrap seed: A was the first node) and
    walks from those that answer; the others, which had dropped nobody, see A again."""
    config = DhtConfig(rpc_timeout=TIMEOUT, get_timeout=5.0, maintenance_interval=3600.0,
                       contact_failures=3, keep_contacts=0, min_contacts=4,
                       reconnect_interval=0.5)
    a = await network.add(config=config, bootstrap=[])
    others = [await network.add(config=config) for _ in range(3)]
    await eventually(lambda: len(contact_ids(a)) == 3)
    deaf = Deaf(a, monkeypatch)
    deaf.down = True  # A hears nothing: every RPC it sends goes unanswered
    assert not any(await asyncio.gather(*(ask(a, o) for o in others)))
    await eventually(lambda: not contact_ids(a), timeout=3 * TIMEOUT + 3, what="table empty")
    assert a.stats.contacts_dropped == 3
    assert a.closest_known_peers(a.node_id) == []
    await eventually(lambda: a.stats.reconnect_pings > 0, timeout=5,
                     what="remembered addresses PINGed while partitioned")
    deaf.down = False
    await eventually(lambda: len(contact_ids(a)) == 3, timeout=10, what="peers found again")
    assert a.stats.reconnected >= 1
    assert a.routing_size() == (3, 0)
    # A's puts reach the others again.
    (result,) = await a.put_many([b"\x41" + os.urandom(16)])
    assert result.acks == 3


async def test_a_node_retries_its_seeds_until_they_answer(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node started while its bootstrap seed was unreachable joins once the seed is
    back, without anyone calling ``bootstrap`` again."""
    config = DhtConfig(rpc_timeout=TIMEOUT, get_timeout=5.0, maintenance_interval=3600.0,
                       min_contacts=4, reconnect_interval=0.5)
    seed = await network.add(config=config)
    peer = await network.add(config=config)
    deaf = Deaf(seed, monkeypatch)
    deaf.down = True
    late = await network.add(config=config, bootstrap=[seed.address])
    assert not contact_ids(late)
    await eventually(lambda: late.stats.reconnect_pings >= 2, timeout=5, what="seed retried")
    deaf.down = False
    await eventually(lambda: contact_ids(late) == {seed.node_id, peer.node_id}, timeout=10,
                     what="joined through the seed")


async def test_offer_contact_adds_a_live_node(network: Network) -> None:
    config = DhtConfig(rpc_timeout=TIMEOUT, get_timeout=5.0, maintenance_interval=3600.0)
    a = await network.add(config=config, bootstrap=[])
    b = await network.add(config=config, bootstrap=[])
    assert not contact_ids(a) and not contact_ids(b)
    assert a.offer_contact(b.address)
    await eventually(lambda: contact_ids(a) == {b.node_id}, what="b added")
    # b heard a's PING, validated a's address and added it too
    await eventually(lambda: contact_ids(b) == {a.node_id}, what="a added by b")
    assert a.closest_known_peers(b.node_id, 1)[0].address == b.address
    assert not a.offer_contact(b.address)  # a contact already: nothing sent
    assert not a.offer_contact(a.address)  # ourselves
    dead = await network.add(config=config, bootstrap=[])
    address = dead.address
    await network.stop(dead)
    assert a.offer_contact(address)
    await eventually(lambda: a.stats.reconnect_pings == 2)
    assert not a.offer_contact(address)  # tried a moment ago: it waits out its backoff
    with pytest.raises(ValueError):
        a.offer_contact(("localhost", b.address[1]))  # a host name would block the loop
    with pytest.raises(ValueError):
        a.offer_contact(("127.0.0.1", 0))


async def test_a_restarted_node_at_a_new_address_replaces_its_stale_entry(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same id answering from elsewhere while its old address is silent: a restart.
    The entry moves to the new address, and probes of the old one do not remove it."""
    identity_b = Identity.generate()
    a = await network.add(config=LOSSY)
    b = await network.add(config=LOSSY, identity=identity_b)
    old = b.address
    await network.stop(b)
    assert not await ask(a, b)
    again = await network.add(identity=identity_b, config=LOSSY)
    assert again.address != old
    await eventually(lambda: a.closest_known_peers(again.node_id, 1)[0].address
                     == again.address)
    await eventually(lambda: not a.server.protocol._liveness._probing, timeout=3 * TIMEOUT + 3)
    assert contact_ids(a) == {again.node_id}
    assert a.stats.contacts_dropped == 0
    assert a.stats.returns_without_handoff == 1


def test_remembered_addresses_back_off_and_stay_bounded() -> None:
    memory = AddressMemory(capacity=3, offered_capacity=2, first_retry=1.0)
    for port in range(1, 6):
        memory.saw(("10.0.0.1", port), bytes(20), now=0.0)
    assert len(memory) == 3  # the least recently added went
    assert ("10.0.0.1", 1) not in memory
    memory.offer(("10.0.0.2", 1), now=0.0)
    # offered first, then contacts, most recent first; those in the table are skipped
    due = memory.due(0.0, limit=3, skip=lambda a: a == ("10.0.0.1", 5))
    assert due == [("10.0.0.2", 1), ("10.0.0.1", 4), ("10.0.0.1", 3)]
    assert memory.due(0.5, limit=9, skip=lambda a: False) == [("10.0.0.1", 5)]
    address = ("10.0.0.2", 1)
    waits = []
    now = 1.0
    for _ in range(6):
        memory.failed(address, now, cap=10.0)
        assert not memory.may_try(address, now)
        later = now
        while not memory.may_try(address, later):
            later += 0.5
        waits.append(later - now)
        now = later
    assert waits == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]  # doubling, up to the cap
    memory.answered(address, bytes(20), now)
    assert memory.may_try(address, now)
    memory.offer(("10.0.0.3", 1), now)
    memory.offer(("10.0.0.4", 1), now)
    assert address not in memory  # two offered at most
