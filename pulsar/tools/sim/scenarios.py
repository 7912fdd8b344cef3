"""``pulsarcast sim``: the reference scenarios on a simulated network of real cores.

iroh-gossip's simulator defines three (``single``: one sender; ``random``: a random sender
each round; ``all``: every node sends in each round). Ours add what a broker must survive:
``churn`` (random senders while nodes crash and, with ``restart``, come back from their
durable state), ``partition`` (a share of the nodes cut off for a while, then healed),
``offline-author`` (the topics' authors crash after creating them and never return) and
``late-subscriber`` (a share of the nodes subscribe after the last event, replaying the
history from the DHT and their neighbours).

A run: the authors create ``topics`` topics; every node (but the late ones) subscribes,
spread over a few simulated seconds; ``events`` rounds of publishing, one every
``interval``, round-robin over the topics; then the network runs until every live
subscriber has every acknowledged event or ``settle_max`` simulated seconds pass. The
result is one dictionary (the command prints it as one JSON line).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from dag import CID, TopicDescriptor
from pulsar.proto import events as ev

from .metrics import (
    check_invariants,
    delivery_counts,
    order_violations,
    overlay_invariants,
    percentiles,
)
from .network import Protocol, SimNetwork, SimNode

__all__ = ["SCENARIOS", "SimOptions", "run_sim"]

QUIET = 10.0
"""Simulated seconds the network runs after the last delivery before the trees are
checked (a JOIN retried after a crash takes up to a few ``join_timeout``)."""

SCENARIOS = ("single", "random", "all", "churn", "partition", "offline-author",
             "late-subscriber")


@dataclass(frozen=True)
class SimOptions:
    nodes: int = 100
    scenario: str = "single"
    protocol: Protocol = "pulsarcast"
    seed: int = 1
    topics: int = 1
    events: int = 100
    """Rounds of publishing: one event per round (``all``: one per live node per round)."""
    latency_ms: tuple[float, float] = (10.0, 100.0)
    """One-way latency of a link, fixed per link, uniform in this range."""
    loss: float = 0.0
    churn: float = 0.0
    """Share of the nodes that crash during publishing (``churn`` scenario: 0.3 unless set)."""
    restart: bool = True
    """Crashed nodes come back (after 1-5 simulated seconds) from their durable state."""
    partition: float = 0.0
    """Share of the nodes cut off during publishing (``partition`` scenario: 0.2)."""
    late: float = 0.0
    """Share of the nodes that subscribe after publishing (``late-subscriber``: 0.1)."""
    interval: float = 0.1
    bucket_size: int = 20
    replicas: int = 8
    settle_max: float = 120.0
    progress: bool = False

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; one of {', '.join(SCENARIOS)}")
        if self.nodes < 2:
            raise ValueError("a network needs at least 2 nodes")
        if not 1 <= self.topics <= self.nodes:
            raise ValueError("topics must be between 1 and the number of nodes")
        if self.events < 1:
            raise ValueError("events must be at least 1")
        lo, hi = self.latency_ms
        if not 0 <= lo <= hi:
            raise ValueError("latency range must be LO-HI with 0 <= LO <= HI (milliseconds)")
        for name in ("loss", "churn", "partition", "late"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")

    def with_defaults(self) -> SimOptions:
        """Fill in what a named scenario implies when the flag was left at 0."""
        changes: dict[str, float] = {}
        if self.scenario == "churn" and self.churn == 0.0:
            changes["churn"] = 0.3
        if self.scenario == "partition" and self.partition == 0.0:
            changes["partition"] = 0.2
        if self.scenario == "late-subscriber" and self.late == 0.0:
            changes["late"] = 0.1
        if not changes:
            return self
        return replace(self, **changes)  # type: ignore[arg-type]


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[sim {time.monotonic() - self.start:7.1f}s] {message}", file=sys.stderr,
                  flush=True)


def run_sim(options: SimOptions) -> dict[str, object]:
    """Run one scenario and return its figures (see ``docs/simulator.md``)."""
    options = options.with_defaults()
    show = _Progress(options.progress)
    wall = time.monotonic()
    lo, hi = options.latency_ms
    net = SimNetwork(
        options.nodes,
        seed=options.seed,
        latency=(lo + hi) / 2000,
        latency_range=(lo / 1000, hi / 1000),
        loss=0.0,
        bucket_size=options.bucket_size,
        protocol=options.protocol,
        replicas=options.replicas,
    )
    rng = net.rng
    nodes = [net.node(i) for i in range(options.nodes)]
    show(f"{options.nodes} nodes built ({options.protocol}, scenario {options.scenario})")

    # --- topics and subscriptions
    authors = rng.sample(nodes, options.topics)
    requests = [net.command(a, lambda r, i=i: ev.CreateTopic(r, f"topic-{i}"))
                for i, a in enumerate(authors)]
    net.settle(2.0)
    topics: list[TopicDescriptor] = []
    for author, request in zip(authors, requests, strict=True):
        if request not in author.topics:
            raise RuntimeError(f"topic creation failed: {author.failed.get(request)}")
        topics.append(author.topics[request])
    late_count = int(options.nodes * options.late)
    others = [n for n in nodes if n not in authors]
    late = set(map(id, rng.sample(others, late_count))) if late_count else set()
    spread = max(1.0, options.nodes / 2000)
    for node in nodes:
        if id(node) in late:
            continue
        for topic in topics:
            if node.peer_id != topic.author:
                net.input(node.peer_id, ev.Subscribe(topic, True, 0.0), rng.uniform(0, spread))
                node.subscriptions[topic.cid] = (topic, 0.0)
    net.settle(spread + 5.0)
    show(f"{len(topics)} topic(s) created and subscribed by {options.nodes - late_count} nodes")

    # --- faults planned over the publishing period
    net.loss = options.loss
    period = options.events * options.interval
    t0 = net.now
    protected = {id(a) for a in authors}
    ready = [n for n in others if id(n) not in late]
    sender = rng.choice(ready) if options.scenario == "single" else None
    if sender is not None:
        protected.add(id(sender))
    faults: list[tuple[float, Callable[[], None]]] = []
    crashed_for_good: set[int] = set()
    if options.scenario == "offline-author":
        for author in authors:
            faults.append((t0, partial(net.crash, author)))
            crashed_for_good.add(id(author))
    if options.churn:
        pool = [n for n in nodes if id(n) not in protected and id(n) not in late]
        victims = rng.sample(pool, min(len(pool), int(options.nodes * options.churn)))
        for victim in victims:
            at = t0 + rng.uniform(0, period)
            faults.append((at, partial(net.crash, victim)))
            if options.restart:
                faults.append((at + rng.uniform(1.0, 5.0), partial(net.restart, victim)))
            else:
                crashed_for_good.add(id(victim))
    if options.partition:
        cut = rng.sample(nodes, int(options.nodes * options.partition))
        faults.append((t0 + 0.25 * period, lambda: net.partition([[n.peer_id for n in cut]])))
        faults.append((t0 + 0.6 * period + 1.0, net.heal))
    faults.sort(key=lambda f: f[0])

    # --- publishing
    published_requests: list[tuple[SimNode, int, CID]] = []
    next_fault = 0
    report_every = max(1, options.events // 10)
    for round_ in range(options.events):
        at = t0 + round_ * options.interval
        while next_fault < len(faults) and faults[next_fault][0] <= at:
            net.run(until=faults[next_fault][0])
            faults[next_fault][1]()
            next_fault += 1
        net.run(until=at)
        topic = topics[round_ % len(topics)]
        live = [n for n in nodes if n.alive and id(n) not in late]
        if options.scenario == "all":
            senders = live
        elif sender is not None:
            senders = [sender]
        else:
            senders = [rng.choice(live)]
        for node in senders:
            published_requests.append((node, net.publish(node, topic.cid, b"%d" % round_),
                                       topic.cid))
        if options.progress and (round_ + 1) % report_every == 0:
            show(f"round {round_ + 1}/{options.events}: {len(published_requests)} published, "
                 f"{net.stats.delivered_pairs:,} deliveries, {net.messages_sent:,} messages")
    while next_fault < len(faults):
        net.run(until=faults[next_fault][0])
        faults[next_fault][1]()
        next_fault += 1

    # --- late subscribers replay the history
    if late:
        net.settle(5.0)
        net.stats.measure = False
        for node in nodes:
            if id(node) in late:
                for topic in topics:
                    net.subscribe(node, topic, since=0.0)
        show(f"{len(late)} late subscribers joined, replaying")

    # --- settle until every live subscriber has every acknowledged event
    def expectation() -> dict[CID, tuple[CID, list[SimNode]]]:
        members = {
            t.cid: [n for n in nodes if n.alive and t.cid in n.subscriptions]
            for t in topics
        }
        out: dict[CID, tuple[CID, list[SimNode]]] = {}
        for node, request, topic_cid in published_requests:
            event = node.published.get(request)
            if event is not None:
                out[event.cid] = (topic_cid, [m for m in members[topic_cid]
                                              if m.peer_id != event.publisher])
        return out

    deadline = net.now + options.settle_max
    while True:
        net.settle(1.0)
        expected = expectation()
        want, have, missed, _ = delivery_counts(expected)
        if missed == 0 or net.now >= deadline:
            break
        if options.progress and int(net.now) % 10 == 0:
            show(f"settling: {have:,}/{want:,} delivered")
    settle_s = net.now - t0 - period
    # A quiet spell before the invariants: repairs and JOINs the last deliveries set off
    # come to rest (the figures above are taken before it).
    net.settle(QUIET)
    want, have, missed, duplicates = delivery_counts(expected)
    stats = net.stats
    live_nodes = [n for n in nodes if n.alive]
    failed = sum(1 for node, request, _ in published_requests if request in node.failed)
    pubsub_bytes = sum(stats.bytes.values())
    parents = {
        event.cid: event.parent
        for event in (node.published.get(request) for node, request, _ in published_requests)
        if event is not None
    }
    violations, unreported = order_violations(live_nodes, parents)
    result: dict[str, object] = {
        "nodes": options.nodes,
        "scenario": options.scenario,
        "protocol": options.protocol,
        "seed": options.seed,
        "topics": options.topics,
        "rounds": options.events,
        "published": len(expected),
        "publish_failed": failed,
        "expected": want,
        "delivered": have,
        "missed": missed,
        "duplicates": duplicates,
        "rmr": round(stats.copies / stats.delivered_pairs - 1, 4) if stats.delivered_pairs
        else None,
        "ldh": stats.max_hop,
        "latency_ms": percentiles(stats.latencies),
        "bytes": {"total": pubsub_bytes, **dict(stats.bytes.most_common())},
        "bytes_per_delivery": round(pubsub_bytes / have, 1) if have else None,
        "messages": sum(stats.messages.values()),
        "dht": {"puts": net.dht.puts, "gets": net.dht.gets, "misses": net.dht.misses},
        "order_violations": violations,
        "order_violations_unreported": unreported,
        "invariants": check_invariants(net, [t.cid for t in topics]),
        "overlay": overlay_invariants(net),
        "faults": {"loss": options.loss, "churn": options.churn, "restart": options.restart,
                   "partition": options.partition, "late": options.late,
                   "crashed_for_good": len(crashed_for_good)},
        "latency_range_ms": list(options.latency_ms),
        "settle_s": round(settle_s, 1),
        "sim_s": round(net.now, 1),
        "wall_s": round(time.monotonic() - wall, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    show(f"done: {have:,}/{want:,} delivered, rmr {result['rmr']}, ldh {result['ldh']}")
    return result
