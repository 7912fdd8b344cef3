"""The consumer-group view and its beat: who handles an event, liveness, and what a beat
off the wire must prove."""

from __future__ import annotations

import pytest

from dag import Identity, cid_of, encode
from pulsar.proto.codec import decode_frame, decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.groups.messages import GroupBeat
from pulsar.proto.groups.view import GroupView, MemberId, MemberState

TOPIC = cid_of(encode({"topic": "groups"}))
EVENTS = [cid_of(encode({"event": i})) for i in range(3000)]


def member(n: int, inc: int = 1) -> MemberId:
    return MemberId(bytes([n]) * 38, f"w{n}", inc)


def view_of(me: int, others: list[int], since: float = 0.0) -> GroupView:
    view = GroupView(MemberState(member(me), since, 0.0), dead_after=3.0)
    for n in others:
        view.heard(member(n), since, 1, False, 0.0)
    return view


def test_members_with_the_same_view_agree_on_every_owner_and_share_evenly() -> None:
    views = [view_of(n, [m for m in range(4) if m != n]) for n in range(4)]
    counts = [0, 0, 0, 0]
    for cid in EVENTS:
        mine = [v.mine(cid, 10.0) for v in views]
        assert sum(mine) == 1  # exactly one member hands each event out
        counts[mine.index(True)] += 1
    assert all(600 <= c <= 900 for c in counts), counts  # 750 each, give or take


def test_a_member_gone_moves_only_its_own_events() -> None:
    before = view_of(0, [1, 2])
    after = view_of(0, [1, 2])
    assert after.heard(member(2), 0.0, 2, True, 1.0) == [member(2)]
    for cid in EVENTS:
        old, new = before.owner(cid, 10.0), after.owner(cid, 10.0)
        if old != member(2):
            assert new == old
        else:
            assert new in (member(0), member(1))


def test_events_created_before_a_member_joined_stay_with_the_others() -> None:
    view = view_of(0, [1])
    view.heard(member(2), 100.0, 1, False, 0.0)  # joins with since = 100
    early = {view.owner(cid, 99.0) for cid in EVENTS}
    late = {view.owner(cid, 100.0) for cid in EVENTS}
    assert member(2) not in early and member(2) in late
    # Nobody eligible (all joined after the event): every live member is.
    young = view_of(0, [1], since=50.0)
    assert {young.owner(cid, 10.0) for cid in EVENTS} == {member(0), member(1)}


def test_silence_a_new_incarnation_and_leaving_end_a_member() -> None:
    view = view_of(0, [1, 2])
    epoch = view.epoch
    view.heard(member(1), 0.0, 2, False, 2.5)
    assert view.expire(3.5) == [member(2)]  # not heard for more than 3 s
    assert view.epoch == epoch + 1
    assert (member(2).peer, member(2).name) not in view.others
    view.heard(member(2), 0.0, 9, False, 3.6)  # heard again (a partition healed): back
    assert (member(2).peer, member(2).name) in view.others and view.epoch == epoch + 2
    assert view.heard(member(2), 0.0, 10, True, 3.7) == [member(2)]  # leaving: for good
    assert view.heard(member(2), 0.0, 11, False, 3.8) == []
    assert (member(2).peer, member(2).name) not in view.others
    assert view.heard(member(1, inc=2), 0.0, 1, False, 4.0) == [member(1)]
    assert view.heard(member(1), 0.0, 3, False, 4.1) == []  # the old one's late beat
    assert [s.id for s in view.live()] == [member(0), member(1, inc=2)]


def beat(identity: Identity, **changes: object) -> GroupBeat:
    fields: dict[str, object] = dict(topic=TOPIC, group="g", name="w", inc=5, seq=1,
                                     since=7000, leaving=False, acked=tuple(EVENTS[:3]),
                                     hops=3)
    fields.update(changes)
    return GroupBeat.signed(identity, **fields)  # type: ignore[arg-type]


def test_a_beat_round_trips_and_a_relay_may_lower_hops_only() -> None:
    identity = Identity.generate()
    sent = beat(identity)
    received = decode_frame(encode_message(sent))
    assert received == sent and isinstance(received, GroupBeat) and received.verify()
    assert sent.relayed().verify() and sent.relayed().hops == 2
    forged = GroupBeat(sent.topic, sent.group, sent.member, sent.name, sent.inc, sent.seq,
                       sent.since, sent.leaving, EVENTS[3:6], sent.hops, sent.sig)
    assert not forged.verify()  # acknowledgements another member did not make
    other = Identity.generate()
    impostor = GroupBeat(sent.topic, sent.group, other.peer_id, sent.name, sent.inc,
                         sent.seq, sent.since, sent.leaving, sent.acked, sent.hops, sent.sig)
    assert not impostor.verify()
    with pytest.raises(MessageError):  # the core is never handed a runtime message
        decode_message(encode_message(sent))


@pytest.mark.parametrize("change", [
    {"group": "no spaces"}, {"group": ""}, {"name": "x" * 65}, {"hops": 9},
    {"acked": [EVENTS[0]] * 513}, {"leaving": 1}, {"sig": b"x" * 63}, {"member": b"junk"},
    {"inc": -1},
])
def test_a_malformed_beat_is_refused(change: dict[str, object]) -> None:
    wire = beat(Identity.generate()).to_wire()
    wire.update(change)
    with pytest.raises(MessageError):
        decode_frame(encode(wire))


def test_a_peer_minting_member_names_cannot_grow_a_view_without_bound() -> None:
    from pulsar.proto.groups.view import MAX_GONE, MAX_MEMBERS

    view = view_of(0, [])
    for i in range(MAX_GONE + 500):
        view.heard(MemberId(b"\x07" * 38, f"m{i}", 1), 0.0, 1, False, 0.0)
        view.heard(MemberId(b"\x07" * 38, f"m{i}", 1), 0.0, 2, True, 0.0)
    assert len(view.others) == 0 and len(view.gone) == MAX_GONE
    for i in range(MAX_MEMBERS + 50):
        view.heard(MemberId(b"\x08" * 38, f"x{i}", 1), 0.0, 1, False, 0.0)
    assert len(view.live()) == MAX_MEMBERS
