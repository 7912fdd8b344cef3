"""Large events along the tree, the fragment layer driven directly (sans-I/O): cut-through
order, verification, IDONTWANT, staggered groups, round-robin pacing, stalls, give-up and
limits; then the whole core in the simulator with a bandwidth limit."""

from __future__ import annotations

import random
from typing import Any

from dag import EventDescriptor, Identity, TopicDescriptor
from dag.chunks import local_blocks, split
from pulsar.proto import events as ev
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.core import CoreConfig
from pulsar.proto.fragments.config import FragmentConfig
from pulsar.proto.fragments.layer import Completed, Fragments
from pulsar.proto.fragments.messages import Fragment, FWant, IDontWant
from pulsar.proto.timers import FragmentStall
from pulsar.proto.tree.messages import MAX_ALSO, Event
from pulsar.tools.sim import SimNetwork

AUTHOR = Identity.from_seed(b"a" * 32)
PEERS = [Identity.from_seed(bytes([i]) * 32).peer_id for i in range(1, 8)]
TOPIC = TopicDescriptor.create(AUTHOR, "big")


def _large(size: int = 100_000, seed: int = 1) -> tuple[EventDescriptor, list[Any]]:
    root, blocks = split(random.Random(seed).randbytes(size))
    store = dict(blocks)
    ordered = local_blocks(root, store.get)
    assert ordered is not None
    event = EventDescriptor.create(AUTHOR, TOPIC.cid, root, parent=None, now=1.0)
    return event, ordered


def _head(event: EventDescriptor, hop: int = 1) -> Event:
    return Event(TOPIC.cid, event.block, hop, True)


def _completed(out: list[Any]) -> list[Completed]:
    """The large events a step reports complete (or given up), for the core to deliver."""
    return [o for o in out if isinstance(o, Completed)]


def _sends(out: list[Any]) -> list[tuple[Any, Any]]:
    return [(o.peer, o.message) for o in out if isinstance(o, ev.Send)]


def test_messages_round_trip_and_are_bounded() -> None:
    event, blocks = _large()
    cid, block = blocks[0]
    for message in (
        Fragment(TOPIC.cid, event.cid, cid, block),
        IDontWant(TOPIC.cid, (event.cid,)),
        FWant(TOPIC.cid, event.cid, (cid,)),
        _head(event),
    ):
        assert decode_message(encode_message(message)) == message
    plain = Event(TOPIC.cid, event.block, 1)
    assert "frags" not in plain.to_wire()  # older peers still read a small event


def test_relay_forwards_each_verified_fragment_at_once() -> None:
    """Cut-through: the EVENT goes on at once, and every fragment in the very step it is
    verified, before the payload is complete; delivery waits for the last one."""
    frags = Fragments(FragmentConfig(stagger_group=0))
    event, blocks = _large()
    parent, child = PEERS[0], PEERS[1]
    out = frags.receive(TOPIC.cid, event, 1, parent, _head(event, 2), [child], [child], 0.0)
    out += frags.pump(0.0)
    assert (child, IDontWant(TOPIC.cid, (event.cid,))) in _sends(out)
    assert (child, _head(event, 2)) in _sends(out)
    for i, (cid, block) in enumerate(blocks):
        step = frags.on_fragment(parent, Fragment(TOPIC.cid, event.cid, cid, block), 0.1 * i)
        step += frags.pump(0.1 * i)
        assert ev.StoreLocal(cid, block) in step
        assert (child, Fragment(TOPIC.cid, event.cid, cid, block)) in _sends(step)
        done = _completed(step)
        assert bool(done) == (i == len(blocks) - 1)
    assert done[0].event == event and not done[0].gave_up


def test_store_and_forward_sends_nothing_before_the_payload_is_complete() -> None:
    frags = Fragments(FragmentConfig(cut_through=False, stagger_group=0))
    event, blocks = _large()
    frags.receive(TOPIC.cid, event, 1, PEERS[0], _head(event, 2), [PEERS[1]], [], 0.0)
    # The EVENT goes at once (the child knows what is coming and repairs nothing), the
    # payload only once it is all here.
    sent: list[Any] = _sends(frags.pump(0.0))
    assert sent == [(PEERS[1], _head(event, 2))]
    for cid, block in blocks:
        frags.on_fragment(PEERS[0], Fragment(TOPIC.cid, event.cid, cid, block), 0.0)
        sent += _sends(frags.pump(0.0))
        if cid != blocks[-1][0]:
            assert len(sent) == 1
    assert len(sent) == 1 + len(blocks)


