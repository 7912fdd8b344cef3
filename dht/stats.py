"""Counters a node keeps about what it refused, dropped and did: cheap, and what tests and the
future ``/metrics`` endpoint read to see that a defence actually fired."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["DhtStats"]


@dataclass(slots=True)
class DhtStats:
    datagrams_dropped: int = 0
    """Datagrams that were malformed, oversized, of an unknown RPC, or a stray response."""
    handler_errors: int = 0
    """Requests whose handler raised (a bug, or input the checks did not anticipate)."""
    stores_accepted: int = 0
    """Values accepted from STORE / STORE_BATCH requests."""
    stores_refused: int = 0
    """Values refused because they do not hash to their key (or are not bytes, or too big)."""
    stores_rate_limited: int = 0
    """Values refused because their sender or all senders together exceeded the rate limit."""
    stores_over_quota: int = 0
    """New keys refused because this node already holds ``max_records`` records and
    eviction freed none."""
    stores_over_source_quota: int = 0
    """New keys refused because their source used up its byte quota (``dht.quota``)."""
    stores_over_byte_cap: int = 0
    """New records refused because the node holds ``max_bytes`` and eviction freed no room."""
    records_evicted: int = 0
    """Records deleted to make room for new ones at ``max_records`` or ``max_bytes``
    (``dht.record_table.RecordTable.evict``: the node's own blocks' copies first, then the
    oldest stored; never heads records)."""
    bytes_evicted: int = 0
    """Bytes of the records evicted."""
    records_cut: int = 0
    """Records dropped because a topic's retention cut them here (this node follows the
    topic and cut its log: ``dht.storage.RecordStorage.forget``)."""
    bytes_cut: int = 0
    """Bytes of the records cut."""
    requests_held: int = 0
    """Requests from an address not yet proven, held until it answers our PING."""
    requests_unvalidated_dropped: int = 0
    """Requests from unproven addresses dropped (hold full, validation failed or recent)."""
    validations_sent: int = 0
    """Validation PINGs sent to addresses that had not answered us yet."""
    validations_failed: int = 0
    """Validation PINGs that went unanswered (a forged source, or a node gone)."""
    bad_values_fetched: int = 0
    """Values returned by peers during a lookup that failed verification (discarded)."""
    block_puts: int = 0
    """Blocks put (each stored at up to ``replication`` nodes)."""
    record_puts: int = 0
    """Heads records put."""
    block_gets: int = 0
    """Blocks looked up in the network (not found locally)."""
    record_gets: int = 0
    """Heads records looked up in the network."""
    locates: int = 0
    """Crawls for a peer's address (``locate``) that the k-buckets could not answer."""
    lookups: int = 0
    """Network node lookups actually run (the rest were answered by the neighbourhood cache)."""
    lookup_stalls: int = 0
    """Lookup queries that waited ``stall_after`` and were replaced by the next closest
    node (``dht.lookup``): dead contacts others still list, or overloaded peers."""
    rpcs_skipped: int = 0
    """RPCs failed at once because their address recently let an RPC time out."""
    contacts_stale: int = 0
    """Contacts that let ``contact_failures`` RPCs in a row go unanswered."""
    contacts_dropped: int = 0
    """Stale contacts removed from the routing table (the others were kept as the table's
    last ``keep_contacts``, or answered again)."""
    contacts_revived: int = 0
    """Stale contacts that answered again (a healed partition, a lossy link)."""
    contact_probes: int = 0
    """PINGs sent to contacts that let an RPC go unanswered, to tell loss from death."""
    reconnect_pings: int = 0
    """PINGs sent to remembered or offered addresses while the table was thin, or to an
    address offered with ``DhtNode.offer_contact``."""
    reconnected: int = 0
    """Of those, the ones answered (the node behind joined the routing table)."""
    republished: int = 0
    expired: int = 0
    bytes_sent: int = 0
    """UDP payload bytes of every datagram sent (requests and answers)."""
    bytes_received: int = 0
    """UDP payload bytes of every datagram received, dropped ones included."""
    handed_off: int = 0
    """Records pushed to newly met nodes that are closer to them than we are."""
    returns_without_handoff: int = 0
    """Contacts that went silent and came back under the same id within the republish
    interval: restarted nodes that kept their store, so no hand-off was sent."""
    background_stores: int = 0
    """Puts that returned at their write quorum while other replicas were still storing."""
    background_acks: int = 0
    """Acknowledgements that came after such a put had returned."""
    local_blocks_served: int = 0
    """FIND_VALUEs answered with one of the node's own blocks (delivered or published,
    not a record held for the network)."""
    audited: int = 0
    """Own blocks whose closest nodes were asked (HOLDS) whether they hold them."""
    audit_repaired: int = 0
    """Of those, the blocks none of their closest nodes held, stored there again."""

    sent_by_rpc: dict[str, int] = field(default_factory=dict)
    """``bytes_sent`` split by RPC: requests under their name (``store``, ``find_node``
    ...), answers under the request's name with ``+answer``. Not in :meth:`as_dict`,
    which stays a flat map of counters."""

    def count_sent(self, rpc: str, size: int) -> None:
        self.bytes_sent += size
        self.sent_by_rpc[rpc] = self.sent_by_rpc.get(rpc, 0) + size

    def as_dict(self) -> dict[str, int]:
        counters = asdict(self)
        del counters["sent_by_rpc"]
        return counters
