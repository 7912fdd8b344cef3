"""The workload of a scenario, drawn once from its seed and given to both protocols.

Popularity is skewed (Zipf): topic ``i`` is subscribed by about ``max_subscribers /
(i+1)**skew`` of the nodes and receives events in proportion to its subscribers. Events are
evenly spaced at the scenario's rate; each is published by one of its topic's subscribers
(its author, for the order-guarantee topics). Nodes hit by a fault are drawn here too, so a
crash takes down the same nodes in both protocols' runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .scenario import Fault, Scenario

__all__ = ["FaultPlan", "Plan", "Publish", "TopicPlan", "plan_workload"]


@dataclass(frozen=True, slots=True)
class TopicPlan:
    index: int
    author: int
    subscribers: tuple[int, ...]
    """Sorted; the author is always one (creating a topic subscribes its creator)."""
    order: bool
    """Single publisher (the author), LAST_SEEN: events must arrive in causal order."""


@dataclass(frozen=True, slots=True)
class Publish:
    at: float
    """Seconds after publishing starts."""
    topic: int
    node: int


@dataclass(frozen=True, slots=True)
class FaultPlan:
    at: float
    kind: str  # "crash" | "restart" | "partition" | "heal"
    nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    topics: tuple[TopicPlan, ...]
    publishes: tuple[Publish, ...]
    faults: tuple[FaultPlan, ...]
    """Every fault step in time order (a crash with a restart is two steps)."""

    def publishes_of(self, node: int) -> list[Publish]:
        return [p for p in self.publishes if p.node == node]

    def expected_deliveries(self) -> int:
        """Deliveries a perfect protocol makes: each event at each subscriber of its topic
        but its publisher."""
        size = {t.index: len(t.subscribers) for t in self.topics}
        return sum(size[p.topic] - (1 if p.node in self.topics[p.topic].subscribers else 0)
                   for p in self.publishes)


def plan_workload(scenario: Scenario) -> Plan:
    rng = random.Random(scenario.seed)
    w, n = scenario.workload, scenario.nodes
    topics: list[TopicPlan] = []
    order_from = w.topics - w.order_topics
    for i in range(w.topics):
        share = w.max_subscribers / (i + 1) ** w.popularity_skew
        count = max(w.min_subscribers, min(n, round(share * n)))
        members = set(rng.sample(range(n), count))
        author = rng.choice(sorted(members))
        topics.append(TopicPlan(i, author, tuple(sorted(members)), i >= order_from))
    weights = [len(t.subscribers) for t in topics]
    publishes: list[Publish] = []
    for k in range(w.events):
        topic = rng.choices(topics, weights)[0]
        node = topic.author if topic.order else rng.choice(topic.subscribers)
        publishes.append(Publish(round(k / w.rate, 6), topic.index, node))
    return Plan(tuple(topics), tuple(publishes), _fault_steps(scenario.faults, n, rng))


def _fault_steps(faults: tuple[Fault, ...], nodes: int, rng: random.Random) -> tuple[
        FaultPlan, ...]:
    steps: list[FaultPlan] = []
    for fault in faults:
        hit = fault.nodes or tuple(sorted(rng.sample(range(nodes),
                                                     max(1, round(fault.fraction * nodes)))))
        steps.append(FaultPlan(fault.at, fault.kind, hit))
        if fault.kind == "crash" and fault.restart_after is not None:
            steps.append(FaultPlan(fault.at + fault.restart_after, "restart", hit))
        if fault.kind == "partition" and fault.heal_after is not None:
            steps.append(FaultPlan(fault.at + fault.heal_after, "heal", hit))
    return tuple(sorted(steps, key=lambda s: s.at))
