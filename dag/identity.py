"""Ed25519 identities, libp2p peer ids and the key file a node keeps on disk.

Pulsarcast names peers the way libp2p does, so its ids can be read by libp2p tooling and
compared with ids printed elsewhere: a peer id is the *identity* multihash of the
protobuf-encoded public key::

    0x00 0x24                 identity multihash, 36-byte digest
      0x08 0x01               PublicKey.Type = Ed25519 (field 1, varint)
      0x12 0x20 <32 bytes>    PublicKey.Data = the raw public key (field 2, bytes)

38 bytes, printed base58btc, which is why every id starts ``12D3KooW``. Because the key is
*inside* the id, a signature can be checked against a peer id with no lookup. Only Ed25519 is
supported: RSA and secp256k1 peers hash their (large) keys into a sha2-256 multihash, so their
ids do not carry the key and would need a key exchange we do not have.

One key has exactly one peer id: :class:`PeerId` accepts only the canonical encoding above
(protobuf would allow the two fields in either order, or other encodings of the same values),
so equality of ids is equality of keys. The Kademlia node id is ``sha1(peer id bytes)``, as
the ``kademlia`` package uses 160-bit ids.

The key file is the libp2p ``PrivateKey`` protobuf {Type = Ed25519, Data = seed || public key},
the same 68 bytes go-libp2p and js-libp2p write, stored raw. It is written 0600 from the first
byte and replaced atomically, and is refused on load if group or others may access it, like
ssh does.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import shlex
import stat
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from nacl.bindings import crypto_sign_open as _sodium_open
from nacl.exceptions import BadSignatureError

from .errors import DagError, InvalidKeyFile
from .multibase import b58decode, b58encode, read_varint

__all__ = ["Identity", "InvalidPeerId", "PeerId"]


class InvalidPeerId(DagError):
    """A peer id that does not parse, or names a key type pulsarcast cannot verify."""


# libp2p's crypto.proto KeyType enum; named in error messages so a user sees *which* key
# they handed us rather than a number.
_KEY_TYPES: Final = {0: "RSA", 1: "Ed25519", 2: "Secp256k1", 3: "ECDSA"}
_ED25519: Final = 1
_KEY_LEN: Final = 32
_SIG_LEN: Final = 64

_IDENTITY_MH: Final = 0x00
_SHA2_256_MH: Final = 0x12
# The fixed head of every Ed25519 peer id: multihash (identity, 36) + PublicKey{Type, Data len}.
_PEER_ID_PREFIX: Final = bytes([_IDENTITY_MH, 36, 0x08, _ED25519, 0x12, _KEY_LEN])
_PEER_ID_LEN: Final = len(_PEER_ID_PREFIX) + _KEY_LEN  # 38
_KEY_OFFSET: Final = len(_PEER_ID_PREFIX)
# base58 of 38 bytes is at most 52 characters; refuse long strings before decoding, since
# base58 decoding is quadratic and the string may come from the network.
_MAX_PEER_ID_CHARS: Final = 128
# Multibase prefixes a CIDv1 peer id ("bafz…", "k51…") or other encoding might start with; a
# base58btc Ed25519 id always starts "1", so these only ever appear on ids we reject.
_MULTIBASE_PREFIXES: Final = frozenset("bBkKfFuUmMzZ")

# PrivateKey{Type = Ed25519, Data = 64 bytes}: the whole key file.
_KEY_FILE_PREFIX: Final = bytes([0x08, _ED25519, 0x12, 2 * _KEY_LEN])
_KEY_FILE_LEN: Final = len(_KEY_FILE_PREFIX) + 2 * _KEY_LEN  # 68
# Anything longer is not ours; an RSA-4096 key file is ~2.4 KB, so this still lets us read far
# enough to name the key type instead of just saying "too long".
_MAX_KEY_FILE_BYTES: Final = 64 * 1024



@dataclass(frozen=True, slots=True)
class PeerId:
    """A validated libp2p peer id of an Ed25519 key. Build with :meth:`parse` or
    :meth:`from_public_key`; equal ids are equal keys."""

    raw: bytes

    def __post_init__(self) -> None:
        _validate_peer_id(self.raw)

    @classmethod
    def parse(cls, value: str | bytes | PeerId) -> PeerId:
        """Parse a base58btc string (``12D3KooW…``) or the raw 38 bytes. Raises
        :class:`InvalidPeerId` with the reason."""
        if isinstance(value, PeerId):
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            return cls(bytes(value))
        if not isinstance(value, str):
            raise InvalidPeerId(f"expected str or bytes, got {type(value).__name__}")
        try:
            return cls(_decode_peer_id_string(value))
        except InvalidPeerId as exc:
            if value[:1] in _MULTIBASE_PREFIXES:
                raise InvalidPeerId(
                    f"{exc} (multibase/CID forms of peer ids are not accepted; use '12D3KooW…')"
                ) from None
            raise

    @classmethod
    def from_public_key(cls, key: Ed25519PublicKey | bytes) -> PeerId:
        """The peer id of an Ed25519 public key object or its 32 raw bytes."""
        if isinstance(key, Ed25519PublicKey):
            data = key.public_bytes_raw()
        elif isinstance(key, bytes | bytearray | memoryview):
            data = bytes(key)
        else:
            raise TypeError(f"expected Ed25519PublicKey or bytes, got {type(key).__name__}")
        if len(data) != _KEY_LEN:
            raise InvalidPeerId(f"an Ed25519 public key is {_KEY_LEN} bytes, got {len(data)}")
        return cls(_PEER_ID_PREFIX + data)

    def public_key_bytes(self) -> bytes:
        """The 32-byte raw Ed25519 public key carried inside the id."""
        return self.raw[len(_PEER_ID_PREFIX) :]

    def verify(self, signature: bytes, message: bytes) -> bool:
        """True when ``signature`` is this peer's Ed25519 signature of ``message``.

        A wrong, truncated or garbage signature returns False rather than raising: the caller
        is judging input from the network, and "does not verify" is the whole answer.

        This runs on every event on every hop, and the Ed25519 check dominates it, so it goes
        through libsodium (PyNaCl), measured here at ~110 µs a check against ~185 µs through
        ``cryptography``'s OpenSSL binding. Keys are still generated and stored with
        ``cryptography``; both implement RFC 8032 and agree on every valid signature."""
        if not isinstance(signature, bytes | bytearray | memoryview) or len(signature) != _SIG_LEN:
            return False
        try:
            _sodium_open(bytes(signature) + message, self.raw[_KEY_OFFSET:])
        except (BadSignatureError, ValueError, TypeError):
            return False
        return True

    def kademlia_id(self) -> bytes:
        """The 20-byte Kademlia node id: sha1 of the peer id bytes."""
        return hashlib.sha1(self.raw).digest()

    def __bytes__(self) -> bytes:
        return self.raw

    def __str__(self) -> str:
        return b58encode(self.raw)

    def __repr__(self) -> str:
        return f"PeerId('{self}')"


class Identity:
    """An Ed25519 keypair and the peer id derived from it."""

    __slots__ = ("_key", "_peer_id")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self._peer_id = PeerId.from_public_key(key.public_key())

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity (from the OS CSPRNG)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """The identity of a 32-byte private seed; deterministic, for tests and the
        simulator (a seed is the whole secret: never derive one from something guessable in
        production)."""
        if not isinstance(seed, bytes | bytearray | memoryview):
            raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
        if len(seed) != _KEY_LEN:
            raise ValueError(f"an Ed25519 seed is {_KEY_LEN} bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @property
    def peer_id(self) -> PeerId:
        return self._peer_id

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return self._key.sign(message)

    def private_bytes(self) -> bytes:
        """The 32-byte private seed. Secret: do not log it."""
        return self._key.private_bytes_raw()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key file at ``path``, atomically replacing any file there.

        The file is created 0600 (never briefly readable by others), fsynced, then renamed
        over ``path``, so a crash leaves either the old key or the new one, never half of
        one."""
        _write_key_file(os.fspath(path), self._key_file_bytes(), replace=True)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Read and check a key file. A missing file raises :class:`FileNotFoundError`; a
        corrupt, foreign or unsafely readable one raises :class:`InvalidKeyFile` saying what
        is wrong and how to fix it."""
        name = os.fspath(path)
        return cls(_parse_key_file(_read_key_file(name), name))

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """Load the key file at ``path``, or create it (and its parent directories, 0700)
        with a new identity when it does not exist.

        Two processes starting at once on the same path end up with the same identity: the
        new file is linked into place only if nothing is there yet, and the loser loads the
        winner's key."""
        name = os.fspath(path)
        try:
            return cls.load(name)
        except FileNotFoundError:
            pass
        parent = os.path.dirname(os.path.abspath(name))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        identity = cls.generate()
        if _write_key_file(name, identity._key_file_bytes(), replace=False):
            return identity
        return cls.load(name)

    def _key_file_bytes(self) -> bytes:
        return _KEY_FILE_PREFIX + self.private_bytes() + self._peer_id.public_key_bytes()

    def __repr__(self) -> str:
        # Deliberately without the seed, so an identity in a log or traceback leaks nothing.
        return f"Identity(peer_id={self._peer_id})"


