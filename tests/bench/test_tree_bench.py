"""The multi-process tree benchmark runs end to end and its figures hang together.

Tiny on purpose (6 nodes over 2 worker processes, 20 events) so the suite stays fast; the
point is that the figures are computed from every process's observations consistently, and
that every process is gone afterwards.
"""

from __future__ import annotations

import os

import pytest

from pulsar.tools.bench import tree
from pulsar.tools.bench.tree import bench_tree

pytestmark = pytest.mark.slow


def _children() -> set[int]:
    """Live child processes of this one (Linux), zombies included."""
    pid = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(entry))
    return found


async def test_tree_bench_figures_are_consistent() -> None:
    before = _children()
    nodes, events = 6, 20
    figures = await bench_tree(nodes=nodes, events=events, processes=2)

    assert figures["nodes"] == nodes and figures["events"] == events
    assert figures["processes"] == 2
    # Every subscriber got every event (bench_tree also refuses to report otherwise, and
    # checks that each delivered CID is one the author published).
    assert figures["deliveries"] == events * (nodes - 1)
    assert figures["deliveries_per_s"] > 0
    assert 0 < figures["delivery_p50_ms"] <= figures["delivery_p99_ms"]
    # Redundancy: copies / deliveries - 1. At least one copy per subscriber and event (below
    # 0 means copies went uncounted, e.g. those taken by repair); at most the target 0.1
    # (measured 0.0 here: a settled tree without faults sends each subscriber one copy; a
    # tree that degenerated into flooding gives ~n - 2).
    assert 0 <= figures["rmr"] <= 0.1
    # A parent chain longer than n - 1 nodes is a cycle (the depth walk stops after n + 1).
    assert 1 <= figures["tree_depth"] <= nodes - 1
    assert 1 <= figures["ldh"] <= nodes - 1
    assert figures["relay_events_per_s"] > 0
    if os.path.isdir("/proc"):
        assert _children() <= before, "a worker process was left behind"


async def test_tree_bench_rejects_a_network_of_one() -> None:
    with pytest.raises(ValueError):
        await bench_tree(nodes=1, events=1)


async def test_tree_bench_timeout_stops_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _children()
    monkeypatch.setattr(tree, "TIMEOUT", 2.0)
    with pytest.raises(TimeoutError, match="did not finish"):
        await bench_tree(nodes=4, events=100_000, processes=2)
    if os.path.isdir("/proc"):
        assert _children() <= before, "a worker process was left behind"
