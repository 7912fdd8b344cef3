"""Tunables of a DHT node, in one frozen value so a node's behaviour is visible at a glance.

Defaults follow the Kademlia paper and the ``kademlia`` package (k=20, alpha=3, hourly
refresh and republish) except where the package's choice does not fit a persistent store:
records live for a day since their last STORE rather than a week since their first, and
republishing never refreshes a record's own age (see ``dht.maintenance``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DhtConfig"]


@dataclass(frozen=True, slots=True)
class DhtConfig:
    """Every knob of a :class:`~dht.node.DhtNode`. Tests shrink the timers."""

    ksize: int = 20
    """Bucket size and replication factor: each block goes to the k closest nodes."""
    alpha: int = 3
    """Lookup parallelism: queries in flight per lookup."""
    rpc_timeout: float = 5.0
    """Seconds to wait for one RPC's answer before counting the peer as unresponsive."""
    silent_for: float = 15.0
    """Seconds an address that let an RPC time out is treated as down: other RPCs to it
    (except PING, which can prove it back) fail at once instead of each waiting
    ``rpc_timeout``. Without this, every lookup after a crash waits out the dead nodes that
    other peers still list; any datagram from the address ends the quarantine early.
    0 turns it off."""
    get_timeout: float = 30.0
    """Upper bound for one :meth:`DhtNode.get`; past it the block is reported not found."""
    put_concurrency: int = 64
    """Keys replicated at once by ``put_many``; bounds memory and socket buffers."""
    neighbourhood_ttl: float = 30.0
    """Seconds a network lookup's result stands for other keys in the same neighbourhood
    (see ``dht.lookup.NeighbourhoodCache``); 0 makes every store do its own lookup."""
    republish_interval: float = 3600.0
    """A held record is pushed to the k closest nodes this often (unless someone else just
    stored it here, which counts as a republish)."""
    record_ttl: float = 86400.0
    """A record not stored here by anyone for this long is dropped, unless this node is still
    among the k closest for it (then it keeps and refreshes it)."""
    maintenance_interval: float = 60.0
    """How often the maintenance loop looks for due republishes, expiry and lonely buckets."""
    bucket_refresh_interval: float = 3600.0
    """A bucket with no lookup for this long is refreshed with a random lookup in its range."""
    republish_batch: int = 2000
    """Records republished per maintenance pass, so a large store never stalls the loop."""
    max_records: int = 1_000_000
    """Records this node holds for the network; new keys beyond it are refused."""
    store_rate: float = 5000.0
    """Values per second one peer address may store here (token bucket refill)."""
    store_burst: float = 20000.0
    """Values one peer address may store in a burst."""
    global_store_rate: float = 50000.0
    """Values per second accepted from all peers together."""
    global_store_burst: float = 100000.0
    """Values accepted from all peers together in a burst."""
    commit_delay: float = 0.0
    """Seconds a received STORE waits for others to share its SQLite commit (group commit);
    0 commits at the end of the event-loop turn, with whatever arrived in it. STOREs are
    acknowledged after the commit, so an ack always means "on disk"."""
    commit_batch: int = 256
    """Received values that trigger a commit at once, without waiting for ``commit_delay``."""
    socket_buffer: int = 4 * 1024 * 1024
    """Requested UDP receive/send buffer (the kernel caps it at ``net.core.rmem_max``), so a
    burst of pipelined stores is queued rather than dropped."""

    def __post_init__(self) -> None:
        if self.ksize < 1 or self.alpha < 1 or self.put_concurrency < 1:
            raise ValueError("ksize, alpha and put_concurrency must be positive")
        if self.silent_for < 0:
            raise ValueError("silent_for must not be negative")
        if self.rpc_timeout <= 0 or self.get_timeout <= 0:
            raise ValueError("timeouts must be positive")
