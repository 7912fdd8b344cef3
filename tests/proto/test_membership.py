"""The node-wide membership layer (HyParView): exact outputs for scripted inputs."""

from __future__ import annotations

from typing import Any

import pytest

from dag import Identity, PeerId, TopicDescriptor, cid_of, encode
from pulsar.proto import events as ev
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.membership.messages import (
    MAX_INTERESTS,
    MAX_VIEW_SAMPLE,
    Disconnect,
    ForwardJoin,
    HvJoin,
    Interests,
    Neighbor,
    NeighborReply,
    ViewShuffle,
    ViewShuffleReply,
)
from pulsar.proto.membership.overlay import Membership, MembershipConfig
from pulsar.proto.timers import MembershipTick

ME = Identity.from_seed(b"m" * 32).peer_id
P = sorted((Identity.from_seed(bytes([i]) * 32).peer_id for i in range(1, 40)), key=bytes)
TOPIC = cid_of(b"a topic")
"""Peers in byte order, so 'sorted by bytes' outputs read in index order."""


def _layer(contacts: list[PeerId] | None = None, distance: dict[PeerId, float] | None = None,
           **config: Any) -> Membership:
    known = contacts or []
    rtt = distance or {}
    config.setdefault("near_slots", 0)  # proximity off unless the test is about it
    return Membership(ME, lambda: known, MembershipConfig(**config), distance=rtt.get)


def _linked(m: Membership, *peers: PeerId) -> None:
    """Make ``peers`` neighbours the way a peer would: each asks with NEIGHBOR."""
    for peer in peers:
        out = m.on_message(peer, Neighbor(True), 0.0)
        assert ev.Send(peer, NeighborReply(True)) in out
    m.tell_interests([], [])  # links up so far are told nothing: no topics


def _sends(out: ev.Out) -> list[tuple[PeerId, Any]]:
    return [(o.peer, o.message) for o in out if isinstance(o, ev.Send)]


def test_join_through_a_contact_then_links_once_it_answers() -> None:
    m = _layer([P[0]])
    assert m.start(0.0) == [ev.Send(P[0], HvJoin()), ev.SetTimer(1.0, MembershipTick(1))]
    assert m.start(0.0) == []  # once
    assert m.neighbours() == []  # not before the contact took us
    assert m.on_message(P[0], NeighborReply(True), 0.1) == []
    assert m.neighbours() == [P[0]]
    # The new neighbour is told every topic we are in, once.
    assert m.tell_interests([TOPIC], []) == [ev.Send(P[0], Interests((TOPIC,)))]
    assert m.tell_interests([TOPIC], []) == []


def test_a_node_without_contacts_joins_when_the_tick_finds_one() -> None:
    contacts: list[PeerId] = []
    m = Membership(ME, lambda: contacts, MembershipConfig())
    assert m.start(0.0) == [ev.SetTimer(1.0, MembershipTick(1))]
    contacts.append(P[3])
    assert m.on_timer(MembershipTick(1), 1.0) == [
        ev.Send(P[3], HvJoin()), ev.SetTimer(1.0, MembershipTick(2))
    ]
    assert m.on_timer(MembershipTick(1), 1.5) == []  # a stale tick does nothing


def test_the_contact_takes_the_newcomer_and_sends_it_on_walks() -> None:
    m = _layer()
    m.start(0.0)
    _linked(m, P[0], P[1])
    out = m.on_message(P[5], HvJoin(), 1.0)
    assert _sends(out) == [
        (P[5], NeighborReply(True)),
        (P[0], ForwardJoin(P[5], 6)),
        (P[1], ForwardJoin(P[5], 6)),
    ]
    assert m.neighbours() == [P[0], P[1], P[5]]


def test_forward_join_walks_keeps_passive_at_prwl_and_links_at_the_end() -> None:
    m = _layer()
    m.start(0.0)
    _linked(m, P[0], P[1])
    # Step 4 of 6: passed on to the only other neighbour, not kept.
    assert _sends(m.on_message(P[0], ForwardJoin(P[9], 4), 1.0)) == [(P[1], ForwardJoin(P[9], 3))]
    assert P[9] not in m.passive
    # Step PRWL = 3: kept as passive and passed on.
    assert _sends(m.on_message(P[0], ForwardJoin(P[9], 3), 1.0)) == [(P[1], ForwardJoin(P[9], 2))]
    assert P[9] in m.passive
    # A hostile TTL is cut to our own walk length.
    assert _sends(m.on_message(P[0], ForwardJoin(P[7], 16), 1.0)) == [(P[1], ForwardJoin(P[7], 5))]
    # The end of the walk: ask the newcomer, with a priority it cannot refuse.
    assert _sends(m.on_message(P[0], ForwardJoin(P[8], 0), 1.0)) == [(P[8], Neighbor(True))]
    assert m.on_message(P[8], NeighborReply(True), 1.1) == []
    assert P[8] in m.active
    # Ourselves or a neighbour already: nothing.
    assert m.on_message(P[0], ForwardJoin(ME, 2), 1.0) == []
    assert m.on_message(P[0], ForwardJoin(P[1], 2), 1.0) == []


