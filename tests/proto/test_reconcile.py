"""Range-based set reconciliation: the pure step on two item sets that differ by nothing,
one item, many, and everything; the messages' wire checks; and backfill turning to
reconciliation when a gap is too deep to walk (exact inputs and outputs)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest

from dag import CID, EventDescriptor, TopicDescriptor
from pulsar.proto import events as ev
from pulsar.proto.codec import decode_frame, decode_message, encode_message
from pulsar.proto.fields import MessageError
from pulsar.proto.reconcile.items import INFINITY, Bound, ItemIndex, fingerprint_of
from pulsar.proto.reconcile.messages import (
    MAX_IDS,
    Fingerprint,
    IdList,
    RBlocks,
    Recon,
    RWant,
)
from pulsar.proto.reconcile.ranges import answer, opening
from pulsar.proto.repair.backfill import UNVOUCHED, BackfillConfig, ReconcileTimeout
from pulsar.proto.repair.messages import Blocks, Want

from .test_backfill import MALLORY, PEER, TID, _chain, _core, _delivered

TOPIC = CID.parse(bytes(TID.raw))


def _raw(n: int) -> bytes:
    """A CIDv1 dag-cbor sha2-256 of item ``n`` (the layout the index reads digests from)."""
    return bytes([0x01, 0x71, 0x12, 0x20]) + hashlib.sha256(n.to_bytes(8, "big")).digest()


def _rows(numbers: list[int], clock: dict[int, int] | None = None) -> list[tuple[int, bytes, int]]:
    """Items ``numbers``, created at ms ``1_000 * n`` unless ``clock`` says otherwise; the
    position is the item's place in ``numbers``."""
    clock = clock or {}
    return [(clock.get(n, 1_000 * n), _raw(n), i + 1) for i, n in enumerate(numbers)]


def _reconcile(mine: list[tuple[int, bytes, int]], theirs: list[tuple[int, bytes, int]],
               lo: Bound = (0, b"")) -> tuple[list[tuple[int, CID]], int, int]:
    """Run a session to its end through the wire codec; (what the asker found missing,
    the messages exchanged, the bytes they took)."""
    asker, answerer = ItemIndex(mine), ItemIndex(theirs)
    step = opening(asker, lo, INFINITY)
    need: list[tuple[int, CID]] = []
    size = 0
    turn_answerer = True
    for round_ in range(64):
        wire = encode_message(Recon(TOPIC, 1, round_, tuple(step.fps), tuple(step.ids)))
        messages = round_ + 1
        size += len(wire)
        msg = decode_frame(wire)
        assert isinstance(msg, Recon)
        index = answerer if turn_answerer else asker
        step = answer(index, msg.fps, msg.ids, asker=not turn_answerer)
        need += step.need
        if step.empty:
            return need, messages, size
        turn_answerer = not turn_answerer
    raise AssertionError("the session did not end in 64 rounds")


Rows = list[tuple[int, bytes, int]]


def _missing(mine: Rows, theirs: Rows) -> set[bytes]:
    have = {raw for _, raw, _ in mine}
    return {raw for _, raw, _ in theirs if raw not in have}


def test_equal_sets_settle_in_one_message_each_way() -> None:
    rows = _rows(list(range(5_000)))
    need, messages, size = _reconcile(rows, rows)
    assert need == []
    assert messages == 1  # the answerer's reply is empty: everything matched
    assert size < 16 * 120


def test_one_missing_item_is_found_in_a_few_rounds_with_few_bytes() -> None:
    theirs = _rows(list(range(10_000)))
    mine = [row for row in theirs if row[1] != _raw(4_321)]
    need, messages, size = _reconcile(mine, theirs)
    assert [cid.raw for _, cid in need] == [_raw(4_321)]
    assert need[0][0] == 4_322  # the answerer's position for it
    assert messages <= 8
    assert size < 20_000  # fingerprints, not the 10,000 ids (~450 KB)


def test_a_node_away_for_the_last_tenth_learns_exactly_what_it_missed() -> None:
    theirs = _rows(list(range(20_000)))
    mine = theirs[:18_000]
    need, messages, size = _reconcile(mine, theirs)
    assert {cid.raw for _, cid in need} == _missing(mine, theirs)
    assert len(need) == 2_000
    assert messages <= 6
    assert size < 2_000 * 60  # the missed ids plus a few rounds of fingerprints