# --- peer id validation ----------------------------------------------------------------------


def _validate_peer_id(raw: object) -> None:
    if not isinstance(raw, bytes):
        raise InvalidPeerId(f"peer id bytes must be bytes, got {type(raw).__name__}")
    # Fast path: every valid id has the same 6-byte head, and ids arrive on every event.
    if len(raw) == _PEER_ID_LEN and raw.startswith(_PEER_ID_PREFIX):
        return
    raise InvalidPeerId(_diagnose_peer_id(raw))


def _diagnose_peer_id(raw: bytes) -> str:
    """Why ``raw`` is not a canonical Ed25519 peer id, as a message for a human."""
    if not raw:
        return "empty peer id"
    try:
        code, off = read_varint(raw, 0)
        if code == _SHA2_256_MH:
            return (
                "peer id is a sha2-256 multihash (an RSA or other large key, 'Qm…' form); "
                "only Ed25519 peer ids ('12D3KooW…') are supported"
            )
        if code != _IDENTITY_MH:
            return f"peer id uses multihash code 0x{code:x}; expected identity (0x00)"
        length, off = read_varint(raw, off)
    except ValueError as exc:
        return f"malformed peer id multihash: {exc}"
    if len(raw) - off != length:
        return f"peer id multihash digest is {len(raw) - off} bytes, header says {length}"
    try:
        fields = _read_protobuf(raw[off:])
    except ValueError as exc:
        return f"peer id does not hold a protobuf PublicKey: {exc}"
    key_type, data = fields.get(1), fields.get(2)
    if not isinstance(key_type, int):
        return "peer id PublicKey has no key type"
    if key_type != _ED25519:
        return f"peer id is for a {_key_type_name(key_type)} key; only Ed25519 is supported"
    if not isinstance(data, bytes):
        return "peer id PublicKey has no key data"
    if len(data) != _KEY_LEN:
        return f"peer id holds a {len(data)}-byte Ed25519 key; expected {_KEY_LEN}"
    return "peer id is not in canonical encoding (PublicKey fields out of order or extended)"