def test_a_walk_that_reaches_a_node_with_one_neighbour_ends_there() -> None:
    m = _layer()
    m.start(0.0)
    _linked(m, P[0])
    assert _sends(m.on_message(P[0], ForwardJoin(P[4], 5), 1.0)) == [(P[4], Neighbor(True))]


def test_a_full_view_refuses_low_priority_and_makes_room_for_high() -> None:
    m = _layer(active_size=2)
    m.start(0.0)
    _linked(m, P[0], P[1])
    assert _sends(m.on_message(P[2], Neighbor(False), 1.0)) == [(P[2], NeighborReply(False))]
    assert P[2] in m.passive and P[2] not in m.active
    out = _sends(m.on_message(P[3], Neighbor(True), 1.0))
    assert len(out) == 2
    (victim, disconnect), reply = out
    assert disconnect == Disconnect(True) and victim in (P[0], P[1])
    assert reply == (P[3], NeighborReply(True))
    assert set(m.active) == {P[0], P[1], P[3]} - {victim}
    assert victim in m.passive
    # Only the link that came up is told our topics; the one that went down is not.
    assert m.tell_interests([TOPIC], []) == [ev.Send(P[3], Interests((TOPIC,)))]


def test_a_failed_neighbour_is_replaced_from_the_passive_view() -> None:
    m = _layer(active_size=2)
    m.start(0.0)
    _linked(m, P[0])
    m.passive.update({P[5]: None, P[6]: None, P[7]: None})
    out = _sends(m.peer_down(P[0], 2.0))
    # No neighbour left: two asks (the view has two slots), both with high priority.
    assert len(out) == 2 and all(msg == Neighbor(True) for _, msg in out)
    asked = {peer for peer, _ in out}
    assert asked < {P[5], P[6], P[7]}
    assert m.tell_interests([TOPIC], []) == []  # a link went down: nobody to tell
    first, second = sorted(asked, key=bytes)
    assert m.on_message(first, NeighborReply(True), 2.1) == []
    # The other refuses. With a neighbour left the node is in no hurry: the next shuffle
    # tick asks the last passive peer, with low priority now.
    rest = ({P[5], P[6], P[7]} - asked).pop()
    assert _sends(m.on_message(second, NeighborReply(False), 2.1)) == []
    out = _sends(m.on_timer(MembershipTick(m._tick_seq), 100.0))
    assert (rest, Neighbor(False)) in out and (second, Neighbor(False)) not in out
    # A refusal keeps a peer from being asked for a shuffle interval: at the next tick
    # the one refused at 2.1 s is asked again, the one refused at 100.1 s is not.
    assert m.on_message(rest, NeighborReply(False), 100.1) == []
    out = _sends(m.on_timer(MembershipTick(m._tick_seq), 130.0))
    asks = [peer for peer, msg in out if isinstance(msg, Neighbor)]
    assert asks == [second]
    assert m.neighbours() == [first]
    assert m.metrics["active_failures"] == 1


def test_an_unanswered_request_times_out_and_its_peer_is_dropped() -> None:
    m = _layer(active_size=1)
    m.start(0.0)
    m.passive.update({P[5]: None})
    out = _sends(m.peer_down(P[20], 0.0))  # any input that repairs
    assert out == [(P[5], Neighbor(True))]
    m.on_timer(MembershipTick(1), 5.0)
    assert P[5] not in m.passive


def test_disconnect_alive_keeps_the_peer_passive_and_leaving_forgets_it() -> None:
    m = _layer(active_size=3)
    m.start(0.0)
    _linked(m, P[0], P[1], P[2])
    out = _sends(m.on_message(P[0], Disconnect(True), 1.0))
    assert P[0] in m.passive and P[0] not in m.active
    assert out == [(P[0], Neighbor(False))]  # the only passive peer: asked back (low)
    m.passive.clear()
    assert m.on_message(P[1], Disconnect(False), 1.0) == []
    assert P[1] not in m.passive and P[1] not in m.active


def test_an_acceptance_nobody_asked_for_is_undone() -> None:
    m = _layer()
    m.start(0.0)
    assert _sends(m.on_message(P[4], NeighborReply(True), 1.0)) == [(P[4], Disconnect(True))]
    assert P[4] not in m.active