def test_bad_or_unexpected_fragments_are_neither_kept_nor_forwarded() -> None:
    frags = Fragments(FragmentConfig(stagger_group=0))
    event, blocks = _large()
    frags.receive(TOPIC.cid, event, 1, PEERS[0], _head(event, 2), [PEERS[1]], [], 0.0)
    frags.pump(0.0)
    cid, block = blocks[0]
    out = frags.on_fragment(PEERS[0], Fragment(TOPIC.cid, event.cid, cid, block + b"x"), 0.0)
    assert [type(o) for o in out] == [ev.Rejected]
    # A leaf before the node that names it is not expected yet: dropped, not buffered.
    leaf_cid, leaf = blocks[-1]
    assert frags.on_fragment(PEERS[0], Fragment(TOPIC.cid, event.cid, leaf_cid, leaf), 0.0) == []
    assert frags.metrics["fragments_bad"] == 1 and frags.metrics["fragments_unexpected"] == 0
    # Fragments of an event never announced are dropped too.
    other, _ = _large(seed=2)
    assert frags.on_fragment(PEERS[0], Fragment(TOPIC.cid, other.cid, cid, block), 0.0) == []
    assert frags.pump(0.0) == []


def test_idontwant_stops_fragments_to_that_peer() -> None:
    frags = Fragments(FragmentConfig(stagger_group=0))
    event, blocks = _large()
    frags.on_idontwant(PEERS[1], IDontWant(TOPIC.cid, (event.cid,)))
    frags.publish(TOPIC.cid, _head(event), blocks, [PEERS[0], PEERS[1]], 0.0)
    sent = _sends(frags.pump(0.0))
    assert {p for p, _ in sent} == {PEERS[0]}
    # Said while the sending is under way: the rest is not sent either.
    frags2 = Fragments(FragmentConfig(stagger_group=0, rate=20_000.0, burst=20_000))
    frags2.publish(TOPIC.cid, _head(event), blocks, [PEERS[0], PEERS[1]], 0.0)
    first = _sends(frags2.pump(0.0))
    frags2.on_idontwant(PEERS[1], IDontWant(TOPIC.cid, (event.cid,)))
    rest = _sends(frags2.on_tick(100.0))
    assert any(p == PEERS[1] for p, _ in first)
    assert rest and all(p == PEERS[0] for p, _ in rest)
    assert frags2.metrics["fragments_saved"] > 0


def test_staggered_groups_start_in_turn() -> None:
    """Groups of two: every target gets the EVENT at once, but the blocks go to the first
    group only until the stagger timeout, then to the next."""
    frags = Fragments(FragmentConfig(stagger_group=2, stagger_timeout=0.5, fanout=0))
    event, blocks = _large()
    # A relay whose blocks are still arriving: group one stays behind the upstream.
    frags.receive(TOPIC.cid, event, 1, PEERS[6], _head(event, 2), PEERS[:4], [], 0.0)
    out = frags.pump(0.0)
    assert {p for p, m in _sends(out) if isinstance(m, Event)} == set(PEERS[:4])
    cid, block = blocks[0]
    out = frags.on_fragment(PEERS[6], Fragment(TOPIC.cid, event.cid, cid, block), 0.0)
    out += frags.pump(0.0)
    # Group one caught up with what is available: the uplink goes on to group two (work
    # conserving), but group one is served first.
    order = [p for p, m in _sends(out) if isinstance(m, Fragment)]
    assert set(order[:2]) == set(PEERS[:2]) and set(order[2:]) == set(PEERS[2:4])
    # A publisher has every block at once: group two waits for its turn (the timeout).
    pub = Fragments(FragmentConfig(stagger_group=2, stagger_timeout=0.5, rate=1e6, fanout=0))
    pub.publish(TOPIC.cid, _head(event), blocks, PEERS[:4], 0.0)
    early = _sends(pub.pump(0.0)) + _sends(pub.on_tick(0.1))
    assert {p for p, m in early if isinstance(m, Fragment)} == set(PEERS[:2])
    late = _sends(pub.on_tick(0.6))
    assert set(PEERS[2:4]) <= {p for p, m in late if isinstance(m, Fragment)}


