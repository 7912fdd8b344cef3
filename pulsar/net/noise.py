"""Noise_XX_25519_ChaChaPoly_SHA256, the few primitives it needs, on ``cryptography``.

This is the Noise Protocol Framework (revision 34, https://noiseprotocol.org/noise.html)
restricted to what the transport uses: the XX pattern, X25519, ChaCha20-Poly1305 and
SHA-256, no PSK, no rekey. Names follow the specification's sections so the code can be
checked against it line by line: :class:`CipherState` (§5.1), :class:`SymmetricState`
(§5.2), :class:`HandshakeState` (§5.3). The pattern is data (:data:`XX`), not code: each
handshake message is the list of tokens the writer processes, in order::

    XX:  -> e
         <- e, ee, s, es
         -> s, se

Why not the ``noiseprotocol`` package: it wraps the same ``cryptography`` primitives behind
a generic, pattern-agnostic layer (last released 2020), allocates a cipher object per
message and would put that layer on every frame's path. The handful of functions below is
all XX needs, the transport's hot path (:meth:`CipherState.encrypt` /
:meth:`CipherState.decrypt`) is one AEAD call each, and the published test vectors
(``tests/net/test_noise_vectors.py``) pin it to the specification byte for byte.

Nothing here does I/O; the handshake driver is :mod:`pulsar.net.handshake`.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

__all__ = [
    "DHLEN",
    "MAX_MESSAGE",
    "PROTOCOL_NAME",
    "TAGLEN",
    "XX",
    "CipherState",
    "HandshakeState",
    "NoiseError",
    "SymmetricState",
]

PROTOCOL_NAME: Final = b"Noise_XX_25519_ChaChaPoly_SHA256"
DHLEN: Final = 32
HASHLEN: Final = 32
TAGLEN: Final = 16
MAX_MESSAGE: Final = 65535
"""Largest Noise message (§3): handshake or transport, ciphertext and tag included."""
_MAX_NONCE: Final = (1 << 64) - 1  # reserved (§5.1); reaching it means the session must end
_NONCE: Final = struct.Struct("<4xQ")  # ChaChaPoly nonce: 32 zero bits, 64-bit LE counter

_HAS_INTO: Final = hasattr(ChaCha20Poly1305, "encrypt_into")

Bytes = bytes | bytearray | memoryview
"""What the AEAD accepts: the transport decrypts records straight out of its receive buffer."""

XX: Final[tuple[tuple[str, ...], ...]] = (
    ("e",),
    ("e", "ee", "s", "es"),
    ("s", "se"),
)
"""The XX pattern: message i is written by the initiator when i is even."""


class NoiseError(ValueError):
    """A Noise message that does not authenticate or is malformed, or a misused state."""


class CipherState:
    """A key and a nonce counter (§5.1). ``encrypt``/``decrypt`` are the transport's hot path:
    empty associated data, one AEAD call, no allocation beyond the output."""

    __slots__ = ("_aead", "has_key", "n")

    def __init__(self, key: bytes | None = None) -> None:
        self._aead: ChaCha20Poly1305 | None = None
        self.has_key = False
        self.n = 0
        if key is not None:
            self.initialize_key(key)

    def initialize_key(self, key: bytes) -> None:
        self._aead = ChaCha20Poly1305(key)
        self.has_key = True
        self.n = 0

    def encrypt_with_ad(self, ad: bytes, plaintext: Bytes) -> bytes:
        if self._aead is None:
            return bytes(plaintext)
        n = self.n
        if n >= _MAX_NONCE:
            raise NoiseError("nonce exhausted; the session must end")
        out = self._aead.encrypt(_NONCE.pack(n), plaintext, ad)
        self.n = n + 1
        return out

    def encrypt_into(self, plaintext: Bytes, out: memoryview) -> None:
        """A transport message written into ``out`` (exactly ``len(plaintext) + TAGLEN``
        bytes): lets the sender put the record's length prefix and its ciphertext in one
        buffer without copying the ciphertext (``cryptography`` >= 45; older versions copy)."""
        aead = self._aead
        if aead is None:
            raise NoiseError("no key")
        n = self.n
        if n >= _MAX_NONCE:
            raise NoiseError("nonce exhausted; the session must end")
        if _HAS_INTO:
            aead.encrypt_into(_NONCE.pack(n), plaintext, b"", out)
        else:  # pragma: no cover - old cryptography
            out[:] = aead.encrypt(_NONCE.pack(n), plaintext, b"")
        self.n = n + 1

    def decrypt_with_ad(self, ad: bytes, ciphertext: Bytes) -> bytes:
        if self._aead is None:
            return bytes(ciphertext)
        n = self.n
        if n >= _MAX_NONCE:
            raise NoiseError("nonce exhausted; the session must end")
        try:
            out = self._aead.decrypt(_NONCE.pack(n), ciphertext, ad)
        except InvalidTag:
            # The nonce is not advanced (§5.1): the caller must end the session anyway.
            raise NoiseError("message does not authenticate (bad MAC)") from None
        self.n = n + 1
        return out

    def encrypt(self, plaintext: Bytes) -> bytes:
        """A transport message (no associated data)."""
        return self.encrypt_with_ad(b"", plaintext)

    def decrypt(self, ciphertext: Bytes) -> bytes:
        """A transport message; raises :class:`NoiseError` if it does not authenticate."""
        return self.decrypt_with_ad(b"", ciphertext)


def _hkdf(chaining_key: bytes, ikm: bytes, outputs: int) -> list[bytes]:
    """HKDF as Noise defines it (§4.3), with HMAC-SHA256."""
    temp = hmac.digest(chaining_key, ikm, "sha256")
    out: list[bytes] = []
    prev = b""
    for i in range(1, outputs + 1):
        prev = hmac.digest(temp, prev + bytes([i]), "sha256")
        out.append(prev)
    return out


class SymmetricState:
    """The chaining key, the handshake hash and the current cipher (§5.2)."""

    __slots__ = ("cipher", "ck", "h")

    def __init__(self, protocol_name: bytes) -> None:
        if len(protocol_name) <= HASHLEN:
            self.h = protocol_name.ljust(HASHLEN, b"\x00")
        else:
            self.h = hashlib.sha256(protocol_name).digest()
        self.ck = self.h
        self.cipher = CipherState()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = _hkdf(self.ck, ikm, 2)
        self.cipher.initialize_key(temp_k)

    def mix_hash(self, data: bytes) -> None:
        self.h = hashlib.sha256(self.h + data).digest()

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ciphertext = self.cipher.encrypt_with_ad(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        plaintext = self.cipher.decrypt_with_ad(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[CipherState, CipherState]:
        k1, k2 = _hkdf(self.ck, b"", 2)
        return CipherState(k1), CipherState(k2)


def _public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def _dh(key: X25519PrivateKey, public: bytes) -> bytes:
    try:
        return key.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:
        # cryptography refuses an all-zero shared secret (a low-order point): a peer's
        # attempt to force a known key.
        raise NoiseError("invalid X25519 public key") from None


class HandshakeState:
    """One side of a Noise XX handshake (§5.3).

    ``static`` is our long-term X25519 key; ``ephemeral`` is only given by the test vectors
    (a fresh key is generated otherwise). Call :meth:`write_message` and
    :meth:`read_message` in the pattern's order (:attr:`my_turn` says whose turn it is);
    after the third message :attr:`complete` is true and :meth:`split` gives the transport
    ciphers ``(send, receive)`` for this side. :attr:`remote_static` is the peer's static key
    once its ``s`` token has been read, and :attr:`handshake_hash` the channel binding.
    """

    __slots__ = ("_e", "_index", "_re", "_s", "_ss", "initiator", "remote_static")

    def __init__(
        self,
        *,
        initiator: bool,
        static: X25519PrivateKey,
        prologue: bytes = b"",
        ephemeral: X25519PrivateKey | None = None,
    ) -> None:
        self.initiator = initiator
        self._s = static
        self._e = ephemeral
        self._re: bytes | None = None
        self.remote_static: bytes | None = None
        self._ss = SymmetricState(PROTOCOL_NAME)
        self._ss.mix_hash(prologue)
        self._index = 0

    @property
    def my_turn(self) -> bool:
        return self._index < len(XX) and (self._index % 2 == 0) == self.initiator

    @property
    def complete(self) -> bool:
        return self._index == len(XX)

    @property
    def handshake_hash(self) -> bytes:
        return self._ss.h

    def write_message(self, payload: bytes = b"") -> bytes:
        if not self.my_turn:
            raise NoiseError("not our turn to write a handshake message")
        ss = self._ss
        out = bytearray()
        for token in XX[self._index]:
            if token == "e":
                if self._e is None:
                    self._e = X25519PrivateKey.generate()
                e_pub = _public(self._e)
                out += e_pub
                ss.mix_hash(e_pub)
            elif token == "s":
                out += ss.encrypt_and_hash(_public(self._s))
            else:
                ss.mix_key(self._token_dh(token))
        out += ss.encrypt_and_hash(payload)
        self._index += 1
        if len(out) > MAX_MESSAGE:
            raise NoiseError("handshake message too large")
        return bytes(out)

    def read_message(self, message: bytes) -> bytes:
        if self.my_turn or self.complete:
            raise NoiseError("not expecting a handshake message")
        if len(message) > MAX_MESSAGE:
            raise NoiseError("handshake message too large")
        ss = self._ss
        pos = 0
        for token in XX[self._index]:
            if token == "e":
                if len(message) - pos < DHLEN:
                    raise NoiseError("handshake message too short")
                self._re = message[pos : pos + DHLEN]
                pos += DHLEN
                ss.mix_hash(self._re)
            elif token == "s":
                size = DHLEN + (TAGLEN if ss.cipher.has_key else 0)
                if len(message) - pos < size:
                    raise NoiseError("handshake message too short")
                self.remote_static = ss.decrypt_and_hash(message[pos : pos + size])
                pos += size
            else:
                ss.mix_key(self._token_dh(token))
        if ss.cipher.has_key and len(message) - pos < TAGLEN:
            raise NoiseError("handshake message too short")
        payload = ss.decrypt_and_hash(message[pos:])
        self._index += 1
        return payload

    def split(self) -> tuple[CipherState, CipherState]:
        """The transport ciphers as ``(send, receive)`` for this side."""
        if not self.complete:
            raise NoiseError("handshake not complete")
        c1, c2 = self._ss.split()
        return (c1, c2) if self.initiator else (c2, c1)

    def _token_dh(self, token: str) -> bytes:
        # ee: e·re. es: the initiator's e with the responder's s. se: the initiator's s with
        # the responder's e. Each side computes the same product from its own half.
        e, s, re, rs = self._e, self._s, self._re, self.remote_static
        if token == "ee":
            mine, theirs = e, re
        elif token == "es":
            mine, theirs = (e, rs) if self.initiator else (s, re)
        elif token == "se":
            mine, theirs = (s, re) if self.initiator else (e, rs)
        else:  # pragma: no cover - XX has no other tokens
            raise NoiseError(f"unknown token {token!r}")
        if mine is None or theirs is None:  # pragma: no cover - the pattern orders tokens
            raise NoiseError(f"token {token!r} before its keys")
        return _dh(mine, theirs)
