"""Our Noise XX reproduces the published Noise_XX_25519_ChaChaPoly_SHA256 vectors byte for
byte: every handshake message and every transport message, both directions, with the fixed
static and ephemeral keys and the prologue of each record."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from pulsar.net.noise import PROTOCOL_NAME, XX, HandshakeState, NoiseError

FILE = "XX_25519_ChaChaPoly_SHA256.txt"


def _candidates() -> list[Path]:
    here = Path(__file__).resolve()
    return [p / "shared" / "conformance" / "noise" / FILE for p in here.parents] + [
        Path("/work/shared/conformance/noise") / FILE
    ]


def load_vectors() -> list[dict[str, str]]:
    path = next((p for p in _candidates() if p.is_file()), None)
    if path is None:
        pytest.skip(f"{FILE} not found beside the checkout")
    records: list[dict[str, str]] = []
    for block in path.read_text().split("\n\n"):
        fields = dict(
            line.split("=", 1) for line in block.strip().splitlines() if "=" in line
        )
        if fields:
            records.append(fields)
    return records


RECORDS = load_vectors()


def _key(hex_: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(bytes.fromhex(hex_))


def test_there_are_vectors_and_all_are_ours() -> None:
    assert len(RECORDS) >= 4
    assert all(r["handshake"] == PROTOCOL_NAME.decode() for r in RECORDS)
    assert any("prologue" in r for r in RECORDS)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"prologue={r.get('prologue', '')}")
def test_vector_reproduced_byte_for_byte(record: dict[str, str]) -> None:
    prologue = bytes.fromhex(record.get("prologue", ""))
    init = HandshakeState(
        initiator=True, static=_key(record["init_static"]), prologue=prologue,
        ephemeral=_key(record["gen_init_ephemeral"]),
    )
    resp = HandshakeState(
        initiator=False, static=_key(record["resp_static"]), prologue=prologue,
        ephemeral=_key(record["gen_resp_ephemeral"]),
    )
    count = sum(1 for k in record if k.startswith("msg_") and k.endswith("_ciphertext"))
    assert count > len(XX)
    ciphers = None
    for i in range(count):
        payload = bytes.fromhex(record[f"msg_{i}_payload"])
        expected = bytes.fromhex(record[f"msg_{i}_ciphertext"])
        if i < len(XX):
            writer, reader = (init, resp) if i % 2 == 0 else (resp, init)
            message = writer.write_message(payload)
            assert message == expected, f"handshake message {i}"
            assert reader.read_message(message) == payload
            if i == len(XX) - 1:
                assert init.handshake_hash == resp.handshake_hash
                ciphers = {"init": init.split(), "resp": resp.split()}
        else:
            assert ciphers is not None
            # After the split the writers alternate, the initiator first (the vectors'
            # convention for one-way-or-not patterns alike).
            first = (i - len(XX)) % 2 == 0
            sender, receiver = ("init", "resp") if first else ("resp", "init")
            message = ciphers[sender][0].encrypt(payload)
            assert message == expected, f"transport message {i}"
            assert ciphers[receiver][1].decrypt(message) == payload
    assert init.remote_static == _key(record["resp_static"]).public_key().public_bytes_raw()
    assert resp.remote_static == _key(record["init_static"]).public_key().public_bytes_raw()


def test_tampered_handshake_message_does_not_authenticate() -> None:
    init = HandshakeState(initiator=True, static=X25519PrivateKey.generate())
    resp = HandshakeState(initiator=False, static=X25519PrivateKey.generate())
    resp.read_message(init.write_message())
    msg = bytearray(resp.write_message(b"hi"))
    msg[40] ^= 1
    with pytest.raises(NoiseError, match="bad MAC"):
        init.read_message(bytes(msg))


def test_transport_replay_and_reorder_fail() -> None:
    init = HandshakeState(initiator=True, static=X25519PrivateKey.generate())
    resp = HandshakeState(initiator=False, static=X25519PrivateKey.generate())
    resp.read_message(init.write_message())
    init.read_message(resp.write_message())
    resp.read_message(init.write_message())
    (send, _), (_, recv) = init.split(), resp.split()
    first, second = send.encrypt(b"one"), send.encrypt(b"two")
    assert recv.decrypt(first) == b"one"
    with pytest.raises(NoiseError):
        recv.decrypt(first)  # replayed
    fresh = resp.split()[1]
    with pytest.raises(NoiseError):
        fresh.decrypt(second)  # out of order


def test_wrong_turns_are_refused() -> None:
    init = HandshakeState(initiator=True, static=X25519PrivateKey.generate())
    with pytest.raises(NoiseError):
        init.read_message(b"\x00" * 32)
    resp = HandshakeState(initiator=False, static=X25519PrivateKey.generate())
    with pytest.raises(NoiseError):
        resp.write_message()
    with pytest.raises(NoiseError, match="too short"):
        resp.read_message(b"\x01" * 31)
