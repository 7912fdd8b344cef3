"""The address book and exact closest-contact selection."""

from __future__ import annotations

import os
import random

import pytest

from dag.identity import Identity
from dht import Contact, PeerBook, PeerIdMismatch
from dht.peers import closest, kademlia_key


def test_a_proof_is_tied_to_the_address_it_was_made_at() -> None:
    book = PeerBook()
    pid = Identity.generate().peer_id
    node_id = book.record_proof(pid, "10.0.0.1", 4000, now=1.0)
    assert node_id == pid.kademlia_id()
    assert book.contact(node_id, "10.0.0.1", 4000) == Contact(node_id, "10.0.0.1", 4000, pid)
    # the same id claimed from elsewhere is not proven there
    assert book.contact(node_id, "10.0.0.2", 4000).peer_id is None
    assert book.last_seen(node_id) == 1.0
    book.forget_proof(node_id)
    assert book.proven_peer_id(node_id, "10.0.0.1", 4000) is None


def test_a_proof_for_another_identity_than_claimed_is_refused() -> None:
    book = PeerBook()
    pid = Identity.generate().peer_id
    with pytest.raises(PeerIdMismatch):
        book.record_proof(pid, "10.0.0.1", 4000, now=1.0, expected_node_id=os.urandom(20))
    assert book.proven_peer_id(pid.kademlia_id(), "10.0.0.1", 4000) is None


def test_sightings_are_bounded() -> None:
    book = PeerBook(max_seen=3)
    ids = [os.urandom(20) for _ in range(5)]
    for i, node_id in enumerate(ids):
        book.saw(node_id, "10.0.0.1", 4000 + i, now=float(i))
    assert book.last_seen(ids[0]) is None
    assert book.address_of(ids[4]) == ("10.0.0.1", 4004)


def test_closest_is_exact_xor_order() -> None:
    rng = random.Random(7)
    contacts = [Contact(rng.randbytes(20), "10.0.0.1", 1 + i) for i in range(200)]
    key = rng.randbytes(20)
    brute = sorted(contacts, key=lambda c: c.distance_to(key))[:20]
    assert closest(key, contacts, 20) == brute


def test_kademlia_key_from_bytes_or_peer_id() -> None:
    pid = Identity.generate().peer_id
    assert kademlia_key(pid) == pid.kademlia_id()
    assert kademlia_key(b"k" * 20) == b"k" * 20
    with pytest.raises(ValueError):
        kademlia_key(b"short")
