"""The authenticated handshake (HELLO, AUTH) as a sans-I/O state machine.

The wire format is described in :mod:`pulsar.net.framing`. This module owns every
handshake transition, and they are few enough to list::

    state        frame read   ->  next state   frame to send
    HELLO_SENT   HELLO        ->  AUTH_SENT    our AUTH
    AUTH_SENT    AUTH         ->  DONE         -
    (anything else raises HandshakeError; the driver closes the connection)

Our own HELLO is sent at the start (:meth:`Handshake.hello`), so both sides speak at once and
the exchange costs one round trip. The driver (:mod:`pulsar.net.connection`) frames the
bodies, applies the frame size limit and the timeout; this module never sees a socket, so
the tests can join two of them back to back.

The handshake bodies are decoded with the strict pure-Python decoder (:func:`dag.decode`),
not ``libipld``: they come from unauthenticated peers, are tiny and arrive once per
connection, and strict decoding refuses non-canonical encodings outright.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import Any, Final

from dag import CodecError, Identity, PeerId
from dag import decode as dag_decode
from dag import encode as dag_encode
from dag.identity import InvalidPeerId

from .errors import HandshakeError

__all__ = [
    "AUTH_CONTEXT",
    "NONCE_LEN",
    "PROTOCOL_VERSION",
    "SIGNATURE_LEN",
    "Handshake",
    "HandshakeState",
    "Hello",
    "encode_auth",
    "parse_auth",
    "signed_message",
]

PROTOCOL_VERSION: Final = 1
NONCE_LEN: Final = 32
SIGNATURE_LEN: Final = 64
AUTH_CONTEXT: Final = b"pulsarcast/handshake/v1"
"""Domain separation: an AUTH signature can never be mistaken for a signature on a
descriptor or any other message signed with the same key."""

_HELLO_KEYS: Final = frozenset({"v", "peer", "nonce", "listen"})
_AUTH_KEYS: Final = frozenset({"sig"})
_MAX_HOST_CHARS: Final = 255


@dataclass(frozen=True, slots=True)
class Hello:
    """A HELLO message: who the sender is, its fresh nonce and where it listens."""

    peer: PeerId
    nonce: bytes
    listen: tuple[str, int]

    def encode(self) -> bytes:
        """The canonical DAG-CBOR body of this HELLO."""
        host, port = self.listen
        return dag_encode(
            {"v": PROTOCOL_VERSION, "peer": self.peer.raw, "nonce": self.nonce,
             "listen": [host, port]}
        )

    @classmethod
    def parse(cls, body: bytes) -> Hello:
        """Validate a HELLO body; raises :class:`HandshakeError` saying what is wrong."""
        msg = _decode_map(body, "HELLO", _HELLO_KEYS)
        version = msg["v"]
        if type(version) is not int:
            raise HandshakeError(f"HELLO 'v' must be an integer, got {type(version).__name__}")
        if version != PROTOCOL_VERSION:
            raise HandshakeError(
                f"HELLO protocol version {version} is not supported (only {PROTOCOL_VERSION})"
            )
        raw = msg["peer"]
        if not isinstance(raw, bytes):
            raise HandshakeError(f"HELLO 'peer' must be bytes, got {type(raw).__name__}")
        try:
            peer = PeerId(raw)
        except InvalidPeerId as exc:
            raise HandshakeError(f"HELLO 'peer' is not a valid peer id: {exc}") from None
        nonce = msg["nonce"]
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_LEN:
            raise HandshakeError(f"HELLO 'nonce' must be {NONCE_LEN} bytes")
        listen = msg["listen"]
        if (
            not isinstance(listen, list)
            or len(listen) != 2
            or not isinstance(listen[0], str)
            or type(listen[1]) is not int
        ):
            raise HandshakeError("HELLO 'listen' must be [host string, port integer]")
        host, port = listen
        if len(host) > _MAX_HOST_CHARS:
            raise HandshakeError(f"HELLO 'listen' host is longer than {_MAX_HOST_CHARS} chars")
        if not 0 <= port <= 0xFFFF:
            raise HandshakeError(f"HELLO 'listen' port {port} is out of range")
        return cls(peer, nonce, (host, port))


def signed_message(their_nonce: bytes, my_nonce: bytes, their_peer: PeerId) -> bytes:
    """What a side signs in its AUTH, from the signer's point of view."""
    return AUTH_CONTEXT + their_nonce + my_nonce + their_peer.raw