def test_many_scattered_differences_both_ways() -> None:
    rng = random.Random(7)
    universe = list(range(30_000))
    theirs = _rows([n for n in universe if rng.random() > 0.05])
    mine = _rows([n for n in universe if rng.random() > 0.05])
    need, messages, _ = _reconcile(mine, theirs)
    assert {cid.raw for _, cid in need} == _missing(mine, theirs)
    assert len(need) == len({cid for _, cid in need})
    assert messages <= 16


@pytest.mark.parametrize("mine,theirs", [(0, 3_000), (3_000, 0), (0, 0)])
def test_everything_or_nothing_differs(mine: int, theirs: int) -> None:
    a = _rows(list(range(mine)))
    b = _rows(list(range(theirs)))
    need, _, _ = _reconcile(a, b)
    assert {cid.raw for _, cid in need} == _missing(a, b)


def test_items_of_one_millisecond_are_told_apart_by_cid() -> None:
    numbers = list(range(2_000))
    same = dict.fromkeys(numbers, 5_000)  # every item created in the same millisecond
    theirs = _rows(numbers, same)
    mine = [row for row in theirs if row[1] not in {_raw(3), _raw(1_999)}]
    need, _, _ = _reconcile(mine, theirs)
    assert {cid.raw for _, cid in need} == {_raw(3), _raw(1_999)}


def test_the_range_starts_at_the_askers_horizon() -> None:
    theirs = _rows(list(range(1_000)))
    need, _, _ = _reconcile([], theirs, lo=(500_000, b""))
    assert {cid.raw for _, cid in need} == {_raw(n) for n in range(500, 1_000)}


def test_a_fingerprint_is_the_same_in_any_order_and_counts_its_items() -> None:
    rows = _rows(list(range(100)))
    a = ItemIndex(rows)
    b = ItemIndex(list(reversed(rows)))
    assert a.fingerprint(0, 100) == b.fingerprint(0, 100)
    assert a.fingerprint(0, 100) != a.fingerprint(0, 99)
    assert a.fingerprint(5, 5) == fingerprint_of(0, 0)


# --------------------------------------------------------------------------- messages


def test_messages_survive_the_wire() -> None:
    e = [event.cid for event in _chain(2)]
    recon = Recon(TOPIC, 9, 3, (Fingerprint((1, b""), (2, b"\x01"), 4, b"f" * 16),),
                  (IdList((2, b"\x01"), INFINITY, True, ((e[0], 7),)),))
    for message in (recon, RWant(TOPIC, 9, tuple(e)), RBlocks(TOPIC, 9, 2, (b"x",))):
        assert decode_frame(encode_message(message)) == message


def test_the_core_refuses_the_runtimes_messages() -> None:
    with pytest.raises(MessageError, match="not the core's"):
        decode_message(encode_message(RWant(TOPIC, 1, (TOPIC,))))


def _wire(message: Any) -> dict[str, Any]:
    wire: dict[str, Any] = message.to_wire()
    return wire


@pytest.mark.parametrize("change,error", [
    (lambda w: w["fps"][0].__setitem__(3, b"short"), "16 bytes"),
    (lambda w: w["fps"][0].__setitem__(0, [1]), r"\[ms, prefix\]"),
    (lambda w: w["fps"][0].__setitem__(0, [2**60, b""]), "integer"),
    (lambda w: w["fps"][0].__setitem__(0, [1, b"p" * 65]), "bytes of at most 64"),
    (lambda w: w.__setitem__("ids", [[[0, b""], [1, b""], True,
                                      [[TOPIC, 1]] * (MAX_IDS + 1)]]), "more than"),
    (lambda w: w.__setitem__("round", 65), "integer"),
])
def test_malformed_recon_is_refused(change: Any, error: str) -> None:
    wire = _wire(Recon(TOPIC, 1, 0, (Fingerprint((0, b""), INFINITY, 1, b"f" * 16),), ()))
    change(wire)
    from dag import encode
    with pytest.raises(MessageError, match=error):
        decode_frame(encode(wire))


