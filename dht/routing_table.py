"""The routing table: ``kademlia.routing.RoutingTable`` with its full-bucket ping tracked, and
the few queries the rest of the DHT asks of it.

It is the package's data structure, adapted; it sends nothing itself and knows no datagram,
which is why it lives apart from :mod:`dht.protocol`, the endpoint that owns one table and
gives it the task spawner its pings run under. :func:`node_address` is here too: it is how
every part of the DHT reads a contact's address off the package's ``Node``.
"""

from __future__ import annotations

from collections.abc import Iterator

from kademlia.node import Node
from kademlia.routing import RoutingTable

from .protocol_view import ProtocolView

__all__ = ["PulsarRoutingTable", "node_address"]

Address = tuple[str, int]


class PulsarRoutingTable(RoutingTable):  # type: ignore[misc]  # kademlia is untyped
    """The package's table, but the ping of a full bucket's oldest contact runs in a task the
    protocol tracks (the package fires and forgets it)."""

    protocol: ProtocolView

    def add_contact(self, node: Node) -> None:
        index = self.get_bucket_for(node)
        bucket = self.buckets[index]
        if bucket.add_node(node):
            return
        # Section 4.2: split if the bucket holds our own id or its depth is not 0 mod 5.
        if bucket.has_in_range(self.node) or bucket.depth() % 5 != 0:
            self.split_bucket(index)
            self.add_contact(node)
        else:
            self.protocol.spawn(self.protocol.call_ping(bucket.head()))

    def contacts(self) -> Iterator[Node]:
        for bucket in self.buckets:
            yield from bucket.nodes.values()

    def size(self) -> int:
        return sum(len(bucket.nodes) for bucket in self.buckets)

    def known_at(self, node: Node) -> Node | None:
        """The contact with ``node``'s id, if the table holds it (at any address)."""
        known: Node | None = self.buckets[self.get_bucket_for(node)].nodes.get(node.id)
        return known


def node_address(node: Node) -> Address:
    """Where the contact ``node`` is reached: its ``(ip, port)``."""
    return node.ip, node.port