def encode_auth(identity: Identity, their: Hello, my_nonce: bytes) -> bytes:
    """The AUTH body ``identity`` sends in answer to the HELLO ``their``."""
    return dag_encode({"sig": identity.sign(signed_message(their.nonce, my_nonce, their.peer))})


def parse_auth(body: bytes) -> bytes:
    """The signature inside an AUTH body; raises :class:`HandshakeError` if malformed."""
    sig = _decode_map(body, "AUTH", _AUTH_KEYS)["sig"]
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_LEN:
        raise HandshakeError(f"AUTH 'sig' must be {SIGNATURE_LEN} bytes")
    return sig


class HandshakeState(enum.Enum):
    HELLO_SENT = "hello-sent"
    AUTH_SENT = "auth-sent"
    DONE = "done"


class Handshake:
    """One side of the handshake.

    ``listen`` is the address advertised in our HELLO. ``expected``, when we dialed, is the
    peer we meant to reach: any other (even a valid one) is refused, so an address that now
    belongs to someone else is not mistaken for the peer the caller asked for.
    """

    __slots__ = ("_identity", "_nonce", "_their", "expected", "listen", "state")

    def __init__(
        self,
        identity: Identity,
        listen: tuple[str, int],
        *,
        expected: PeerId | None = None,
        nonce: bytes | None = None,
    ) -> None:
        self._identity = identity
        self._nonce = secrets.token_bytes(NONCE_LEN) if nonce is None else nonce
        if len(self._nonce) != NONCE_LEN:
            raise ValueError(f"a nonce is {NONCE_LEN} bytes")
        self._their: Hello | None = None
        self.listen = listen
        self.expected = expected
        self.state = HandshakeState.HELLO_SENT

    @property
    def nonce(self) -> bytes:
        return self._nonce

    @property
    def their_hello(self) -> Hello | None:
        """The peer's HELLO once read (its peer id is verified only when :attr:`done`)."""
        return self._their

    @property
    def done(self) -> bool:
        return self.state is HandshakeState.DONE

    def hello(self) -> bytes:
        """Our HELLO body, sent first."""
        return Hello(self._identity.peer_id, self._nonce, self.listen).encode()

    def receive(self, body: bytes) -> bytes | None:
        """Handle one frame body from the peer; returns the body to send back, if any."""
        if self.state is HandshakeState.HELLO_SENT:
            their = Hello.parse(body)
            if their.peer == self._identity.peer_id:
                raise HandshakeError("connection to self")
            if self.expected is not None and their.peer != self.expected:
                raise HandshakeError(f"dialed {self.expected} but reached {their.peer}")
            self._their = their
            self.state = HandshakeState.AUTH_SENT
            return encode_auth(self._identity, their, self._nonce)
        if self.state is HandshakeState.AUTH_SENT:
            assert self._their is not None
            sig = parse_auth(body)
            message = signed_message(self._nonce, self._their.nonce, self._identity.peer_id)
            if not self._their.peer.verify(sig, message):
                raise HandshakeError(f"AUTH signature of {self._their.peer} does not verify")
            self.state = HandshakeState.DONE
            return None
        raise HandshakeError("handshake already complete")


def _decode_map(body: bytes, what: str, keys: frozenset[str]) -> dict[str, Any]:
    try:
        msg = dag_decode(body)
    except CodecError as exc:
        raise HandshakeError(f"{what} is not canonical DAG-CBOR: {exc}") from None
    if not isinstance(msg, dict):
        raise HandshakeError(f"{what} must be a map, got {type(msg).__name__}")
    if msg.keys() != keys:
        missing = sorted(keys - msg.keys())
        extra = sorted(msg.keys() - keys)
        raise HandshakeError(f"{what} fields wrong: missing {missing}, unexpected {extra}")
    return msg
