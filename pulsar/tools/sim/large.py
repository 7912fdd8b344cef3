"""The ``large`` workload in the simulator: ``pulsarcast bench large --sim``.

The same figures as :mod:`pulsar.tools.bench.large`, from the same protocol cores driven by
:class:`~pulsar.tools.sim.network.SimNetwork` with its bandwidth model (a token bucket per
node's uplink), so they can be had at 1,000 nodes. Differences from the loopback bench: the
simulated DHT answers in one round trip and is not bandwidth-limited (so ``dht_pull`` is a
lower bound: the herd of 171 chunk look-ups per subscriber costs nothing here beyond the
round trips), latencies are simulated seconds, and the payload is counted delivered when the
event is delivered (delivery waits for the complete, verified payload; in ``dht_pull`` one
more round trip per chunk-tree level is added for the reader's pull, at 16 blocks in flight
as ``dag.chunks.assemble`` does).
"""

from __future__ import annotations

import math
import random
from typing import Any

from dag import CID
from dag.chunks import local_blocks
from pulsar.proto import events as ev
from pulsar.proto.core import CoreConfig
from pulsar.proto.fragments.config import FragmentConfig

from .network import SimNetwork

__all__ = ["MODES", "large_figures", "mode_config", "sim_large"]

_PULL_PARALLEL = 16


MODES: tuple[str, ...] = ("fragments", "store_and_forward", "store_and_forward_plain",
                          "dht_pull")
"""The bench modes, in the order they run."""


def mode_config(mode: str, rate: float) -> FragmentConfig:
    """The fragment settings of one bench mode:

    * ``fragments``: everything on;
    * ``store_and_forward``: the same but without cut-through (a relay holds a payload
      until it is complete), the one difference the cut-through figure may rest on; its
      children's stall timeout is raised to 30 s, since a relay that waits for a whole
      payload is not stalled (with no loss nothing is asked for again either way);
    * ``store_and_forward_plain``: as ``store_and_forward`` and also no IDONTWANT and no
      staggering: the baseline of the figures first published, kept beside the fair one
      because staggering helps store-and-forward most;
    * else DHT pull (fragments off)."""
    if mode == "fragments":
        return FragmentConfig(rate=rate)
    if mode == "store_and_forward":
        return FragmentConfig(rate=rate, cut_through=False, stall_timeout=30.0)
    if mode == "store_and_forward_plain":
        return FragmentConfig(rate=rate, cut_through=False, idontwant=False, stagger_group=0,
                              stall_timeout=30.0)
    return FragmentConfig(enabled=False)


