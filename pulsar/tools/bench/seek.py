"""``pulsarcast bench seek``: block fetches to find the first event at or after a time,
from the topic's CID alone, through the author's checkpoints — against today's walk back
along parent links, in the same run.

The harness is DHT-only and in memory: one author's topic of ``n`` signed events (a
LAST_SEEN chain, one every 10 ms), checkpointed every ``checkpoint_every`` events exactly
as a node does (:func:`dag.checkpoints.make_checkpoint`), its heads record naming the
newest checkpoint, every block in a dict that stands for the DHT and counts each get.
What is counted is the number of blocks a reader must fetch one after another (the
record, checkpoints, index blocks, the event): that number, not the network, is what a
seek costs in round trips; the wall time printed is the harness's CPU time, with no
network latency in it. The baseline reads the same record and walks parent links back
from its heads to the first event at or after the time, as a replay does without
checkpoints.
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from typing import Any

from dag import CID, EventDescriptor, Identity, TopicDescriptor
from dag.checkpoints import (
    Skip,
    fetch_checkpoint,
    find_segment,
    make_checkpoint,
    seek_entry,
)
from dag.descriptors import parse_timestamp
from dag.event_links import event_links
from dag.records import HeadsRecord

__all__ = ["bench_seek"]

EVENT_GAP_MS = 10
START = 1_780_000_000.0


class Harness:
    """A topic's blocks and its author's record, in a dict that counts gets."""

    def __init__(self, n: int, every: int, seed: int) -> None:
        self.author = Identity.from_seed(bytes([seed % 256]) * 32)
        self.topic = TopicDescriptor.create(self.author, f"bench seek {n}", now=START)
        self.blocks: dict[CID, bytes] = {self.topic.cid: self.topic.block}
        self.gets = 0
        self.times: list[float] = []
        parent: CID | None = None
        segment: list[tuple[int, CID]] = []
        skips: dict[int, Skip] = {}
        newest: CID | None = None
        for i in range(n):
            now = START + i * EVENT_GAP_MS / 1000
            event = EventDescriptor.create(self.author, self.topic.cid, b"event %d" % i,
                                           parent=parent, now=now)
            self.blocks[event.cid] = event.block
            self.times.append(event.created_at)
            parent = event.cid
            segment.append((round(event.created_at * 1000), event.cid))
            if len(segment) == every or i == n - 1:
                number = len(skips) + 1
                checkpoint, blocks = make_checkpoint(
                    self.author, self.topic.cid, number, segment, [event.cid], skips.__getitem__,
                    now=now)
                self.blocks.update(blocks)
                skips[number] = Skip(number, checkpoint.count, checkpoint.last_ms, checkpoint.cid)
                newest = checkpoint.cid
                segment = []
        assert parent is not None and newest is not None
        self.record = HeadsRecord.create(self.author, self.topic.cid, 1, self.topic.cid,
                                         [parent], checkpoint=newest, now=START)
        self.checkpoints = len(skips)

    async def get(self, cid: CID) -> bytes | None:
        self.gets += 1
        return self.blocks.get(cid)

    def read_record(self) -> HeadsRecord:
        self.gets += 1  # a DHT get of the author's record, as a replay starts
        return self.record

    async def seek(self, at: float) -> CID | None:
        """Checkpoints: record, newest checkpoint, skips, index, then the event itself."""
        record = self.read_record()
        assert record.checkpoint is not None
        author = self.author.peer_id
        latest = await fetch_checkpoint(self.get, record.checkpoint, author, self.topic.cid)
        at_ms = math.ceil(at * 1000)
        segment = await find_segment(self.get, latest, author, at_ms=at_ms)
        if segment is None:
            return None
        _, (_, cid) = await seek_entry(self.get, segment, at_ms)
        block = await self.get(cid)  # the event itself: what a replay yields first
        assert block is not None
        return cid

    async def walk(self, at: float) -> CID | None:
        """Today's way: the record's heads, then parent links back to the time."""
        record = self.read_record()
        first: CID | None = None
        cursor: CID | None = record.heads[0]
        while cursor is not None:
            block = await self.get(cursor)
            assert block is not None
            links = event_links(block)
            assert links is not None
            if parse_timestamp(links.created) < at:
                break
            first, cursor = cursor, links.parent
        return first


def bench_seek(events: int = 1_000_000, every: int = 1000, seeks: int = 50,
               seed: int = 1) -> dict[str, Any]:
    """Seek at ``events / 100``, ``events / 10`` and ``events`` events; one JSON line."""
    sizes = [s for s in (events // 100, events // 10, events) if s >= 10]
    rng = random.Random(seed)
    rows = []
    for n in sizes:
        began = time.perf_counter()
        harness = Harness(n, every, seed)
        built = time.perf_counter() - began
        seek_gets, walk_gets, seek_s = [], [], []
        for _ in range(seeks):
            at = rng.uniform(harness.times[0], harness.times[-1])
            harness.gets = 0
            t0 = time.perf_counter()
            found = asyncio.run(harness.seek(at))
            seek_s.append(time.perf_counter() - t0)
            seek_gets.append(harness.gets)
            harness.gets = 0
            walked = asyncio.run(harness.walk(at))
            walk_gets.append(harness.gets)
            if found != walked:
                raise AssertionError(f"seek found {found}, the walk {walked}, at {at}")
        bound = 2 * math.log2(n) + 8
        row = {
            "events": n, "checkpoints": harness.checkpoints, "seeks": seeks,
            "fetches_max": max(seek_gets), "fetches_mean": round(sum(seek_gets) / seeks, 2),
            "bound": round(bound, 1), "within_bound": max(seek_gets) <= bound,
            "walk_fetches_mean": round(sum(walk_gets) / seeks, 1),
            "walk_over_seek": round(sum(walk_gets) / sum(seek_gets), 1),
            "seek_ms_max": round(max(seek_s) * 1000, 2), "build_s": round(built, 1),
        }
        print(f"  {n:>9,} events, {harness.checkpoints:>5} checkpoints: seek "
              f"{row['fetches_mean']} fetches on average, {row['fetches_max']} at most "
              f"(bound {row['bound']}); the walk {row['walk_fetches_mean']} "
              f"({row['walk_over_seek']}x)", file=sys.stderr)
        rows.append(row)
    largest = rows[-1]
    return {"benchmark": "seek", "seed": seed, "checkpoint_every": every, "sizes": rows,
            "fetches_max": largest["fetches_max"], "bound": largest["bound"],
            "walk_over_seek": largest["walk_over_seek"]}
