"""Key mapping and the value check behind every STORE."""

from __future__ import annotations

import hashlib
import os

import pytest
import umsgpack
from kademlia.utils import digest

from dag.cid import CID, cid_of, cid_of_raw
from dht import MAX_BLOCK_SIZE, BlockTooLarge, UnsupportedCID, dht_key
from dht.keys import (
    MAX_RPC_SIZE,
    check_block_size,
    check_fetchable,
    record_cid,
    record_matches,
)


def test_key_is_the_packages_digest_of_the_binary_cid() -> None:
    # so a stock Server.get(bytes(cid)) looks where we store
    cid = cid_of(b"\xa0")
    assert dht_key(cid) == digest(bytes(cid)) == hashlib.sha1(bytes(cid)).digest()


@pytest.mark.parametrize("make", [cid_of, cid_of_raw])
def test_record_cid_accepts_a_value_under_its_own_key(make: object) -> None:
    value = os.urandom(100)
    cid = make(value)  # type: ignore[operator]
    assert record_cid(dht_key(cid), value) == cid
    assert record_matches(dht_key(cid), value)


def test_record_cid_refuses_everything_else() -> None:
    value = os.urandom(100)
    key = dht_key(cid_of(value))
    for bad_key, bad_value in [(key, value + b"x"), (key, value.hex()), (key[:19], value),
                               (dht_key(cid_of(b"other")), value), (key, bytearray(value))]:
        assert not record_matches(bad_key, bad_value)
    assert record_cid(key, value + b"x") is None  # tampered
    assert record_cid(dht_key(cid_of(b"other")), value) is None  # someone else's key
    assert record_cid(key, value.hex()) is None  # not bytes
    assert record_cid(key, None) is None
    assert record_cid(key[:19], value) is None  # not a 20-byte key
    big = os.urandom(MAX_BLOCK_SIZE + 1)
    assert record_cid(dht_key(cid_of_raw(big)), big) is None  # over one RPC


def test_max_block_size_is_exactly_what_one_store_rpc_carries() -> None:
    def store_rpc(size: int) -> int:
        return len(umsgpack.packb(["store", (os.urandom(20), os.urandom(20), bytes(size))]))

    assert store_rpc(MAX_BLOCK_SIZE) == MAX_RPC_SIZE
    assert store_rpc(MAX_BLOCK_SIZE + 1) > MAX_RPC_SIZE
    check_block_size(bytes(MAX_BLOCK_SIZE))
    with pytest.raises(BlockTooLarge, match="put_large"):
        check_block_size(bytes(MAX_BLOCK_SIZE + 1))


def test_only_sha2_256_cids_can_be_fetched() -> None:
    check_fetchable(cid_of(b"\xa0"))
    identity_hash = CID(b"\x01\x55\x00\x03abc")
    with pytest.raises(UnsupportedCID):
        check_fetchable(identity_hash)
