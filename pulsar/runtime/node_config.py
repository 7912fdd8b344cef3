"""Node configuration: one frozen dataclass with sensible defaults for a laptop.

It lives with the runtime that reads it; :mod:`pulsar.config` is where users import it from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dht import DhtConfig
from pulsar.net.config import TransportConfig
from pulsar.net.faults import FaultInjector
from pulsar.proto.config import CoreConfig

from .peer_faults import FaultConfig
from .trace import Tracer

__all__ = ["PROTOCOLS", "NodeConfig"]

PROTOCOLS = ("pulsarcast", "floodsub")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything a :class:`pulsar.Node` needs.

    ``port`` is both the UDP port of the DHT and the TCP port of the pub-sub transport (0
    picks a free one). ``data_dir`` holds the key and the SQLite database; a node started
    again on the same directory keeps its identity, blocks and subscriptions.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    bootstrap: tuple[tuple[str, int], ...] = ()
    inline_limit: int = 4096
    """Payloads larger than this go into a chunk tree in the DHT (max 6144)."""
    prove_timeout: float = 5.0
    """How long start-up waits to prove the peer ids of the DHT contacts it knows."""
    core: CoreConfig = field(default_factory=CoreConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    dht: DhtConfig = field(default_factory=DhtConfig)
    faults: FaultInjector | None = field(default=None, compare=False)
    """Fault injection on this node's outgoing frames (tests and the testbed only)."""
    protocol: str = "pulsarcast"
    """The router: ``pulsarcast``, or ``floodsub`` (the baseline the testbed compares it
    with; no trees, repair or persistence in the DHT)."""
    tracer: Tracer | None = field(default=None, compare=False)
    """Hooks told about every frame, delivery and publish (the testbed's traces)."""
    wait_all_replicas: bool = False
    """Publish only once every one of the k closest DHT nodes answered the store, instead
    of at the write quorum (``core.min_acks`` acknowledgements, the rest in the
    background)."""
    peer_faults: FaultConfig = field(default_factory=FaultConfig)
    """Misbehaviour scores, bans and the rate of fault log lines."""
    reconcile: bool = True
    """A gap too deep to walk (a node back after missing hundreds of events, a healed
    partition) is caught up by range reconciliation with the neighbour that showed it
    (:mod:`pulsar.runtime.reconciler`); False: walked back ``want_limit`` blocks per round
    trip, as the DAG links lead."""
    checkpoint_every: int = 1000
    """The author of a topic checkpoints its history every this many events
    (:mod:`pulsar.runtime.checkpoints`): a seek reads ``log2(events / checkpoint_every)``
    checkpoints, and a segment's index is one block up to 256 events, two up to 65,536."""
    checkpoint_interval: float = 600.0
    """...or this many seconds after the last checkpoint, if an event came since."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, not {self.port}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, "
                             f"not {self.protocol!r}")
        if not 0 < self.inline_limit <= 6144:
            raise ValueError("inline_limit must be in 1..6144 bytes")
        if self.checkpoint_every < 1 or not self.checkpoint_interval > 0:
            raise ValueError("checkpoint_every must be >= 1 and checkpoint_interval > 0")
