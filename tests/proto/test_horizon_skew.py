"""The subscription horizon against publishers' clocks: exact inputs and outputs.

The horizon (``since`` minus ``horizon_slack``) is read on the subscriber's clock, an
event's ``created`` on its publisher's. A publisher whose clock was stepped back for a
moment (the Jepsen-style verifier does it with libfaketime) publishes an event that looks
minutes older than it is; one such event in a chain must not end a backfill walk and lose
every event below it that was published after the subscription began. A fresh
subscriber's walk must still stop at the horizon, one block later than it used to.
"""

from __future__ import annotations

from typing import Any

from dag import CID, EventDescriptor
from dag.descriptors import iso_timestamp
from pulsar.proto import events as ev
from pulsar.proto.repair.backfill import (
    REPAIR_HOP,
    Backfill,
    GapTimeout,
    Repaired,
    RetryFetch,
    WantTimeout,
)
from pulsar.proto.repair.messages import Blocks, Want

from .test_backfill import AUTHOR, PEER, PEER2, T0, TID, Net, _chain, _core, _verifier

SINCE = T0 + 10_000.0
"""When the subscription began (the subscriber's clock)."""
HORIZON = iso_timestamp(SINCE - 60)
"""``since`` minus the default 60 s of slack."""
SKEWED = SINCE - 60 - 600
"""``created`` of an event whose publisher's clock was 10 minutes behind: 600 s before
the horizon, though it was published well after the subscription began."""

GAP = ev.SetTimer(5.0, GapTimeout(TID, 0, 1))


def _store(*chains: list[EventDescriptor]) -> dict[CID, bytes]:
    return {e.cid: e.block for chain in chains for e in chain}


def _answer(store: dict[CID, bytes], want: Want) -> Blocks:
    """What a neighbour holding ``store`` answers (the real WANT answering)."""
    (send,) = Backfill(store.get, _verifier()).on_want(PEER2, want, 0.0)
    assert isinstance(send, ev.Send) and isinstance(send.message, Blocks)
    return send.message


def _want(head: EventDescriptor, limit: int, have: tuple[CID, ...], after: str | None) -> list[Any]:
    """The two outputs of a WANT to PEER for gap 0."""
    return [
        ev.Send(PEER, Want(TID, head.cid, limit, have, after)),
        ev.SetTimer(2.0, WantTimeout(TID, 0, PEER, head.cid)),
    ]


def _stored(events: list[EventDescriptor]) -> list[Any]:
    return [ev.StoreLocal(e.cid, e.block) for e in events]


def _pushed(events: list[EventDescriptor]) -> list[Any]:
    """What repair reports it brought in (for the core to push down the tree)."""
    return [Repaired(TID, e) for e in events]


def _repaired(events: list[EventDescriptor]) -> list[Any]:
    return [ev.Deliver(TID, e, REPAIR_HOP) for e in events]


def _jepsen_chain() -> tuple[EventDescriptor, list[EventDescriptor], EventDescriptor,
                             EventDescriptor]:
    """``d`` (delivered before the subscriber went down) <- 18 events published while it
    was down <- ``r``, published while the publisher's clock was 10 min behind <- ``c``,
    the live event the subscriber gets after its restart."""
    (d,) = _chain(1, start=SINCE + 10, tag="d")
    down = _chain(18, parent=d.cid, start=SINCE + 100, tag="e")
    (r,) = _chain(1, parent=down[-1].cid, start=SKEWED, tag="r")
    (c,) = _chain(1, parent=r.cid, start=SINCE + 130, tag="c")
    return d, down, r, c


# --------------------------------------------------------------------------- (1) the scenario


