"""Backfill and causal delivery, driven without sockets: exact inputs with asserted outputs,
and small networks of :class:`Backfill` cores joined by an in-memory link on which every
message goes through the real wire encoding."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from dag import (
    CID,
    EventDescriptor,
    Identity,
    InvalidDescriptor,
    PeerId,
    TopicDescriptor,
    check_rights,
    encode,
)
from dag.codec import decode, encode_reference_free
from dag.descriptors import iso_timestamp
from pulsar.proto import events as ev
from pulsar.proto.codec import decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.repair import messages as repair_messages
from pulsar.proto.repair.backfill import (
    REPAIR_HOP,
    Backfill,
    BackfillConfig,
    GapReported,
    GapTimeout,
    HeadsTick,
    Repaired,
    RetryFetch,
    RetryLost,
    Verify,
    WantTimeout,
)
from pulsar.proto.repair.messages import (
    MAX_BLOCK,
    Blocks,
    Heads,
    HeadsDigest,
    Joined,
    Want,
    heads_digest,
)
from pulsar.proto.tree.rtt import RttTable

T0 = 1_700_000_000.0
AUTHOR = Identity.from_seed(b"\x01" * 32)
OTHER = Identity.from_seed(b"\x02" * 32)
MALLORY = Identity.from_seed(b"\x03" * 32)
PEER = Identity.from_seed(b"\x04" * 32).peer_id
PEER2 = Identity.from_seed(b"\x05" * 32).peer_id


def _topic(**kw: Any) -> TopicDescriptor:
    meta = TopicDescriptor.create(AUTHOR, "t/meta", now=T0)
    return TopicDescriptor.create(AUTHOR, "t", meta=meta.cid, now=T0, **kw)


TOPIC = _topic()
TID = TOPIC.cid


def _chain(
    n: int,
    *,
    parent: CID | None = None,
    start: float = T0 + 1,
    step: float = 1.0,
    publisher: Identity = AUTHOR,
    tag: str = "e",
    topic: CID = TID,
) -> list[EventDescriptor]:
    out = []
    for i in range(n):
        event = EventDescriptor.create(
            publisher, topic, f"{tag}{i}".encode(), parent=parent, now=start + i * step
        )
        out.append(event)
        parent = event.cid
    return out


@cache
def _long_chain(n: int) -> tuple[EventDescriptor, ...]:
    return tuple(_chain(n))


def _verifier(topic: TopicDescriptor = TOPIC) -> Verify:
    """What the core passes: parse and verify the block, check its topic and rights."""

    def verify(tree: CID, block: bytes | EventDescriptor) -> EventDescriptor | None:
        if tree != topic.cid:
            return None
        try:
            event = block if isinstance(block, EventDescriptor) else EventDescriptor.from_block(
                block)
            if event.topic != topic.cid:
                return None
            check_rights(event, topic)
        except InvalidDescriptor:
            return None
        return event

    return verify


def _core(store: dict[CID, bytes] | None = None, **kw: Any) -> Backfill:
    store = {} if store is None else store
    verify = kw.pop("verify", None) or _verifier()
    since = kw.pop("since", None)
    heads = kw.pop("heads", ())
    core = Backfill(store.get, verify, **kw)
    core.open(TID, 0.0, since=since, heads=heads)
    return core


def _delivered(out: list[Any]) -> list[EventDescriptor]:
    return [o.event for o in out if isinstance(o, ev.Deliver)]


# --------------------------------------------------------------------------- a small network


class Node:
    def __init__(self, net: Net, peer: PeerId, **kw: Any) -> None:
        self.peer = peer
        self.store: dict[CID, bytes] = {}
        self.delivered: list[EventDescriptor] = []
        self.reports: list[GapReported] = []
        self.rejected: list[str] = []
        self.repaired: list[EventDescriptor] = []
        """What repair reported it brought in (the core pushes these down its tree)."""
        self.timers: list[tuple[float, Any]] = []
        self.busy = 0.0
        verify = kw.pop("verify", None) or _verifier()
        since = kw.pop("since", None)
        self.bf = Backfill(self.store.get, verify, **kw)
        net.run(self, self.bf.open(TID, net.now, since=since))

    def has(self, events: Any) -> None:
        for event in events:
            self.store[event.cid] = event.block


class Net:
    """Runs outputs to completion: sends go to the target core (through the wire codec),
    fetches to a shared DHT dictionary, timers wait for :meth:`advance`."""

    def __init__(self) -> None:
        self.nodes: dict[PeerId, Node] = {}
        self.dht: dict[CID, bytes] = {}
        self.now = 0.0
        self.max_held = 0
        self.sent: list[tuple[PeerId, PeerId, Any]] = []

    def add(self, peer: PeerId, **kw: Any) -> Node:
        node = self.nodes[peer] = Node(self, peer, **kw)
        return node

    def call(self, node: Node, fn: Callable[..., list[Any]], *args: Any) -> None:
        self.run(node, self._timed(node, fn, *args))

    def _timed(self, node: Node, fn: Callable[..., list[Any]], *args: Any) -> list[Any]:
        start = time.perf_counter()
        out = fn(*args) + node.bf.arm_tick()  # as the core does after every input
        node.busy += time.perf_counter() - start
        return out

    def run(self, node: Node, outputs: list[Any]) -> None:
        queue = deque((node, o) for o in [*outputs, *node.bf.arm_tick()])
        while queue:
            at, out = queue.popleft()
            self.max_held = max(self.max_held, at.bf.metrics["held"])
            result: list[Any] = []
            if isinstance(out, ev.Send):
                target = self.nodes[out.peer]
                message = decode_message(encode_message(out.message))
                self.sent.append((at.peer, out.peer, message))
                handlers: dict[type, Callable[..., list[Any]]] = {
                    Want: target.bf.on_want,
                    Blocks: target.bf.on_blocks,
                    Heads: target.bf.on_heads,
                    HeadsDigest: target.bf.on_digest,
                }
                handler = handlers[type(message)]
                result = self._timed(target, handler, at.peer, message, self.now)
                at = target
            elif isinstance(out, ev.Fetch):
                block = self.dht.get(out.cid)
                result = self._timed(at, at.bf.on_fetched, out.cid, block, self.now)
            elif isinstance(out, ev.StoreLocal):
                at.store[out.cid] = out.block
            elif isinstance(out, ev.Deliver):
                at.delivered.append(out.event)
            elif isinstance(out, ev.SetTimer):
                at.timers.append((self.now + out.delay, out.timer))
            elif isinstance(out, GapReported):
                at.reports.append(out)
            elif isinstance(out, ev.Rejected):
                at.rejected.append(out.reason)
            elif isinstance(out, Repaired):
                at.repaired.append(out.event)
            else:
                raise AssertionError(f"unexpected output {out!r}")
            queue.extend((at, o) for o in result)

    def advance(self, until: float) -> None:
        """Fire every timer due by ``until``, in time order."""
        while True:
            due = [
                (when, index, node)
                for node in self.nodes.values()
                for index, (when, _) in enumerate(node.timers)
                if when <= until
            ]
            if not due:
                break
            when, index, node = min(due, key=lambda d: d[0])
            _, timer = node.timers.pop(index)
            self.now = when
            self.call(node, node.bf.on_timer, timer, when)
        self.now = until


# --------------------------------------------------------------------------- exact outputs


def test_in_order_arrival_delivers_immediately() -> None:
    e0, e1, e2 = _chain(3)
    core = _core()
    assert core.accepted(TID, e0, 1, PEER, 0.0) == [ev.Deliver(TID, e0, 1)]
    assert core.accepted(TID, e1, 2, PEER, 0.1) == [ev.Deliver(TID, e1, 2)]
    assert core.accepted(TID, e2, 1, None, 0.2) == [ev.Deliver(TID, e2, 1)]
    assert core.accepted(TID, e1, 3, PEER2, 0.3) == []  # a second copy
    assert core.heads(TID) == [e2.cid]
    assert core.metrics["delivered"] == 3 and core.metrics["duplicates"] == 1
    assert core.metrics["gaps_open"] == 0 and core.metrics["held"] == 0


def test_missing_parent_sends_exactly_one_want_and_delivers_nothing() -> None:
    e0, e1, e2, e3, e4 = _chain(5)
    core = _core()
    core.accepted(TID, e0, 1, PEER, 0.0)
    out = core.accepted(TID, e3, 1, PEER, 1.0)
    assert out == [
        ev.SetTimer(5.0, GapTimeout(TID, 0, 1)),
        ev.Send(PEER, Want(TID, e2.cid, 512, (e0.cid,), None)),
        ev.SetTimer(2.0, WantTimeout(TID, 0, PEER, e2.cid)),
    ]
    # A descendant of the held event, from anyone: held too, and no second request.
    assert core.accepted(TID, e4, 2, PEER2, 1.1) == []
    assert core.held(TID) == 2 and core.missing(TID) == [e2.cid]

    # The answer, newest first: ancestors, then the held events, in causal order, once.
    answer = Blocks(TID, e2.cid, (e2.block, e1.block, e0.block))
    out = core.on_blocks(PEER, answer, 1.2)
    assert out == [
        ev.StoreLocal(e2.cid, e2.block),
        ev.StoreLocal(e1.cid, e1.block),
        ev.Deliver(TID, e1, REPAIR_HOP),
        ev.Deliver(TID, e2, REPAIR_HOP),
        ev.Deliver(TID, e3, 1),
        ev.Deliver(TID, e4, 2),
        # New to this node: the core pushes them down its tree (children missed them too).
        Repaired(TID, e2),
        Repaired(TID, e1),
    ]
    assert core.held(TID) == 0 and core.missing(TID) == []
    assert core.heads(TID) == [e4.cid]
    assert core.metrics["backfilled"] == 2 and core.metrics["wants_sent"] == 1
    # The timers of the closed gap are no-ops now; a repeated answer changes nothing.
    assert core.on_timer(GapTimeout(TID, 0, 1), 6.0) == []
    assert core.on_timer(WantTimeout(TID, 0, PEER, e2.cid), 3.0) == []
    assert core.on_blocks(PEER, answer, 1.3) == []


def test_concurrent_held_events_come_out_in_order_key_order() -> None:
    (root,) = _chain(1)
    (x,) = _chain(1, parent=root.cid, start=T0 + 10, tag="x")
    # Two children of the missing x, the later-created one arriving first.
    (late,) = _chain(1, parent=x.cid, start=T0 + 30, tag="late")
    (early,) = _chain(1, parent=x.cid, start=T0 + 20, tag="early")
    (grandchild,) = _chain(1, parent=late.cid, start=T0 + 25, tag="g")
    core = _core()
    core.accepted(TID, root, 1, PEER, 0.0)
    core.accepted(TID, grandchild, 1, PEER, 0.0)  # its parent `late` is missing too
    core.accepted(TID, late, 1, PEER, 0.0)  # fills that frontier, moves it back to x
    core.accepted(TID, early, 1, PEER, 0.0)
    assert core.missing(TID) == [x.cid]
    out = core.on_blocks(PEER, Blocks(TID, late.cid, ()), 0.5)  # the first WANT: nothing
    assert out == [ev.Send(PEER, Want(TID, x.cid, 512, (root.cid,), None)), out[1]]
    out = core.on_blocks(PEER, Blocks(TID, x.cid, (x.block,)), 0.6)
    assert _delivered(out) == [x, early, late, grandchild]
    assert sorted(core.heads(TID), key=bytes) == sorted([early.cid, grandchild.cid], key=bytes)


def test_no_sender_goes_to_the_dht_and_the_local_store_comes_first() -> None:
    chain = _chain(5)
    store = {chain[3].cid: chain[3].block, chain[2].cid: chain[2].block}  # not 1
    core = _core(store)
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    out = core.accepted(TID, chain[4], 0, None, 1.0)
    assert out == [ev.SetTimer(5.0, GapTimeout(TID, 0, 1)), ev.Fetch(chain[1].cid)]
    assert core.metrics["found_locally"] == 2 and core.fetching(chain[1].cid)
    out = core.on_fetched(chain[1].cid, chain[1].block, 1.5)
    assert out[0] == ev.StoreLocal(chain[1].cid, chain[1].block)
    assert _delivered(out) == chain[1:]


def test_want_and_peer_failures_fall_back_to_the_dht() -> None:
    chain = _chain(4)
    core = _core()
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    core.accepted(TID, chain[3], 1, PEER, 0.0)
    assert core.on_timer(WantTimeout(TID, 0, PEER, chain[2].cid), 2.0) == [ev.Fetch(chain[2].cid)]
    assert core.metrics["want_timeouts"] == 1
    (other,) = _chain(1, parent=chain[0].cid, start=T0 + 50, tag="o")
    (child,) = _chain(1, parent=other.cid, start=T0 + 51, tag="c")
    out = core.accepted(TID, child, 1, PEER2, 2.0)
    assert ev.Send(PEER2, Want(TID, other.cid, 512, (chain[0].cid,), None)) in out
    assert core.peer_down(PEER2, 2.5) == [ev.Fetch(other.cid)]


def test_fetch_misses_retry_then_stall_until_the_gap_timeout() -> None:
    chain = _chain(3)
    core = _core(config=BackfillConfig(fetch_retries=1, fetch_retry_delay=0.5))
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    assert core.accepted(TID, chain[2], 1, None, 0.0)[1:] == [ev.Fetch(chain[1].cid)]
    assert core.on_fetched(chain[1].cid, None, 0.1) == [ev.SetTimer(0.5, RetryFetch(TID, 0))]
    assert core.on_timer(RetryFetch(TID, 0), 0.6) == [ev.Fetch(chain[1].cid)]
    # A block that does not hash to the CID asked for counts as a miss.
    assert core.on_fetched(chain[1].cid, chain[0].block, 0.7) == []
    out = core.on_timer(GapTimeout(TID, 0, 1), 5.0)
    assert out == [
        ev.Deliver(TID, chain[2], 1),
        GapReported(TID, chain[1].cid, 0.0, 1, "timeout"),
        ev.SetTimer(30.0, RetryLost(TID, chain[1].cid)),  # asked for again later
    ]
    assert core.missing(TID) == [] and core.metrics["gaps_reported"] == 1


def test_an_event_given_up_on_is_asked_for_again_with_back_off_until_it_comes() -> None:
    """A gap that timed out released what waited behind it; its missing event is not a
    head, so no HEADS will ever name it. It is asked for again 30 s, 60 s, 120 s ...
    later (a partition may have healed), from a tree neighbour, and delivered when it
    comes; after ``lost_retries`` attempts it is left alone."""
    chain = _chain(3)
    core = _core(neighbours=lambda topic: [PEER2],
                 config=BackfillConfig(fetch_retries=0, lost_retries=2))
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    core.accepted(TID, chain[2], 1, None, 0.0)
    assert core.on_fetched(chain[1].cid, None, 0.1) == []  # stalled
    out = core.on_timer(GapTimeout(TID, 0, 1), 5.0)
    assert out[-1] == ev.SetTimer(30.0, RetryLost(TID, chain[1].cid))
    # The first retry: a WANT to the neighbour; it never answers and the DHT misses.
    out = core.on_timer(RetryLost(TID, chain[1].cid), 35.0)
    (want,) = [o for o in out if isinstance(o, ev.Send)]
    assert want.peer == PEER2 and isinstance(want.message, Want)
    assert want.message.head == chain[1].cid
    assert core.metrics["lost_retried"] == 1
    assert core.peer_down(PEER2, 36.0) == [ev.Fetch(chain[1].cid)]
    assert core.on_fetched(chain[1].cid, None, 36.1) == []
    (gap_timer,) = [o.timer for o in out if isinstance(o, ev.SetTimer)
                    and isinstance(o.timer, GapTimeout)]
    out = core.on_timer(gap_timer, 40.0)
    assert out[-1] == ev.SetTimer(60.0, RetryLost(TID, chain[1].cid))  # twice as long
    # The second retry finds it: delivered late, once; no third retry is armed.
    out = core.on_timer(RetryLost(TID, chain[1].cid), 100.0)
    (want,) = [o for o in out if isinstance(o, ev.Send)]
    out = core.on_blocks(PEER2, Blocks(TID, chain[1].cid, (chain[1].block,)), 100.5)
    assert _delivered(out) == [chain[1]]
    assert core.on_timer(RetryLost(TID, chain[1].cid), 300.0) == []


def test_gap_timeout_reports_releases_and_a_late_ancestor_is_delivered_once() -> None:
    e0, e1, e2, e3 = _chain(4)
    core = _core()
    core.accepted(TID, e0, 1, PEER, 0.0)
    core.accepted(TID, e2, 1, PEER, 0.0)
    core.accepted(TID, e3, 2, PEER, 0.1)
    assert core.on_timer(WantTimeout(TID, 0, PEER, e1.cid), 2.0) == [ev.Fetch(e1.cid)]
    assert core.on_fetched(e1.cid, None, 2.1) == [ev.SetTimer(0.5, RetryFetch(TID, 0))]
    # The gap timeout: reported, the held events delivered; the retry still runs.
    out = core.on_timer(GapTimeout(TID, 0, 1), 5.0)
    assert out == [
        ev.Deliver(TID, e2, 1),
        ev.Deliver(TID, e3, 2),
        GapReported(TID, e1.cid, 0.0, 2, "timeout"),
        ev.SetTimer(5.0, GapTimeout(TID, 0, 2)),
    ]
    assert core.on_timer(GapTimeout(TID, 0, 1), 5.0) == []  # superseded
    assert core.on_timer(RetryFetch(TID, 0), 5.1) == [ev.Fetch(e1.cid)]
    out = core.on_fetched(e1.cid, e1.block, 5.2)
    assert out == [ev.StoreLocal(e1.cid, e1.block), ev.Deliver(TID, e1, REPAIR_HOP),
                   Repaired(TID, e1)]
    assert core.heads(TID) == [e3.cid]  # the late ancestor has children: not a head
    assert core.metrics["delivered"] == 4 and core.metrics["gaps_open"] == 0


def test_a_gap_whose_dht_get_is_in_flight_waits_once_more_before_it_releases() -> None:
    """The gap timeout comes while the DHT is still being asked: the answer may be due
    (a lookup round whose datagrams were all lost costs the DHT's RPC timeout), so the
    held events wait ``dht_patience`` once more; then the timeout releases them as usual."""
    e0, e1, e2 = _chain(3)
    core = _core(config=BackfillConfig(dht_patience=4.0))
    core.accepted(TID, e0, 1, PEER, 0.0)
    assert core.accepted(TID, e2, 1, None, 0.0)[1:] == [ev.Fetch(e1.cid)]
    assert core.on_timer(GapTimeout(TID, 0, 1), 5.0) == [ev.SetTimer(4.0, GapTimeout(TID, 0, 2))]
    # The answer comes in that time: delivered in order, nothing reported.
    out = core.on_fetched(e1.cid, e1.block, 7.0)
    assert _delivered(out) == [e1, e2] and core.metrics["gaps_reported"] == 0
    # Once only: a second timeout with the get still in flight releases.
    (f1,) = _chain(1, parent=e2.cid, start=T0 + 20, tag="f")
    (f2,) = _chain(1, parent=f1.cid, start=T0 + 21, tag="g")
    assert core.accepted(TID, f2, 1, None, 8.0)[1:] == [ev.Fetch(f1.cid)]
    assert core.on_timer(GapTimeout(TID, 1, 1), 13.0) == [ev.SetTimer(4.0, GapTimeout(TID, 1, 2))]
    out = core.on_timer(GapTimeout(TID, 1, 2), 17.0)
    assert _delivered(out) == [f2]
    (report,) = [o for o in out if isinstance(o, GapReported)]
    assert report.reason == "timeout"


def test_forged_and_tampered_blocks_are_rejected_and_never_delivered() -> None:
    topic = _topic(allowed_publishers=[])  # only the author may publish
    e0, e1 = _chain(2, topic=topic.cid)
    forged = EventDescriptor.create(MALLORY, topic.cid, b"spam", parent=e0.cid, now=T0 + 5)
    child = EventDescriptor.create(AUTHOR, topic.cid, b"x", parent=forged.cid, now=T0 + 6)
    (e2,) = _chain(1, parent=e1.cid, start=T0 + 7, topic=topic.cid, tag="n")
    store: dict[CID, bytes] = {}
    core = Backfill(store.get, _verifier(topic))
    core.open(topic.cid, 0.0)
    core.accepted(topic.cid, e0, 1, PEER, 0.0)

    # A tampered copy of e1 hashes to another CID: it is not what we asked for.
    wire = decode(e1.block)
    wire["payload"] = b"tampered"
    tampered = encode_reference_free(wire)
    core.accepted(topic.cid, e2, 1, PEER, 0.0)
    out = core.on_blocks(PEER, Blocks(topic.cid, e1.cid, (tampered,)), 0.1)
    assert out == [ev.Fetch(e1.cid)]

    # A genuinely signed event its publisher had no right to: the verify callback refuses
    # it, the gap can never be filled, so it is dropped and its descendant delivered.
    core.accepted(topic.cid, child, 1, PEER2, 0.2)
    out = core.on_blocks(PEER2, Blocks(topic.cid, forged.cid, (forged.block,)), 0.3)
    assert [type(o) for o in out] == [ev.Rejected, ev.Deliver, GapReported]
    assert out[0].peer == PEER2
    assert out[1] == ev.Deliver(topic.cid, child, 1)
    assert out[2] == GapReported(topic.cid, forged.cid, 0.2, 1, "invalid")
    assert not core.known(topic.cid, forged.cid)
    # Its CID is not asked for again when a neighbour advertises it.
    assert core.on_heads(PEER, Heads(topic.cid, (forged.cid,)), 10.0) == []
    assert core.metrics["rejected"] == 1

    out = core.on_fetched(e1.cid, e1.block, 0.4)
    assert _delivered(out) == [e1, e2]


def test_a_dht_block_that_fails_verification_drops_the_gap() -> None:
    topic = _topic(allowed_publishers=[])
    forged = EventDescriptor.create(MALLORY, topic.cid, b"spam", now=T0 + 5)
    child = EventDescriptor.create(AUTHOR, topic.cid, b"x", parent=forged.cid, now=T0 + 6)
    store: dict[CID, bytes] = {}
    core = Backfill(store.get, _verifier(topic))
    core.open(topic.cid, 0.0)
    assert core.accepted(topic.cid, child, 0, None, 1.0)[1:] == [ev.Fetch(forged.cid)]
    out = core.on_fetched(forged.cid, forged.block, 1.5)
    assert [type(o) for o in out] == [ev.Rejected, ev.Deliver, GapReported]
    assert out[0].peer is None and out[2].reason == "invalid"
    assert core.missing(topic.cid) == [] and core.metrics["gaps_open"] == 0


def test_a_batch_that_runs_into_another_gap_feeds_it() -> None:
    chain = _chain(7)
    cids = [e.cid for e in chain]
    core = _core()
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    out = core.on_heads(PEER2, Heads(TID, (cids[3],)), 0.0)  # gap B: 3, asked of PEER2
    assert ev.Send(PEER2, Want(TID, cids[3], 512, (cids[0],), None)) in out
    core.accepted(TID, chain[6], 1, PEER, 1.0)  # gap A: 5, asked of PEER
    batch = tuple(chain[i].block for i in (5, 4, 3, 2))
    out = core.on_blocks(PEER, Blocks(TID, cids[5], batch), 1.1)
    # A met B's frontier and closed; the same batch then moved B back to 1.
    assert _delivered(out) == [] and core.missing(TID) == [cids[1]]
    assert core.metrics["gaps_open"] == 1 and core.metrics["backfilled"] == 4
    # B's own (late) answer: it moved since it asked, so it asks the same peer again.
    late = Blocks(TID, cids[3], tuple(chain[i].block for i in (3, 2, 1)))
    out = core.on_blocks(PEER2, late, 1.2)
    assert out == [
        ev.Send(PEER2, Want(TID, cids[1], 512, (cids[0],), None)),
        ev.SetTimer(2.0, WantTimeout(TID, 0, PEER2, cids[1])),
    ]
    out = core.on_blocks(PEER2, Blocks(TID, cids[1], (chain[1].block,)), 1.3)
    assert _delivered(out) == chain[1:]


def test_heads_in_the_delivery_log_are_not_fetched() -> None:
    (old,) = _chain(1)
    core = _core(is_delivered=lambda topic, cid: cid == old.cid)
    assert core.on_heads(PEER, Heads(TID, (old.cid,)), 0.0) == []
    assert core.known(TID, old.cid) and core.metrics["heads_unknown"] == 0


def test_gaps_meeting_on_one_chain_merge_and_deliver_in_order() -> None:
    chain = _chain(6)
    core = _core()
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    core.accepted(TID, chain[5], 1, PEER, 0.0)  # gap A: frontier 4, asked of PEER
    core.accepted(TID, chain[2], 1, PEER2, 1.0)  # gap B: frontier 1, asked of PEER2
    assert core.metrics["gaps_open"] == 2
    out = core.on_blocks(PEER, Blocks(TID, chain[4].cid, (chain[4].block, chain[3].block)), 1.1)
    # A's chain reached the held event 2: A closes, B keeps the earlier deadline.
    assert _delivered(out) == [] and core.metrics["gaps_open"] == 1
    assert out[-3:] == [ev.SetTimer(3.9, GapTimeout(TID, 1, 2)),
                        Repaired(TID, chain[4]), Repaired(TID, chain[3])]
    out = core.on_blocks(PEER2, Blocks(TID, chain[1].cid, (chain[1].block,)), 1.2)
    assert _delivered(out) == chain[1:]


def test_relay_orders_and_tracks_heads_without_delivering() -> None:
    chain = _chain(3)
    store: dict[CID, bytes] = {e.cid: e.block for e in chain}  # a relay keeps the blocks
    core = Backfill(store.get, _verifier())
    core.open(TID, 0.0, deliver=False)
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    out = core.accepted(TID, chain[2], 1, PEER, 0.0)
    out += core.on_blocks(PEER, Blocks(TID, chain[1].cid, (chain[1].block,)), 0.1)
    assert _delivered(out) == [] and core.heads(TID) == [chain[2].cid]
    assert core.metrics["delivered"] == 0
    # The relay subscribes with replay: what it only relayed is now delivered, from its
    # own store, in order — and the next event after it.
    found = core.metrics["found_locally"]
    out = core.open(TID, 0.2, deliver=True, since=None)
    assert _delivered(out) == chain
    assert core.metrics["found_locally"] == found + 3
    nxt = _chain(1, parent=chain[2].cid, start=T0 + 9)[0]
    assert _delivered(core.accepted(TID, nxt, 1, PEER, 0.3)) == [nxt]


# --------------------------------------------------------------------------- answering WANTs


def test_want_answer_is_newest_first_bounded_and_stops_at_the_first_missing() -> None:
    chain = _chain(10)
    store = {e.cid: e.block for e in chain if e is not chain[4]}
    core = _core(store)

    def answer(want: Want, **kw: Any) -> tuple[bytes, ...]:
        responder = Backfill(store.get, _verifier(), config=BackfillConfig(**kw))
        (out,) = responder.on_want(PEER, want, 0.0)
        assert out.peer == PEER and out.message.head == want.head
        return tuple(out.message.blocks)

    blocks = [e.block for e in reversed(chain)]
    assert answer(Want(TID, chain[9].cid, 3)) == tuple(blocks[:3])
    assert answer(Want(TID, chain[9].cid, 10)) == tuple(blocks[:5])  # 9..5, 4 is missing
    assert answer(Want(TID, chain[3].cid, 10)) == tuple(blocks[6:])  # 3..0: the root ends it
    assert answer(Want(TID, chain[4].cid, 10)) == ()
    assert answer(Want(TID, chain[9].cid, 10, (chain[6].cid,))) == tuple(blocks[:3])
    after = chain[7].created  # include the first block older than the horizon, then stop
    assert answer(Want(TID, chain[9].cid, 10, (), after)) == tuple(blocks[:4])
    assert answer(Want(TID, chain[9].cid, 10), answer_limit=2) == tuple(blocks[:2])
    budget = BackfillConfig(answer_bytes=MAX_BLOCK)
    responder = Backfill(store.get, _verifier(), config=budget)
    store.update({e.cid: e.block for e in _long_chain(60)})
    long = list(reversed(_long_chain(60)))
    (out,) = responder.on_want(PEER, Want(TID, long[0].cid, 60), 0.0)
    assert sum(len(b) for b in out.message.blocks) <= MAX_BLOCK
    assert out.message.blocks == tuple(e.block for e in long[: len(out.message.blocks)])
    assert len(out.message.blocks) < 60 and responder.metrics["wants_answered"] == 1
    # A non-event block (a topic descriptor) ends the walk too.
    store[TOPIC.cid] = TOPIC.block
    (out,) = core.on_want(PEER, Want(TID, TOPIC.cid, 10), 0.0)
    assert out.message.blocks == ()


def test_restart_resumes_from_the_stored_heads() -> None:
    chain = _chain(9)
    net = Net()
    source = net.add(PEER)
    source.has(chain)
    me = net.add(PEER2)
    me.bf = Backfill(me.store.get, _verifier())  # back from a restart: memory is empty
    me.bf.open(TID, 0.0, heads=[chain[5].cid])  # but the store kept the heads
    net.call(me, me.bf.accepted, TID, chain[8], 1, PEER, 0.0)
    wants = [m for _, _, m in net.sent if isinstance(m, Want)]
    assert wants == [Want(TID, chain[7].cid, 512, (chain[5].cid,), None)]
    answers = [m for _, _, m in net.sent if isinstance(m, Blocks)]
    assert answers[0].blocks == (chain[7].block, chain[6].block)  # stops before our head
    assert me.delivered == chain[6:]


def test_a_restarted_node_does_not_deliver_again_what_its_log_holds() -> None:
    """After a restart only the heads are remembered in memory; a neighbour that sends an
    older event again (its copy crossed the crash) must not make the application see it
    twice: a restored topic asks the durable log first. A fresh one never has to."""
    chain = _chain(4)
    logged = {e.cid for e in chain[:3]}
    core = _core(is_delivered=lambda topic, cid: cid in logged, heads=[chain[2].cid])
    assert core.accepted(TID, chain[1], 1, PEER, 0.0) == []
    assert core.metrics["duplicates"] == 1
    assert core.accepted(TID, chain[3], 1, PEER, 0.0) == [ev.Deliver(TID, chain[3], 1)]
    fresh = _core(is_delivered=lambda topic, cid: cid in logged)
    assert fresh.accepted(TID, chain[0], 1, PEER, 0.0) == [ev.Deliver(TID, chain[0], 1)]


def test_settled_memory_is_bounded_and_the_delivery_log_is_asked() -> None:
    chain = _chain(10)
    asked: list[tuple[CID, CID]] = []

    def in_log(topic: CID, cid: CID) -> bool:
        asked.append((topic, cid))
        return cid in {e.cid for e in chain}

    core = _core(is_delivered=in_log, config=BackfillConfig(settled_limit=3))
    for event in chain:
        core.accepted(TID, event, 1, PEER, 0.0)
    assert asked == [] and not core.known(TID, chain[2].cid)
    (fork,) = _chain(1, parent=chain[2].cid, start=T0 + 100, tag="f")
    assert core.accepted(TID, fork, 1, PEER, 0.0) == [ev.Deliver(TID, fork, 1)]
    assert asked == [(TID, chain[2].cid)]


def test_a_fresh_subscription_stops_backfill_at_its_horizon() -> None:
    chain = _chain(6, start=T0, step=100.0)  # created T0, T0+100, ...
    net = Net()
    source = net.add(PEER)
    source.has(chain)
    me = net.add(PEER2, since=T0 + 330)  # horizon = T0 + 270 (60 s of slack)
    net.call(me, me.bf.accepted, TID, chain[4], 1, PEER, 0.0)
    want, lookahead = [m for _, _, m in net.sent if isinstance(m, Want)]
    assert want.after == iso_timestamp(T0 + 270)
    answer, last = [m for _, _, m in net.sent if isinstance(m, Blocks)]
    assert answer.blocks == (chain[3].block, chain[2].block)  # 2 is older than the horizon
    # One block more: 2's parent, older than the horizon too, confirms that the chain is
    # history (one event alone could be a publisher's clock gone back: test_horizon_skew).
    assert lookahead == Want(TID, chain[1].cid, 1, (), None)  # nothing delivered yet
    assert last.blocks == (chain[1].block,)
    assert me.delivered == [chain[3], chain[4]]
    assert me.bf.known(TID, chain[2].cid) and me.bf.known(TID, chain[1].cid)
    assert me.bf.heads(TID) == [chain[4].cid]


# --------------------------------------------------------------------------- networks


def test_ten_thousand_event_gap_closes_with_want_batches_and_dht_fetches() -> None:
    chain = _long_chain(10_001)
    for label, verify in (
        ("verify callback parsing and checking signatures", _verifier()),
        ("pre-verified blocks (the backfill core alone)", _preverified(chain)),
    ):
        net = Net()
        net.dht.update({e.cid: e.block for e in chain})
        source = net.add(PEER)
        source.has(chain[5000:])  # the sender has the newest half only
        me = net.add(PEER2, verify=verify)
        net.call(me, me.bf.accepted, TID, chain[0], 1, PEER, 0.0)
        me.busy = 0.0
        net.call(me, me.bf.accepted, TID, chain[-1], 1, PEER, 0.0)

        assert me.delivered[0] is chain[0] and len(me.delivered) == 10_001
        assert [e.cid for e in me.delivered] == [e.cid for e in chain]
        metrics = me.bf.metrics
        assert metrics["wants_sent"] == 11  # ten batches of <= 512, one empty answer
        assert metrics["fetches"] == 4999  # the rest, one block at a time from the DHT
        assert metrics["backfilled"] == 9999 and metrics["held"] == 0
        assert metrics["gaps_open"] == 0 and metrics["gaps_reported"] == 0
        assert me.reports == [] and me.rejected == []
        assert me.bf.heads(TID) == [chain[-1].cid]
        assert net.max_held == 9_999  # the first event and the chain above the last gap
        rate = 10_000 / me.busy
        print(f"\nbackfill_events_per_s, {label}: {rate:,.0f} ({me.busy * 1000:.0f} ms)")
    # The core alone must leave most of the 5,000/s end-to-end budget to signature checks
    # and I/O; typically ~40,000/s here, asserted loosely so a busy machine does not fail.
    assert rate > 10_000


def _preverified(chain: tuple[EventDescriptor, ...]) -> Verify:
    by_block = {e.block: e for e in chain}
    return lambda tree, block: by_block.get(block) if tree == TID else None


def test_heads_exchange_finds_a_branch_nobody_forwarded() -> None:
    # Two publishers both saw e0 and, LAST_SEEN, both linked it: the DAG forks.
    (e0,) = _chain(1)
    (a1,) = _chain(1, parent=e0.cid, start=T0 + 10, tag="a")
    (b1,) = _chain(1, parent=e0.cid, start=T0 + 11, publisher=OTHER, tag="b")
    (b2,) = _chain(1, parent=b1.cid, start=T0 + 12, publisher=OTHER, tag="b2")
    net = Net()
    slow = BackfillConfig(heads_refresh=5)  # refreshes after 5, 10, 20 ... 160 quiet ticks
    m = net.add(PEER, neighbours=lambda topic: [PEER2], config=slow)
    n = net.add(PEER2, neighbours=lambda topic: [PEER], config=slow)
    for event in (e0, a1, b1, b2):
        net.run(m, m.bf.accepted(TID, event, 1, None, 0.0))
        m.has([event])
    for event in (e0, a1):  # the b branch never reached n
        net.run(n, n.bf.accepted(TID, event, 1, None, 0.0))
        n.has([event])
    assert [type(timer) for _, timer in n.timers] == [HeadsTick]  # one for the node
    assert [when for when, _ in n.timers] == [0.1]  # prompt: the topic just woke up
    assert m.bf.heads(TID) == [a1.cid, b2.cid] and n.bf.heads(TID) == [a1.cid]

    net.advance(2.0)  # one heads tick on each side
    heads = [(src, msg) for src, _, msg in net.sent if isinstance(msg, Heads)]
    assert (PEER, Heads(TID, (a1.cid, b2.cid))) in heads
    wants = [msg for _, _, msg in net.sent if isinstance(msg, Want)]
    # ``have``: n's head, then what it delivered lately: e0, no longer a head, is where
    # the b branch hangs off, so the answer stops there instead of sending e0 again.
    assert wants == [Want(TID, b2.cid, 512, (a1.cid, e0.cid), None)]
    blocks = [msg for _, _, msg in net.sent if isinstance(msg, Blocks)]
    assert [len(b.blocks) for b in blocks] == [2]
    assert n.delivered == [e0, a1, b1, b2]
    assert sorted(n.bf.heads(TID), key=bytes) == sorted([a1.cid, b2.cid], key=bytes)

    sent = len(net.sent)
    net.advance(4.0)  # nothing changed since: no heads are resent, nothing is fetched
    assert net.sent[sent:] == []
    net.advance(14.0)  # after 5 quiet ticks, heads go once more to everyone; nothing to fetch
    refreshed = net.sent[sent:]
    # Each was sent or told of every head (the HEADS above told), so the round is the
    # digest; m's comes first and matches, so n, which now knows they agree, sends none.
    assert {(src, type(msg)) for src, _, msg in refreshed} == {(PEER, HeadsDigest)}
    assert n.bf.metrics["digests_spared"] == 1
    assert n.bf.metrics["heads_unknown"] == 1 and m.bf.metrics["heads_unknown"] == 0
    # Again after 10, 20, 40, 80 and 160 quiet ticks (a lost refresh is covered by the next)...
    net.advance(400.0)
    refreshes = [src for src, _, msg in net.sent[sent:] if isinstance(msg, HeadsDigest)]
    assert refreshes.count(PEER) == 6 and refreshes.count(PEER2) == 0
    assert not [msg for _, _, msg in net.sent[sent:] if isinstance(msg, Heads)]
    # ...then the topic is idle: no timer armed, nothing sent however long nothing happens.
    assert n.timers == [] and m.timers == []
    total = len(net.sent)
    net.advance(4000.0)
    assert len(net.sent) == total


def test_a_merged_tip_nobody_forwarded_is_fetched_and_stops_being_a_head() -> None:
    # The DAG forked at e0 (a1 and b1). The next event, c2, links a1 as parent and b1 as
    # a merge. n never got b1 and no neighbour names it as a head any more (c2 replaced
    # both): only the merge link tells n that b1 exists.
    (e0,) = _chain(1)
    (a1,) = _chain(1, parent=e0.cid, start=T0 + 10, tag="a")
    (b1,) = _chain(1, parent=e0.cid, start=T0 + 11, publisher=OTHER, tag="b")
    c2 = EventDescriptor.create(AUTHOR, TID, b"c2", parent=a1.cid, merges=(b1.cid,),
                                now=T0 + 12)
    net = Net()
    net.dht.update({e.cid: e.block for e in (e0, a1, b1, c2)})
    n = net.add(PEER, neighbours=lambda topic: [])
    for event in (e0, a1, c2):
        net.run(n, n.bf.accepted(TID, event, 1, None, 0.0))
        n.has([event])
    # c2 is not held for its merge (order follows parents); b1 is fetched from the DHT
    # (no neighbour to ask, no RTT measured: no reorder wait) and delivered after it.
    assert n.delivered == [e0, a1, c2, b1]
    assert n.bf.metrics["merges_followed"] == 1
    assert n.bf.heads(TID) == [c2.cid]  # b1 arrived after c2 merged it: not a head
    assert n.bf.missing(TID) == []


def test_a_restart_fetches_the_merged_tips_it_never_got() -> None:
    """c2 merged b1 and was delivered; the fetch of b1 died with the process. After the
    restart nothing names b1 (it is nobody's head): the restored subscription reads back
    from its heads and asks for it, and only for it."""
    (e0,) = _chain(1)
    (a1,) = _chain(1, parent=e0.cid, start=T0 + 10, tag="a")
    (b1,) = _chain(1, parent=e0.cid, start=T0 + 11, publisher=OTHER, tag="b")
    c2 = EventDescriptor.create(AUTHOR, TID, b"c2", parent=a1.cid, merges=(b1.cid,),
                                now=T0 + 12)
    (d3,) = _chain(1, parent=c2.cid, start=T0 + 13, tag="d")
    store = {e.cid: e.block for e in (e0, a1, c2, d3)}
    log = {e0.cid, a1.cid, c2.cid, d3.cid}
    core = Backfill(store.get, _verifier(), is_delivered=lambda topic, cid: cid in log)
    out = core.open(TID, 0.0, heads=[d3.cid])
    assert [o.cid for o in out if isinstance(o, ev.Fetch)] == [b1.cid]
    assert _delivered(core.on_fetched(b1.cid, b1.block, 0.1)) == [b1]
    # Nothing missing: a restart asks for nothing.
    log.add(b1.cid)
    store[b1.cid] = b1.block
    again = Backfill(store.get, _verifier(), is_delivered=lambda topic, cid: cid in log)
    assert not [o for o in again.open(TID, 0.0, heads=[d3.cid]) if isinstance(o, ev.Fetch)]


def test_merged_tips_are_no_longer_heads() -> None:
    (e0,) = _chain(1)
    (a1,) = _chain(1, parent=e0.cid, start=T0 + 10, tag="a")
    (b1,) = _chain(1, parent=e0.cid, start=T0 + 11, publisher=OTHER, tag="b")
    core = _core()
    for event in (e0, a1, b1):
        core.accepted(TID, event, 1, PEER, 0.0)
    assert core.heads(TID) == [a1.cid, b1.cid]
    c2 = EventDescriptor.create(AUTHOR, TID, b"c2", parent=b1.cid, merges=(a1.cid,),
                                now=T0 + 12)
    assert _delivered(core.accepted(TID, c2, 1, PEER, 0.0)) == [c2]
    assert core.heads(TID) == [c2.cid]
    assert core.metrics["merges_followed"] == 0  # a1 was delivered: nothing to fetch


# --------------------------------------------------------------------------- bounds


def test_max_pending_bounds_held_events_and_every_event_is_delivered_once() -> None:
    chain = _long_chain(41)
    net = Net()
    source = net.add(PEER)
    source.has(chain)
    me = net.add(PEER2, config=BackfillConfig(max_pending=5, want_limit=8))
    net.call(me, me.bf.accepted, TID, chain[0], 1, PEER, 0.0)
    net.call(me, me.bf.accepted, TID, chain[40], 1, PEER, 0.0)
    assert net.max_held <= 5
    assert sorted(bytes(e.cid) for e in me.delivered) == sorted(bytes(e.cid) for e in chain)
    assert len(me.delivered) == len(chain)
    assert me.reports and {r.reason for r in me.reports} == {"overflow"}
    released = sum(r.released for r in me.reports)
    assert released == me.delivered.index(chain[1]) - 1  # all before the final segment


def test_heads_sharing_their_history_bring_each_missing_block_once() -> None:
    """A restarted node told of several heads that share the history it missed asks one
    neighbour one WANT at a time: the first answer brings the shared ancestors, so the
    next WANT (whose ``have`` now names them) brings only its own head. One WANT per
    head at once brought the shared part once per head."""
    trunk = _chain(30)
    tips = [_chain(1, parent=trunk[-1].cid, start=T0 + 40 + i, tag=f"tip{i}")[0]
            for i in range(6)]
    net = Net()
    source = net.add(PEER)
    source.has([*trunk, *tips])
    me = net.add(PEER2)
    net.call(me, me.bf.accepted, TID, trunk[0], 1, PEER, 0.0)
    net.call(me, me.bf.on_heads, PEER, Heads(TID, tuple(t.cid for t in tips)), 1.0)
    net.advance(30.0)
    assert {e.cid for e in me.delivered} == {e.cid for e in [*trunk, *tips]}
    answers = [m for _, _, m in net.sent if isinstance(m, Blocks)]
    assert sum(len(m.blocks) for m in answers) == len(trunk) - 1 + len(tips)  # 35, not 180
    assert len(answers) == len(tips)
    assert not me.reports


def _two_heads_from_peer(
    trunk_length: int,
) -> tuple[Backfill, list[EventDescriptor], EventDescriptor, list[Any]]:
    """A node holding the trunk's first event is told by PEER (JOINED) of two heads it
    lacks: the trunk's last event and the tip of a two-event fork off the first."""
    trunk = _chain(trunk_length)
    (fork,) = _chain(1, parent=trunk[0].cid, start=T0 + 9, tag="fork")
    (tip,) = _chain(1, parent=fork.cid, start=T0 + 10, tag="tip")
    core = _core()
    core.accepted(TID, trunk[0], 1, PEER, 0.0)
    out = core.on_heads(PEER, Joined(TID, (trunk[-1].cid, tip.cid)), 0.0)
    return core, trunk, tip, out


def test_a_gap_parked_behind_a_want_asks_when_that_gap_connects_another_way() -> None:
    """Two heads from one neighbour: the second gap's WANT waits for the first's. When
    the first gap's missing event then comes down the tree (its WANT is moot), the
    second WANT goes at once — found by the simulator: the parked gap waited for an
    answer that was never going to end its wait, and its event was never fetched."""
    core, (_, e1, e2), tip, out = _two_heads_from_peer(3)
    assert [o.message.head for o in out if isinstance(o, ev.Send)] == [e2.cid]
    # e2 comes down the tree; its gap's frontier moves to e1, also delivered that way.
    core.accepted(TID, e2, 1, PEER2, 0.5)
    out = core.accepted(TID, e1, 1, PEER2, 0.6)
    assert [o.event for o in out if isinstance(o, ev.Deliver)] == [e1, e2]
    assert [o.message.head for o in out if isinstance(o, ev.Send)] == [tip.cid]


def test_a_parked_gap_waits_at_most_one_rto_for_the_want_before_it() -> None:
    """A WANT lost on the way must not hold the gaps parked behind it until its own
    timeout: a parked gap asks once the WANT before it is older than the peer's RTO
    (``want_timeout`` / 4 while unmeasured)."""
    core, (_, e1), other, out = _two_heads_from_peer(2)
    assert [o.message.head for o in out if isinstance(o, ev.Send)] == [e1.cid]
    wait = [o for o in out if isinstance(o, ev.SetTimer) and isinstance(o.timer, RetryFetch)]
    assert [o.delay for o in wait] == [0.5]
    out = core.on_timer(wait[0].timer, 0.5)
    assert [o.message.head for o in out if isinstance(o, ev.Send)] == [other.cid]


def _first_want(core: Backfill, out: list[Any], now: float) -> tuple[WantTimeout, float]:
    """Fire the gap's waits (its reorder wait) until its WANT goes: that WANT's timer."""
    while True:
        for o in out:
            if isinstance(o, ev.SetTimer) and isinstance(o.timer, WantTimeout):
                return o.timer, o.delay
        timer = next(o for o in out if isinstance(o, ev.SetTimer)
                     and not isinstance(o.timer, GapTimeout))
        now += timer.delay
        out = core.on_timer(timer.timer, now)


def test_a_want_to_a_slow_peer_is_waited_for_at_most_max_want_timeout() -> None:
    """The WANT wait follows the peer's RTO (two of them), but a path that looks very slow
    — a busy author, or an unmeasured peer given the worst RTO known — does not keep the
    DHT from being asked for more than ``max_want_timeout``."""
    e0, e1, e2 = _chain(3)
    waits = []
    for rtt_s in (1.0, 0.1):  # RTO 3 s: 6 s, cut to 5; RTO 0.3 s: the 2 s floor
        rtt = RttTable()
        rtt.sample(PEER, rtt_s, 0.0)
        core = _core(rtt=rtt)
        core.accepted(TID, e0, 1, PEER, 0.0)
        timer, wait = _first_want(core, core.accepted(TID, e2, 1, PEER, 1.0), 1.0)
        waits.append(wait)
        assert core.on_timer(timer, 10.0) == [ev.Fetch(e1.cid)]  # the missing parent
    assert waits == [5.0, 2.0]


def test_max_gaps_evicts_the_oldest_gap() -> None:
    heads = [_chain(1, start=T0 + i, tag=f"h{i}")[0] for i in range(3)]
    core = _core(config=BackfillConfig(max_gaps=2))
    out = core.on_heads(PEER, Heads(TID, tuple(h.cid for h in heads)), 0.0)
    reports = [o for o in out if isinstance(o, GapReported)]
    assert reports == [GapReported(TID, heads[0].cid, 0.0, 0, "evicted")]
    assert core.missing(TID) == [heads[1].cid, heads[2].cid]
    # The evicted head is not asked for again until retry_heads_after has passed.
    assert core.on_heads(PEER, Heads(TID, (heads[0].cid,)), 1.0) == []
    out = core.on_heads(PEER, Heads(TID, (heads[0].cid,)), 31.0)
    # Evicting heads[1]'s gap ended its WANT: heads[2]'s, parked behind it, goes now,
    # and heads[0]'s waits for that one (one WANT in flight per neighbour and topic).
    wants = [o.message.head for o in out if isinstance(o, ev.Send)]
    assert wants == [heads[2].cid]
    assert heads[0].cid in core.missing(TID)
    timeout = next(o.timer for o in out if isinstance(o, ev.SetTimer)
                   and isinstance(o.timer, WantTimeout))
    out = core.on_timer(timeout, 33.0)
    assert ev.Send(PEER, Want(TID, heads[0].cid, 512, (), None)) in out


def test_close_forgets_the_topic() -> None:
    chain = _chain(3)
    core = _core()
    core.accepted(TID, chain[0], 1, PEER, 0.0)
    core.accepted(TID, chain[2], 1, PEER, 0.0)
    core.close(TID)
    assert core.metrics["held"] == 0 and core.metrics["gaps_open"] == 0
    assert core.on_blocks(PEER, Blocks(TID, chain[1].cid, (chain[1].block,)), 0.1) == []
    assert core.on_timer(HeadsTick(1), 1.0) == []
    with pytest.raises(KeyError):
        core.accepted(TID, chain[1], 1, PEER, 0.2)


# --------------------------------------------------------------------------- wire


def test_repair_messages_round_trip() -> None:
    chain = _chain(2)
    for message in (
        Want(TID, chain[1].cid, 512),
        Want(TID, chain[1].cid, 1024, (chain[0].cid,), iso_timestamp(T0)),
        Blocks(TID, chain[1].cid, (chain[1].block, chain[0].block)),
        Blocks(TID, chain[1].cid, ()),
        Heads(TID, (chain[0].cid, chain[1].cid)),
    ):
        assert decode_message(encode_message(message)) == message


def _bad_cases() -> list[dict[str, Any]]:
    cid = TID
    want = {"t": "want", "topic": cid, "head": cid, "limit": 4, "have": [], "after": None}
    blocks = {"t": "blocks", "topic": cid, "head": cid, "blocks": [b"x"]}
    heads = {"t": "heads", "topic": cid, "heads": [cid]}
    many = [_chain(1, start=T0 + i)[0].cid for i in range(repair_messages.MAX_HEADS + 1)]
    return [
        {**want, "limit": 0},
        {**want, "limit": repair_messages.MAX_WANT_LIMIT + 1},
        {**want, "limit": True},
        {**want, "head": "not a link"},
        {**want, "topic": b"\x01\x02"},
        {**want, "have": many[: repair_messages.MAX_HAVE + 1]},
        {**want, "have": [cid, cid]},
        {**want, "have": cid},
        {**want, "after": "yesterday"},
        {**want, "after": 5},
        {**want, "extra": 1},
        {k: v for k, v in want.items() if k != "after"},
        {**blocks, "blocks": [b"x"] * (repair_messages.MAX_BLOCKS + 1)},
        {**blocks, "blocks": [b"x" * (MAX_BLOCK + 1)]},
        {**blocks, "blocks": [b""]},
        {**blocks, "blocks": ["text"]},
        {**blocks, "blocks": {"a": b"x"}},
        {**blocks, "head": None},
        {**heads, "heads": many},
        {**heads, "heads": [cid, cid]},
        {**heads, "heads": [7]},
        {**heads, "heads": None},
    ]


@pytest.mark.parametrize("wire", _bad_cases(), ids=lambda w: f"{w['t']}")
def test_malformed_repair_messages_raise_message_error(wire: dict[str, Any]) -> None:
    with pytest.raises(MessageError):
        decode_message(encode(wire))


def test_blocks_total_size_is_bounded() -> None:
    wire = {"t": "blocks", "topic": TID, "head": TID, "blocks": [b"x" * MAX_BLOCK] * 129}
    with pytest.raises(MessageError):
        Blocks.from_wire(wire)  # 1,056,768 bytes: more than 1 MiB of blocks
    with pytest.raises(MessageError):
        decode_message(encode(wire))  # and the frame itself is too large


def test_heads_skip_neighbours_that_were_sent_or_told_every_head() -> None:
    """What was forwarded to a neighbour or announced to it is not named to it again in
    HEADS when the heads change; what it was not told of is (and a HEADS tells). Every
    refresh round of a quiet topic reaches everyone: the list where a head is untold, a
    16-byte digest where every head was sent or told (the copy may still have been
    lost)."""
    e0, e1 = _chain(2)
    core = _core(neighbours=lambda topic: [PEER, PEER2])
    core.accepted(TID, e0, 1, PEER, 0.0)
    core.cover(TID, e0.cid, {PEER, PEER2})  # came from PEER, forwarded to PEER2

    def sent(now: float) -> dict[PeerId, type]:
        return {o.peer: type(o.message) for o in core.tick(TID, [PEER, PEER2], now)
                if isinstance(o, ev.Send)}

    assert sent(2.0) == {}  # both have e0: nothing to tell
    assert core.metrics["heads_skipped"] == 2
    # e1 came by repair and went nowhere: PEER2 is told; PEER was told already.
    core.accepted(TID, e1, REPAIR_HOP, None, 3.0)
    core.cover(TID, e1.cid, {PEER})
    assert sent(4.0) == {PEER2: Heads}
    # Refresh rounds 1 and 2: to everyone; both were told of everything (PEER2 by the
    # HEADS just sent), so both get the digest.
    assert sent(6.0) == {PEER: HeadsDigest, PEER2: HeadsDigest}
    assert sent(8.0) == {PEER: HeadsDigest, PEER2: HeadsDigest}
    assert sent(10.0) == {}  # quiet tick 3: no refresh round
    assert sent(12.0) == {PEER: HeadsDigest, PEER2: HeadsDigest}  # 4
    assert core.metrics["digests_sent"] == 6
    # A neighbour told of nothing (a new lazy link, say) gets the list once, then digests.
    newcomer = PeerId(b"\x00\x24\x08\x01\x12\x20" + bytes(range(32)))

    def sent3(now: float) -> dict[PeerId, type]:
        return {o.peer: type(o.message) for o in core.tick(TID, [PEER, PEER2, newcomer], now)
                if isinstance(o, ev.Send)}

    assert sent3(14.0) == {newcomer: Heads}  # quiet tick 5: only the untold newcomer
    assert sent3(16.0) == sent3(18.0) == {}
    assert sent3(20.0) == {PEER: HeadsDigest, PEER2: HeadsDigest, newcomer: HeadsDigest}  # 8


def test_a_digest_that_differs_brings_the_lists_both_ways() -> None:
    """A refresh digest matching the receiver's heads costs nothing more; one that differs
    makes the receiver send its HEADS, and the sender, seeing that they differ from what
    it hashed, sends its own: whichever side lacks a head learns it."""
    e0, e1, e2 = _chain(3)
    mine = _core(neighbours=lambda topic: [PEER])
    theirs = _core(neighbours=lambda topic: [PEER2])
    for core in (mine, theirs):
        core.accepted(TID, e0, 1, PEER, 0.0)
        core.accepted(TID, e1, 1, PEER, 0.0)
    theirs.tick(TID, [PEER2], 0.5)
    theirs.tick(TID, [PEER2], 1.0)  # their heads have been still for a tick
    same = HeadsDigest(TID, heads_digest([e1.cid]))
    assert theirs.on_digest(PEER2, same, 1.0) == []
    assert theirs.metrics["digests_matched"] == 1
    # We move on to e2 (its copy to them was lost); our refresh digest no longer matches.
    mine.accepted(TID, e2, 1, PEER2, 2.0)
    mine.cover(TID, e2.cid, {PEER})
    digest = next(o.message for o in _quiet_refresh(mine, PEER) if o.peer == PEER)
    assert isinstance(digest, HeadsDigest)
    (answer,) = theirs.on_digest(PEER2, digest, 3.0)
    assert isinstance(answer, ev.Send) and answer.message == Heads(TID, (e1.cid,))
    back = mine.on_heads(PEER, answer.message, 3.1)
    assert [o.message for o in back if isinstance(o, ev.Send)] == [Heads(TID, (e2.cid,))]
    wants = theirs.on_heads(PEER2, Heads(TID, (e2.cid,)), 3.2)
    assert any(isinstance(o, ev.SetTimer) or isinstance(getattr(o, "message", None), Want)
               for o in wants)
    assert theirs.metrics["heads_unknown"] == 1  # they now fetch e2


def test_a_differing_digest_while_our_heads_move_is_answered_only_the_second_time() -> None:
    """Heads that changed on our last tick (or since) explain a differing digest best by
    an event still in flight, and our own tick names them: the first such digest from a
    neighbour is let go, its next one is answered whatever our heads do."""
    e0, e1 = _chain(2)
    theirs = _core(neighbours=lambda topic: [PEER2])
    theirs.accepted(TID, e0, 1, PEER, 0.0)
    theirs.accepted(TID, e1, 1, PEER, 0.0)
    stale = HeadsDigest(TID, heads_digest([e0.cid]))
    assert theirs.on_digest(PEER2, stale, 0.5) == []  # moved since the last tick
    assert theirs.metrics["digests_deferred"] == 1
    (answer,) = theirs.on_digest(PEER2, stale, 0.6)
    assert isinstance(answer, ev.Send) and answer.message == Heads(TID, (e1.cid,))
    theirs.tick(TID, [PEER2], 1.0)  # the change is ticked: quiet == 0, still moving
    assert theirs.on_digest(PEER2, stale, 1.5) == []
    theirs.tick(TID, [PEER2], 2.0)  # a quiet tick: a differing digest is answered at once
    (answer,) = theirs.on_digest(PEER2, stale, 2.5)
    assert answer.message == Heads(TID, (e1.cid,))
    assert theirs.metrics["digests_deferred"] == 2


def test_a_neighbour_whose_digest_matched_is_not_sent_ours() -> None:
    """Both ends of a link refresh: when the neighbour's digest of the current heads
    matched ours, our round skips it (one digest per link and round, not two); once our
    heads change, it gets ours again."""
    e0, e1 = _chain(2)
    core = _core(neighbours=lambda topic: [PEER, PEER2])
    core.accepted(TID, e0, 1, PEER, 0.0)
    core.cover(TID, e0.cid, {PEER, PEER2})

    def sent(now: float) -> dict[PeerId, type]:
        return {o.peer: type(o.message) for o in core.tick(TID, [PEER, PEER2], now)
                if isinstance(o, ev.Send)}

    assert sent(2.0) == {}  # both have e0
    assert core.on_digest(PEER, HeadsDigest(TID, heads_digest([e0.cid])), 3.0) == []
    assert sent(4.0) == {PEER2: HeadsDigest}  # refresh round 1: PEER already agreed
    assert core.metrics["digests_spared"] == 1
    assert sent(6.0) == {PEER2: HeadsDigest}  # and round 2
    core.accepted(TID, e1, 1, PEER2, 7.0)
    core.cover(TID, e1.cid, {PEER, PEER2})
    assert sent(8.0) == {}  # changed: both were told of e1
    assert sent(10.0) == {PEER: HeadsDigest, PEER2: HeadsDigest}  # PEER agreed on e0 only


def _quiet_refresh(core: Backfill, peer: PeerId) -> list[ev.Send]:
    """Tick until the first quiet refresh round; its sends."""
    now = 10.0
    while True:
        out = [o for o in core.tick(TID, [peer], now) if isinstance(o, ev.Send)]
        if out and core.metrics["digests_sent"]:
            return out
        now += 2.0


def test_heads_that_change_every_tick_still_reach_everyone_now_and_then() -> None:
    """Under steady traffic a topic is never quiet; every 16th changing tick its heads
    go to every neighbour anyway (here as digests: both were sent every event), so a copy
    lost to a neighbour that was sent it is caught up without waiting for the traffic to
    stop."""
    events = _chain(40)
    core = _core(neighbours=lambda topic: [PEER, PEER2])
    full_ticks = []
    for i, event in enumerate(events):
        core.accepted(TID, event, 1, PEER, float(i))
        core.cover(TID, event.cid, {PEER, PEER2})
        sent = [o for o in core.tick(TID, [PEER, PEER2], i + 0.5)
                if isinstance(o, ev.Send) and isinstance(o.message, Heads | HeadsDigest)]
        if sent:
            assert len(sent) == 2
            full_ticks.append(i + 1)
    assert full_ticks == [16, 32]
