"""``pulsarcast bench retention`` on a small scale: five real nodes, a topic keeping 60
events, published past it; the subscribers' logs are cut and the figures computed."""

from __future__ import annotations

from pulsar.runtime.retention import APPLY_EVERY
from pulsar.tools.bench.retention import NODES, bench_retention
from pulsar.tools.cli import main


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    assert main(["bench", "retention", "--rate", "-1"]) == 2


async def test_the_logs_are_cut_to_the_policy_and_the_growth_is_measured() -> None:
    rate, max_events = 40.0, 60
    figures = await bench_retention(rate=rate, seconds=8.0, max_events=max_events,
                                    sample_every=1.0)
    assert figures["refused"] == 0 and figures["published"] >= 0.5 * rate * 8
    # Every subscriber filled its log and was cut back: what a log holds is the policy
    # plus what arrives between two cuts (one every APPLY_EVERY seconds while it grows).
    last = figures["samples"][-1]
    assert all(max_events <= kept <= max_events + rate * (APPLY_EVERY + 1.5)
               for kept in last["kept"][1:])
    assert figures["log_kept_max"] < figures["published"]
    assert figures["filled_at_s"] is not None
    assert figures["disk_growth_after_fill"] is not None
    assert len(last["disk"]) == len(last["dht"]) == NODES


async def test_a_compacted_topic_keeps_about_one_event_per_key() -> None:
    rate, keys = 40.0, 10
    figures = await bench_retention(rate=rate, seconds=6.0, keys=keys, sample_every=1.0,
                                    settle_for=0.0)
    assert figures["refused"] == 0 and figures["published"] >= 0.5 * rate * 6
    assert figures["keys"] == keys and figures["max_events"] is None
    # Without waiting for the idle sweep: one per key, plus what arrived since the last
    # pass (one every APPLY_EVERY seconds while the log grows).
    assert figures["compacted_events"] is not None
    assert keys <= figures["compacted_events"] <= keys + rate * (APPLY_EVERY + 1.5)
    assert figures["compacted_events"] < figures["published"]