def test_an_event_from_a_clock_gone_back_does_not_end_a_resumed_walk() -> None:
    """The verifier's case: node 3 restarts (heads and delivery log from its store) and
    gets the live ``c``, whose parent ``r`` looks 600 s older than the horizon. ``r`` is
    fetched, and so is its parent, which is newer than the horizon: the clock went back
    along the chain, so the walk goes on to ``d`` and everything comes out in order."""
    d, down, r, c = _jepsen_chain()
    source = _store([d], down, [r, c])
    me = _core(since=SINCE, heads=[d.cid], is_delivered=lambda topic, cid: cid == d.cid)

    out = me.accepted(TID, c, 1, PEER, 0.0)
    want = Want(TID, r.cid, 512, (d.cid,), HORIZON)
    assert out == [GAP, *_want(r, 512, (d.cid,), HORIZON)]

    answer = _answer(source, want)
    assert answer.blocks == (r.block,)  # the answerer stops at the first block before `after`
    out = me.on_blocks(PEER, answer, 0.1)
    # Not history yet: r is held, and the blocks that decide are asked for in one WANT
    # (a resumed subscription looks 8 events past the horizon; without `after`).
    assert out == [*_stored([r]), *_want(down[-1], 7, (d.cid,), None), *_pushed([r])]
    assert me.held(TID) == 2 and me.missing(TID) == [down[-1].cid]

    answer = _answer(source, Want(TID, down[-1].cid, 7, (d.cid,), None))
    assert answer.blocks == tuple(e.block for e in reversed(down[11:]))
    out = me.on_blocks(PEER, answer, 0.2)
    # down[17] is newer than the horizon: r's clock was behind. An ordinary WANT follows.
    assert out == [*_stored(down[:10:-1]), *_want(down[10], 512, (d.cid,), HORIZON),
                   *_pushed(down[:10:-1])]

    answer = _answer(source, Want(TID, down[10].cid, 512, (d.cid,), HORIZON))
    assert answer.blocks == tuple(e.block for e in reversed(down[:11]))  # stops before d
    out = me.on_blocks(PEER, answer, 0.3)
    assert out == [*_stored(down[10::-1]), *_repaired([*down, r]), ev.Deliver(TID, c, 1),
                   *_pushed(down[10::-1])]

    assert me.heads(TID) == [c.cid]
    assert me.metrics["held"] == 0 and me.metrics["gaps_open"] == 0
    assert me.metrics["wants_sent"] == 3 and me.metrics["backfilled"] == 19
    assert me.metrics["delivered"] == 20 and me.metrics["gaps_reported"] == 0


def test_an_event_from_a_clock_gone_back_does_not_end_a_fresh_walk_over_the_dht() -> None:
    """The same chain for a subscriber that never restarted (it delivered ``d`` live, then
    was cut off) and fetches from the DHT, one block at a time: ``r`` is fetched and so is
    its parent; all 18 events below ``r`` come, then everything is delivered in order."""
    d, down, r, c = _jepsen_chain()
    me = _core(since=SINCE)
    assert me.accepted(TID, d, 1, PEER, 0.0) == [ev.Deliver(TID, d, 1)]

    assert me.accepted(TID, c, 1, None, 1.0) == [GAP, ev.Fetch(r.cid)]
    assert me.on_fetched(r.cid, r.block, 1.1) == [*_stored([r]), ev.Fetch(down[-1].cid),
                                                  *_pushed([r])]
    for event, parent in zip(down[:0:-1], down[-2::-1], strict=True):
        assert me.on_fetched(event.cid, event.block, 1.2) == [*_stored([event]),
                                                              ev.Fetch(parent.cid),
                                                              *_pushed([event])]
    out = me.on_fetched(down[0].cid, down[0].block, 1.3)
    assert out == [*_stored([down[0]]), *_repaired([*down, r]), ev.Deliver(TID, c, 1),
                   *_pushed([down[0]])]
    assert me.metrics["fetches"] == 19 and me.heads(TID) == [c.cid]
    assert me.metrics["held"] == 0 and me.metrics["gaps_open"] == 0