def test_shuffle_sends_a_sample_of_both_views_on_a_walk() -> None:
    m = _layer(shuffle_interval=30.0)
    m.start(0.0)
    _linked(m, *P[0:5])
    m.passive.update({p: None for p in P[10:20]})
    out = _sends(m.on_timer(MembershipTick(m._tick_seq), 100.0))
    assert len(out) == 1
    target, shuffle = out[0]
    assert isinstance(shuffle, ViewShuffle) and target in m.active
    assert shuffle.origin == ME and shuffle.ttl == 3 and shuffle.peers[0] == ME
    actives, passives = shuffle.peers[1:4], shuffle.peers[4:]
    assert set(actives) <= set(P[0:5]) - {target} and len(set(actives)) == 3
    assert set(passives) <= set(P[10:20]) and len(set(passives)) == 4


def test_shuffle_walks_on_then_the_last_node_answers_the_origin_and_merges() -> None:
    m = _layer(passive_size=4)
    m.start(0.0)
    _linked(m, P[0], P[1])
    m.passive.update({P[30]: None, P[31]: None})
    sample = (P[20], P[21], P[22])
    # TTL left and another neighbour: passed on.
    assert _sends(m.on_message(P[0], ViewShuffle(P[20], 2, sample), 1.0)) == [
        (P[1], ViewShuffle(P[20], 1, sample))
    ]
    # The end of the walk: our passive sample goes straight back to the origin.
    out = _sends(m.on_message(P[0], ViewShuffle(P[20], 0, sample), 1.0))
    assert len(out) == 1 and out[0][0] == P[20]
    answer = out[0][1]
    assert isinstance(answer, ViewShuffleReply) and set(answer.peers) == {P[30], P[31]}
    # The origin and its sample are kept; room is made by evicting what we gave away.
    assert len(m.passive) == 4 and {P[20], P[21], P[22]} <= set(m.passive)
    assert len(set(m.passive) & {P[30], P[31]}) == 1


def test_a_shuffle_reply_evicts_what_was_sent_first() -> None:
    m = _layer(active_size=1, passive_size=3, shuffle_passive=2, shuffle_active=0)
    m.start(0.0)
    _linked(m, P[0])
    m.passive.update({P[10]: None, P[11]: None, P[12]: None})
    sent = _sends(m.on_timer(MembershipTick(m._tick_seq), 100.0))
    [(target, shuffle)] = sent
    assert target == P[0] and isinstance(shuffle, ViewShuffle)
    given = set(shuffle.peers[1:])
    kept = {P[10], P[11], P[12]} - given
    m.on_message(P[3], ViewShuffleReply((P[25], P[26])), 100.5)
    assert set(m.passive) == kept | {P[25], P[26]}
    # A second answer, or one nobody asked for, is ignored.
    m.on_message(P[3], ViewShuffleReply((P[27],)), 100.6)
    assert P[27] not in m.passive


def test_proximity_asks_the_nearest_passive_peer_and_swaps_out_the_farthest() -> None:
    rtt = {P[0]: 0.2, P[1]: 0.3, P[10]: 0.05, P[11]: 0.01}
    m = _layer(distance=rtt, active_size=2, near_slots=1, shuffle_interval=30.0)
    m.start(0.0)
    _linked(m, P[0], P[1])
    m.passive[P[10]] = None
    out = _sends(m.on_timer(MembershipTick(m._tick_seq), 100.0))
    assert (P[10], Neighbor(False)) in out  # a free near slot: the nearest is asked
    out = _sends(m.on_message(P[10], NeighborReply(True), 100.1))
    assert len(out) == 1 and out[0][1] == Disconnect(True)  # a random link made room
    assert m.near() == [P[10]]
    # A peer under near_gain x the near link's RTT takes its slot; the old one goes.
    m.passive[P[11]] = None
    out = _sends(m.on_timer(MembershipTick(m._tick_seq), 200.0))
    assert (P[11], Neighbor(False)) in out
    out = _sends(m.on_message(P[11], NeighborReply(True), 200.1))
    assert out == [(P[10], Disconnect(True))]
    assert m.near() == [P[11]] and P[10] in m.passive
    assert m.metrics["near_swaps"] == 1


def test_proximity_leaves_links_alone_without_a_clear_gain() -> None:
    rtt = {P[0]: 0.2, P[10]: 0.05, P[11]: 0.04}
    m = _layer(distance=rtt, active_size=2, near_slots=1)
    m.start(0.0)
    _linked(m, P[0])
    m.passive[P[10]] = None
    m.on_timer(MembershipTick(m._tick_seq), 0.5)  # repair asks P[10]
    m.on_message(P[10], NeighborReply(True), 0.6)
    m.active[P[10]] = True  # suppose it holds the near slot
    m.passive[P[11]] = None
    out = _sends(m.on_timer(MembershipTick(m._tick_seq), 100.0))
    assert not any(msg == Neighbor(False) and peer == P[11] for peer, msg in out)


