"""The pure state of address validation and storage quotas, driven by explicit clocks."""

from __future__ import annotations

from dht.address_check import AddressCheck, Verdict
from dht.quota import Refusal, StoreQuota

A = ("10.0.0.1", 4000)
B = ("10.0.0.2", 4000)


def test_requests_wait_for_the_round_trip_and_are_served_in_order() -> None:
    check: AddressCheck[str] = AddressCheck(max_held=3)
    assert not check.is_proven(A, 0.0)
    assert check.hold(A, "r1", 100, 0.0) is Verdict.VALIDATE  # one PING per address ...
    assert check.hold(A, "r2", 100, 0.0) is Verdict.HELD  # ... however many requests
    assert check.hold(A, "r3", 100, 0.0) is Verdict.HELD
    assert check.hold(A, "r4", 100, 0.0) is Verdict.DROPPED  # the hold is bounded
    assert check.held_bytes == 300
    assert check.prove(A, 0.1, b"i" * 20) == ["r1", "r2", "r3"]
    assert check.held_bytes == 0
    assert check.is_proven(A, 0.2) and check.identity(A, 0.2) == b"i" * 20
    assert check.prove(A, 0.3) == [] and check.identity(A, 0.3) == b"i" * 20  # id kept
    assert not check.is_proven(A, 0.3 + check.proof_ttl + 1)  # proofs expire


def test_a_failed_address_is_not_asked_again_for_a_while() -> None:
    check: AddressCheck[str] = AddressCheck(retry_after=30.0)
    assert check.hold(A, "r1", 10, 0.0) is Verdict.VALIDATE
    assert check.failed(A, 1.0) == 1
    assert check.held_bytes == 0
    assert check.hold(A, "r2", 10, 2.0) is Verdict.DROPPED
    assert not check.start(A, 2.0)
    assert check.hold(A, "r3", 10, 31.5) is Verdict.VALIDATE  # retry_after later


def test_start_sends_one_identity_ping_per_interval() -> None:
    check: AddressCheck[str] = AddressCheck(retry_after=30.0)
    assert check.start(B, 0.0)
    assert not check.start(B, 0.1)  # under way
    check.prove(B, 0.2, b"x" * 20)
    assert not check.start(B, 1.0)  # done recently
    assert check.start(B, 31.0)


def test_held_bytes_are_capped_across_addresses() -> None:
    check: AddressCheck[int] = AddressCheck(max_held_bytes=1000)
    assert check.hold(A, 1, 800, 0.0) is Verdict.VALIDATE
    assert check.hold(B, 2, 800, 0.0) is Verdict.VALIDATE  # validated, but not held
    assert check.prove(B, 0.1) == []
    assert check.held_bytes == 800


def test_memory_is_bounded() -> None:
    check: AddressCheck[int] = AddressCheck(max_addresses=10)
    for i in range(1000):
        check.hold((f"10.0.{i // 256}.{i % 256}", 1), i, 10, 0.0)
        check.prove((f"10.1.{i // 256}.{i % 256}", 1), 0.0)
    assert len(check._pending) == 10 and len(check._proven) == 10
    assert check.held_bytes == 100


def test_quota_per_source_window_and_total() -> None:
    stored = [0]
    quota = StoreQuota(source_quota=100, peer_quota=1000, window=60.0, max_bytes=500,
                       measure=lambda: stored[0])
    assert quota.admit(A, 60, 0.0) is None
    assert quota.admit(A, 60, 1.0) is Refusal.SOURCE
    assert quota.admit(A, 40, 1.0) is None
    assert quota.used(A, 1.0) == 100
    assert quota.admit(A, 60, 61.0) is None  # a new window
    assert quota.admit(B, 300, 61.0, peer=True) is None  # a proven peer's larger quota
    assert quota.total_bytes == 460
    stored[0] = 460  # the database agrees
    assert quota.admit(("10.0.0.3", 1), 60, 62.0) is Refusal.TOTAL  # 520 > 500 ...
    stored[0] = 100  # ... until expiry freed space: the estimate is re-counted
    assert quota.admit(("10.0.0.3", 1), 60, 62.0) is None
    assert quota.total_bytes == 160


def test_own_puts_count_toward_the_total() -> None:
    quota = StoreQuota(source_quota=1000, peer_quota=1000, window=60.0, max_bytes=500,
                       measure=lambda: 450)  # the database agrees with the estimate
    quota.added_locally(450)  # (starts at 450 measured, so now 900: over-estimated)
    assert quota.admit(A, 60, 0.0) is Refusal.TOTAL  # re-counted: 450 + 60 > 500
    assert quota.admit(A, 50, 0.0) is None