def test_a_skewed_event_whose_parent_was_delivered_is_delivered_at_once() -> None:
    """What follows a delivered event is delivered, whatever its clock said: no look-ahead
    block is needed."""
    (d,) = _chain(1, start=SINCE + 10, tag="d")
    (r,) = _chain(1, parent=d.cid, start=SKEWED, tag="r")
    (c,) = _chain(1, parent=r.cid, start=SINCE + 20, tag="c")
    me = _core(since=SINCE)
    assert me.accepted(TID, d, 1, PEER, 0.0) == [ev.Deliver(TID, d, 1)]
    assert me.accepted(TID, c, 1, PEER, 0.1) == [GAP, *_want(r, 512, (d.cid,), HORIZON)]
    out = me.on_blocks(PEER, Blocks(TID, r.cid, (r.block,)), 0.2)
    assert out == [*_stored([r]), *_repaired([r]), ev.Deliver(TID, c, 1), *_pushed([r])]


def test_a_live_event_from_a_clock_gone_back_waits_for_its_parent() -> None:
    """Down the tree, an event that looks older than the horizon was delivered at once and
    its parent never asked for: the 18 events published while the node was down were lost,
    and ``r`` came before its parent. Now its parent is fetched like any other's."""
    d, down, r, c = _jepsen_chain()
    source = _store([d], down)
    me = _core(since=SINCE, heads=[d.cid], is_delivered=lambda topic, cid: cid == d.cid)

    out = me.accepted(TID, r, 1, PEER, 0.0)
    assert out == [GAP, *_want(down[-1], 7, (d.cid,), None)]
    out = me.on_blocks(PEER, _answer(source, Want(TID, down[-1].cid, 7, (d.cid,), None)), 0.1)
    assert out == [*_stored(down[:10:-1]), *_want(down[10], 512, (d.cid,), HORIZON),
                   *_pushed(down[:10:-1])]
    out = me.on_blocks(PEER, _answer(source, Want(TID, down[10].cid, 512, (d.cid,), HORIZON)),
                       0.2)
    assert out == [*_stored(down[10::-1]), *_repaired(down), ev.Deliver(TID, r, 1),
                   *_pushed(down[10::-1])]
    assert me.accepted(TID, c, 1, PEER, 0.3) == [ev.Deliver(TID, c, 1)]


def test_a_run_of_skewed_events_does_not_end_a_resumed_walk() -> None:
    """Three events published while the clock was behind, one after another: a resumed
    subscription looks up to 8 events past the horizon, in one WANT."""
    (d,) = _chain(1, start=SINCE + 10, tag="d")
    down = _chain(10, parent=d.cid, start=SINCE + 100, tag="e")
    skewed = _chain(3, parent=down[-1].cid, start=SKEWED, tag="r")
    (c,) = _chain(1, parent=skewed[-1].cid, start=SINCE + 130, tag="c")
    source = _store([d], down, skewed)
    me = _core(since=SINCE, heads=[d.cid], is_delivered=lambda topic, cid: cid == d.cid)

    assert me.accepted(TID, c, 1, PEER, 0.0) == [GAP, *_want(skewed[2], 512, (d.cid,),
                                                               HORIZON)]
    out = me.on_blocks(PEER, Blocks(TID, skewed[2].cid, (skewed[2].block,)), 0.1)
    assert out == [*_stored([skewed[2]]), *_want(skewed[1], 7, (d.cid,), None),
                   *_pushed([skewed[2]])]
    answer = _answer(source, Want(TID, skewed[1].cid, 7, (d.cid,), None))
    assert answer.blocks == tuple(e.block for e in [skewed[1], skewed[0], *down[:4:-1]])
    out = me.on_blocks(PEER, answer, 0.2)
    assert out == [*_stored([skewed[1], skewed[0], *down[:4:-1]]),
                   *_want(down[4], 512, (d.cid,), HORIZON),
                   *_pushed([skewed[1], skewed[0], *down[:4:-1]])]
    answer = _answer(source, Want(TID, down[4].cid, 512, (d.cid,), HORIZON))
    out = me.on_blocks(PEER, answer, 0.3)
    assert out == [*_stored(down[4::-1]), *_repaired([*down, *skewed]), ev.Deliver(TID, c, 1),
                   *_pushed(down[4::-1])]


