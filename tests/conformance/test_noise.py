"""The recorded transport handshake (noise.json): each side, given the recorded static and
ephemeral keys and the other side's recorded records, writes exactly the recorded records,
authenticates the other's identity and opens the first transport record of each
direction."""

from __future__ import annotations

import hmac
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dag import Identity, PeerId, decode
from pulsar.net.errors import HandshakeError
from pulsar.net.framing import FrameDecoder, Kind
from pulsar.net.handshake import STATIC_KEY_CONTEXT, Handshake, StaticKey
from pulsar.net.noise import PROTOCOL_NAME, CipherState
from pulsar.net.secure import RecordDecoder, seal
from pulsar.proto.codec import decode_message

from .generate import HERE, readable

DATA: dict[str, Any] = json.loads((HERE / "noise.json").read_text())


def _key(hex_: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(bytes.fromhex(hex_))


def _side(data: dict[str, Any], name: str) -> Handshake:
    side = data[name]
    identity = Identity.from_seed(bytes.fromhex(side["identity"]["seed"]))
    assert str(identity.peer_id) == side["identity"]["peer_id"]
    static = StaticKey.generate(identity, _key(side["static_private"]))
    assert static.public.hex() == side["static_public"]
    assert _key(side["ephemeral_private"]).public_key().public_bytes_raw().hex() == side[
        "ephemeral_public"]
    fields = side["payload_fields"]
    listen = (fields["listen"][0], fields["listen"][1])
    expected = None
    if name == "dialer":
        expected = PeerId.parse(data["listener"]["identity"]["peer_id"])
    return Handshake(static, listen, initiator=name == "dialer", expected=expected,
                     prologue=bytes.fromhex(data["prologue"]),
                     ephemeral=_key(side["ephemeral_private"]))


def _body(record_hex: str) -> bytes:
    record = bytes.fromhex(record_hex)
    assert int.from_bytes(record[:2], "big") == len(record) - 2, "record length prefix"
    return record[2:]


def replay(data: dict[str, Any], me: str) -> tuple[Handshake, list[bytes]]:
    """Play side ``me`` against the other side's recorded records; returns the handshake
    and the records it wrote (as bytes on the stream)."""
    ours = _side(data, me)
    written: list[bytes] = []
    if me == "dialer":
        first = ours.start()
        assert first is not None
        written.append(len(first).to_bytes(2, "big") + first)
    for step in data["handshake"]:
        if step["from"] == me:
            continue
        try:
            reply = ours.receive(_body(step["record"]))
        except HandshakeError as exc:
            raise AssertionError(f"{me}: {exc}") from None
        if reply is not None:
            written.append(len(reply).to_bytes(2, "big") + reply)
    assert ours.done
    return ours, written


def check_side(data: dict[str, Any], me: str) -> None:
    """Raise AssertionError unless side ``me`` reproduces its records and reads the rest."""
    hs, written = replay(data, me)
    recorded = [bytes.fromhex(s["record"]) for s in data["handshake"] if s["from"] == me]
    assert written == recorded, f"{me} wrote other handshake records"
    other = "listener" if me == "dialer" else "dialer"
    assert hs.their is not None
    assert str(hs.their.peer) == data[other]["identity"]["peer_id"]
    assert readable({"peer": hs.their.peer.raw, "sig": hs.their.sig,
                     "listen": list(hs.their.listen)}) == data[other]["payload_fields"]
    assert hs._noise.handshake_hash.hex() == data["handshake_hash"]
    send, receive = hs.ciphers()
    for record in data["transport"]:
        if record["from"] == me:  # sealed under our next nonce: exactly the recorded bytes
            sealed = bytes(seal(send, bytes.fromhex(record["plaintext"])))
            assert sealed.hex() == record["record"], f"{me} sealed another record"
            continue
        decoder = RecordDecoder()
        plain = b"".join(decoder.open(bytes.fromhex(record["record"]), receive))
        assert decoder.error is None, f"{me} could not open the {other}'s record"
        assert plain.hex() == record["plaintext"]
        frames = FrameDecoder(1 << 20)
        frames.feed(plain)
        (body,) = frames.frames()
        assert body[0] == Kind.DATA
        assert readable(decode_message(body[1:]).to_wire()) == record["message"]


@pytest.mark.parametrize("me", ["dialer", "listener"])
def test_each_side_reproduces_the_transcript(me: str) -> None:
    check_side(DATA, me)


def test_the_transcript_is_the_documented_handshake() -> None:
    assert DATA["protocol"] == PROTOCOL_NAME.decode() == "Noise_XX_25519_ChaChaPoly_SHA256"
    assert bytes.fromhex(DATA["prologue"]) == b"pulsarcast/transport/2"
    sizes = [len(bytes.fromhex(s["record"])) - 2 for s in DATA["handshake"]]
    payloads = [len(bytes.fromhex(s["payload"])) for s in DATA["handshake"]]
    # 1: e; 2: e, encrypted s and payload; 3: encrypted s and payload; 4: an empty record
    assert sizes == [32, 32 + 48 + payloads[1] + 16, 48 + payloads[2] + 16, 16]
    for side, step in (("listener", 1), ("dialer", 2)):
        payload = decode(bytes.fromhex(DATA["handshake"][step]["payload"]))
        assert readable(payload) == DATA[side]["payload_fields"]
        peer = PeerId(payload["peer"])
        static = bytes.fromhex(DATA[side]["static_public"])
        assert peer.verify(payload["sig"], STATIC_KEY_CONTEXT + static)
    assert DATA["dialer"]["payload_fields"]["listen"] == ["", 0]  # a dialer that does not listen


def test_the_transport_records_open_with_keys_derived_by_hand() -> None:
    """What another implementation computes: Split() of the final chaining key, then
    ChaCha20-Poly1305 with the nonce as 32 zero bits and a 64-bit little-endian counter."""
    hs, _ = replay(DATA, "dialer")
    ck = hs._noise._ss.ck
    temp = hmac.digest(ck, b"", "sha256")
    k1 = hmac.digest(temp, b"\x01", "sha256")
    k2 = hmac.digest(temp, k1 + b"\x02", "sha256")
    to_listener, to_dialer = CipherState(k1), CipherState(k2)
    assert to_dialer.decrypt(_body(DATA["handshake"][3]["record"])) == b""  # nonce 0
    for record in DATA["transport"]:
        cipher = to_listener if record["from"] == "dialer" else to_dialer
        assert cipher.n == record["nonce"]
        assert cipher.decrypt(_body(record["record"])).hex() == record["plaintext"]


@pytest.mark.parametrize("me", ["dialer", "listener"])
def test_a_changed_byte_fails_the_replay(me: str) -> None:
    for index in range(len(DATA["handshake"])):
        for position in (2, 12, -1):
            changed = json.loads(json.dumps(DATA))
            record = bytearray(bytes.fromhex(changed["handshake"][index]["record"]))
            record[position] ^= 0x01
            changed["handshake"][index]["record"] = record.hex()
            with pytest.raises(AssertionError):
                check_side(changed, me)
    for index in range(len(DATA["transport"])):
        changed = json.loads(json.dumps(DATA))
        record = bytearray(bytes.fromhex(changed["transport"][index]["record"]))
        record[-5] ^= 0x01
        changed["transport"][index]["record"] = record.hex()
        if changed["transport"][index]["from"] != me:
            with pytest.raises(AssertionError):
                check_side(changed, me)
