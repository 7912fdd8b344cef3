"""The node-wide membership layer in the simulator: active views stay symmetric and the
overlay connected while 30 % of the nodes crash, and when they come back."""

from __future__ import annotations

import random

from pulsar.proto.membership.overlay import MembershipConfig
from pulsar.tools.sim import SimNetwork
from pulsar.tools.sim.metrics import overlay_invariants

SIZE = MembershipConfig().active_size


def _check(net: SimNetwork) -> None:
    figures = overlay_invariants(net)
    assert figures["overlay_one_sided_links"] == 0  # nor any link to a dead node
    assert figures["overlay_components"] == 1
    assert all(1 <= len(view) <= SIZE for view in net.overlay().values())


def test_views_are_symmetric_and_connected_under_30_percent_churn() -> None:
    net = SimNetwork(200, seed=5, bucket_size=20, latency_range=(0.005, 0.1))
    net.settle(60)
    _check(net)
    overlay = net.overlay()
    assert sum(len(v) for v in overlay.values()) / len(overlay) >= SIZE - 1  # views fill up

    rng = random.Random(9)
    victims = rng.sample(sorted(net.nodes.values(), key=lambda n: bytes(n.peer_id)), 60)
    for node in victims:
        net.crash(node)
    net.settle(40)
    assert len(net.overlay()) == 140
    _check(net)  # no dead neighbour kept, no live node cut off

    for node in victims:
        net.restart(node)
    net.settle(60)
    overlay = net.overlay()
    assert len(overlay) == 200
    _check(net)
    assert sum(len(v) for v in overlay.values()) / len(overlay) >= SIZE - 1


def test_waves_of_churn_never_split_the_overlay() -> None:
    """Three waves: 30 % crash, the previous wave's victims come back, twice more."""
    net = SimNetwork(150, seed=8, bucket_size=20, latency_range=(0.005, 0.1))
    net.settle(40)
    rng = random.Random(3)
    down: list = []
    for _ in range(3):
        for node in down:
            net.restart(node)
        up = sorted((n for n in net.nodes.values() if n.alive), key=lambda n: bytes(n.peer_id))
        down = rng.sample(up, 45)
        for node in down:
            net.crash(node)
        net.settle(40)
        _check(net)


def test_near_slots_go_to_the_nearest_peers() -> None:
    """Links of 5 to 400 ms one way: the near slots end up on peers much nearer than the
    random ones (which stay random, at about the network's mean)."""
    net = SimNetwork(200, seed=6, bucket_size=20, latency_range=(0.005, 0.4))
    net.settle(180)
    figures = overlay_invariants(net)
    assert figures["overlay_components"] == 1
    assert figures["near_links"] >= 100  # one seek per shuffle: 137 of 400 slots by 180 s
    assert figures["near_link_ms"] < 0.6 * figures["random_link_ms"], figures
    assert figures["random_link_ms"] > 120  # the mean of the range is ~200 ms