def test_payload_fanout_is_limited_by_delegating_to_helpers() -> None:
    """Five targets, fan-out two: every target gets the EVENT from us, but the blocks go to
    two helpers only, whose EVENT asks them (``also``) to push the blocks to the other
    three."""
    frags = Fragments(FragmentConfig(stagger_group=0, fanout=2))
    event, blocks = _large()
    frags.publish(TOPIC.cid, _head(event), blocks, PEERS[:5], 0.0)
    sent = _sends(frags.pump(0.0))
    heads = {p: m for p, m in sent if isinstance(m, Event)}
    assert set(heads) == set(PEERS[:5])
    assert heads[PEERS[0]].also == (PEERS[2], PEERS[4])
    assert heads[PEERS[1]].also == (PEERS[3],)
    assert all(not heads[p].also for p in PEERS[2:5])
    assert {p for p, m in sent if isinstance(m, Fragment)} == set(PEERS[:2])
    assert decode_message(encode_message(heads[PEERS[0]])) == heads[PEERS[0]]
    # A helper relaying as it receives: its sending covers the peers it was asked to help,
    # without the EVENT (they have it), even those that told it IDONTWANT (as receivers).
    helper = Fragments(FragmentConfig(stagger_group=0, fanout=0))
    helper.on_idontwant(PEERS[2], IDontWant(TOPIC.cid, (event.cid,)))
    helper.receive(TOPIC.cid, event, 1, PEERS[6], _head(event, 2), [], [], 0.0,
                   also=(PEERS[2], PEERS[4]))
    cid, block = blocks[0]
    out = helper.on_fragment(PEERS[6], Fragment(TOPIC.cid, event.cid, cid, block), 0.0)
    out += helper.pump(0.0)
    assert sorted(bytes(p) for p, _ in _sends(out)) == sorted([bytes(PEERS[2]), bytes(PEERS[4])])
    assert all(isinstance(m, Fragment) for _, m in _sends(out))
    # Asked again later (a duplicate EVENT with ``also``): more targets, same sending.
    assert helper.delegate(event.cid, [PEERS[5]])
    assert [p for p, _ in _sends(helper.pump(0.1))] == [PEERS[5]]


def test_no_helper_is_asked_to_help_more_peers_than_the_wire_allows() -> None:
    many = [Identity.from_seed(i.to_bytes(2, "big") * 16).peer_id for i in range(300)]
    frags = Fragments(FragmentConfig(stagger_group=0, fanout=2))
    event, blocks = _large()
    frags.publish(TOPIC.cid, _head(event), blocks, many, 0.0)
    heads = [m for _, m in _sends(frags.pump(0.0)) if isinstance(m, Event)]
    assert len(heads) == 300
    assert max(len(h.also) for h in heads) <= MAX_ALSO
    assert sum(len(h.also) for h in heads) == 300 - sum(1 for h in heads if h.also)


def test_pacing_rotates_between_queued_events() -> None:
    frags = Fragments(FragmentConfig(stagger_group=0, rate=100_000.0, burst=8_000))
    first, blocks1 = _large(seed=1)
    second, blocks2 = _large(seed=2)
    frags.publish(TOPIC.cid, _head(first), blocks1, [PEERS[0]], 0.0)
    frags.publish(TOPIC.cid, _head(second), blocks2, [PEERS[0]], 0.0)
    order: list[Any] = []
    now = 0.0
    out = frags.pump(now)
    while len(order) < 8:
        order += [m.event for _, m in _sends(out) if isinstance(m, Fragment)]
        now += 0.05
        out = frags.on_tick(now)
    assert order[:8].count(first.cid) == order[:8].count(second.cid) == 4
    assert any(isinstance(o, ev.SetTimer) for o in out)  # still paced: the tick re-arms


def test_a_stalled_event_asks_neighbours_then_the_dht_then_gives_up() -> None:
    cfg = FragmentConfig(stall_timeout=1.0, want_rounds=1)
    frags = Fragments(cfg)
    event, blocks = _large()
    out = frags.receive(TOPIC.cid, event, 1, PEERS[0], _head(event, 2), [], [PEERS[1]], 0.0)
    stall = next(o.timer for o in out if isinstance(o, ev.SetTimer))
    frags.on_idontwant(PEERS[1], IDontWant(TOPIC.cid, (event.cid,)))  # it has the event
    out = frags.on_stall(stall, 1.0)
    wants = _sends(out)
    assert {p for p, _ in wants} == {PEERS[0], PEERS[1]}
    assert all(isinstance(m, FWant) and m.cids == (blocks[0][0],) for _, m in wants)
    stall = next(o.timer for o in out if isinstance(o, ev.SetTimer))
    out = frags.on_stall(stall, 2.0)
    assert [o.cid for o in out if isinstance(o, ev.Fetch)] == [blocks[0][0]]
    # The DHT has the root: the event goes on (its leaves are fetched next).
    out = frags.on_fetched(blocks[0][0], blocks[0][1], 2.1)
    fetches = [o.cid for o in out if isinstance(o, ev.Fetch)]
    assert fetches and set(fetches) <= {c for c, _ in blocks}
    # A block found nowhere: given up, and delivered without its payload held here.
    [done] = _completed(frags.on_fetched(fetches[0], None, 2.2))
    assert done.gave_up and done.event == event
    assert not frags.receiving(event.cid)


