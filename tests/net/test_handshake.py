"""The handshake state machine, two of them joined back to back (no sockets)."""

from __future__ import annotations

from typing import Any

import pytest

from dag import Identity, encode
from dag.codec import encode_reference_free
from pulsar.net import HandshakeError
from pulsar.net.handshake import (
    AUTH_CONTEXT,
    Handshake,
    HandshakeState,
    Hello,
    signed_message,
)

A = Identity.from_seed(b"\x01" * 32)
B = Identity.from_seed(b"\x02" * 32)
C = Identity.from_seed(b"\x03" * 32)


def run(a: Handshake, b: Handshake) -> None:
    """Both send HELLO at once, then each answers with AUTH."""
    hello_a, hello_b = a.hello(), b.hello()
    auth_a = a.receive(hello_b)
    auth_b = b.receive(hello_a)
    assert auth_a is not None and auth_b is not None
    assert a.receive(auth_b) is None
    assert b.receive(auth_a) is None


def test_handshake_completes_and_names_the_peer() -> None:
    a = Handshake(A, ("10.0.0.1", 4001), expected=B.peer_id)
    b = Handshake(B, ("", 0))
    run(a, b)
    assert a.done and b.done
    assert a.their_hello is not None and b.their_hello is not None
    assert a.their_hello.peer == B.peer_id
    assert b.their_hello.peer == A.peer_id
    assert b.their_hello.listen == ("10.0.0.1", 4001)
    assert a.their_hello.peer.kademlia_id() == B.peer_id.kademlia_id()


def test_signed_message_layout() -> None:
    mine, theirs = b"m" * 32, b"t" * 32
    assert signed_message(theirs, mine, B.peer_id) == (
        b"pulsarcast/handshake/v1" + theirs + mine + B.peer_id.raw
    )
    assert AUTH_CONTEXT == b"pulsarcast/handshake/v1"


def test_connection_to_self_is_refused() -> None:
    a = Handshake(A, ("", 0))
    with pytest.raises(HandshakeError, match="connection to self"):
        a.receive(Handshake(A, ("", 0)).hello())


def test_reaching_another_peer_than_dialed_is_refused() -> None:
    a = Handshake(A, ("", 0), expected=B.peer_id)
    with pytest.raises(HandshakeError, match="dialed"):
        a.receive(Handshake(C, ("", 0)).hello())


def test_auth_from_another_connection_does_not_verify() -> None:
    """A signature is bound to both nonces: an AUTH recorded on one connection, replayed on
    another (even with the same HELLO), fails against the new nonce."""
    a1, b1 = Handshake(A, ("", 0)), Handshake(B, ("", 0))
    a1.receive(b1.hello())
    recorded = b1.receive(a1.hello())
    assert recorded is not None
    a2 = Handshake(A, ("", 0))
    a2.receive(b1.hello())  # the attacker replays B's HELLO...
    with pytest.raises(HandshakeError, match="does not verify"):
        a2.receive(recorded)  # ...and B's AUTH


def test_auth_for_another_receiver_does_not_verify() -> None:
    """B's AUTH addressed to C cannot be relayed to A, even with A's nonce."""
    a = Handshake(A, ("", 0), nonce=b"\x05" * 32)
    c = Handshake(C, ("", 0), nonce=b"\x05" * 32)  # the relay copies A's nonce to C
    b = Handshake(B, ("", 0))
    a.receive(b.hello())
    auth_for_c = b.receive(c.hello())
    assert auth_for_c is not None
    with pytest.raises(HandshakeError, match="does not verify"):
        a.receive(auth_for_c)


def test_tampered_signature_is_refused() -> None:
    a, b = Handshake(A, ("", 0)), Handshake(B, ("", 0))
    a.receive(b.hello())
    auth = b.receive(a.hello())
    assert auth is not None
    tampered = auth[:-1] + bytes([auth[-1] ^ 1])
    with pytest.raises(HandshakeError, match="does not verify"):
        a.receive(tampered)
    assert a.state is HandshakeState.AUTH_SENT


def test_auth_before_hello_is_refused() -> None:
    a, b = Handshake(A, ("", 0)), Handshake(B, ("", 0))
    b.receive(a.hello())
    auth = Handshake(B, ("", 0)).receive(a.hello())
    assert auth is not None
    with pytest.raises(HandshakeError, match="HELLO fields wrong"):
        Handshake(A, ("", 0)).receive(auth)


def test_frames_after_the_handshake_are_not_its_business() -> None:
    a, b = Handshake(A, ("", 0)), Handshake(B, ("", 0))
    run(a, b)
    with pytest.raises(HandshakeError, match="already complete"):
        a.receive(b.hello())


def _hello(**change: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "v": 1, "peer": B.peer_id.raw, "nonce": b"\x09" * 32, "listen": ["127.0.0.1", 4001],
    }
    msg.update(change)
    return {k: v for k, v in msg.items() if v is not None}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (encode(_hello(extra=1)), "unexpected \\['extra'\\]"),
        (encode(_hello(listen=None)), "missing \\['listen'\\]"),
        (encode(_hello(v=2)), "version 2"),
        (encode(_hello(v=True)), "'v' must be an integer"),
        (encode(_hello(peer=b"\x00\x24" + b"\x00" * 36)), "not a valid peer id"),
        (encode(_hello(peer="12D3KooW")), "'peer' must be bytes"),
        (encode(_hello(nonce=b"\x01" * 31)), "'nonce' must be 32 bytes"),
        (encode(_hello(listen=["h", 1, 2])), "'listen' must be"),
        (encode(_hello(listen=["h", "1"])), "'listen' must be"),
        (encode(_hello(listen=["h", 70000])), "out of range"),
        (encode(_hello(listen=["h" * 300, 1])), "longer than"),
        (encode([1, 2]), "must be a map"),
        (b"\xff\x00garbage", "not canonical DAG-CBOR"),
        (b"", "not canonical DAG-CBOR"),
    ],
)
def test_malformed_hello_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(HandshakeError, match=reason):
        Handshake(A, ("", 0)).receive(body)


def test_non_canonical_hello_is_refused() -> None:
    """Keys out of canonical order: same map, different bytes; strict decoding refuses it."""
    canonical = encode_reference_free(_hello())
    assert Hello.parse(canonical).peer == B.peer_id
    # Canonical order is shortest key first (v, peer, nonce, listen); write it reversed.
    items = [("listen", ["127.0.0.1", 4001]), ("nonce", b"\x09" * 32),
             ("peer", B.peer_id.raw), ("v", 1)]
    body = bytes([0xA4]) + b"".join(
        encode_reference_free(k) + encode_reference_free(v) for k, v in items
    )
    with pytest.raises(HandshakeError, match="not canonical"):
        Handshake(A, ("", 0)).receive(body)
