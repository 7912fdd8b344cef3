"""A node's cost follows its traffic: topics that carry nothing cost no message at all,
however many the node is in, and an event costs messages of its own topic only. What an
idle node does send is the membership layer's, once per node: its shuffle every 30 s."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dag import CID
from pulsar.proto import events as ev
from pulsar.proto.batch.messages import Batch
from pulsar.proto.membership.overlay import MembershipConfig
from pulsar.tools.sim import SimNetwork


def _topics_of(message: Any) -> list[CID | None]:
    if isinstance(message, Batch):
        return [t for m in message.messages for t in _topics_of(m)]
    return [getattr(message, "topic", None)]  # PING and PONG name no topic


def test_a_network_in_many_idle_topics_sends_nothing() -> None:
    net = SimNetwork(6, seed=11, latency=0.02)
    author = net.node(0)
    requests = [net.command(author, lambda r, i=i: ev.CreateTopic(r, f"t{i}"))
                for i in range(60)]
    net.settle(10)
    topics = [author.topics[r] for r in requests]
    subscribers = [net.node(i) for i in range(1, 6)]
    for node in subscribers:
        for topic in topics:
            net.subscribe(node, topic, since=0.0)
    net.settle(30)
    net.publish(author, topics[0].cid, b"one event")
    # Repair refreshes back off (HEADS after 1, 2, 4 ... 32 quiet ticks), then stop.
    net.settle(200)
    sent: list[CID | None] = []
    kinds: Counter[str] = Counter()
    send = net._send

    def recording(node: Any, out: ev.Send) -> None:
        sent.extend(_topics_of(out.message))
        kinds[out.message.T] += 1
        send(node, out)

    net._send = recording  # type: ignore[method-assign]
    net.settle(600)
    # Ten idle minutes: not one message about a topic; the membership layer's shuffle
    # (one per node per interval, walking a few steps, answered once) and the RTT probes
    # that follow its traffic, whatever the number of topics.
    assert set(sent) == {None}
    config = MembershipConfig()
    rounds = len(net.nodes) * (600 / config.shuffle_interval + 1)
    assert set(kinds) <= {"vshuffle", "vshuffle_reply", "ping", "pong"}
    assert kinds["vshuffle"] <= rounds * (config.shuffle_walk + 1)
    assert kinds["vshuffle_reply"] <= rounds
    assert kinds["ping"] <= rounds * 2  # at most one per peer a shuffle message goes to
    sent.clear()
    # An event wakes its own topic only: its messages name it (or no topic), none of the
    # 59 others.
    net.publish(author, topics[1].cid, b"another")
    net.settle(200)
    assert topics[1].cid in sent and set(sent) <= {topics[1].cid, None}
    assert all(len(s.delivered.get(topics[1].cid, [])) == 1 for s in subscribers)
