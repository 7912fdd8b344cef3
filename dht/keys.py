"""How blocks map onto Kademlia keys, and the one check every stored or fetched value passes.

A block with CID ``c`` lives under the *user key* ``bytes(c)``. The ``kademlia`` package
never puts a user key on the wire: ``Server.set``/``Server.get`` hash it with sha1 first
(:func:`kademlia.utils.digest`), and the 20-byte digest is what STORE and FIND_VALUE carry
and what every node's storage is keyed by. We use the same mapping, so a stock
``Server.get(bytes(cid))`` finds our blocks and a stock ``Server.set(bytes(cid), block)``
lands where our lookups search.

A STORE therefore shows a node only ``sha1(bytes(cid))`` and the value, never the CID.
The value still pins the CID down: we hash it with sha2-256, build the CIDv1 for each codec
pulsarcast writes (dag-cbor, raw) and accept the value only if one of them hashes to the
key. Forging that would need a sha2-256 preimage under a sha1 preimage; anything else (a
wrong value, a value for another key, a non-``bytes`` value) is refused.
"""

from __future__ import annotations

import hashlib
from typing import Final

import umsgpack

from dag.cid import CID, DAG_CBOR, RAW, SHA2_256, cid_of, cid_of_raw
from dag.errors import InvalidDescriptor
from dag.records import MAX_RECORD_SIZE, HeadsRecord

from .errors import BlockTooLarge, UnsupportedCID

__all__ = [
    "KEY_SIZE",
    "MAX_BLOCK_SIZE",
    "MAX_RPC_SIZE",
    "STORABLE_CODECS",
    "check_block_size",
    "check_fetchable",
    "dht_key",
    "parse_record",
    "record_cid",
    "record_matches",
    "record_replaces",
]

KEY_SIZE: Final = 20
"""Kademlia ids and keys are 160 bits (the package's choice, sha1-sized)."""

MAX_RPC_SIZE: Final = 8192
"""``rpcudp`` refuses to send a request whose msgpack body ``[name, args]`` exceeds this."""

_STORE_OVERHEAD: Final = (
    len(umsgpack.packb(["store", (b"\0" * KEY_SIZE, b"\0" * KEY_SIZE, b"\0" * 1024)])) - 1024
)

MAX_BLOCK_SIZE: Final = MAX_RPC_SIZE - _STORE_OVERHEAD
"""Largest block one STORE can carry (8137 bytes). Bigger payloads go through a chunk tree
(``dag.chunks``), whose leaves (6 KiB) and nodes (< 5 KiB) stay below this."""

STORABLE_CODECS: Final = (DAG_CBOR, RAW)
"""Codecs a node accepts in a STORE: what pulsarcast writes (descriptors, chunk nodes and
chunk leaves). Only these are tried when verifying a value against a bare key."""


_DAG_CBOR_PREFIX: Final = bytes(cid_of(b""))[:-32]
_RAW_PREFIX: Final = bytes(cid_of_raw(b""))[:-32]


def dht_key(cid: CID) -> bytes:
    """The 20-byte key a block is stored under: sha1 of its binary CID."""
    return hashlib.sha1(bytes(cid)).digest()


def record_cid(key: bytes, value: object) -> CID | None:
    """The CID that ``value`` is stored under if it belongs under ``key``, else ``None``.

    This is the check behind every STORE we accept and every value we keep."""
    if not isinstance(key, bytes) or len(key) != KEY_SIZE:
        return None
    if not isinstance(value, bytes) or len(value) > MAX_BLOCK_SIZE:
        return None
    digest = hashlib.sha256(value).digest()  # once, then one cheap sha1 per codec
    for prefix in (_DAG_CBOR_PREFIX, _RAW_PREFIX):
        if hashlib.sha1(prefix + digest).digest() == key:
            return CID(prefix + digest)
    return None


def record_matches(key: bytes, value: object) -> bool:
    """:func:`record_cid` as a yes/no, without building the CID (the STORE hot path)."""
    if type(value) is not bytes or len(value) > MAX_BLOCK_SIZE or len(key) != KEY_SIZE:
        return False
    digest = hashlib.sha256(value).digest()
    return key in (hashlib.sha1(_DAG_CBOR_PREFIX + digest).digest(),
                   hashlib.sha1(_RAW_PREFIX + digest).digest())


def check_block_size(block: bytes) -> None:
    """Raise :class:`BlockTooLarge` for a block that does not fit one STORE."""
    if len(block) > MAX_BLOCK_SIZE:
        raise BlockTooLarge(
            f"block of {len(block)} bytes exceeds the {MAX_BLOCK_SIZE}-byte DHT RPC limit; "
            "store it with put_large(), which splits it into a chunk tree"
        )


def check_fetchable(cid: CID) -> None:
    """Raise :class:`UnsupportedCID` unless a block for ``cid`` can be verified (sha2-256)."""
    if cid.hash_code != SHA2_256:
        raise UnsupportedCID(f"{cid} uses multihash 0x{cid.hash_code:x}; only sha2-256 is checked")


# --------------------------------------------------------------------------- heads records


def parse_record(key: bytes, value: object) -> HeadsRecord | None:
    """The record ``value`` holds if it is a valid heads record belonging under ``key``."""
    if type(value) is not bytes or len(value) > MAX_RECORD_SIZE:
        return None
    try:
        record = HeadsRecord.from_block(value)
    except InvalidDescriptor:
        return None
    return record if record.key == key else None


def record_replaces(key: bytes, value: object, held: bytes | None) -> bool:
    """Whether ``value`` may be stored under ``key`` in place of ``held``: a valid record
    for that key, newer than the one held (if any)."""
    record = parse_record(key, value)
    if record is None:
        return False
    if held is None:
        return True
    current = parse_record(key, held)
    return current is None or record.seq > current.seq
