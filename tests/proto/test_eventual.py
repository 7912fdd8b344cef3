"""Eventual delivery in the simulator: tree + Plumtree + backfill + heads, under loss and
crashes, driving the real cores (the loopback version lives in tests/node)."""

from __future__ import annotations

import pytest

from dag import EventDescriptor
from pulsar.proto.core import PulsarCore
from pulsar.tools.sim import SimNode

from .test_core import _network, _subscribe_all, _topic


def _causal(events: list[EventDescriptor]) -> bool:
    seen = set()
    for event in events:
        if event.parent is not None and event.parent not in seen:
            return False
        seen.add(event.cid)
    return True


def _backfill_counts(node: SimNode) -> dict[str, int]:
    assert isinstance(node.core, PulsarCore)
    return node.core.backfill.metrics


@pytest.mark.parametrize("seed", [3, 11])
def test_loss_and_crashes_every_live_subscriber_gets_everything_once_in_order(seed: int) -> None:
    net, author = _network(30, bucket_size=1, loss=0.10, seed=seed)
    nodes = list(net.nodes.values())
    topic = _topic(author.identity)
    _subscribe_all(net, topic, nodes)
    doomed = net.rng.sample(nodes[1:], 9)  # 30 % of the network
    for i in range(120):
        net.publish(author, topic.cid, b"e%d" % i)
        net.run(until=net.now + 0.05)
        if i == 40:
            for node in doomed:
                net.crash(node)
    net.settle(60)
    published = [e.cid for e in author.delivered[topic.cid]]
    assert len(published) == 120
    for node in nodes[1:]:
        if node in doomed:
            continue
        got = node.delivered.get(topic.cid, [])
        assert [e.cid for e in got] == published, (len(got), node.gaps)
        assert _causal(got)


def test_concurrent_publishers_converge_to_the_same_dag() -> None:
    net, author = _network(20, bucket_size=1, loss=0.05, seed=5)
    nodes = list(net.nodes.values())
    topic = _topic(author.identity)  # anyone may publish, LAST_SEEN linking
    _subscribe_all(net, topic, nodes)
    publishers = nodes[1:4]
    for i in range(30):
        for p in publishers:
            net.publish(p, topic.cid, f"{p.peer_id} {i}".encode())
        net.run(until=net.now + 0.02)
    net.settle(60)
    everything = {e.cid for p in publishers for e in p.delivered.get(topic.cid, [])}
    assert len(everything) == 90
    for node in nodes:
        got = node.delivered.get(topic.cid, [])
        assert {e.cid for e in got} == everything
        assert len(got) == 90 and _causal(got)
    assert not any(n.gaps for n in nodes)
    # The 5 % loss did cost events that only backfill (WANT/BLOCKS, DHT fetches) brought
    # back: with this seed some 50 blocks. Zero would mean the run converged without the
    # repair path this test is about (or that backfill stopped counting what it took).
    assert sum(_backfill_counts(n)["backfilled"] for n in nodes) > 0
    for node in nodes:
        counts = _backfill_counts(node)
        # Every node's core emitted one Deliver per event, and nothing is left behind: no
        # event still held for a parent, no gap still open (they would be delivered late,
        # or never, after this check).
        assert counts["delivered"] == 90
        assert counts["held"] == 0 and counts["gaps_open"] == 0
