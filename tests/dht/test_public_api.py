"""The public surface of ``dht`` changes only on purpose."""

from __future__ import annotations

import dht


def test_public_api_is_pinned() -> None:
    assert sorted(dht.__all__) == sorted([
        "MAX_BLOCK_SIZE", "BlockNotFound", "BlockTooLarge", "Contact", "DhtConfig",
        "DhtError", "DhtNode", "DhtStats", "MaintenanceReport", "NotStarted", "PeerBook",
        "PeerIdMismatch", "PeerProver", "PutResult", "UnsupportedCID", "dht_key",
    ])
    for name in dht.__all__:
        assert getattr(dht, name) is not None


def test_errors_subclass_the_builtins_they_resemble() -> None:
    assert issubclass(dht.BlockNotFound, LookupError)
    assert issubclass(dht.BlockTooLarge, ValueError)
    assert issubclass(dht.UnsupportedCID, ValueError)
    assert issubclass(dht.PeerIdMismatch, ValueError)
    assert issubclass(dht.NotStarted, RuntimeError)
    assert all(issubclass(e, dht.DhtError) for e in (
        dht.BlockNotFound, dht.BlockTooLarge, dht.UnsupportedCID, dht.PeerIdMismatch,
        dht.NotStarted))
