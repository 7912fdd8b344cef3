"""Checkpoints: their rules, their index, and seeking, held against a linear scan."""

from __future__ import annotations

import asyncio
import itertools
import math
import random

import pytest

from dag import CID, Identity, cid_of, encode
from dag.checkpoints import (
    INDEX_FANOUT,
    Checkpoint,
    CheckpointError,
    Skip,
    entries_from,
    fetch_checkpoint,
    find_segment,
    make_checkpoint,
    seek_in_segment,
    skip_numbers,
)

AUTHOR = Identity.from_seed(b"a" * 32)
OTHER = Identity.from_seed(b"o" * 32)
TOPIC = cid_of(encode({"a topic": 1}))


class Chain:
    """A topic's checkpoints over synthetic events, in a dict standing for the DHT."""

    def __init__(self, segments: list[list[tuple[int, CID]]], who: Identity = AUTHOR) -> None:
        self.blocks: dict[CID, bytes] = {}
        self.checkpoints: list[Checkpoint] = []
        self.fetches = 0
        for number, entries in enumerate(segments, start=1):
            def earlier(n: int) -> Skip:
                c = self.checkpoints[n - 1]
                return Skip(c.number, c.count, c.last_ms, c.cid)
            checkpoint, blocks = make_checkpoint(
                who, TOPIC, number, entries, [entries[-1][1]], earlier, now=1.0)
            self.blocks.update(blocks)
            self.checkpoints.append(checkpoint)

    async def get(self, cid: CID) -> bytes | None:
        self.fetches += 1
        return self.blocks.get(cid)


def _segments(rng: random.Random, total: int, count: int) -> list[list[tuple[int, CID]]]:
    """``total`` events in ``count`` segments; times mostly grow, with skew backwards."""
    cuts = sorted(rng.sample(range(1, total), count - 1))
    ms = 1_700_000_000_000
    events = []
    for i in range(total):
        ms += rng.randint(0, 50) if rng.random() > 0.1 else -rng.randint(0, 400)
        events.append((ms, cid_of(encode({"event": i}))))
    bounds = [0, *cuts, total]
    return [events[a:b] for a, b in itertools.pairwise(bounds)]


def _seek(chain: Chain, *, at_ms: int | None = None, position: int | None = None
          ) -> list[tuple[int, CID]] | None:
    async def run() -> list[tuple[int, CID]] | None:
        latest = chain.checkpoints[-1]
        found = await find_segment(chain.get, latest, AUTHOR.peer_id, at_ms=at_ms,
                                   position=position)
        if found is None:
            return None
        offset = await seek_in_segment(chain.get, found, at_ms=at_ms, position=position)
        out = [e async for e in entries_from(chain.get, found, offset)]
        for later in chain.checkpoints[found.number:]:
            out += [e async for e in entries_from(chain.get, later)]
        return out
    return asyncio.run(run())


def test_skip_links_halve_the_distance() -> None:
    assert skip_numbers(1) == []
    assert skip_numbers(2) == [1]
    assert skip_numbers(11) == [10, 9, 7, 3]


@pytest.mark.parametrize("seed", range(6))
def test_seek_by_time_and_position_matches_a_linear_scan(seed: int) -> None:
    rng = random.Random(seed)
    segments = _segments(rng, rng.randint(200, 3000), rng.randint(1, 40))
    chain = Chain(segments)
    everything = [e for s in segments for e in s]
    low, high = min(ms for ms, _ in everything), max(ms for ms, _ in everything)
    for _ in range(25):
        at = rng.randint(low - 1000, high + 1000)
        expected_start = next((i for i, (ms, _) in enumerate(everything) if ms >= at), None)
        got = _seek(chain, at_ms=at)
        if expected_start is None:
            assert got is None
        else:
            assert got == everything[expected_start:]
        position = rng.randint(1, len(everything))
        assert _seek(chain, position=position) == everything[position - 1:]
    assert _seek(chain, position=len(everything) + 1) is None


def test_a_seek_costs_log2_checkpoints_plus_the_index_depth() -> None:
    rng = random.Random(7)
    segments = _segments(rng, 4096 * 4, 1024)  # 1,024 checkpoints of ~16 events
    chain = Chain(segments)
    worst = 0
    for _ in range(200):
        at = rng.randint(segments[0][0][0], segments[-1][-1][0])

        async def one(at: int = at) -> None:
            found = await find_segment(chain.get, chain.checkpoints[-1], AUTHOR.peer_id,
                                       at_ms=at)
            assert found is not None
            await seek_in_segment(chain.get, found, at_ms=at)

        chain.fetches = 0
        asyncio.run(one())
        worst = max(worst, chain.fetches)
    # At most log2(1024) = 10 checkpoints, then one leaf (each segment fits one block).
    assert worst <= int(math.log2(1024)) + 1


