"""The lazy-repair layer: exact outputs for scripted inputs, and repair under loss."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dag import CID, Identity, cid_of
from pulsar.proto import events as ev
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.gossip.plumtree import (
    DispatchTimer,
    GraftTimer,
    Plumtree,
    PlumtreeConfig,
    ShuffleTimer,
)
from pulsar.proto.tree.messages import Event

from .test_core import _network, _payloads, _subscribe_all, _topic

TOPIC = cid_of(b"\xa1atb")
ME = Identity.from_seed(b"m" * 32).peer_id
PEERS = [Identity.from_seed(bytes([i]) * 32).peer_id for i in range(1, 8)]
TREE = {PEERS[0]}


def _layer(blocks: dict[CID, bytes] | None = None, **config: Any) -> Plumtree:
    store = blocks or {}
    layer = Plumtree(ME, lambda topic: set(TREE), store.get, PlumtreeConfig(**config))
    layer.start(TOPIC, 0.0)
    return layer


def test_an_idle_topic_never_shuffles_and_one_tick_serves_every_topic() -> None:
    layer = Plumtree(ME, lambda t: {PEERS[0]}, lambda c: None)
    assert layer.start(TOPIC, 0.0) == []  # nothing armed: a topic that carries nothing
    assert layer.start(TOPIC, 0.0) == []
    other = cid_of(b"\xa1atc")
    assert layer.start(other, 0.0) == []
    # The first event makes it want lazy links: the node's one tick is armed, due within a
    # shuffle interval of the start (a JOINED usually names members before).
    out = layer.accepted(TOPIC, cid_of(b"\x07"), 1, PEERS[0], 1.0)
    [tick] = [o for o in out if isinstance(o, ev.SetTimer)]
    assert tick.timer == ShuffleTimer() and tick.delay <= 2.0
    assert layer.accepted(other, cid_of(b"\x08"), 1, PEERS[0], 1.0) == []  # already armed


def test_a_topic_with_its_lazy_links_costs_nothing() -> None:
    layer = _layer(lazy_peers=2)
    layer.learn(TOPIC, PEERS[1:3], now=0.0)
    assert len(layer.lazy(TOPIC)) == 2
    layer.accepted(TOPIC, cid_of(b"\x07"), 1, PEERS[0], 1.0)
    # The tick sends nothing and is not armed again: no timer while nothing lacks links.
    assert layer.on_timer(ShuffleTimer(), lambda c: True, 40.0) == []


def test_a_topic_lacking_links_shuffles_with_a_backoff_reset_by_news() -> None:
    layer = _layer(lazy_peers=3, shuffle_interval=2.0, shuffle_backoff_max=16.0)
    sent_at = []
    now = 2.0  # the first is due within an interval of the start
    for number in range(60):
        # Events keep flowing (an idle topic would not shuffle at all); the tick is armed
        # again by the shuffle (still due later) or by the next event.
        out = layer.accepted(TOPIC, cid_of(bytes([number])), 1, PEERS[0], now)
        out += layer.on_timer(ShuffleTimer(), lambda c: True, now)
        if any(isinstance(o, ev.Send) for o in out):
            sent_at.append(now)
        out += layer.accepted(TOPIC, cid_of(bytes([number, 1])), 1, PEERS[0], now)
        now += min(o.delay for o in out if isinstance(o, ev.SetTimer))
        if now > 60.0:
            break
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert sent_at and all(later >= earlier for earlier, later in itertools.pairwise(gaps))
    assert max(gaps) >= 16.0 and len(sent_at) <= 8  # backed off, up to the cap
    # Someone new resets the backoff: after the next shuffle, the one after comes sooner.
    layer.on_shuffle(PEERS[1], Shuffle(TOPIC, (PEERS[2],), True), now)
    assert len(layer.lazy(TOPIC)) == 2  # still lacking one


def test_lazy_peers_come_from_the_passive_view_not_the_tree() -> None:
    layer = _layer(lazy_peers=2)
    layer.learn(TOPIC, PEERS[:4], now=0.0)
    lazy = layer.lazy(TOPIC)
    assert len(lazy) == 2 and PEERS[0] not in lazy and ME not in lazy


def test_accepted_events_are_announced_in_one_batch() -> None:
    layer = _layer(lazy_peers=1)
    layer.learn(TOPIC, [PEERS[1]], now=0.0)
    a, b = cid_of(b"\x01"), cid_of(b"\x02")
    first = layer.accepted(TOPIC, a, 2, PEERS[0], 0.0)
    assert first == [ev.SetTimer(0.05, DispatchTimer())]
    assert layer.accepted(TOPIC, b, 3, PEERS[0], 0.0) == []  # timer already armed
    other = cid_of(b"\xa1atc")
    layer.start(other, 0.0)
    layer.learn(other, [PEERS[1]], now=0.0)
    c = cid_of(b"\x05")
    assert layer.accepted(other, c, 1, PEERS[0], 0.0) == []  # the node's one timer
    out = layer.on_timer(DispatchTimer(), lambda c: True, 0.1)
    assert out == [ev.Send(PEERS[1], IHave(TOPIC, ((a, 2), (b, 3)))),
                   ev.Send(PEERS[1], IHave(other, ((c, 1),)))]


def test_missing_event_is_grafted_from_announcers_in_turn() -> None:
    layer = _layer()
    missing = cid_of(b"\x03")
    out = layer.on_ihave(PEERS[2], IHave(TOPIC, ((missing, 4),)), lambda c: False, 0.0)
    assert out == [ev.SetTimer(0.5, GraftTimer(TOPIC, missing))]
    assert layer.on_ihave(PEERS[3], IHave(TOPIC, ((missing, 2),)), lambda c: False, 0.1) == []
    out = layer.on_timer(GraftTimer(TOPIC, missing), lambda c: False, 0.5)
    assert out == [
        ev.Send(PEERS[2], Graft(TOPIC, missing)),
        ev.SetTimer(0.25, GraftTimer(TOPIC, missing)),
    ]
    assert PEERS[2] in layer.eager_extra(TOPIC)
    out = layer.on_timer(GraftTimer(TOPIC, missing), lambda c: False, 0.75)
    assert out[0] == ev.Send(PEERS[3], Graft(TOPIC, missing))
    # Once it arrives, nothing more is asked for.
    layer.accepted(TOPIC, missing, 3, PEERS[3], 0.8)
    assert layer.on_timer(GraftTimer(TOPIC, missing), lambda c: True, 1.0) == []


def test_known_events_in_an_ihave_are_ignored() -> None:
    layer = _layer()
    have = cid_of(b"\x04")
    assert layer.on_ihave(PEERS[2], IHave(TOPIC, ((have, 1),)), lambda c: True, 0.0) == []


def test_no_ihave_goes_to_a_lazy_link_known_to_have_the_event() -> None:
    """A lazy link that announced an event before it reached us, or while our IHAVE of
    it still waited for the dispatch, has it: it is not told."""
    layer = _layer(lazy_peers=3)
    layer.learn(TOPIC, PEERS[1:4], now=0.0)
    early, late = cid_of(b"\x05"), cid_of(b"\x06")
    # PEERS[1] announces ``early`` before the tree brings it: told by it, not to it.
    layer.on_ihave(PEERS[1], IHave(TOPIC, ((early, 2),)), lambda c: False, 0.0)
    layer.accepted(TOPIC, early, 1, PEERS[0], 0.01)
    # ``late`` arrives first here; PEERS[2]'s IHAVE of it comes before our dispatch.
    layer.accepted(TOPIC, late, 1, PEERS[0], 0.02)
    layer.on_ihave(PEERS[2], IHave(TOPIC, ((late, 2),)), lambda c: True, 0.03)
    sent = {(o.peer, e) for o in layer.on_timer(DispatchTimer(), lambda c: True, 0.07)
            if isinstance(o, ev.Send) for e, _ in o.message.entries}
    assert sent == {(PEERS[2], early), (PEERS[3], early), (PEERS[1], late), (PEERS[3], late)}
    assert layer.metrics["ihave_suppressed"] == 1


def test_graft_is_answered_with_the_event_and_duplicates_prune() -> None:
    block = b"\xa0"
    cid = cid_of(block)
    layer = _layer({cid: block})
    layer.accepted(TOPIC, cid, 2, PEERS[0], 0.0)
    out = layer.on_graft(PEERS[4], Graft(TOPIC, cid), 0.1)
    assert out == [ev.Send(PEERS[4], Event(TOPIC, block, 3))]
    assert PEERS[4] in layer.eager_extra(TOPIC)
    # A grafted (non-tree) peer that sends a duplicate is pruned; a tree edge never is.
    assert layer.duplicate(TOPIC, PEERS[4]) == [ev.Send(PEERS[4], Prune(TOPIC))]
    assert PEERS[4] not in layer.eager_extra(TOPIC) and PEERS[4] in layer.lazy(TOPIC)
    assert layer.duplicate(TOPIC, PEERS[0]) == []
    layer.on_graft(PEERS[5], Graft(TOPIC, None), 0.2)
    layer.on_prune(PEERS[5], Prune(TOPIC), 0.3)
    assert PEERS[5] not in layer.eager_extra(TOPIC)


def test_a_grafted_link_the_tree_duplicates_is_pruned() -> None:
    layer = _layer()
    layer.on_graft(PEERS[4], Graft(TOPIC, None), 0.0)
    assert PEERS[4] in layer.eager_extra(TOPIC)
    # The tree brought this one first: its duplicate over the grafted link prunes that
    # link (as before); a duplicate over the tree edge prunes nothing.
    via_tree = cid_of(b"\x01")
    layer.accepted(TOPIC, via_tree, 2, PEERS[0], 0.1)
    assert layer.duplicate(TOPIC, PEERS[0], via_tree) == []
    # The grafted link brought this one first and the tree's copy followed: the tree
    # carries the topic again, so the grafted link goes back to lazy.
    via_graft = cid_of(b"\x02")
    layer.accepted(TOPIC, via_graft, 1, PEERS[4], 0.2)
    assert layer.duplicate(TOPIC, PEERS[0], via_graft) == [ev.Send(PEERS[4], Prune(TOPIC))]
    assert PEERS[4] not in layer.eager_extra(TOPIC) and PEERS[4] in layer.lazy(TOPIC)
    assert layer.duplicate(TOPIC, PEERS[0], via_graft) == []  # once


def test_shuffle_is_answered_once_and_dead_peers_are_forgotten() -> None:
    layer = _layer()
    out = layer.on_shuffle(PEERS[1], Shuffle(TOPIC, (PEERS[2], PEERS[3]), False), 0.0)
    assert len(out) == 1 and isinstance(out[0].message, Shuffle) and out[0].message.reply
    assert layer.on_shuffle(PEERS[1], Shuffle(TOPIC, (PEERS[4],), True), 0.0) == []
    layer.peer_down(PEERS[2])
    assert PEERS[2] not in layer.lazy(TOPIC)


def test_a_peer_that_left_the_topic_is_forgotten_through_prune() -> None:
    layer = _layer()
    layer.learn(TOPIC, [PEERS[1]], now=0.0)
    assert PEERS[1] in layer.lazy(TOPIC)
    # It left: our IHAVE or SHUFFLE reaches a node without the topic, which answers PRUNE.
    other = Plumtree(PEERS[1], lambda t: set(), lambda c: None)
    assert other.on_ihave(ME, IHave(TOPIC, ((TOPIC, 1),)), lambda c: False, 0.0) == [
        ev.Send(ME, Prune(TOPIC))]
    assert other.on_shuffle(ME, Shuffle(TOPIC, (), False), 0.0) == [ev.Send(ME, Prune(TOPIC))]
    out = layer.on_prune(PEERS[1], Prune(TOPIC), 1.0)
    assert PEERS[1] not in layer.lazy(TOPIC)
    assert out == [] or isinstance(out[0].timer, ShuffleTimer)  # lacking a link: shuffle


@pytest.mark.parametrize(
    "message",
    [
        IHave(TOPIC, ((TOPIC, 3),)),
        Graft(TOPIC, None),
        Graft(TOPIC, TOPIC),
        Prune(TOPIC),
        Shuffle(TOPIC, (PEERS[0], PEERS[1]), True),
    ],
)
def test_messages_roundtrip(message: Any) -> None:
    assert decode_message(encode_message(message)) == message


def test_malformed_repair_messages_are_refused() -> None:
    from dag import encode

    for wire in (
        {"t": "ihave", "topic": TOPIC, "ids": [[TOPIC]]},
        {"t": "ihave", "topic": TOPIC, "ids": [[TOPIC, 1]] * 600},
        {"t": "shuffle", "topic": TOPIC, "peers": [b"x"], "reply": False},
        {"t": "shuffle", "topic": TOPIC, "peers": [], "reply": 1},
        {"t": "graft", "topic": TOPIC},
    ):
        with pytest.raises(MessageError):
            decode_message(encode(wire))


@pytest.mark.parametrize("loss", [0.05, 0.1])
def test_repair_recovers_most_losses_in_a_lossy_network(loss: float) -> None:
    """Plumtree alone (backfill is another layer): far better than the tree without it."""
    net, author = _network(30, bucket_size=1, loss=loss, seed=7)
    nodes = list(net.nodes.values())
    topic = _topic(author.identity)
    _subscribe_all(net, topic, nodes)
    for i in range(100):
        net.publish(author, topic.cid, b"e%d" % i)
        net.run(until=net.now + 0.05)
    net.settle()
    delivered = sum(len(set(_payloads(n, topic.cid))) for n in nodes[1:])
    grafts = sum(n.core.lazy.metrics["grafts"] for n in nodes)
    assert grafts > 0
    assert delivered >= 0.985 * 29 * 100
    for node in nodes[1:]:  # never twice
        assert len(_payloads(node, topic.cid)) == len(set(_payloads(node, topic.cid)))
