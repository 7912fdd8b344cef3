"""BATCH: one frame for a step's control messages to one neighbour, validated as a whole."""

from __future__ import annotations

from typing import Any

import pytest

from dag import Identity, cid_of, encode
from pulsar.proto import events as ev
from pulsar.proto.batch.messages import MAX_BATCH, Batch
from pulsar.proto.batch.packing import coalesce
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.repair.messages import Heads, Joined
from pulsar.proto.tree.messages import Event

TOPIC = cid_of(b"\xa1atb")
A = Identity.from_seed(b"a" * 32).peer_id
B = Identity.from_seed(b"b" * 32).peer_id


def test_a_batch_round_trips_and_keeps_its_order() -> None:
    batch = Batch((Heads(TOPIC, (TOPIC,)), IHave(TOPIC, ((TOPIC, 2),)), Prune(TOPIC),
                   Shuffle(TOPIC, (A,), False), Graft(TOPIC, None)))
    assert decode_message(encode_message(batch)) == batch


@pytest.mark.parametrize(
    "inner",
    [
        [],  # empty
        [Event(TOPIC, b"\xa0", 1).to_wire()],  # an event never rides in a batch
        [Joined(TOPIC, (), ()).to_wire()],  # nor the JOIN acknowledgement
        [Batch((Prune(TOPIC),)).to_wire()],  # nor another batch
        [{"t": "prune"}],  # an inner message missing its fields
        ["prune"],  # not a map
        [Prune(TOPIC).to_wire()] * (MAX_BATCH + 1),  # too many
    ],
)
def test_a_batch_with_anything_else_is_refused_whole(inner: list[Any]) -> None:
    with pytest.raises(MessageError):
        decode_message(encode({"t": "batch", "msgs": inner}))


def test_coalesce_packs_per_peer_and_leaves_the_rest_in_place() -> None:
    event = ev.Send(A, Event(TOPIC, b"\xa0", 1))
    out: list[ev.OutEvent] = [
        ev.Send(A, Heads(TOPIC, ())),
        event,
        ev.Send(B, Prune(TOPIC)),  # alone for B: sent as it is
        ev.Send(A, IHave(TOPIC, ((TOPIC, 1),))),
        ev.Send(A, Joined(TOPIC, (), ())),  # JOINED goes alone
    ]
    packed = coalesce(out)
    # A's two control messages become one BATCH where the last of them was: nothing is
    # moved ahead of what was emitted before it.
    assert packed == [
        event,
        ev.Send(B, Prune(TOPIC)),
        ev.Send(A, Batch((Heads(TOPIC, ()), IHave(TOPIC, ((TOPIC, 1),))))),
        ev.Send(A, Joined(TOPIC, (), ())),
    ]


def test_coalesce_starts_another_batch_past_the_limit() -> None:
    out: list[ev.OutEvent] = [ev.Send(A, Prune(TOPIC)) for _ in range(MAX_BATCH + 3)]
    packed = coalesce(out)
    sizes = [len(o.message.messages) for o in packed
             if isinstance(o, ev.Send) and isinstance(o.message, Batch)]
    assert sizes == [MAX_BATCH, 3]
