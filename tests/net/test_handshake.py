"""The handshake state machine, two of them joined back to back (no sockets)."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dag import Identity, encode
from dag.codec import encode_reference_free
from pulsar.net import HandshakeError
from pulsar.net.handshake import (
    PROLOGUE_PLAINTEXT,
    STATIC_KEY_CONTEXT,
    Handshake,
    Payload,
    Phase,
    StaticKey,
)

A = Identity.from_seed(b"\x01" * 32)
B = Identity.from_seed(b"\x02" * 32)
C = Identity.from_seed(b"\x03" * 32)
KEY_A, KEY_B, KEY_C = StaticKey.generate(A), StaticKey.generate(B), StaticKey.generate(C)


def dialer(key: StaticKey = KEY_A, **kw: Any) -> Handshake:
    return Handshake(key, kw.pop("listen", ("", 0)), initiator=True, **kw)


def listener(key: StaticKey = KEY_B, **kw: Any) -> Handshake:
    return Handshake(key, kw.pop("listen", ("", 0)), initiator=False, **kw)


def run(a: Handshake, b: Handshake) -> None:
    """Message 1, 2, 3, then the listener's empty first record."""
    first = a.start()
    assert first is not None and b.start() is None
    second = b.receive(first)
    assert second is not None
    third = a.receive(second)
    assert third is not None and not a.done and a.peer is not None
    ok = b.receive(third)
    assert ok is not None and b.done
    assert a.receive(ok) is None and a.done


def test_handshake_completes_names_the_peers_and_keys_match() -> None:
    a = dialer(listen=("10.0.0.1", 4001), expected=B.peer_id)
    b = listener()
    run(a, b)
    assert a.peer == B.peer_id and b.peer == A.peer_id
    assert b.their is not None and b.their.listen == ("10.0.0.1", 4001)
    (a_send, a_recv), (b_send, b_recv) = a.ciphers(), b.ciphers()
    assert b_recv.decrypt(a_send.encrypt(b"to b")) == b"to b"
    assert a_recv.decrypt(b_send.encrypt(b"to a")) == b"to a"


def test_the_transitions_are_the_documented_ones() -> None:
    a, b = dialer(), listener()
    assert (a.phase, b.phase) == (Phase.START, Phase.AWAIT_1)
    first = a.start()
    assert first is not None and a.phase is Phase.AWAIT_2
    assert len(first) == 32  # e only: nothing in the clear but an ephemeral key
    second = b.receive(first)
    assert second is not None and b.phase is Phase.AWAIT_3
    third = a.receive(second)
    assert third is not None and a.phase is Phase.AWAIT_OK
    with pytest.raises(HandshakeError, match="not complete"):
        a.ciphers()
    ok = b.receive(third)
    assert ok is not None and len(ok) == 16  # an empty plaintext and its tag
    a.receive(ok)
    assert a.phase is b.phase is Phase.DONE


def test_payload_binds_the_static_key_to_the_identity() -> None:
    assert KEY_A.identity is A
    assert A.peer_id.verify(KEY_A.signature, STATIC_KEY_CONTEXT + KEY_A.public)
    assert STATIC_KEY_CONTEXT == b"noise-libp2p-static-key:"


def test_connection_to_self_is_refused() -> None:
    a, b = dialer(KEY_A), listener(StaticKey.generate(A))
    second = b.receive(a.start() or b"")
    assert second is not None
    with pytest.raises(HandshakeError, match="connection to self"):
        a.receive(second)


def test_reaching_another_peer_than_dialed_is_refused() -> None:
    a, c = dialer(expected=B.peer_id), listener(KEY_C)
    second = c.receive(a.start() or b"")
    assert second is not None
    with pytest.raises(HandshakeError, match=r"dialed .* but reached"):
        a.receive(second)


def _forged(claimed: Identity, signer: Identity) -> StaticKey:
    """A static key whose payload claims ``claimed`` but which ``signer`` signed."""
    private = X25519PrivateKey.generate()
    public = private.public_key().public_bytes_raw()
    return StaticKey(claimed, private, public, signer.sign(STATIC_KEY_CONTEXT + public))


def test_listener_with_a_static_key_signed_by_another_identity_is_refused() -> None:
    """A man in the middle that answers as B with its own static key cannot produce B's
    signature over that key."""
    a, mitm = dialer(expected=B.peer_id), listener(_forged(B, C))
    second = mitm.receive(a.start() or b"")
    assert second is not None
    with pytest.raises(HandshakeError, match=r"static key signature of .* does not verify"):
        a.receive(second)


def test_dialer_with_a_static_key_signed_by_another_identity_is_refused() -> None:
    a, b = dialer(_forged(A, C)), listener()
    second = b.receive(a.start() or b"")
    third = a.receive(second or b"")
    assert third is not None
    with pytest.raises(HandshakeError, match="does not verify"):
        b.receive(third)
    assert not b.done