def test_rblocks_may_not_hold_more_blocks_than_it_settles() -> None:
    from dag import encode
    wire = _wire(RBlocks(TOPIC, 1, 2, (b"a", b"b")))
    wire["n"] = 1
    with pytest.raises(MessageError, match="more blocks than n"):
        decode_frame(encode(wire))


# --------------------------------------------------------------------------- backfill


def _deep_gap(config: BackfillConfig) -> tuple[Any, list[Any], list[Any]]:
    """A restarted subscriber that holds the first 10 events hears of the 400th: its
    WANT is answered with 200 blocks that do not reach what it holds."""
    chain = _chain(400)
    core = _core(config=config, heads=[chain[9].cid])
    core.mark_delivered(TID, [e.cid for e in chain[:10]])
    out = core.learn_heads(TID, [chain[-1].cid], PEER, 0.0)
    want = next(o.message for o in out if isinstance(o, ev.Send))
    assert isinstance(want, Want)
    answer_blocks = Blocks(TID, want.head, tuple(e.block for e in reversed(chain[200:])))
    return core, chain, core.on_blocks(PEER, answer_blocks, 0.1)


def test_a_deep_gap_turns_to_reconciliation_and_waits_for_it() -> None:
    core, chain, out = _deep_gap(BackfillConfig(reconcile=True, reconcile_after=128))
    assert ev.Reconcile(TID, PEER) in out
    assert not [o for o in out if isinstance(o, ev.Send | ev.Fetch)]  # the walk waits
    assert _delivered(out) == []
    # The gap's timeout comes: it is put off, nothing is released out of order.
    timeouts = [o.timer for o in out if isinstance(o, ev.SetTimer)
                and type(o.timer).__name__ == "GapTimeout"]
    later = core.on_timer(timeouts[-1], 6.0) if timeouts else []
    assert _delivered(later) == [] and not [o for o in later if isinstance(o, ev.GapReported)]
    # The reconciliation brings the missing middle, oldest first: everything is delivered.
    got = core.on_reconciled(ev.Reconciled(PEER, TID, tuple(chain[10:200])),
                             7.0)
    assert [e.cid for e in _delivered(got)] == [e.cid for e in chain[10:]]
    done = core.on_reconciled(ev.Reconciled(PEER, TID, (), done=True), 7.1)
    assert not [o for o in done if isinstance(o, ev.Send | ev.Fetch)]
    assert core.metrics["reconciled"] == 190


def test_when_reconciliation_ends_short_the_gaps_walk_again() -> None:
    core, chain, out = _deep_gap(BackfillConfig(reconcile=True, reconcile_after=128))
    assert ev.Reconcile(TID, PEER) in out
    part = core.on_reconciled(ev.Reconciled(PEER, TID, tuple(chain[10:100])),
                              1.0)
    assert [e.cid for e in _delivered(part)] == [e.cid for e in chain[10:100]]
    timer = next(o.timer for o in out if isinstance(o, ev.SetTimer)
                 and isinstance(o.timer, ReconcileTimeout))
    resumed = core.on_timer(timer, 121.0)  # never reported done: the timeout ends it
    wants = [o.message for o in resumed if isinstance(o, ev.Send)]
    assert [w.head for w in wants if isinstance(w, Want)] == [chain[199].cid]
    assert core.metrics["reconcile_timeouts"] == 1


def test_an_event_that_fails_the_topics_check_is_skipped_not_delivered() -> None:
    core, chain, _ = _deep_gap(BackfillConfig(reconcile=True, reconcile_after=128))
    other = TopicDescriptor.create(MALLORY, "elsewhere", now=1.0)
    stray = _chain(1, topic=other.cid, publisher=MALLORY)[0]  # signed, of another topic
    got = core.on_reconciled(ev.Reconciled(PEER, TID, (stray, chain[10])), 1.0)
    assert [e.cid for e in _delivered(got)] == [chain[10].cid]
    assert core.metrics["reconcile_refused"] == 1
    # Refused here is not dropped: the walk asks that peer for it once reconciling ends,
    # and its answer gets what any BLOCKS answer gets (a version fetched, the vouching
    # walk, or dropped for good if invalid).
    assert stray.cid in core.missing(TID)  # a gap, waiting while reconciliation runs
    done = core.on_reconciled(ev.Reconciled(PEER, TID, (), done=True), 1.1)
    wants = [o.message for o in done if isinstance(o, ev.Send) and isinstance(o.message, Want)]
    assert len(wants) == 1  # one WANT per neighbour at a time: the others wait their turn
    assert stray.cid in core.missing(TID)