# --------------------------------------------------------------------------- (2) history


def _history() -> tuple[list[EventDescriptor], EventDescriptor]:
    """500 events from long before the subscription, then a live one linking the last."""
    history = _chain(500, start=SINCE - 5000, tag="h")
    (live,) = _chain(1, parent=history[-1].cid, start=SINCE + 5, tag="l")
    return history, live


def test_history_still_ends_a_fresh_walk_one_block_later() -> None:
    history, live = _history()
    source = _store(history)
    me = _core(since=SINCE)
    assert me.accepted(TID, live, 1, PEER, 0.0) == [GAP, *_want(history[-1], 512, (),
                                                                  HORIZON)]
    answer = _answer(source, Want(TID, history[-1].cid, 512, (), HORIZON))
    assert answer.blocks == (history[-1].block,)
    out = me.on_blocks(PEER, answer, 0.1)
    assert out == [*_stored(history[-1:]), *_want(history[-2], 1, (), None),
                   *_pushed(history[-1:])]
    answer = _answer(source, Want(TID, history[-2].cid, 1, (), None))
    assert answer.blocks == (history[-2].block,)
    # Two events in a row older than the horizon: history. Nothing more is asked for.
    assert me.on_blocks(PEER, answer, 0.2) == [*_stored(history[-2:-1]), ev.Deliver(TID, live, 1)]
    assert me.known(TID, history[-1].cid) and me.known(TID, history[-2].cid)
    assert me.heads(TID) == [live.cid] and me.metrics["gaps_open"] == 0
    assert me.metrics["wants_sent"] == 2 and me.metrics["backfilled"] == 2
    assert me.metrics["delivered"] == 1 and me.metrics["gaps_reported"] == 0
    # The closed gap's timers are no-ops.
    assert me.on_timer(GapTimeout(TID, 0, 1), 5.0) == []
    assert me.on_timer(WantTimeout(TID, 0, PEER, history[-2].cid), 2.1) == []


def test_history_still_ends_a_fresh_walk_over_the_dht() -> None:
    history, live = _history()
    me = _core(since=SINCE)
    assert me.accepted(TID, live, 1, None, 0.0) == [GAP, ev.Fetch(history[-1].cid)]
    out = me.on_fetched(history[-1].cid, history[-1].block, 0.1)
    assert out == [*_stored(history[-1:]), ev.Fetch(history[-2].cid), *_pushed(history[-1:])]
    out = me.on_fetched(history[-2].cid, history[-2].block, 0.2)
    assert out == [*_stored(history[-2:-1]), ev.Deliver(TID, live, 1)]
    assert me.metrics["fetches"] == 2 and me.metrics["gaps_open"] == 0


def test_a_live_event_older_than_the_horizon_is_still_delivered_after_one_block() -> None:
    """Down the tree, an event created before the horizon (its own clock gone back, or
    long in flight) whose parent is history: that parent alone decides, and it is
    delivered as before."""
    history, _ = _history()
    (old,) = _chain(1, parent=history[-1].cid, start=SINCE - 100, tag="o")
    me = _core(since=SINCE)
    assert me.accepted(TID, old, 1, PEER, 0.0) == [GAP, *_want(history[-1], 1, (), None)]
    out = me.on_blocks(PEER, Blocks(TID, history[-1].cid, (history[-1].block,)), 0.1)
    assert out == [*_stored(history[-1:]), ev.Deliver(TID, old, 1)]
    assert me.metrics["wants_sent"] == 1 and me.metrics["gaps_open"] == 0