def test_the_index_spans_levels_and_streams_from_any_offset() -> None:
    entries = [(1000 + i, cid_of(encode({"e": i}))) for i in range(INDEX_FANOUT * 3 + 5)]
    chain = Chain([entries])
    checkpoint = chain.checkpoints[0]

    async def run() -> None:
        for offset in (0, 1, INDEX_FANOUT - 1, INDEX_FANOUT, len(entries) - 1):
            got = [e async for e in entries_from(chain.get, checkpoint, offset)]
            assert got == entries[offset:]
        middle = len(entries) // 2
        assert await seek_in_segment(chain.get, checkpoint, at_ms=1000 + middle) == middle

    asyncio.run(run())


def test_a_checkpoint_not_made_by_the_author_is_refused() -> None:
    chain = Chain(_segments(random.Random(1), 50, 2), who=OTHER)

    async def run() -> None:
        with pytest.raises(CheckpointError, match="author"):
            await fetch_checkpoint(chain.get, chain.checkpoints[-1].cid, AUTHOR.peer_id, TOPIC)

    asyncio.run(run())


def test_a_tampered_checkpoint_does_not_verify() -> None:
    chain = Chain(_segments(random.Random(2), 50, 2))
    block = chain.checkpoints[-1].block
    forged = block.replace(chain.checkpoints[-1].heads[0].raw, chain.checkpoints[0].heads[0].raw)
    assert forged != block
    with pytest.raises(CheckpointError, match="signature"):
        Checkpoint.from_block(forged)


def test_a_skip_link_to_another_checkpoint_than_it_describes_is_refused() -> None:
    segments = _segments(random.Random(3), 90, 3)
    good = Chain(segments)
    # A second history whose checkpoint 1 differs: the author's checkpoint 3 is made to
    # link it while describing the genuine one (an out-of-order or swapped link).
    other = Chain([segments[0][:-1], *segments[1:]])
    forged_skips = [Skip(2, good.checkpoints[1].count, good.checkpoints[1].last_ms,
                         good.checkpoints[1].cid),
                    Skip(1, good.checkpoints[0].count, good.checkpoints[0].last_ms,
                         other.checkpoints[0].cid)]
    latest = Checkpoint.create(AUTHOR, TOPIC, number=3,
                               count=good.checkpoints[2].count, size=len(segments[2]),
                               first_ms=good.checkpoints[2].first_ms,
                               last_ms=good.checkpoints[2].last_ms,
                               heads=good.checkpoints[2].heads, index=good.checkpoints[2].index,
                               skips=forged_skips, now=1.0)
    blocks = {**good.blocks, **other.blocks}

    async def get(cid: CID) -> bytes | None:
        return blocks.get(cid)

    async def run() -> None:
        with pytest.raises(CheckpointError, match="link described"):
            await find_segment(get, latest, AUTHOR.peer_id, position=1)

    asyncio.run(run())


def test_malformed_checkpoints_are_refused() -> None:
    chain = Chain(_segments(random.Random(4), 40, 3))
    c = chain.checkpoints[2]
    skips = list(c.skips)
    with pytest.raises(CheckpointError, match="must link"):  # a skip left out
        Checkpoint.create(AUTHOR, TOPIC, number=3, count=c.count, size=c.size,
                          first_ms=c.first_ms, last_ms=c.last_ms, heads=c.heads,
                          index=c.index, skips=skips[:1])
    with pytest.raises(CheckpointError, match="count"):  # a count that does not add up
        Checkpoint.create(AUTHOR, TOPIC, number=3, count=c.count + 1, size=c.size,
                          first_ms=c.first_ms, last_ms=c.last_ms, heads=c.heads,
                          index=c.index, skips=skips)
    with pytest.raises(CheckpointError, match="last_ms"):  # time running backwards
        Checkpoint.create(AUTHOR, TOPIC, number=3, count=c.count, size=c.size,
                          first_ms=0, last_ms=skips[0].last_ms - 1, heads=c.heads,
                          index=c.index, skips=skips)
    with pytest.raises(CheckpointError, match="not"):
        Checkpoint.from_block(c.block, chain.checkpoints[0].cid)  # not the CID asked for


def test_every_index_block_and_checkpoint_fits_one_dht_store() -> None:
    """A checkpoint's blocks go into the DHT with ``put_many``, which refuses a block over
    one STORE: with a fanout of 256 the maker's first checkpoint of 1,000 events raised
    BlockTooLarge and stopped the node's checkpointing. Largest entries: 9-byte times,
    counts over 2^16, 64 heads and 40 skips."""
    from dht.keys import MAX_BLOCK_SIZE

    size = INDEX_FANOUT**2 + 1
    ms = 2**53 - 1 - size  # the largest time allowed, less the segment
    entries = [(ms + i, cid_of(encode({"e": i}))) for i in range(size)]
    heads = [cid for _, cid in entries[:64]]
    checkpoint, blocks = make_checkpoint(
        AUTHOR, TOPIC, 2**40 + 1, entries, heads,
        lambda n: Skip(n, 2**40 + n, ms, cid_of(encode({"c": n}))), now=1.0)
    assert len(checkpoint.skips) >= 40 and len(checkpoint.heads) == 64
    assert max(len(block) for _, block in blocks) <= MAX_BLOCK_SIZE