def test_without_reconcile_the_deep_gap_walks_on() -> None:
    _, chain, out = _deep_gap(BackfillConfig())
    assert not [o for o in out if isinstance(o, ev.Reconcile)]
    wants = [o.message for o in out if isinstance(o, ev.Send)]
    assert [w.head for w in wants if isinstance(w, Want)] == [chain[199].cid]


def test_a_deep_gap_of_large_blocks_turns_to_reconciliation_by_their_bytes() -> None:
    _, _, out = _deep_gap(BackfillConfig(reconcile=True, reconcile_after=10_000,
                                         reconcile_after_bytes=200 * 150))
    assert ev.Reconcile(TID, PEER) in out  # 200 blocks of ~150+ bytes: past the bytes
    _, _, out = _deep_gap(BackfillConfig(reconcile=True, reconcile_after=10_000,
                                         reconcile_after_bytes=10**9))
    assert not [o for o in out if isinstance(o, ev.Reconcile)]


def test_an_index_grown_by_appends_and_insertions_matches_one_built_at_once() -> None:
    rows = _rows(list(range(3_000)))
    rng = random.Random(3)
    shuffled = rows[:]
    rng.shuffle(shuffled)
    grown = ItemIndex(shuffled[:1_000])
    for start in range(1_000, 3_000, 250):
        grown.add(shuffled[start:start + 250])
        grown.fingerprint(0, len(grown))  # sums completed in between, then cut again
    grown.add(rows[:10])  # already there: nothing changes
    whole = ItemIndex(rows)
    assert len(grown) == len(whole) == 3_000
    for i, j in ((0, 3_000), (5, 2_999), (1_234, 1_235), (0, 0)):
        assert grown.fingerprint(i, j) == whole.fingerprint(i, j)
        assert grown.items(i, j) == whole.items(i, j)


def test_an_event_nothing_vouches_for_yet_is_kept_and_walked_for() -> None:
    """A revoked publisher's event from before the revocation arrives before the event that
    vouches for it (history comes oldest first): it is stored, so the vouching can reach it
    through the local store, and its gap asks for it when the session ends."""
    chain = _chain(400)
    store: dict[CID, bytes] = {}
    vouched: set[CID] = set()

    def verify(tree: CID, block: bytes | EventDescriptor) -> Any:
        event = block if isinstance(block, EventDescriptor) else EventDescriptor.from_block(
            block)
        return event if event.cid != chain[10].cid or event.cid in vouched else UNVOUCHED

    core = _core(store, verify=verify, config=BackfillConfig(reconcile=True),
                 heads=[chain[9].cid])
    core.mark_delivered(TID, [e.cid for e in chain[:10]])
    out = core.learn_heads(TID, [chain[-1].cid], PEER, 0.0)
    want = next(o.message for o in out if isinstance(o, ev.Send))
    core.on_blocks(PEER, Blocks(TID, want.head, tuple(e.block for e in reversed(chain[200:]))),
                   0.1)
    got = core.on_reconciled(ev.Reconciled(PEER, TID, tuple(chain[10:200])), 1.0)
    assert ev.StoreLocal(chain[10].cid, chain[10].block) in got
    assert _delivered(got) == []  # everything waits on the unvouched event
    assert chain[10].cid in core.missing(TID)
    for o in got:
        if isinstance(o, ev.StoreLocal):
            store[o.cid] = o.block
    vouched.add(chain[10].cid)  # the vouching walk reached it through the local store
    done = core.on_reconciled(ev.Reconciled(PEER, TID, (), done=True), 2.0)
    assert [e.cid for e in _delivered(done)] == [e.cid for e in chain[10:]]
