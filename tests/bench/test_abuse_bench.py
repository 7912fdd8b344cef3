"""``pulsarcast bench abuse`` runs end to end, tiny, and the DHT figures hold their bounds.

The REST figures are only checked for presence: they measure the API's input validation and
back-pressure, which the benchmark reports whatever they are."""

from __future__ import annotations

import pytest

from pulsar.bench.abuse import REST_BATTERY, SOURCE_QUOTA, bench_abuse

pytestmark = pytest.mark.slow


async def test_abuse_bench_figures() -> None:
    figures = await bench_abuse(events=2, payload_kb=16, junk_mb=9.0, stall_seconds=1.0,
                                reflection_seconds=6.0,
                                latency_requests=20)
    assert figures["rest_battery"] == len(REST_BATTERY)
    for name in ("rest_5xx", "rest_bad_accepted", "stalled_readers_mem_mb",
                 "rest_p99_ms_baseline", "rest_p99_ms_during_dht_flood"):
        assert figures[name] >= 0
    assert 0 < figures["dht_reflection_ratio"] <= 3
    assert figures["dht_validations_failed"] >= 1
    assert 0 < figures["unproven_source_stored_bytes"] <= SOURCE_QUOTA
    assert figures["junk_sent_bytes"] > SOURCE_QUOTA
    assert figures["dht_stores_over_source_quota"] > 0
    assert figures["dht_flood_datagrams_per_s"] > 0