def _decode_peer_id_string(text: str) -> bytes:
    if not text:
        raise InvalidPeerId("empty peer id string")
    if len(text) > _MAX_PEER_ID_CHARS:
        raise InvalidPeerId(f"peer id string is {len(text)} characters; too long")
    try:
        return b58decode(text)
    except ValueError as exc:
        raise InvalidPeerId(f"invalid peer id {text[:80]!r}: {exc}") from None


def _read_protobuf(data: bytes) -> dict[int, int | bytes]:
    """Decode a flat protobuf message of varint and length-delimited fields.

    Enough for libp2p's two key messages and strict where protobuf is lax: a repeated field,
    another wire type or trailing garbage is an error, because a key file or peer id that
    carries anything we do not understand should not be trusted."""
    fields: dict[int, int | bytes] = {}
    off = 0
    while off < len(data):
        tag, off = read_varint(data, off)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if number in fields:
            raise ValueError(f"field {number} repeated")
        if wire == 0:
            fields[number], off = read_varint(data, off)
        elif wire == 2:
            length, off = read_varint(data, off)
            if off + length > len(data):
                raise ValueError(f"field {number} runs {off + length - len(data)} bytes past end")
            fields[number], off = data[off : off + length], off + length
        else:
            raise ValueError(f"field {number} has unsupported wire type {wire}")
    unknown = sorted(set(fields) - {1, 2})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    return fields