def test_a_signature_is_not_transferable_to_another_static_key() -> None:
    """A's genuine signature, replayed with a static key it did not sign."""
    private = X25519PrivateKey.generate()
    stolen = StaticKey(A, private, private.public_key().public_bytes_raw(), KEY_A.signature)
    a, b = dialer(stolen), listener()
    third = a.receive(b.receive(a.start() or b"") or b"")
    with pytest.raises(HandshakeError, match="does not verify"):
        b.receive(third or b"")


def test_tampered_handshake_message_is_refused() -> None:
    a, b = dialer(), listener()
    second = bytearray(b.receive(a.start() or b"") or b"")
    second[-1] ^= 1
    with pytest.raises(HandshakeError, match=r"handshake message 2: .*bad MAC"):
        a.receive(bytes(second))


def test_handshake_messages_of_another_session_do_not_fit() -> None:
    """Message 3 recorded from one session, replayed into another listener."""
    a1, b1 = dialer(), listener()
    third = a1.receive(b1.receive(a1.start() or b"") or b"")
    b2 = listener()
    a2 = dialer()
    b2.receive(a2.start() or b"")
    with pytest.raises(HandshakeError, match="handshake message 3"):
        b2.receive(third or b"")


def test_plaintext_and_encrypted_transports_do_not_complete_a_handshake() -> None:
    a, b = dialer(prologue=PROLOGUE_PLAINTEXT), listener()
    second = b.receive(a.start() or b"")
    with pytest.raises(HandshakeError, match="handshake message 2"):
        a.receive(second or b"")


def test_message_1_with_a_payload_is_refused() -> None:
    from pulsar.net.noise import HandshakeState

    raw = HandshakeState(initiator=True, static=X25519PrivateKey.generate())
    with pytest.raises(HandshakeError, match="carries a payload"):
        listener().receive(raw.write_message(b"hello"))


def test_empty_message_names_the_old_protocol() -> None:
    with pytest.raises(HandshakeError, match="transport v1 peer"):
        listener().receive(b"")


def test_first_record_must_be_empty_and_authentic() -> None:
    a, b = dialer(), listener()
    third = a.receive(b.receive(a.start() or b"") or b"")
    ok = b.receive(third or b"")
    assert ok is not None
    with pytest.raises(HandshakeError, match=r"first record: .*bad MAC"):
        a.receive(ok[:-1] + bytes([ok[-1] ^ 1]))
    a2, b2 = dialer(), listener()
    b2.receive(a2.receive(b2.receive(a2.start() or b"") or b"") or b"")
    send = b2.ciphers()[0]
    send.n = 0  # as if the listener had sent data in place of its empty first record
    with pytest.raises(HandshakeError, match="not empty"):
        a2.receive(send.encrypt(b"data too early"))


def test_records_after_the_handshake_are_not_its_business() -> None:
    a, b = dialer(), listener()
    run(a, b)
    with pytest.raises(HandshakeError, match="already complete"):
        a.receive(b"\x00" * 48)
    with pytest.raises(HandshakeError, match="already complete"):
        b.receive(b"\x00" * 48)


def _payload(**change: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "peer": B.peer_id.raw, "sig": b"\x09" * 64, "listen": ["127.0.0.1", 4001],
    }
    msg.update(change)
    return {k: v for k, v in msg.items() if v is not None}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (encode(_payload(extra=1)), "unexpected \\['extra'\\]"),
        (encode(_payload(listen=None)), "missing \\['listen'\\]"),
        (encode(_payload(peer=b"\x00\x24" + b"\x00" * 36)), "not a valid peer id"),
        (encode(_payload(peer="12D3KooW")), "'peer' must be bytes"),
        (encode(_payload(sig=b"\x01" * 63)), "'sig' must be 64 bytes"),
        (encode(_payload(listen=["h", 1, 2])), "'listen' must be"),
        (encode(_payload(listen=["h", "1"])), "'listen' must be"),
        (encode(_payload(listen=["h", 70000])), "out of range"),
        (encode(_payload(listen=["h" * 300, 1])), "longer than"),
        (encode([1, 2]), "must be a map"),
        (b"\xff\x00garbage", "not canonical DAG-CBOR"),
        (b"", "not canonical DAG-CBOR"),
    ],
)
def test_malformed_payload_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(HandshakeError, match=reason):
        Payload.parse(body)


def test_non_canonical_payload_is_refused() -> None:
    """Keys out of canonical order: same map, different bytes; strict decoding refuses it."""
    canonical = encode_reference_free(_payload())
    assert Payload.parse(canonical).peer == B.peer_id
    # Canonical order is shortest key first (sig, peer, listen); write it reversed.
    items = [("listen", ["127.0.0.1", 4001]), ("peer", B.peer_id.raw), ("sig", b"\x09" * 64)]
    body = bytes([0xA3]) + b"".join(
        encode_reference_free(k) + encode_reference_free(v) for k, v in items
    )
    with pytest.raises(HandshakeError, match="not canonical"):
        Payload.parse(body)
