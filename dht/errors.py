"""The exception tree of the ``dht`` layer.

A caller's misuse (a block too large for one RPC, a CID we cannot verify) is a
``ValueError``; the network not producing a block is a ``LookupError``; a peer whose proof
contradicts the id it claims is a ``ValueError`` too, because it is bad input from outside::

    DhtError
     ├── BlockNotFound      (LookupError)  no holder returned a block matching the CID in time
     ├── BlockTooLarge      (ValueError)   a block over one RPC; use ``put_large``
     ├── UnsupportedCID     (ValueError)   a CID whose hash we cannot check (not sha2-256)
     ├── PeerIdMismatch     (ValueError)   a proven peer id does not hash to the contact's id
     └── NotStarted         (RuntimeError) the node is stopped or was never started
"""

from __future__ import annotations

__all__ = [
    "BlockNotFound",
    "BlockTooLarge",
    "DhtError",
    "NotStarted",
    "PeerIdMismatch",
    "UnsupportedCID",
]


class DhtError(Exception):
    """Base of every error raised by the ``dht`` package."""


class BlockNotFound(DhtError, LookupError):
    """No reachable holder returned a block that hashes to the CID asked for.

    ``queried`` counts peers that answered, ``bad_values`` those that answered with a value
    that failed verification (they were ignored), ``timed_out`` tells whether the lookup ran
    out of time rather than out of peers.
    """

    def __init__(self, cid: object, *, queried: int = 0, bad_values: int = 0,
                 timed_out: bool = False) -> None:
        self.cid = cid
        self.queried = queried
        self.bad_values = bad_values
        self.timed_out = timed_out
        why = "lookup timed out" if timed_out else "no holder left to ask"
        super().__init__(
            f"block {cid} not found ({why}; {queried} peers answered, "
            f"{bad_values} returned a value that failed verification)"
        )


class BlockTooLarge(DhtError, ValueError):
    """A block larger than one DHT RPC can carry. Large payloads go through ``put_large``."""


class UnsupportedCID(DhtError, ValueError):
    """A CID whose block cannot be verified here (only sha2-256 multihashes are checked)."""


class PeerIdMismatch(DhtError, ValueError):
    """A peer proved an identity whose Kademlia id is not the id the contact claimed."""


class NotStarted(DhtError, RuntimeError):
    """The node is not running (never started, or already stopped)."""
