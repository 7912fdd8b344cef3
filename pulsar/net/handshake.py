"""The transport handshake: Noise XX with the node's Ed25519 identity bound in, sans I/O.

The wire format is described in :mod:`pulsar.net.framing` (and ``docs/protocol.md`` §2).
The dialer is the Noise *initiator*, the listener the *responder*. Every transition is in
:data:`TRANSITIONS`; there are five::

    role       phase       record read   ->  next phase  record written
    initiator  START       (start())     ->  AWAIT_2     1: -> e
    initiator  AWAIT_2     message 2     ->  AWAIT_OK    3: -> s, se  + our payload
    initiator  AWAIT_OK    first record  ->  DONE        -
    responder  AWAIT_1     message 1     ->  AWAIT_3     2: <- e, ee, s, es  + our payload
    responder  AWAIT_3     message 3     ->  DONE        first record (empty plaintext)
    (anything else raises HandshakeError; the driver closes the connection)

*Identity binding*, as libp2p's Noise specification does it: each side's payload carries
its peer id (which contains its Ed25519 public key) and an Ed25519 signature, by that key,
of ``b"noise-libp2p-static-key:" || its X25519 static public key``. The static key arrives
encrypted in the same handshake and the session keys are derived from it, so a payload
that verifies proves that the holder of the peer id's key is the other end of *this*
session: a relay that passes the handshake on learns no key, and cannot complete it as
either peer, splice two handshakes, or inject or replay a record afterwards.

*The first record.* In XX the initiator is done after writing message 3, before the
responder has verified it. So that a dialer never takes a connection for accepted that the
listener is refusing (a wrong or banned peer id, a fault-injected partition), the responder
answers a message 3 it accepts with one transport record of empty plaintext, and the
initiator calls the handshake complete, and writes its first record, only once that record
has decrypted. This costs half a round trip per connection, once.

The payloads are strict, canonical DAG-CBOR decoded with the pure-Python decoder
(:func:`dag.decode`): they come from a peer not yet authenticated, are tiny and arrive once
per connection.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dag import CodecError, Identity, PeerId
from dag import decode as dag_decode
from dag import encode as dag_encode
from dag.identity import InvalidPeerId

from .errors import HandshakeError
from .noise import CipherState, HandshakeState, NoiseError

__all__ = [
    "PROLOGUE",
    "PROLOGUE_PLAINTEXT",
    "SIGNATURE_LEN",
    "STATIC_KEY_CONTEXT",
    "TRANSITIONS",
    "Handshake",
    "Payload",
    "Phase",
    "StaticKey",
]

PROLOGUE: Final = b"pulsarcast/transport/2"
"""Mixed into the handshake hash by both sides: a peer speaking another protocol or version
fails the handshake at the first encrypted field instead of being misunderstood."""

PROLOGUE_PLAINTEXT: Final = b"pulsarcast/transport/2+plaintext"
"""The prologue of transports configured with ``encrypt=False`` (benchmark baseline and
tests only): such a transport can only complete a handshake with another one."""

STATIC_KEY_CONTEXT: Final = b"noise-libp2p-static-key:"
"""What the identity key signs, followed by the X25519 static public key (libp2p's string)."""

SIGNATURE_LEN: Final = 64

_PAYLOAD_KEYS: Final = frozenset({"peer", "sig", "listen"})
_MAX_HOST_CHARS: Final = 255


class Phase(enum.Enum):
    START = "start"
    AWAIT_1 = "await-1"
    AWAIT_2 = "await-2"
    AWAIT_3 = "await-3"
    AWAIT_OK = "await-ok"
    DONE = "done"


TRANSITIONS: Final[dict[tuple[bool, Phase], Phase]] = {
    # (initiator?, phase) -> next phase, once the phase's record is read (or start())
    (True, Phase.START): Phase.AWAIT_2,
    (True, Phase.AWAIT_2): Phase.AWAIT_OK,
    (True, Phase.AWAIT_OK): Phase.DONE,
    (False, Phase.AWAIT_1): Phase.AWAIT_3,
    (False, Phase.AWAIT_3): Phase.DONE,
}


@dataclass(frozen=True, slots=True)
class StaticKey:
    """A node's X25519 static key for Noise and the signature binding it to the node's
    Ed25519 identity. One per transport, as in libp2p: signing once saves a signature per
    connection, and the binding signature, not the key's age, is what ties it to the id."""

    identity: Identity
    private: X25519PrivateKey
    public: bytes
    signature: bytes

    @classmethod
    def generate(cls, identity: Identity, private: X25519PrivateKey | None = None) -> StaticKey:
        key = private if private is not None else X25519PrivateKey.generate()
        public = key.public_key().public_bytes_raw()
        return cls(identity, key, public, identity.sign(STATIC_KEY_CONTEXT + public))


@dataclass(frozen=True, slots=True)
class Payload:
    """A handshake payload: who the sender is, the signature binding its static key, and
    where it accepts connections (port 0: it does not listen)."""

    peer: PeerId
    sig: bytes
    listen: tuple[str, int]

    def encode(self) -> bytes:
        """The canonical DAG-CBOR body of this payload."""
        host, port = self.listen
        return dag_encode({"peer": self.peer.raw, "sig": self.sig, "listen": [host, port]})

    @classmethod
    def parse(cls, body: bytes) -> Payload:
        """Validate a payload's shape (not its signature); raises :class:`HandshakeError`
        saying what is wrong."""
        try:
            msg = dag_decode(body)
        except CodecError as exc:
            raise HandshakeError(f"payload is not canonical DAG-CBOR: {exc}") from None
        if not isinstance(msg, dict):
            raise HandshakeError(f"payload must be a map, got {type(msg).__name__}")
        if msg.keys() != _PAYLOAD_KEYS:
            missing = sorted(_PAYLOAD_KEYS - msg.keys())
            extra = sorted(msg.keys() - _PAYLOAD_KEYS)
            raise HandshakeError(f"payload fields wrong: missing {missing}, unexpected {extra}")
        raw = msg["peer"]
        if not isinstance(raw, bytes):
            raise HandshakeError(f"payload 'peer' must be bytes, got {type(raw).__name__}")
        try:
            peer = PeerId(raw)
        except InvalidPeerId as exc:
            raise HandshakeError(f"payload 'peer' is not a valid peer id: {exc}") from None
        sig = msg["sig"]
        if not isinstance(sig, bytes) or len(sig) != SIGNATURE_LEN:
            raise HandshakeError(f"payload 'sig' must be {SIGNATURE_LEN} bytes")
        return cls(peer, sig, _parse_listen(msg["listen"]))


def _parse_listen(listen: Any) -> tuple[str, int]:
    if (
        not isinstance(listen, list)
        or len(listen) != 2
        or not isinstance(listen[0], str)
        or type(listen[1]) is not int
    ):
        raise HandshakeError("payload 'listen' must be [host string, port integer]")
    host, port = listen
    if len(host) > _MAX_HOST_CHARS:
        raise HandshakeError(f"payload 'listen' host is longer than {_MAX_HOST_CHARS} chars")
    if not 0 <= port <= 0xFFFF:
        raise HandshakeError(f"payload 'listen' port {port} is out of range")
    return host, port


class Handshake:
    """One side of the handshake; the dialer is the ``initiator``.

    ``listen`` is the address advertised in our payload. ``expected``, when we dialed, is the
    peer we meant to reach: any other (even a valid one) is refused, so an address that now
    belongs to someone else is not mistaken for the peer the caller asked for. The driver
    decides whether to admit a peer once :attr:`peer` is set, before it writes the reply
    that :meth:`receive` returned. ``ephemeral`` is for tests.
    """

    __slots__ = ("_noise", "_payload", "_recv", "_send", "_static", "expected", "initiator",
                 "listen", "phase", "their")

    def __init__(
        self,
        key: StaticKey,
        listen: tuple[str, int],
        *,
        initiator: bool,
        expected: PeerId | None = None,
        prologue: bytes = PROLOGUE,
        ephemeral: X25519PrivateKey | None = None,
    ) -> None:
        self._static = key
        self.listen = listen
        self.initiator = initiator
        self.expected = expected
        self._noise = HandshakeState(
            initiator=initiator, static=key.private, prologue=prologue, ephemeral=ephemeral
        )
        self._payload = Payload(key.identity.peer_id, key.signature, listen).encode()
        self._send: CipherState | None = None
        self._recv: CipherState | None = None
        self.phase = Phase.START if initiator else Phase.AWAIT_1
        self.their: Payload | None = None
        """The peer's payload once read and verified: its peer id is authenticated."""

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def peer(self) -> PeerId | None:
        """The authenticated peer id (set as soon as the peer's payload verifies, which for
        the initiator is one record before :attr:`done`)."""
        return self.their.peer if self.their is not None else None

    def start(self) -> bytes | None:
        """The first record's body if we are the initiator (None for a responder)."""
        if self.phase is not Phase.START:
            return None
        self.phase = TRANSITIONS[(True, Phase.START)]
        return self._noise.write_message(b"")  # nothing in the clear, as in libp2p

    def receive(self, message: bytes) -> bytes | None:
        """Handle one record body from the peer; returns the record body to send back, if
        any. Raises :class:`HandshakeError` for anything that must end the connection."""
        phase = self.phase
        nxt = TRANSITIONS.get((self.initiator, phase))
        if nxt is None or phase is Phase.START:
            raise HandshakeError(
                "handshake already complete" if self.done else f"unexpected record in {phase}"
            )
        if phase is Phase.AWAIT_OK:
            self._confirmed(message)
            self.phase = nxt
            return None
        if not message:
            raise HandshakeError(
                "empty handshake message (a transport v1 peer, which sends a plaintext HELLO "
                "with a 4-byte length, reads as one; v1 is not spoken any more)"
            )
        try:
            payload = self._noise.read_message(message)
        except NoiseError as exc:
            raise HandshakeError(f"handshake message {_INDEX[phase]}: {exc}") from None
        reply: bytes | None
        if phase is Phase.AWAIT_1:
            if payload:
                raise HandshakeError("handshake message 1 carries a payload")
            reply = self._noise.write_message(self._payload)
        else:
            self.their = self._verify(payload)
            if phase is Phase.AWAIT_2:
                reply = self._noise.write_message(self._payload)
                self._send, self._recv = self._noise.split()
            else:  # AWAIT_3: accept, and say so with the first transport record
                self._send, self._recv = self._noise.split()
                reply = self._send.encrypt(b"")
        self.phase = nxt
        return reply

    def ciphers(self) -> tuple[CipherState, CipherState]:
        """The transport ciphers ``(send, receive)``; only once :attr:`done`."""
        if not self.done or self._send is None or self._recv is None:
            raise HandshakeError("handshake not complete")
        return self._send, self._recv

    def _confirmed(self, record: bytes) -> None:
        assert self._recv is not None
        try:
            plain = self._recv.decrypt(record)
        except NoiseError as exc:
            raise HandshakeError(f"first record: {exc}") from None
        if plain:
            raise HandshakeError("first record from the responder is not empty")

    def _verify(self, body: bytes) -> Payload:
        their = Payload.parse(body)
        static = self._noise.remote_static
        assert static is not None  # the pattern reads s before this payload
        if their.peer == self._static.identity.peer_id:
            raise HandshakeError("connection to self")
        if self.expected is not None and their.peer != self.expected:
            raise HandshakeError(f"dialed {self.expected} but reached {their.peer}")
        if not their.peer.verify(their.sig, STATIC_KEY_CONTEXT + static):
            raise HandshakeError(f"static key signature of {their.peer} does not verify")
        return their


_INDEX: Final = {Phase.AWAIT_1: 1, Phase.AWAIT_2: 2, Phase.AWAIT_3: 3}
