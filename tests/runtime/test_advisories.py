"""The node's advisory board: ids only grow, the newest are kept, a gap is told, and a
waiter wakes on the next one (pulsar.runtime.advisories)."""

from __future__ import annotations

import asyncio

from pulsar.runtime.advisories import Advisories


def test_ids_grow_even_when_the_clock_does_not() -> None:
    board = Advisories(clock=lambda: 100.0)
    ids = [board.emit("k", n=i).id for i in range(3)]
    assert ids == sorted(set(ids)) and ids[0] > board.booted
    assert [a.fields["n"] for a in board.after(ids[0])] == [1, 2]
    assert board.after(ids[-1]) == []
    assert board.after(ids[0], limit=1)[0].fields == {"n": 1}
    assert board.after(0)[0].to_json() == {"id": ids[0], "kind": "k", "at": 100.0, "n": 0}


def test_only_the_newest_are_kept_and_what_went_is_told() -> None:
    board = Advisories(clock=lambda: 100.0, kept=3)
    ids = [board.emit("k", n=i).id for i in range(5)]
    assert [a.id for a in board.after(0)] == ids[2:]
    # A watcher that had seen the first one missed the second: it is told from where the
    # stream is whole again; one that had seen the second missed nothing.
    assert board.oldest(ids[0]) == ids[1]
    assert board.oldest(ids[1]) is None
    # A watcher from before this node started missed what the last one said, if anything.
    assert board.oldest(board.booted - 1) == ids[1]


async def test_a_waiter_wakes_on_the_next_advisory_or_times_out() -> None:
    board = Advisories()
    assert not await board.wait(board.booted, 0.01)
    waiting = asyncio.ensure_future(board.wait(board.booted, 5.0))
    await asyncio.sleep(0)  # let it start waiting
    board.emit("k")
    assert await asyncio.wait_for(waiting, 1.0)
    assert await board.wait(board.booted, 0.0)  # one is already there
