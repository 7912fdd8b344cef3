"""Consumer groups across real nodes on loopback: each event handled by one member, a
member that dies has its share taken over, one that joins takes its share."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from dag import CID
from pulsar import Node
from pulsar.runtime.consumer_share import GroupInfo
from pulsar.tools.bench.delivery import crash
from tests.node.conftest import Network, PartitionableNetwork
from tests.waiting import eventually


async def group_of(net: Network, count: int, ack_wait: float = 60.0
                   ) -> tuple[list[Node], CID]:
    nodes = await net.start(count)
    topic = await nodes[0].create_topic("work")
    for node in nodes:
        await node.subscribe(topic.cid)
    for i, node in enumerate(nodes):
        await node.consumers.add(topic.cid, {"name": f"w{i}", "group": "g",
                                             "ack_wait": ack_wait})
    await eventually(lambda: all(_view_size(n, topic.cid, f"w{i}") == count
                                 for i, n in enumerate(nodes)),
                     timeout=20, what="every member sees the whole group")
    return nodes, topic.cid


def _view_size(node: Node, topic: CID, name: str) -> int:
    member = node._driver.groups.member(topic, name)
    if member is None or not node._driver.groups.ready(member):
        return 0
    return len(member.view.live())


def _group(node: Node, topic: CID, name: str) -> GroupInfo:
    group = node.consumers.describe(topic, name, node.consumers.clock()).group
    assert group is not None
    return group


async def publish(node: Node, topic: CID, count: int, start: int = 0) -> set[CID]:
    return {(await node.publish(topic, f"job {start + i}".encode())).cid
            for i in range(count)}


async def work(node: Node, topic: CID, name: str, handled: Counter[CID],
               stop: asyncio.Event, *, ack: bool = True) -> None:
    """One worker: fetch, note what it handled, acknowledge."""
    while not stop.is_set() and not node.stopped:
        messages = await node.consumers.fetch(topic, name, 10, 0.2)
        for message in messages:
            handled[message.event.cid] += 1
        if ack and messages:
            await node.consumers.ack(topic, name, [m.id for m in messages])


async def test_a_group_hands_each_event_to_one_member(tmp_path: Path) -> None:
    net = Network(tmp_path)
    try:
        nodes, topic = await group_of(net, 3)
        published = await publish(nodes[0], topic, 90)
        handled = [Counter[CID]() for _ in nodes]
        stop = asyncio.Event()
        workers = [asyncio.create_task(work(n, topic, f"w{i}", handled[i], stop))
                   for i, n in enumerate(nodes)]
        total: Counter[CID] = Counter()
        await eventually(lambda: set(sum(handled, total)) == published, timeout=30,
                         what="every event handled")
        stop.set()
        await asyncio.gather(*workers)
        both = sum(handled, Counter[CID]())
        assert set(both) == published and max(both.values()) == 1  # once, by one member
        assert all(len(h) >= 10 for h in handled), [len(h) for h in handled]  # ~30 each
        # What the others left is watched until its owner's acknowledgement is heard.
        await eventually(lambda: all(_group(n, topic, f"w{i}").num_watched == 0
                                     for i, n in enumerate(nodes)),
                         timeout=10, what="watched entries settled")
        info = nodes[0].consumers.describe(topic, "w0", nodes[0].consumers.clock())
        assert info.group is not None and info.group.duplicates == 0
        assert len(info.group.members) == 3 and info.num_ack_pending == 0
    finally:
        await net.close()


async def test_a_dead_members_share_is_taken_over_without_waiting_for_ack_wait(
        tmp_path: Path) -> None:
    net = Network(tmp_path)
    try:
        nodes, topic = await group_of(net, 3, ack_wait=600.0)
        published = await publish(nodes[0], topic, 60)
        await eventually(lambda: all(n.last_position(topic) == 60 for n in nodes),
                         timeout=20, what="every node logged every event")
        # The third member takes its share and never acknowledges it; then its node dies.
        victim = nodes[2]
        unacked = {m.event.cid for m in await victim.consumers.fetch(topic, "w2", 100, 2.0)}
        assert unacked
        await crash(victim)
        net.nodes.remove(victim)
        handled = [Counter[CID](), Counter[CID]()]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        started = loop.time()
        workers = [asyncio.create_task(work(n, topic, f"w{i}", handled[i], stop))
                   for i, n in enumerate(nodes[:2])]
        await eventually(lambda: set(handled[0]) | set(handled[1]) == published,
                         timeout=30, what="the survivors handle every event")
        recovered = loop.time() - started
        stop.set()
        await asyncio.gather(*workers)
        both = handled[0] + handled[1]
        assert max(both.values()) == 1
        assert unacked <= set(both)  # what the dead member held came again...
        assert recovered < 20  # ...long before its ack_wait of 600 s
        taken = sum(_group(n, topic, f"w{i}").taken_over for i, n in enumerate(nodes[:2]))
        assert taken >= len(unacked)
    finally:
        await net.close()


async def test_a_member_that_joins_takes_a_share_and_nothing_is_handled_twice(
        tmp_path: Path) -> None:
    net = Network(tmp_path)
    try:
        nodes, topic = await group_of(net, 2)
        early = await publish(nodes[0], topic, 40)
        handled = [Counter[CID]() for _ in range(3)]
        stop = asyncio.Event()
        workers = [asyncio.create_task(work(n, topic, f"w{i}", handled[i], stop))
                   for i, n in enumerate(nodes)]
        await eventually(lambda: set(handled[0]) | set(handled[1]) == early, timeout=20,
                         what="the first events handled")
        (joiner,) = await net.start(1)
        await joiner.subscribe(topic)
        await joiner.consumers.add(topic, {"name": "w2", "group": "g", "ack_wait": 60.0})
        await eventually(lambda: all(_view_size(n, topic, f"w{i}") == 3
                                     for i, n in enumerate([*nodes, joiner])),
                         timeout=20, what="the joiner is in every view")
        workers.append(asyncio.create_task(work(joiner, topic, "w2", handled[2], stop)))
        late = await publish(nodes[0], topic, 60, start=40)
        total = early | late
        await eventually(lambda: set(handled[0] + handled[1] + handled[2]) == total,
                         timeout=30, what="every event handled")
        stop.set()
        await asyncio.gather(*workers)
        both = handled[0] + handled[1] + handled[2]
        assert max(both.values()) == 1
        assert not set(handled[2]) & early  # what was there before it joined is not its
        assert len(set(handled[2]) & late) >= 5  # ~20 of the 60 published after
    finally:
        await net.close()


async def test_a_member_whose_node_restarts_leaves_its_unfinished_events_to_the_group(
        tmp_path: Path) -> None:
    """A clean stop says it is leaving (after the acknowledgements it had not told yet):
    the other member handles the unfinished events. The restarted member is a new
    incarnation: it does not hand them out again, and nothing it acknowledged comes back."""
    net = Network(tmp_path)
    try:
        nodes, topic = await group_of(net, 2)
        published = await publish(nodes[0], topic, 40)
        await eventually(lambda: all(n.last_position(topic) == 40 for n in nodes),
                         timeout=20, what="every node logged every event")
        first = await nodes[1].consumers.fetch(topic, "w1", 100, 2.0)
        assert len(first) >= 4
        done, unfinished = first[: len(first) // 2], first[len(first) // 2:]
        await nodes[1].consumers.ack(topic, "w1", [m.id for m in done])
        restarted = await net.restart(nodes[1])
        nodes[1] = restarted
        handled = [Counter[CID](), Counter[CID]()]
        for message in done:
            handled[1][message.event.cid] += 1
        stop = asyncio.Event()
        workers = [asyncio.create_task(work(n, topic, f"w{i}", handled[i], stop))
                   for i, n in enumerate(nodes)]
        await eventually(lambda: set(handled[0] + handled[1]) == published, timeout=30,
                         what="every event handled")
        await eventually(lambda: _view_size(restarted, topic, "w1") == 2, timeout=20,
                         what="the restarted member back in the group")
        stop.set()
        await asyncio.gather(*workers)
        both = handled[0] + handled[1]
        assert max(both.values()) == 1, [c for c, n in both.items() if n > 1]
        assert {m.event.cid for m in unfinished} <= set(handled[0])  # the other's now
        # What the restarted member left to the other is settled by its acknowledgements.
        await eventually(lambda: _group(restarted, topic, "w1").num_watched == 0,
                         timeout=10, what="the restarted member's watched entries settled")
    finally:
        await net.close()


async def test_a_partition_splits_the_group_and_healing_joins_it_again(
        tmp_path: Path) -> None:
    """Cut off, each side handles what the other would have (the duplicates a partition
    costs, counted); healed, the members hear each other again and share what comes next
    once each."""
    net = PartitionableNetwork(tmp_path)
    try:
        nodes, topic = await group_of(net, 3)
        published = await publish(nodes[0], topic, 30)
        await eventually(lambda: all(n.last_position(topic) == 30 for n in nodes),
                         timeout=20, what="every node logged every event")
        net.faults.partition([[nodes[0].peer_id, nodes[1].peer_id], [nodes[2].peer_id]])
        await eventually(lambda: [_view_size(n, topic, f"w{i}") for i, n in
                                  enumerate(nodes)] == [2, 2, 1],
                         timeout=20, what="each side's view without the other")
        handled = [Counter[CID]() for _ in nodes]
        stop = asyncio.Event()
        workers = [asyncio.create_task(work(n, topic, f"w{i}", handled[i], stop))
                   for i, n in enumerate(nodes)]
        await eventually(lambda: set(handled[0] + handled[1]) == published
                         and set(handled[2]) == published, timeout=30,
                         what="each side handles every event")
        net.faults.heal()
        await eventually(lambda: all(_view_size(n, topic, f"w{i}") == 3
                                     for i, n in enumerate(nodes)),
                         timeout=30, what="one group again")
        counted = sum(_group(n, topic, f"w{i}").duplicates for i, n in enumerate(nodes))
        assert counted > 0  # what both sides handled is counted, not hidden
        before = handled[0] + handled[1] + handled[2]
        late = await publish(nodes[0], topic, 30, start=30)
        await eventually(lambda: set(handled[0] + handled[1] + handled[2]) >= late,
                         timeout=30, what="the events after the heal handled")
        stop.set()
        await asyncio.gather(*workers)
        after = handled[0] + handled[1] + handled[2]
        assert all(after[c] == 1 for c in late)  # once each, by one member
        assert all(after[c] == before[c] for c in published)  # nothing old again
    finally:
        await net.close()
