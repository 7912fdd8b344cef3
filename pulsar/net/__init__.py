"""The peer-to-peer transport of pulsarcast.

Persistent TCP connections between peers, on the same port number as the node's UDP DHT
port, carrying length-prefixed frames whose payloads are the protocol layer's DAG-CBOR
messages (the transport never decodes them). Each connection starts with a Noise XX
handshake (X25519, ChaCha20-Poly1305, SHA-256) in which each side's Ed25519 identity signs
its Noise static key, as in libp2p, so the peer id, and with it the Kademlia id
``sha1(peer id)``, is proven before any payload flows; every frame after it is encrypted and
authenticated, so nobody on the path can read, inject, alter or replay one. One connection per pair
of peers carries every topic; per-peer send queues are bounded and apply back-pressure;
dropped connections are re-dialed; a fault injector can drop, delay and partition traffic
for tests and the testbed.

Modules: :mod:`~pulsar.net.framing` (frames, and the wire format notes),
:mod:`~pulsar.net.noise` (the Noise primitives), :mod:`~pulsar.net.handshake` (sans-I/O
handshake and identity binding), :mod:`~pulsar.net.secure` (records: sealing and opening the
frame stream), :mod:`~pulsar.net.connection` (one TCP connection),
:mod:`~pulsar.net.transport` (the public face: sending, probing, closing) with
:mod:`~pulsar.net.peer` (per-peer queues and the write path), :mod:`~pulsar.net.dialer`
(dialing and reconnect) and :mod:`~pulsar.net.registry` (the connections, duplicates, peers up
and down), :mod:`~pulsar.net.faults`, :mod:`~pulsar.net.config`, :mod:`~pulsar.net.errors`,
:mod:`~pulsar.tools.bench.net`.
"""

from .config import TransportConfig, TransportStats
from .errors import (
    BadRecord,
    FrameTooLarge,
    HandshakeError,
    PeerUnreachable,
    RemoteProtocolError,
    TransportClosed,
)
from .faults import FaultInjector, FaultStats
from .transport import ConnectionInfo, Transport

__all__ = [
    "BadRecord",
    "ConnectionInfo",
    "FaultInjector",
    "FaultStats",
    "FrameTooLarge",
    "HandshakeError",
    "PeerUnreachable",
    "RemoteProtocolError",
    "Transport",
    "TransportClosed",
    "TransportConfig",
    "TransportStats",
]
