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
    """Bucket size, and how many live nodes a lookup converges on."""
    replicas: int = 8
    """Replication factor: each block is stored at this many of the closest nodes (at most
    ``ksize``). Eight, not k = 20: a block is lost only if all its holders leave within
    one republish interval, with probability p^r for independent departures (p = 0.3:
    7e-5 at r = 8), and every subscriber keeps the events it delivered besides; the
    argument is in docs/architecture.md. Each replica costs a STORE per block."""
    alpha: int = 3
    """Lookup parallelism: queries in flight per lookup."""
    rpc_timeout: float = 5.0
    """Seconds to wait for one RPC's answer before counting the peer as unresponsive."""
    stall_after: float = 2.5
    """Seconds after which a lookup stops waiting for one query: the next closest node is
    asked in its place and the lookup may end without it (its answer still counts if it
    comes in time). A dead node others still list then costs a lookup this, not
    ``rpc_timeout`` per round. Half of ``rpc_timeout``, not less: on a loaded machine (the
    100-process testbed on 2 cores) answers often take over a second, and at 1 s a churn
    run counted 837 stalls and 0.7 MiB more bytes (catch-up blocks, duplicates) than
    without stalls. 0 turns it off."""
    silent_for: float = 15.0
    """Seconds an address that let an RPC time out is treated as down: other RPCs to it
    (except PING, which can prove it back) fail at once instead of each waiting
    ``rpc_timeout``. Without this, every lookup after a crash waits out the dead nodes that
    other peers still list; any datagram from the address ends the quarantine early.
    0 turns it off."""
    contact_failures: int = 3
    """Unanswered RPCs in a row after which a contact is *stale*. A miss counts only if the
    RPC was sent after the previous miss was noticed (a burst of RPCs lost to the same
    outage is one miss), and any answer from the address starts the count again. After
    a first miss the contact is PINGed at once, then again after each further miss, so a
    node that crashed is stale ``contact_failures`` x ``rpc_timeout`` after its first
    silence, while one behind a lossy link (3 % of datagrams lost: about 6 % of RPCs)
    goes stale with a probability of about 0.06^3 per lost RPC. A stale contact is
    removed from the routing table unless it is one of the last ``keep_contacts``
    (Kademlia section 4.1: flag, do not void the table when one's own link is down).
    The package removed a contact at its first unanswered RPC."""
    keep_contacts: int = 4
    """The routing table's floor: a stale contact is not removed while the table holds no
    more than this many contacts. It stays as a way back into the network — PINGed with
    backoff, asked nothing else, handed to nobody, left out of ``closest_known_peers`` —
    until it answers or a live contact takes its place."""
    min_contacts: int = 8
    """While fewer live (not stale) contacts than this are known, the node looks for
    more: it re-PINGs, with backoff, the addresses it remembers (contacts it had,
    bootstrap seeds, addresses offered with :meth:`dht.node.DhtNode.offer_contact`) and
    walks toward its own id through those that answer — a bootstrap retry, also for a
    node started without seeds. 0 turns it off."""
    reconnect_interval: float = 10.0
    """Longest wait between two PINGs of a stale contact kept as one of the last, and of a
    remembered address while the node has no live contact (backoff from 1 s, doubling);
    remembered addresses wait up to ten times this while some contact is live. After a
    partition heals, a node that lost every contact finds its way back within about
    this plus ``rpc_timeout``."""
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
    returning_window: float = 3600.0
    """A contact that went silent and is back under the same id within this many seconds
    restarted with its store and gets no hand-off (see ``ContactLiveness._returning``); at
    most ``republish_interval``, after which what it missed has been republished to it
    anyway. 0 hands off to every returning contact."""
    record_ttl: float = 86400.0
    """A record not stored here by anyone for this long is dropped, unless this node is still
    among the k closest for it (then it keeps and refreshes it)."""
    maintenance_interval: float = 60.0
    """How often the maintenance loop looks for due republishes, expiry and lonely buckets."""
    bucket_refresh_interval: float = 3600.0
    """A bucket with no lookup for this long is refreshed with a random lookup in its range."""
    republish_batch: int = 2000
    """Records republished per maintenance pass, so a large store never stalls the loop."""
    audit_interval: float = 3600.0
    """How often the node checks that its own blocks (pinned: what it delivered or
    published, which it serves to FIND_VALUE besides its records) are held by one of the
    ``replicas`` closest nodes of their keys, and stores there the ones nobody holds
    (``dht.maintenance.Maintainer.audit``). The first round starts one interval after
    the node starts. 0 turns it off (the blocks are still served)."""
    audit_batch: int = 2000
    """Own blocks audited per maintenance pass: a round over a large store is spread
    over passes (``maintenance_interval`` apart) instead of sending it all at once."""
    max_records: int = 1_000_000
    """Records this node holds for the network; beyond it, room is made by eviction
    (``dht.record_table.RecordTable.evict``)."""
    max_bytes: int = 2 * 1024**3
    """Bytes of record values this node holds for the network (2 GiB); beyond it, room is
    made by eviction (the copies of the node's own blocks first, then the oldest stored;
    never heads records). The node's own puts are always kept."""
    source_store_quota: int = 8 * 1024**2
    """Bytes of new records one source address that is not a proven peer may make this
    node hold per ``store_quota_window`` (see ``dht.quota``)."""
    peer_store_quota: int = 256 * 1024**2
    """The same for an address where a peer proved its identity (transport handshake)."""
    store_quota_window: float = 86400.0
    """Seconds over which a source's quota is counted (then it starts again)."""
    store_rate: float = 2000.0
    """Values per second one peer address may store here (token bucket refill)."""
    store_burst: float = 4000.0
    """Values one peer address may store in a burst. (It was 20,000 with a refill of
    5,000/s: a flood of 20,000 values never reached it.)"""
    global_store_rate: float = 20000.0
    """Values per second accepted from all peers together."""
    global_store_burst: float = 40000.0
    """Values accepted from all peers together in a burst."""
    store_byte_rate: float = 4 * 1024**2
    """Bytes of values per second one peer address may store here."""
    store_byte_burst: float = 8 * 1024**2
    """Bytes of values one peer address may store in a burst."""
    global_store_byte_rate: float = 32 * 1024**2
    """Bytes of values per second accepted from all peers together."""
    global_store_byte_burst: float = 64 * 1024**2
    """Bytes of values accepted from all peers together in a burst."""
    address_proof_ttl: float = 3600.0
    """Seconds an address stays proven (it answered one of our RPCs there) without a new
    answer; only proven addresses get hand-offs, large answers and a routing-table slot
    (see ``dht.address_check``)."""
    address_retry_after: float = 30.0
    """Seconds after an unanswered validation PING before that address is pinged again."""
    commit_delay: float = 0.0
    """Seconds a received STORE waits for others to share its SQLite commit (group commit);
    0 commits at the end of the event-loop turn, with whatever arrived in it. STOREs are
    acknowledged after the commit, so an ack always means "on disk"."""
    commit_batch: int = 256
    """Received values that trigger a commit at once, without waiting for ``commit_delay``."""
    socket_buffer: int = 4 * 1024 * 1024
    """Requested UDP receive/send buffer (the kernel caps it at ``net.core.rmem_max``), so a
    burst of pipelined stores is queued rather than dropped."""

    @property
    def replication(self) -> int:
        """The replicas actually written: ``replicas``, but never more than ``ksize``."""
        return min(self.replicas, self.ksize)

    def __post_init__(self) -> None:
        if self.ksize < 1 or self.alpha < 1 or self.put_concurrency < 1 or self.replicas < 1:
            raise ValueError("ksize, replicas, alpha and put_concurrency must be positive")
        if self.contact_failures < 1 or self.keep_contacts < 0 or self.min_contacts < 0:
            raise ValueError("contact_failures must be positive, keep_contacts and "
                             "min_contacts not negative")
        if self.reconnect_interval <= 0:
            raise ValueError("reconnect_interval must be positive")
        if self.silent_for < 0 or self.stall_after < 0:
            raise ValueError("silent_for and stall_after must not be negative")
        if self.rpc_timeout <= 0 or self.get_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if min(self.max_bytes, self.source_store_quota, self.peer_store_quota) < 0:
            raise ValueError("byte quotas must not be negative")
        if self.audit_interval < 0 or self.audit_batch < 1:
            raise ValueError("audit_interval must not be negative, audit_batch positive")
        if self.store_quota_window <= 0 or self.address_proof_ttl <= 0:
            raise ValueError("store_quota_window and address_proof_ttl must be positive")
