"""Local routing queries for the tree layer, and the proof hook of the address book."""

from __future__ import annotations

import pytest

from dag.identity import Identity, PeerId
from dht import Contact, DhtError, PeerIdMismatch, dht_key
from tests.waiting import eventually

from .conftest import Network

pytestmark = pytest.mark.slow


async def test_closest_known_peers_is_exact_and_local(
        network: Network, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = await network.grow(12)
    me = nodes[0]
    await eventually(lambda: len(me.closest_known_peers(me.node_id, 50)) == 11)
    sent: list[object] = []
    transport = me.server.protocol.transport
    monkeypatch.setattr(transport, "sendto", lambda *a: sent.append(a))
    for target in nodes[1:4]:
        peers = me.closest_known_peers(target.peer_id, 5)
        others = sorted(nodes[1:], key=lambda n: int.from_bytes(n.node_id, "big")
                        ^ int.from_bytes(target.node_id, "big"))[:5]
        assert [p.node_id for p in peers] == [n.node_id for n in others]
        assert [p.address for p in peers] == [n.address for n in others]
        assert peers[0].distance_to(target.node_id) == 0
    raw_key = b"\x00" * 20
    assert len(me.closest_known_peers(raw_key)) == 11  # k defaults to ksize (20)
    assert sent == []  # no network traffic
    assert all(p.peer_id is None for p in me.closest_known_peers(raw_key))  # nothing proven


async def test_identify_runs_the_prover_once_and_checks_it(network: Network) -> None:
    identities = [Identity.generate() for _ in range(3)]
    nodes = [await network.add(identity=i) for i in identities]
    me = nodes[0]
    by_address = {n.address: n.peer_id for n in nodes}
    calls: list[tuple[str, int]] = []

    async def prover(host: str, port: int) -> PeerId:
        calls.append((host, port))
        return by_address[(host, port)]

    contact = me.closest_known_peers(nodes[1].node_id, 1)[0]
    with pytest.raises(DhtError, match="prover"):
        await me.identify(contact)
    me.set_prover(prover)
    assert await me.identify(contact) == nodes[1].peer_id
    assert await me.identify(contact) == nodes[1].peer_id
    assert calls == [contact.address]  # proven once, then remembered
    (again,) = me.closest_known_peers(nodes[1].node_id, 1)
    assert again.peer_id == nodes[1].peer_id

    async def liar(host: str, port: int) -> PeerId:
        return Identity.generate().peer_id

    me.set_prover(liar)
    other = me.closest_known_peers(nodes[2].node_id, 1)[0]
    with pytest.raises(PeerIdMismatch):
        await me.identify(other)
    assert me.closest_known_peers(nodes[2].node_id, 1)[0].peer_id is None


async def test_a_proof_from_the_transport_adds_the_peer(network: Network) -> None:
    a = await network.add()
    b = await network.add(bootstrap=[])  # has not met anyone over UDP
    contact = a.record_proof(b.peer_id, *b.address)
    assert contact == Contact(b.node_id, *b.address, b.peer_id)
    assert a.closest_known_peers(b.node_id, 1) == [contact]
    # the same id claimed from another address is not proven there
    assert a.peers.proven_peer_id(b.node_id, "127.0.0.1", 1) is None
    # and the routing table is a real one: A can now store at B
    cid = await a.put(b"\x41p")
    assert b.records.get(dht_key(cid)) == b"\x41p"