def test_a_fresh_subscriber_on_a_network_fetches_two_blocks_of_the_past() -> None:
    history, live = _history()
    net = Net()
    source = net.add(PEER)
    source.has([*history, live])
    me = net.add(PEER2, since=SINCE)
    net.call(me, me.bf.accepted, TID, live, 1, PEER, 0.0)
    net.advance(60.0)
    wants = [m for _, _, m in net.sent if isinstance(m, Want)]
    blocks = [b for _, _, m in net.sent if isinstance(m, Blocks) for b in m.blocks]
    assert len(wants) == 2 and len(blocks) == 2
    assert me.delivered == [live] and me.reports == []


def test_a_resumed_walk_into_older_history_looks_eight_events_past_the_horizon() -> None:
    """A resumed subscription's chain that forks off history older than the subscription
    (a CUSTOM link to an old event): the look-ahead is one WANT of 7 blocks."""
    history, live = _history()
    (d,) = _chain(1, start=SINCE + 1, tag="d")  # delivered before the restart, elsewhere
    source = _store(history)
    me = _core(since=SINCE, heads=[d.cid], is_delivered=lambda topic, cid: cid == d.cid)
    assert me.accepted(TID, live, 1, PEER, 0.0) == [GAP, *_want(history[-1], 512, (d.cid,),
                                                                  HORIZON)]
    out = me.on_blocks(PEER, _answer(source, Want(TID, history[-1].cid, 512, (d.cid,),
                                                  HORIZON)), 0.1)
    assert out == [*_stored(history[-1:]), *_want(history[-2], 7, (d.cid,), None),
                   *_pushed(history[-1:])]
    answer = _answer(source, Want(TID, history[-2].cid, 7, (d.cid,), None))
    assert answer.blocks == tuple(e.block for e in history[-2:-9:-1])
    out = me.on_blocks(PEER, answer, 0.2)
    # The first six were held (not yet 8 in a row); the eighth was history.
    assert out == [*_stored(history[-2:-9:-1]), ev.Deliver(TID, live, 1),
                   *_pushed(history[-2:-8:-1])]
    assert me.metrics["wants_sent"] == 2 and me.metrics["backfilled"] == 8
    assert me.metrics["gaps_open"] == 0 and me.metrics["held"] == 0


def test_a_look_ahead_that_cannot_finish_ends_as_the_horizon_did() -> None:
    """The block after the first one older than the horizon cannot be had: at the gap
    timeout the walk ends as it used to (the fetched event is history, the live one is
    delivered), with no gap reported and nothing asked for again."""
    history, live = _history()
    me = _core(since=SINCE)
    assert me.accepted(TID, live, 1, None, 0.0) == [GAP, ev.Fetch(history[-1].cid)]
    out = me.on_fetched(history[-1].cid, history[-1].block, 0.1)
    assert out == [*_stored(history[-1:]), ev.Fetch(history[-2].cid), *_pushed(history[-1:])]
    assert me.on_fetched(history[-2].cid, None, 0.2) == [ev.SetTimer(0.5, RetryFetch(TID, 0))]
    assert me.on_timer(GapTimeout(TID, 0, 1), 5.0) == [ev.Deliver(TID, live, 1)]
    assert me.known(TID, history[-1].cid) and me.heads(TID) == [live.cid]
    assert me.metrics["gaps_reported"] == 0 and me.metrics["gaps_open"] == 0
    assert me.metrics["held"] == 0 and me.metrics["delivered"] == 1
    assert me.on_timer(RetryFetch(TID, 0), 5.1) == []


# --------------------------------------------------------------------------- (3) clock ahead


