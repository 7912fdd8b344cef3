"""Token buckets and throttled logs, driven by explicit clocks."""

from __future__ import annotations

import logging

import pytest

from dht.ratelimit import KeyedLimiter, LogThrottle, TokenBucket


def test_token_bucket_spends_and_refills() -> None:
    bucket = TokenBucket(rate=10, burst=5, now=0.0)
    assert all(bucket.take(1, 0.0) for _ in range(5))
    assert not bucket.take(1, 0.0)
    assert bucket.take(1, 0.1)  # 0.1 s at 10/s is one token
    assert not bucket.take(5, 0.2)
    assert bucket.take(5, 10.0)  # capped at burst


def test_keyed_limiter_limits_each_key_and_all_together() -> None:
    limiter = KeyedLimiter(rate=1, burst=3, global_rate=1, global_burst=5)
    assert limiter.allow("a", 3, 0.0)
    assert not limiter.allow("a", 1, 0.0)  # a's own bucket is empty
    assert limiter.allow("b", 2, 0.0)
    assert not limiter.allow("c", 1, 0.0)  # the global bucket is empty


def test_keyed_limiter_memory_is_bounded() -> None:
    limiter = KeyedLimiter(rate=1, burst=1, global_rate=1e9, global_burst=1e9, max_keys=10)
    for i in range(1000):
        limiter.allow(i, 1, 0.0)
    assert len(limiter._buckets) == 10


def test_log_throttle_counts_what_it_suppresses(caplog: pytest.LogCaptureFixture) -> None:
    throttle = LogThrottle(logging.getLogger("t"), interval=10.0)
    with caplog.at_level(logging.WARNING, logger="t"):
        for i in range(5):
            throttle.log(logging.WARNING, "x", float(i), "bad thing %d", i)
        throttle.log(logging.WARNING, "x", 20.0, "bad thing %d", 99)
    assert [r.getMessage() for r in caplog.records] == [
        "bad thing 0", "bad thing 99 (4 similar suppressed)"]