def test_messages_round_trip_and_bad_ones_are_refused() -> None:
    topic = cid_of(b"\xa1atb")
    for message in (
        HvJoin(), ForwardJoin(P[0], 6), Neighbor(True), NeighborReply(False), Disconnect(True),
        ViewShuffle(P[0], 3, (P[1], P[2])), ViewShuffleReply(()), Interests((topic,)),
    ):
        assert decode_message(encode_message(message)) == message
    bad = [
        {"t": "fwdjoin", "peer": P[0].raw, "ttl": 17},
        {"t": "fwdjoin", "peer": b"x", "ttl": 1},
        {"t": "neighbor", "high": 1},
        {"t": "vshuffle", "origin": P[0].raw, "ttl": 1,
         "peers": [P[1].raw] * (MAX_VIEW_SAMPLE + 1)},
        {"t": "interests", "topics": []},
        {"t": "interests", "topics": [topic] * (MAX_INTERESTS + 1)},
    ]
    for wire in bad:
        with pytest.raises(MessageError):
            decode_message(encode(wire))


# --------------------------------------------------------------------------- in the core


def test_the_core_tells_a_new_overlay_neighbour_its_topics_and_learns_theirs() -> None:
    from pulsar.proto.core import PulsarCore

    from .test_core import StaticRouting, _ident, _topic

    me, other = _ident(1), _ident(2).peer_id
    topic = _topic(me)
    core = PulsarCore(me, StaticRouting([other]))
    assert core.members.started is False
    core.handle(ev.Subscribe(topic), 0.0)  # before Start: the overlay is not entered
    trees = sorted(core._trees, key=bytes)  # the topic and its meta topic
    out = core.handle(ev.Start(), 0.0)
    assert ev.Send(other, HvJoin()) in out
    # The contact takes us: both sides now hold the link, and we name our trees.
    out = core.handle(ev.Received(other, NeighborReply(True)), 0.1)
    assert ev.Send(other, Interests(tuple(trees))) in out
    # A tree joined later is named once, to the neighbours we have.
    later = TopicDescriptor.create(me, "later")
    out = core.handle(ev.Subscribe(later), 0.2)
    assert ev.Send(other, Interests((later.cid,))) in out
    # What the neighbour says it is in becomes a lazy-link candidate for our topics only.
    stranger = cid_of(b"\xa1ax")
    assert core.handle(ev.Received(other, Interests((stranger, topic.cid))), 0.3) == []
    assert core.lazy.lazy(topic.cid) == {other}
    # The overlay's messages reach the overlay: a neighbour's failure is repaired.
    assert core.members.neighbours() == [other]
    core.handle(ev.PeerDown(other), 0.4)
    assert core.members.neighbours() == []


def test_a_lone_core_sends_nothing_until_started() -> None:
    from pulsar.proto.core import PulsarCore

    from .test_core import StaticRouting, _ident

    core = PulsarCore(_ident(1), StaticRouting([]))
    assert core.handle(ev.TimerFired(MembershipTick(1)), 0.0) == []  # never armed: stale
    assert core.handle(ev.Start(), 0.0) == [ev.SetTimer(1.0, MembershipTick(1))]


def test_interests_go_whole_to_new_links_and_as_news_to_the_others() -> None:
    m = _layer()
    m.start(0.0)
    _linked(m, P[0], P[1])
    joined = cid_of(b"joined just now")
    m.on_message(P[2], Neighbor(True), 1.0)
    out = m.tell_interests([TOPIC, joined], [joined])
    everything = tuple(sorted([TOPIC, joined], key=bytes))
    assert sorted(_sends(out), key=lambda s: bytes(s[0])) == sorted(
        [(P[2], Interests(everything)), (P[0], Interests((joined,))),
         (P[1], Interests((joined,)))], key=lambda s: bytes(s[0]))
    # More topics than one message carries: split, nothing left out.
    many = [cid_of(bytes([i, j])) for i in range(3) for j in range(256)][:MAX_INTERESTS + 5]
    m.on_message(P[3], Neighbor(True), 2.0)
    told = [msg.topics for peer, msg in _sends(m.tell_interests(many, [])) if peer == P[3]]
    assert [len(t) for t in told] == [MAX_INTERESTS, 5]
    assert sorted((t for chunk in told for t in chunk), key=bytes) == sorted(many, key=bytes)
