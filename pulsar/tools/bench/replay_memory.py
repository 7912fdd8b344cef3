"""``pulsarcast bench replay-memory``: the peak memory of a streamed replay from a time,
at two history lengths, each in a process of its own.

For each size the harness first writes, in a child process, one author's topic of ``n``
signed events (a LAST_SEEN chain, one every 10 ms), its checkpoints every
``checkpoint_every`` events and the author's heads record naming the newest, into a
SQLite block store on disk. A second child process then opens that store and runs the
node's replay (:func:`pulsar.runtime.replay.replay_history`, the code behind
``Node.replay`` and ``GET /v1/topics/{cid}/replay``) from the first event's time, with the
store standing for the DHT: every event is fetched by CID, verified (CID, signature, the
rights rule) and counted as it streams. That process reports its peak resident set
(``ru_maxrss``) before the replay began and at its end; the figure is the ratio of the
replay's peak at the larger size to that at the smaller one. What it leaves out: the
network (no DHT latency, no fetches in flight beyond the replay's own window of 32), and
the REST layer above the replay.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from dag import CID, BlockStore, EventDescriptor, Identity, PeerId, TopicDescriptor
from dag.checkpoints import Skip, make_checkpoint
from dag.records import HeadsRecord
from dht import BlockNotFound

__all__ = ["bench_replay_memory"]

START = 1_780_000_000.0
GAP = 0.01


def build(path: Path, n: int, every: int) -> None:
    """Write the topic, its events, checkpoints and the author's record into ``path``."""
    author = Identity.from_seed(b"r" * 32)
    topic = TopicDescriptor.create(author, f"replay memory {n}", now=START)
    store = BlockStore(path / "blocks.sqlite3")
    store.put(topic.cid, topic.block)
    parent: CID | None = None
    segment: list[tuple[int, CID]] = []
    skips: dict[int, Skip] = {}
    newest: CID | None = None
    batch: list[tuple[CID, bytes]] = []
    for i in range(n):
        event = EventDescriptor.create(author, topic.cid, b"event %d" % i, parent=parent,
                                       now=START + i * GAP)
        batch.append((event.cid, event.block))
        parent = event.cid
        segment.append((round(event.created_at * 1000), event.cid))
        if len(segment) == every or i == n - 1:
            number = len(skips) + 1
            checkpoint, blocks = make_checkpoint(author, topic.cid, number, segment,
                                                 [event.cid], skips.__getitem__, now=START)
            batch += blocks
            skips[number] = Skip(number, checkpoint.count, checkpoint.last_ms, checkpoint.cid)
            newest = checkpoint.cid
            segment = []
        if len(batch) >= 10_000:
            store.put_many(batch)
            batch = []
    store.put_many(batch)
    assert parent is not None and newest is not None
    record = HeadsRecord.create(author, topic.cid, 1, topic.cid, [parent], checkpoint=newest,
                                now=START)
    (path / "meta.json").write_text(json.dumps({"topic": str(topic.cid),
                                                "record": record.block.hex()}))
    store.close()


class _StoreSource:
    """What a replay needs of a node, over a block store standing for the DHT."""

    def __init__(self, store: BlockStore, topic: TopicDescriptor, record: HeadsRecord) -> None:
        self._store = store
        self._topic = topic
        self._record = record

    @property
    def dht(self) -> Any:
        return self

    async def get(self, cid: CID, *, timeout: float | None = None) -> bytes:
        block = self._store.get(cid)
        if block is None:
            raise BlockNotFound(f"{cid}")
        return block

    async def get_record(self, topic: CID, publisher: PeerId) -> HeadsRecord | None:
        return self._record if publisher == self._record.publisher else None

    def routing_size(self) -> tuple[int, int]:
        return 1, 0

    async def get_topic(self, cid: CID) -> TopicDescriptor:
        return self._topic

    async def _lineage(self, topic_cid: CID
                       ) -> tuple[TopicDescriptor, tuple[TopicDescriptor, ...]]:
        return self._topic, ()


def replay(path: Path) -> dict[str, Any]:
    """Replay the topic in ``path`` from its first event's time; peak RSS before/after."""
    from pulsar.runtime.replay import ReplaySource, replay_history

    meta = json.loads((path / "meta.json").read_text())
    store = BlockStore(path / "blocks.sqlite3")
    topic_cid = CID.parse(meta["topic"])
    block = store.get(topic_cid)
    assert block is not None
    topic = TopicDescriptor.from_block(block, topic_cid)
    record = HeadsRecord.from_block(bytes.fromhex(meta["record"]))
    source = cast(ReplaySource, _StoreSource(store, topic, record))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def run() -> int:
        count = 0
        async for _ in replay_history(source, topic_cid, since=START):
            count += 1
        return count

    began = time.perf_counter()
    count = asyncio.run(run())
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store.close()
    return {"events": count, "rss_before_mb": round(before / 1024, 1),
            "rss_peak_mb": round(peak / 1024, 1), "replay_s": round(seconds, 1),
            "events_per_s": round(count / seconds)}


def _child(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pulsar.tools.bench.replay_memory", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout


def bench_replay_memory(events: int = 1_000_000, every: int = 1000) -> dict[str, Any]:
    """Streamed replays at ``events / 10`` and ``events`` events; one JSON line."""
    rows = []
    for n in (events // 10, events):
        with tempfile.TemporaryDirectory(prefix="pulsarcast-replay-") as tmp:
            began = time.perf_counter()
            _child("build", tmp, str(n), str(every))
            built = time.perf_counter() - began
            row = json.loads(_child("replay", tmp).strip().splitlines()[-1])
        if row["events"] != n:
            raise AssertionError(f"replayed {row['events']} of {n} events")
        row["build_s"] = round(built, 1)
        print(f"  {n:>9,} events: replay peak {row['rss_peak_mb']} MiB "
              f"({row['rss_before_mb']} MiB before it), {row['events_per_s']:,} events/s",
              file=sys.stderr)
        rows.append(row)
    small, large = rows
    return {"benchmark": "replay-memory", "checkpoint_every": every, "sizes": rows,
            "peak_ratio": round(large["rss_peak_mb"] / small["rss_peak_mb"], 3)}


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        print(json.dumps(replay(Path(sys.argv[2]))))
