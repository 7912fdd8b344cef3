"""``pulsarcast bench large --sim`` at a size a test can afford: the figures are there and
the large events arrive whole in every mode."""

from __future__ import annotations

from pulsar.tools.sim.large import sim_large


def test_sim_large_reports_the_bench_figures() -> None:
    figures = sim_large(nodes=12, events=1, interval=2.0)
    assert figures["delivery_ratio"] == 1.0
    for mode in ("fragments", "store_and_forward", "store_and_forward_plain", "dht_pull"):
        assert figures["modes"][mode]["delivery_ratio"] == 1.0
    assert figures["modes"]["fragments"]["pulled_from_dht"] == 0
    assert figures["latency_p50_ms"] < figures["store_and_forward_latency_p50_ms"]
    assert figures["bytes_ratio_vs_store_and_forward"] <= 1.1
    assert figures["small_event_latency_p50_ms"] <= 2 * figures["idle_small_event_latency_p50_ms"]
