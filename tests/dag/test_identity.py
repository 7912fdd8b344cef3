"""Peer ids, signatures and key files (dag.identity)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from dag import identity as identity_module
from dag.errors import DagError, InvalidKeyFile
from dag.identity import Identity, InvalidPeerId, PeerId
from dag.multibase import varint

ZERO_SEED = bytes(32)
# The all-zero seed's peer id. Independently known: it is the relay in rust-libp2p's
# hole-punching tutorial, run with `--secret-key-seed 0` (which makes the all-zero seed), and
# appears in many libp2p projects' fixtures.
ZERO_SEED_PEER_ID = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def _hand_built_peer_id(seed: bytes) -> bytes:
    """Build a peer id byte by byte from the spec, sharing no code with dag.identity.

    libp2p PublicKey protobuf: field 1 (Type) is tag (1 << 3 | varint) = 0x08, value
    Ed25519 = 1; field 2 (Data) is tag (2 << 3 | length-delimited) = 0x12, length 32, then
    the raw key. The peer id is the identity multihash of that: code 0x00, length 36.
    """
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key()
    raw_public = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    public_key_pb = bytes([0x08, 0x01, 0x12, 0x20]) + raw_public
    return bytes([0x00, len(public_key_pb)]) + public_key_pb


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


# --- peer ids --------------------------------------------------------------------------------


def test_public_surface() -> None:
    assert identity_module.__all__ == ["Identity", "InvalidPeerId", "PeerId"]
    assert issubclass(InvalidPeerId, DagError)
    assert issubclass(InvalidPeerId, ValueError)


def test_known_answer_all_zero_seed() -> None:
    pid = Identity.from_seed(ZERO_SEED).peer_id
    # RFC 8032-style derivation by cryptography: the public key of the zero seed.
    assert pid.public_key_bytes().hex() == (
        "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29"
    )
    assert pid.raw == _hand_built_peer_id(ZERO_SEED)
    assert len(pid.raw) == 38
    assert str(pid) == ZERO_SEED_PEER_ID


def test_string_round_trip() -> None:
    pid = Identity.generate().peer_id
    text = str(pid)
    assert text.startswith("12D3KooW")
    assert PeerId.parse(text) == pid
    assert PeerId.parse(bytes(pid)) == pid
    assert PeerId.parse(pid) is pid
    assert bytes(pid) == pid.raw
    assert repr(pid) == f"PeerId('{text}')"
    assert hash(PeerId.parse(text)) == hash(pid)


def test_from_public_key_object_and_bytes() -> None:
    key = Ed25519PrivateKey.generate().public_key()
    from_obj = PeerId.from_public_key(key)
    assert from_obj == PeerId.from_public_key(key.public_bytes_raw())
    assert from_obj.public_key_bytes() == key.public_bytes_raw()
    with pytest.raises(InvalidPeerId, match="32 bytes"):
        PeerId.from_public_key(bytes(31))


def test_kademlia_id_is_sha1_of_raw() -> None:
    pid = Identity.from_seed(ZERO_SEED).peer_id
    kid = pid.kademlia_id()
    assert kid == hashlib.sha1(pid.raw).digest()
    assert len(kid) == 20


@given(st.binary(min_size=32, max_size=32))
@settings(max_examples=50, deadline=None)
def test_parse_str_round_trip_property(seed: bytes) -> None:
    pid = Identity.from_seed(seed).peer_id
    assert str(pid).startswith("12D3KooW")
    assert PeerId.parse(str(pid)) == pid
    assert pid.raw == _hand_built_peer_id(seed)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("not a peer id", "invalid base58 character"),
        ("12D3KooW0OIl", "invalid base58 character"),  # 0 O I l are not base58
        ("12D3KooW", "digest is"),  # truncated
        ("x" * 200, "too long"),
        ("bafzaajaiaejca", "multibase/CID"),
    ],
)
def test_invalid_peer_id_strings(text: str, reason: str) -> None:
    with pytest.raises(InvalidPeerId, match=reason):
        PeerId.parse(text)


def _pid_raw(body: bytes, code: int = 0x00) -> bytes:
    return varint(code) + varint(len(body)) + body


KEY = bytes(range(32))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty"),
        # A 'Qm…' id: sha2-256 multihash of an RSA key.
        (_pid_raw(bytes(32), code=0x12), "sha2-256 multihash"),
        (_pid_raw(bytes([0x08, 0x01, 0x12, 0x20]) + KEY, code=0x13), "multihash code 0x13"),
        (bytes([0x00, 0x25, 0x08, 0x01, 0x12, 0x20]) + KEY, "header says 37"),
        (_pid_raw(bytes([0x08, 0x00, 0x12, 0x20]) + KEY), "RSA key"),
        (_pid_raw(bytes([0x08, 0x02, 0x12, 0x21]) + bytes(33)), "Secp256k1 key"),
        (_pid_raw(bytes([0x08, 0x01, 0x12, 0x1F]) + KEY[:31]), "31-byte Ed25519 key"),
        (_pid_raw(bytes([0x12, 0x20]) + KEY), "no key type"),
        (_pid_raw(bytes([0x08, 0x01])), "no key data"),
        (_pid_raw(bytes([0x08, 0x01, 0x12, 0x40]) + KEY), "past end"),
        (_pid_raw(bytes([0x08, 0x01, 0x08, 0x01, 0x12, 0x20]) + KEY), "repeated"),
        (_pid_raw(bytes([0x08, 0x01, 0x12, 0x20]) + KEY + bytes([0x18, 0x01])), "unknown field"),
        # Same key, fields swapped: valid protobuf, but not the one encoding of this key.
        (_pid_raw(bytes([0x12, 0x20]) + KEY + bytes([0x08, 0x01])), "canonical"),
    ],
)
def test_invalid_peer_id_bytes(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidPeerId, match=reason):
        PeerId.parse(raw)


def test_invalid_peer_id_type() -> None:
    with pytest.raises(InvalidPeerId, match="expected str or bytes"):
        PeerId.parse(42)  # type: ignore[arg-type]


# --- signatures ------------------------------------------------------------------------------


def test_sign_and_verify() -> None:
    me = Identity.from_seed(bytes([7]) * 32)
    sig = me.sign(b"hello")
    assert len(sig) == 64
    assert me.peer_id.verify(sig, b"hello")
    # A peer id parsed afresh (a different object, same raw) verifies too, via the cache.
    assert PeerId.parse(str(me.peer_id)).verify(sig, b"hello")


@pytest.mark.parametrize(
    "case", ["tampered message", "flipped bit", "garbage", "short", "long", "empty", "other key"]
)
def test_verify_rejects_bad_signatures(case: str) -> None:
    me = Identity.from_seed(bytes([7]) * 32)
    sig = me.sign(b"hello")
    message = b"hello"
    pid = me.peer_id
    if case == "tampered message":
        message = b"hellp"
    elif case == "flipped bit":
        sig = bytes([sig[0] ^ 1]) + sig[1:]
    elif case == "garbage":
        sig = bytes([0xFF]) * 64
    elif case == "short":
        sig = sig[:63]
    elif case == "long":
        sig = sig + b"\0"
    elif case == "empty":
        sig = b""
    elif case == "other key":
        pid = Identity.from_seed(ZERO_SEED).peer_id
    assert pid.verify(sig, message) is False


def test_verify_with_non_bytes_signature_is_false() -> None:
    pid = Identity.from_seed(ZERO_SEED).peer_id
    assert pid.verify("x" * 64, b"hello") is False  # type: ignore[arg-type]


# --- identities and key files ----------------------------------------------------------------


def test_from_seed_is_deterministic() -> None:
    a, b = Identity.from_seed(ZERO_SEED), Identity.from_seed(ZERO_SEED)
    assert a.peer_id == b.peer_id
    assert a.private_bytes() == ZERO_SEED
    assert ZERO_SEED.hex() not in repr(a)
    assert str(a.peer_id) in repr(a)
    with pytest.raises(ValueError, match="32 bytes"):
        Identity.from_seed(bytes(31))


def test_generate_is_random() -> None:
    assert Identity.generate().peer_id != Identity.generate().peer_id


def test_save_load_round_trip(tmp_path: Path) -> None:
    me = Identity.generate()
    path = tmp_path / "node.key"
    me.save(path)
    loaded = Identity.load(path)
    assert loaded.peer_id == me.peer_id
    assert loaded.private_bytes() == me.private_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Only the key file is left behind, no temp files.
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]


def test_key_file_is_libp2p_private_key_protobuf(tmp_path: Path) -> None:
    """PrivateKey{Type(1)=Ed25519, Data(2)=seed || public}, as go-/js-libp2p write it."""
    me = Identity.from_seed(ZERO_SEED)
    path = tmp_path / "node.key"
    me.save(str(path))
    public = me.peer_id.public_key_bytes()
    assert path.read_bytes() == bytes([0x08, 0x01, 0x12, 0x40]) + ZERO_SEED + public


def test_save_is_0600_despite_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        Identity.generate().save(tmp_path / "k")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600


def test_save_replaces_existing_key(tmp_path: Path) -> None:
    path = tmp_path / "k"
    Identity.generate().save(path)
    second = Identity.generate()
    second.save(path)
    assert Identity.load(path).peer_id == second.peer_id


def test_load_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Identity.load(tmp_path / "missing.key")


def test_load_or_create(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "node.key"
    created = Identity.load_or_create(path)
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Identity.load_or_create(path)
    assert again.peer_id == created.peer_id
    assert sorted(p.name for p in path.parent.iterdir()) == ["node.key"]


def test_load_or_create_keeps_a_key_that_appears_first(tmp_path: Path) -> None:
    """The no-replace path: if another process created the file, its key wins."""
    path = tmp_path / "node.key"
    winner = Identity.generate()
    winner.save(path)
    assert identity_module._write_key_file(str(path), b"loser", replace=False) is False
    assert Identity.load(path).peer_id == winner.peer_id
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]


def test_load_or_create_does_not_replace_a_bad_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "node.key", b"junk")
    with pytest.raises(InvalidKeyFile):
        Identity.load_or_create(path)
    assert path.read_bytes() == b"junk"


def _good_key_file() -> bytes:
    me = Identity.from_seed(ZERO_SEED)
    return bytes([0x08, 0x01, 0x12, 0x40]) + ZERO_SEED + me.peer_id.public_key_bytes()


_RSA_PEM = (
    b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "is empty"),
        (_good_key_file()[:40], "corrupt .*past end"),  # truncated
        (_good_key_file()[:-1], "corrupt .*past end"),
        (_good_key_file() + b"\x00", "corrupt .*field number 0"),
        (b"\xff" * 68, "corrupt"),
        # Hand-built PrivateKey{Type=0 (RSA), Data=<300 bytes>}.
        (bytes([0x08, 0x00, 0x12]) + varint(300) + bytes(300), "wrong key type RSA"),
        (bytes([0x08, 0x02, 0x12, 0x20]) + bytes(32), "wrong key type Secp256k1"),
        (bytes([0x08, 0x03, 0x12, 0x20]) + bytes(32), "wrong key type ECDSA"),
        (bytes([0x08, 0x09, 0x12, 0x20]) + bytes(32), r"wrong key type unknown \(type 9\)"),
        (_RSA_PEM, "wrong key type: .* is a PEM file"),
        (b"CAESQ" + b"A" * 86, "base64"),
        (bytes([0x12, 0x40]) + bytes(64), "no key type"),
        (bytes([0x08, 0x01]), "no key data"),
        (bytes([0x08, 0x01, 0x12, 0x20]) + bytes(32), "is 32 bytes, expected 64"),
        # Seed of all zeros with a public half that belongs to no such seed.
        (bytes([0x08, 0x01, 0x12, 0x40]) + bytes(64), "does not match the private seed"),
        (bytes(70_000), "over 65536 bytes"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_load_rejects_bad_key_files(tmp_path: Path, data: bytes, reason: str) -> None:
    path = _write(tmp_path / "node.key", data)
    with pytest.raises(InvalidKeyFile, match=reason) as info:
        Identity.load(path)
    assert str(path) in str(info.value)


def test_load_accepts_hand_built_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "node.key", _good_key_file())
    assert str(Identity.load(path).peer_id) == ZERO_SEED_PEER_ID


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o644, 0o666, 0o601, 0o610])
def test_load_refuses_key_accessible_to_others(tmp_path: Path, mode: int) -> None:
    path = _write(tmp_path / "node.key", _good_key_file(), mode)
    with pytest.raises(InvalidKeyFile, match=f"permissions 0{mode:o}") as info:
        Identity.load(path)
    assert f"chmod 600 {path}" in str(info.value)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_load_accepts_owner_only_modes(tmp_path: Path, mode: int) -> None:
    path = _write(tmp_path / "node.key", _good_key_file(), mode)
    assert Identity.load(path).private_bytes() == ZERO_SEED


def test_load_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidKeyFile, match="not a regular file"):
        Identity.load(tmp_path)
