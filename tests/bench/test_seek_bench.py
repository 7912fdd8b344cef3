"""``pulsarcast bench seek`` at a small size: what its figures mean holds."""

from __future__ import annotations

import math

from pulsar.tools.bench.seek import bench_seek


def test_seek_finds_what_the_walk_finds_within_the_bound() -> None:
    figures = bench_seek(events=3000, every=100, seeks=12, seed=3)
    sizes = [row["events"] for row in figures["sizes"]]
    assert sizes == [30, 300, 3000]
    for row in figures["sizes"]:
        # The bench raises if a seek and the walk ever disagree; here: the bound holds,
        # and a seek reads at most log2(checkpoints) checkpoints beyond the record, the
        # newest checkpoint, one leaf and the event.
        assert row["fetches_max"] <= 2 * math.log2(row["events"]) + 8
        assert row["fetches_max"] <= math.ceil(math.log2(row["checkpoints"])) + 4
    largest = figures["sizes"][-1]
    assert largest["walk_fetches_mean"] > 10 * largest["fetches_mean"]
    assert figures["fetches_max"] == largest["fetches_max"]