def _key_type_name(key_type: int) -> str:
    return _KEY_TYPES.get(key_type, f"unknown (type {key_type})")


# --- key files -------------------------------------------------------------------------------


def _read_key_file(path: str) -> bytes:
    """Read at most ``_MAX_KEY_FILE_BYTES + 1`` bytes, after checking type and permissions.

    The checks use ``fstat`` on the descriptor we read from, so the file checked is the file
    read. ``O_NONBLOCK`` keeps a FIFO planted at the path from hanging us before the check."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidKeyFile(f"key file {path} is not a regular file")
        # Windows has no group/other bits (st_mode is always 0o666 there); ACLs are the
        # user's business.
        if os.name == "posix" and st.st_mode & 0o077:
            raise InvalidKeyFile(
                f"key file {path} has permissions {stat.S_IMODE(st.st_mode):04o}, which let "
                f"group or others access the private key; make it private to its owner with: "
                f"chmod 600 {shlex.quote(path)}"
            )
        chunks: list[bytes] = []
        remaining = _MAX_KEY_FILE_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parse_key_file(data: bytes, path: str) -> Ed25519PrivateKey:
    expected = "expected a libp2p protobuf Ed25519 private key (as go-libp2p/js-libp2p write)"
    if not data:
        raise InvalidKeyFile(f"key file {path} is empty; {expected}")
    if data.lstrip().startswith(b"-----BEGIN"):
        raise InvalidKeyFile(
            f"wrong key type: {path} is a PEM file (OpenSSL/OpenSSH format); {expected}"
        )
    if data.startswith(b"CAES"):
        raise InvalidKeyFile(
            f"key file {path} looks base64-encoded (like an IPFS config 'PrivKey'); "
            f"{expected}, stored as raw bytes: decode it with base64 -d"
        )
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise InvalidKeyFile(f"key file {path} is over {_MAX_KEY_FILE_BYTES} bytes; {expected}")
    try:
        fields = _read_protobuf(data)
    except ValueError as exc:
        raise InvalidKeyFile(f"key file {path} is corrupt ({exc}); {expected}") from None
    key_type, key_data = fields.get(1), fields.get(2)
    if not isinstance(key_type, int):
        raise InvalidKeyFile(f"key file {path} is corrupt (no key type); {expected}")
    if key_type != _ED25519:
        raise InvalidKeyFile(
            f"wrong key type {_key_type_name(key_type)} in {path}: pulsarcast uses only "
            f"Ed25519 keys; generate a new one (delete the file to have one created)"
        )
    if not isinstance(key_data, bytes):
        raise InvalidKeyFile(f"key file {path} is corrupt (no key data); {expected}")
    if len(key_data) != 2 * _KEY_LEN:
        raise InvalidKeyFile(
            f"key file {path} is corrupt: Ed25519 key data is {len(key_data)} bytes, "
            f"expected {2 * _KEY_LEN} (32-byte seed + 32-byte public key)"
        )
    seed, stored_public = key_data[:_KEY_LEN], key_data[_KEY_LEN:]
    key = Ed25519PrivateKey.from_private_bytes(seed)
    if not hmac.compare_digest(key.public_key().public_bytes_raw(), stored_public):
        raise InvalidKeyFile(
            f"key file {path} is corrupt: the stored public key does not match the private seed"
        )
    return key


def _write_key_file(path: str, data: bytes, *, replace: bool) -> bool:
    """Write ``data`` to a 0600 temp file beside ``path``, fsync it, then move it into place.

    With ``replace`` the move is ``os.replace``; without, it is ``os.link``, which fails if
    ``path`` exists, and False is returned (the temp file is removed). True when our bytes are
    now at ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            if hasattr(os, "fchmod"):
                # The umask can only remove bits from 0600, but a umask like 0277 would leave
                # the owner unable to read the key back; pin exactly 0600.
                os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError:
                # A filesystem without hard links: fall back to rename, which may replace a
                # file created in the meantime. Only a simultaneous start can lose this race.
                os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_directory(directory)
    return True


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable; not every platform can open a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