def _ahead_walk(skew: float) -> list[Any]:
    """A fresh subscriber's walk from a live event down 5 events published after the
    subscription (the middle one's publisher clock ``skew`` seconds ahead) to history.
    Returns every output, events named by their payload."""
    history = _chain(10, start=SINCE - 5000, tag="h")
    after: list[EventDescriptor] = []
    parent = history[-1].cid
    for i in range(5):
        at = SINCE + 1 + i + (skew if i == 2 else 0.0)
        after.append(EventDescriptor.create(AUTHOR, TID, f"p{i}".encode(), parent=parent,
                                            now=at))
        parent = after[-1].cid
    (live,) = _chain(1, parent=parent, start=SINCE + 6, tag="l")
    source = _store(history, after)
    me = _core(since=SINCE)
    step = me.accepted(TID, live, 1, PEER, 0.0)
    outputs = list(step)
    for at in (0.1, 0.2, 0.3, 0.4):
        sent = [o.message for o in step if isinstance(o, ev.Send)]
        if not sent:
            break
        (want,) = sent
        assert isinstance(want, Want)
        step = me.on_blocks(PEER, _answer(source, want), at)
        outputs += step
    assert me.metrics["held"] == 0 and me.metrics["gaps_open"] == 0
    names = {e.cid: e.payload for e in [*history, *after, live]}

    def name(item: Any) -> Any:
        match item:
            case ev.Deliver(event=event, hop=hop):
                return ("deliver", event.payload, hop)
            case ev.StoreLocal(cid=cid):
                return ("store", names[cid])
            case ev.Send(message=Want(head=head, limit=limit, after=after_)):
                return ("want", names[head], limit, after_)
            case ev.Fetch(cid=cid):
                return ("fetch", names[cid])
            case Repaired(event=event):
                return ("pushed", event.payload)
        return item

    return [name(o) for o in outputs if not isinstance(o, ev.SetTimer)]


def test_an_event_from_a_clock_ahead_changes_nothing() -> None:
    """An event created 10 minutes in the future looks newer than the horizon, as it did:
    the walk, its requests and the deliveries are those of a chain with a correct clock."""
    expected = [
        ("want", b"p4", 512, HORIZON),
        ("store", b"p4"), ("store", b"p3"), ("store", b"p2"), ("store", b"p1"),
        ("store", b"p0"), ("store", b"h9"),
        ("want", b"h8", 1, None),
        ("pushed", b"p4"), ("pushed", b"p3"), ("pushed", b"p2"), ("pushed", b"p1"),
        ("pushed", b"p0"), ("pushed", b"h9"),
        ("store", b"h8"),
        ("deliver", b"p0", REPAIR_HOP), ("deliver", b"p1", REPAIR_HOP),
        ("deliver", b"p2", REPAIR_HOP), ("deliver", b"p3", REPAIR_HOP),
        ("deliver", b"p4", REPAIR_HOP), ("deliver", b"l0", 1),
    ]
    assert _ahead_walk(0.0) == expected
    assert _ahead_walk(600.0) == expected


def test_a_retention_cut_moves_the_horizon_so_cut_events_do_not_come_back() -> None:
    """A subscriber of the whole history (no ``since``) whose retention policy cut its log
    down to events created at ``SINCE``: a live event whose parent chain runs back into the
    cut part must not deliver the cut events again. Told of the cut (HistoryCut), the walk
    stops past it exactly as at a subscription horizon; not told, it delivers all 500."""
    history, live = _history()
    for told in (True, False):
        net = Net()
        source = net.add(PEER)
        source.has([*history, live])
        me = net.add(PEER2)
        if told:
            me.bf.raise_horizon(TID, SINCE)
        net.call(me, me.bf.accepted, TID, live, 1, PEER, 0.0)
        net.advance(60.0)
        if told:
            assert me.delivered == [live] and me.reports == []
        else:
            assert me.delivered == [*history, live]


def test_the_horizon_only_moves_forward() -> None:
    me = _core(since=SINCE)
    me.raise_horizon(TID, SINCE - 10_000)  # an older cut does not widen what is delivered
    _, live = _history()
    # The same WANT as without the cut: its ``after`` is still the subscription's horizon.
    assert me.accepted(TID, live, 1, PEER, 0.0) == [GAP, *_want(_history()[0][-1], 512, (),
                                                              HORIZON)]
