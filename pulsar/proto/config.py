"""The protocol core's settings: one frozen dataclass with defaults for a laptop."""

from __future__ import annotations

from dataclasses import dataclass, field

from pulsar.proto.fragments.config import FragmentConfig

__all__ = ["LONE_NODE", "CoreConfig", "quorum_reason"]


@dataclass(frozen=True, slots=True)
class CoreConfig:
    parent_retries: int = 3
    """Attempts to re-reach a lost parent before routing a new JOIN around it."""
    parent_retry_delay: float = 0.25
    """First retry delay; doubles on each attempt."""
    root_check_interval: float = 5.0
    """How often a node acting as root (author offline or unknown) looks for a way in."""
    request_timeout: float = 10.0
    """How long a request to publish may wait for its event to come back."""
    seen_limit: int = 200_000
    """Event CIDs remembered per tree for de-duplication (oldest forgotten first)."""
    parked_limit: int = 10_000
    """Events held while their topic version is fetched."""
    routing_candidates: int = 20
    join_timeout: float = 2.0
    """A JOIN is answered with JOINED; unanswered this long, it counts as a failed attempt
    (a lost JOIN must not leave a node silently detached). The shortest wait: on a path
    whose round-trip time is measured the wait is ``join_rtts`` x its RTO if longer."""
    join_rtts: float = 2.0
    stale_edge_quiet: float = 10.0
    """A peer that pushes duplicates over an edge we do not hold is told LEAVE at most
    once in this long (its copies in flight must not each cost a LEAVE)."""
    avoid_for: float = 30.0
    """How long a parent we gave up on is left out of join routing."""
    min_acks: int = 1
    """DHT nodes that must acknowledge an event (or topic) before it counts as persisted:
    the publish fails with a clear error below this and the event is not forwarded."""
    record_delay: float = 0.5
    """How long the author gathers changes of its heads before writing its record (a
    publish waiting for its acknowledgement has the record written at once)."""
    record_retries: int = 3
    """Heads-record writes retried (backing off from ``record_delay``) before the
    publishes waiting for them fail as ``unrecorded``."""
    author_record_interval: float = 5.0
    """The author also rewrites its record when its heads change, at most this often."""
    waiting_publishes: int = 1000
    """Publishes (and requests to publish) queued per tree while it learns the latest
    version and heads; beyond this they fail at once."""
    sync_rounds: int = 2
    """Rounds of heads-record look-ups: the author and allowed publishers, then the
    publishers their records name."""
    sync_publishers: int = 16
    """Most publishers whose records one round asks for."""
    fragments: FragmentConfig = field(default_factory=FragmentConfig)
    """Large events along the tree (:mod:`pulsar.proto.fragments.layer`)."""

    def __post_init__(self) -> None:
        if self.min_acks < 0:
            raise ValueError("min_acks must be >= 0")
        if self.sync_rounds < 1 or self.sync_publishers < 1:
            raise ValueError("sync_rounds and sync_publishers must be >= 1")


LONE_NODE = CoreConfig(min_acks=0)
"""For a node that runs without DHT peers on purpose (one-node benchmarks): a publish
counts as persisted once it is in the local store."""


def quorum_reason(acks: int, min_acks: int, what: str) -> str:
    """Why a store that missed the write quorum failed, in words an operator can act on."""
    return (
        f"{what} stored on {acks} DHT node(s), fewer than the {min_acks} "
        "required (min_acks); not published — is the node connected to its network?"
    )