def _percentile(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _run(mode: str, n: int, events: int, interval: float, mbps: float, link_ms: float,
         seed: int) -> dict[str, Any]:
    bandwidth = mbps * 1e6 / 8
    net = SimNetwork(n, seed=seed, bucket_size=20, latency=link_ms / 1000,
                     bandwidth=bandwidth,
                     config=CoreConfig(fragments=mode_config(mode, bandwidth * 0.9)))
    author = net.node(0)
    requests = [net.command(author, lambda r, name=name: ev.CreateTopic(r, name))
                for name in ("large", "small")]
    net.settle(10)
    large, small = (author.topics[r] for r in requests)
    for i in range(1, n):
        net.subscribe(net.node(i), large)
        net.subscribe(net.node(i), small)
        if i % 100 == 0:
            net.settle(0.1)
    net.settle(20)
    rng = random.Random(seed)

    def small_round(rounds: int) -> None:
        for _ in range(rounds):
            net.publish(net.node(2), small.cid, rng.randbytes(200))
            net.settle(0.1)

    def latencies(topic_cid: Any, since: float) -> list[float]:
        out = []
        for node in net._order[1:]:
            for event in node.delivered.get(topic_cid, []):
                t0 = net.stats.published_at.get(event.cid)
                if t0 is not None and t0 >= since and event.publisher != node.peer_id:
                    out.append(delivered_at[(node.peer_id, event.cid)] - t0)
        return out

    delivered_at: dict[Any, float] = {}
    missing = [0]
    # The reader's pull: root, then the leaves 16 at a time, one round trip each.
    pull = 2 * link_ms / 1000 * (2 + math.ceil(171 / _PULL_PARALLEL))
    original = net._delivered

    def record(node: Any, out: ev.Deliver) -> None:
        # The payload counts when it is here: a large event delivered without its whole
        # chunk tree (given up, or taken in by repair) pays the reader's DHT pull.
        at = net.now
        root = out.event.payload
        if isinstance(root, CID) and local_blocks(root, node.store.get) is None:
            at += pull
            missing[0] += 1
        delivered_at[(node.peer_id, out.event.cid)] = at
        original(node, out)

    net._delivered = record  # type: ignore[method-assign]
    t_idle = net.now
    small_round(30)
    idle_small = latencies(small.cid, t_idle)
    t_busy = net.now
    bytes0 = net.bytes_sent
    per_large = max(1, round(interval / 0.1))
    for k in range(events):
        net.publish(net.node(1), large.cid, random.Random(k).randbytes(1 << 20))
        small_round(per_large)
    net.settle(60)
    sent = net.bytes_sent - bytes0
    busy_small = latencies(small.cid, t_busy)
    large_lat = latencies(large.cid, t_busy)
    expected = events * (n - 2)  # node 1 publishes
    counters: dict[str, int] = {}
    for node in net._order:
        for key, value in node.core.counters().items():
            if key.startswith(("fragment", "large_", "idontwant", "fwant")):
                counters[key] = counters.get(key, 0) + value
    p = _percentile
    return {
        "delivery_ratio": round(len(large_lat) / expected, 4),
        "latency_p50_ms": _ms(p(large_lat, 50)),
        "latency_p99_ms": _ms(p(large_lat, 99)),
        "small_p50_ms": _ms(p(busy_small, 50)),
        "idle_small_p50_ms": _ms(p(idle_small, 50)),
        "bytes": sent,
        "pulled_from_dht": missing[0],
        "counters": counters,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def sim_large(nodes: int = 1000, events: int = 3, interval: float = 4.0, mbps: float = 50.0,
              link_ms: float = 100.0, seed: int = 1,
              modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """The ``bench large`` figures from the simulator (see the module docstring)."""
    results = {m: _run(m, nodes, events, interval, mbps, link_ms, seed) for m in modes}
    return {"simulated": True, "seed": seed,
            **large_figures(results, nodes, events, mbps, link_ms)}


def large_figures(results: dict[str, dict[str, Any]], nodes: int, events: int, mbps: float,
                  link_ms: float) -> dict[str, Any]:
    """The figures from the runs of each mode (:data:`MODES`), the same for the loopback
    bench and the simulator: cut-through against ``store_and_forward`` (only cut-through
    differs), and beside it the same against ``store_and_forward_plain``."""
    main = results.get("fragments", {})
    saf = results.get("store_and_forward", {})
    plain = results.get("store_and_forward_plain", {})
    pull = results.get("dht_pull", {})

    def bytes_ratio(base: dict[str, Any]) -> float | None:
        return round(main["bytes"] / base["bytes"], 3) if main and base and base["bytes"] else None

    def latency_ratio(base: dict[str, Any]) -> float | None:
        ours, theirs = main.get("latency_p50_ms"), base.get("latency_p50_ms")
        return round(ours / theirs, 3) if ours is not None and theirs else None

    return {
        "nodes": nodes,
        "events": events,
        "mbps": mbps,
        "link_ms": link_ms,
        "delivery_ratio": main.get("delivery_ratio"),
        "latency_p50_ms": main.get("latency_p50_ms"),
        "latency_p99_ms": main.get("latency_p99_ms"),
        "store_and_forward_latency_p50_ms": saf.get("latency_p50_ms"),
        "latency_p50_ratio_vs_store_and_forward": latency_ratio(saf),
        "bytes_ratio_vs_store_and_forward": bytes_ratio(saf),
        "store_and_forward_plain_latency_p50_ms": plain.get("latency_p50_ms"),
        "latency_p50_ratio_vs_store_and_forward_plain": latency_ratio(plain),
        "bytes_ratio_vs_store_and_forward_plain": bytes_ratio(plain),
        "dht_pull_latency_p50_ms": pull.get("latency_p50_ms"),
        "small_event_latency_p50_ms": main.get("small_p50_ms"),
        "idle_small_event_latency_p50_ms": main.get("idle_small_p50_ms"),
        "modes": results,
    }
