"""Large events on real nodes over loopback: fragments along the tree under a bandwidth
limit, and the publish size limit."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pulsar import Node, NodeConfig, PayloadTooLarge
from pulsar.net.faults import FaultInjector
from pulsar.proto.fragments.config import FragmentConfig

from .conftest import FAST_CORE, Network, collect

BANDWIDTH = 4 * 1024 * 1024
"""Bytes/s of each node's uplink in these tests (small enough to matter, fast to run)."""


class LargeNetwork(Network):
    """Nodes whose uplinks are bandwidth-limited with 10 ms links, fragments paced at the
    uplink's rate and a small size limit (so the over-limit error is cheap to provoke)."""

    def config(self, index: int, bootstrap: tuple[tuple[str, int], ...]) -> NodeConfig:
        base = super().config(index, bootstrap)
        fragments = FragmentConfig(rate=BANDWIDTH * 0.9, max_event_size=2 * 1024 * 1024)
        return dataclasses.replace(
            base,
            core=dataclasses.replace(FAST_CORE, fragments=fragments),
            faults=FaultInjector(seed=index, latency=0.01, bandwidth=BANDWIDTH),
        )


@pytest.fixture
async def large_network(tmp_path: Path) -> AsyncIterator[LargeNetwork]:
    net = LargeNetwork(tmp_path)
    try:
        yield net
    finally:
        await net.close()


async def test_a_large_event_travels_the_tree_as_verified_fragments(
    large_network: LargeNetwork,
) -> None:
    nodes: list[Node] = await large_network.start(5)
    author = nodes[0]
    topic = await author.create_topic("large")
    subs = await asyncio.gather(*(n.subscribe(topic.cid) for n in nodes[1:]))
    payload = random.Random(7).randbytes(1024 * 1024)
    event = await nodes[1].publish(topic.cid, payload)
    assert not event.is_inline
    received = await asyncio.gather(*(collect(s, 1, timeout=30.0) for s in subs))
    for node, [got] in zip(nodes[1:], received, strict=True):
        assert got.cid == event.cid
        assert await node.payload_of(got) == payload
    # The payload came down the tree: the subscribers received fragments, relayed them
    # and never had to pull from the DHT; nobody gave up.
    counters = [n.metrics for n in nodes]
    assert sum(c["fragments_received"] for c in counters) >= 4 * 170
    assert sum(c["large_completed"] for c in counters) >= 3
    assert sum(c["large_given_up"] for c in counters) == 0
    assert sum(c["fragment_fetches"] for c in counters) == 0
    # Over the limit: refused at once with the documented error.
    with pytest.raises(PayloadTooLarge, match="over this node's limit"):
        await author.publish(topic.cid, bytes(2 * 1024 * 1024 + 1))


async def test_small_events_below_the_threshold_are_unchanged(network: Network) -> None:
    a, b = await network.start(2)
    topic = await a.create_topic("small")
    sub = await b.subscribe(topic.cid)
    medium = bytes(range(256)) * 40  # 10 KiB: a DHT chunk tree, below the threshold
    event = await a.publish(topic.cid, medium)
    [got] = await collect(sub, 1)
    assert got.cid == event.cid and await b.payload_of(got) == medium
    assert b.metrics["fragments_received"] == 0