def test_a_neighbour_answers_fwant_from_its_store() -> None:
    frags = Fragments()
    event, blocks = _large()
    store = dict(blocks)
    want = FWant(TOPIC.cid, event.cid, tuple(c for c, _ in blocks[:3]))
    frags.on_fwant(PEERS[2], want, store.get)
    sent = _sends(frags.pump(0.0))
    assert [m.cid for _, m in sent] == [c for c, _ in blocks[:3]]
    assert all(p == PEERS[2] for p, _ in sent)


def test_partial_events_are_bounded() -> None:
    """Over ``max_partial`` the oldest is given up; a root declaring more than
    ``max_event_size`` is given up at once."""
    frags = Fragments(FragmentConfig(max_partial=2, threshold=1, max_event_size=50_000))
    events = [_large(seed=s) for s in range(3)]
    out: list[Any] = []
    for event, _ in events:
        out += frags.receive(TOPIC.cid, event, 1, PEERS[0], _head(event), [], [], 0.0)
    [dropped] = _completed(out)
    assert dropped.event == events[0][0] and dropped.gave_up
    event, blocks = events[1]
    root, root_block = blocks[0]
    [too_big] = _completed(
        frags.on_fragment(PEERS[0], Fragment(TOPIC.cid, event.cid, root, root_block), 0.0))
    assert too_big.gave_up and "over the limit" in too_big.reason


def test_a_stall_check_never_spins_in_place() -> None:
    """Float time: a check re-armed for 'just before' the deadline must move on."""
    frags = Fragments(FragmentConfig(stall_timeout=2.0))
    event, _ = _large()
    frags.receive(TOPIC.cid, event, 1, PEERS[0], _head(event), [], [], 31.5)
    out = frags.on_stall(FragmentStall(TOPIC.cid, event.cid, 0), 33.49999999)
    [timer] = [o for o in out if isinstance(o, ev.SetTimer)]
    assert timer.delay >= 0.02


def _sim_run(
    n: int, fragments: FragmentConfig, events: int = 2
) -> tuple[SimNetwork, Any, list[float]]:
    net = SimNetwork(n, bucket_size=20, latency=0.1, bandwidth=6.25e6,
                     config=CoreConfig(fragments=fragments))
    author = net.node(0)
    request = net.command(author, lambda r: ev.CreateTopic(r, "big"))
    net.settle(10)
    topic = author.topics[request]
    for i in range(1, n):
        net.subscribe(net.node(i), topic)
    net.settle(20)
    net.stats.latencies.clear()
    for i in range(events):
        net.publish(net.node(1 + i), topic.cid, random.Random(i).randbytes(1 << 20))
        net.settle(6)
    net.settle(20)
    return net, topic, sorted(net.stats.latencies)


def test_simulated_network_with_bandwidth_delivers_complete_payloads_faster() -> None:
    """20 nodes, 50 Mbit/s uplinks, 100 ms links, 1 MiB events: every subscriber gets every
    event with its whole payload in its store, and relaying fragments as they arrive beats
    store-and-forward at the same bytes."""
    fast = FragmentConfig(rate=6e6)
    net, topic, cut = _sim_run(20, fast)
    for node in [net.node(i) for i in range(1, 20)]:
        delivered = node.delivered[topic.cid]
        assert len(delivered) == 2
        for event in delivered:
            assert local_blocks(event.payload, node.store.get) is not None
    cut_bytes = net.bytes_sent
    # The payload went through helpers (fan-out 3 under a star-shaped tree) without a
    # duplicate, a stall, a DHT fetch or a give-up.
    totals: dict[str, int] = {}
    for node in net._order:
        for key, value in node.core.counters().items():
            totals[key] = totals.get(key, 0) + value
    assert totals["large_completed"] == 2 * 19  # every node but the publisher, per event
    assert totals["fragments_duplicate"] == totals["fwant_sent"] == 0
    assert totals["fragment_fetches"] == totals["large_given_up"] == 0
    slow = FragmentConfig(rate=6e6, cut_through=False, idontwant=False, stagger_group=0)
    net2, _, saf = _sim_run(20, slow)
    assert cut[len(cut) // 2] < saf[len(saf) // 2]
    assert cut_bytes <= 1.1 * net2.bytes_sent
