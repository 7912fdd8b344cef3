"""The DHT layer: content-addressed, verified, durable block storage on Kademlia.

Built on the ``kademlia`` package (UDP, u-msgpack RPC) and wire-compatible with it: a block
with CID ``c`` is stored under the package's key for ``bytes(c)``, so a stock
``kademlia.network.Server`` reads our blocks with ``await server.get(bytes(c))``. What we add
on top — verification of every stored and fetched value, durable SQLite storage with working
republish and expiry, pipelined batched stores, hardened datagram handling, local routing
queries and the address book — is described in ``docs/architecture.md``.

Dependencies point one way: ``dht`` uses ``dag`` (CIDs, identity, block store, chunk trees)
and nothing above it.
"""

from .config import DhtConfig
from .errors import (
    BlockNotFound,
    BlockTooLarge,
    DhtError,
    NotStarted,
    PeerIdMismatch,
    UnsupportedCID,
)
from .keys import MAX_BLOCK_SIZE, dht_key
from .maintenance import MaintenanceReport
from .node import DhtNode, PeerProver
from .peers import Contact, PeerBook
from .replication import PutResult
from .stats import DhtStats

__all__ = [
    "MAX_BLOCK_SIZE",
    "BlockNotFound",
    "BlockTooLarge",
    "Contact",
    "DhtConfig",
    "DhtError",
    "DhtNode",
    "DhtStats",
    "MaintenanceReport",
    "NotStarted",
    "PeerBook",
    "PeerIdMismatch",
    "PeerProver",
    "PutResult",
    "UnsupportedCID",
    "dht_key",
]
