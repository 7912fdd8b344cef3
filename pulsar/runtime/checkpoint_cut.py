"""Checkpoints a topic's retention has passed, dropped with their index at this node.

A checkpoint and its index blocks (:mod:`dag.checkpoints`) name every event of their
segment: about 50 bytes an event, at every DHT holder of each block. Once a topic's
retention has cut every event a checkpoint covers, no seek into the retained history lands
in its segment (a seek follows a skip only if it still reaches the time or position asked
for), so the checkpoint and its index are weight that grows for ever.

Index blocks do not name their topic, so a node notes checkpoints as they are written
here: every batch of DHT records written passes :meth:`HeldCheckpoints.noticed`, and a
checkpoint (one substring test per record; parsed only on a match) of a topic this node
follows, signed by that topic's author, gets a row ``(topic, cid, last_ms)`` in
``held_checkpoints``. When the topic's log is cut, :meth:`HeldCheckpoints.cut` takes the
rows whose ``last_ms`` is before the new floor (less the margin the delivery log keeps),
walks each checkpoint's index through the blocks held here, and drops the index blocks and
the checkpoint from the DHT records and the block store. A forged checkpoint never gets a
row (its signature or its author is checked first), so it cannot make us drop what it
names.

What stays: an index block held here whose checkpoint is held by other nodes only (this
node cannot tell its topic), and checkpoints of topics this node does not follow (like
their events: see :mod:`pulsar.runtime.retention`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

from dag import CID, BlockStore, PeerId
from dag.checkpoints import (
    CHECKPOINT_TYPE,
    INDEX_FANOUT,
    MAX_INDEX_DEPTH,
    Checkpoint,
    CheckpointError,
    IndexNode,
)
from dht.keys import dht_key
from dht.storage import RecordStorage

__all__ = ["HeldCheckpoints"]

log = logging.getLogger(__name__)

_MARKER: Final = CHECKPOINT_TYPE.encode()
"""The type string as it appears inside a checkpoint's DAG-CBOR (a text string's bytes
are verbatim): a record without it is not a checkpoint and costs no parse."""
MAX_WALK: Final = 4 * INDEX_FANOUT
"""Index blocks one checkpoint's walk drops at most (a segment of 12,544 events has 113)."""


class HeldCheckpoints:
    """The ``held_checkpoints`` table, and the cut that drops what retention passed."""

    def __init__(self, store: BlockStore, records: RecordStorage,
                 author_of: Callable[[CID], PeerId | None]) -> None:
        self._store = store
        self._records = records
        self._author_of = author_of
        """The author of a topic this node follows; None for one it does not."""
        self.dropped = 0
        """Checkpoint and index blocks dropped since the node started (a metric)."""

    def noticed(self, rows: Iterable[tuple[bytes, bytes]]) -> None:
        """Records just written here: note the checkpoints of followed topics."""
        found = []
        for _, value in rows:
            if _MARKER not in value:
                continue
            try:
                checkpoint = Checkpoint.from_block(value)
            except CheckpointError:
                continue
            if self._author_of(checkpoint.topic) != checkpoint.publisher:
                continue  # not followed here, or not its author's: never acted on
            found.append((checkpoint.topic.raw, checkpoint.cid.raw, checkpoint.last_ms))
        if found:
            with self._store.transaction() as conn:
                conn.executemany("INSERT OR IGNORE INTO held_checkpoints (topic, cid, last_ms) "
                                 "VALUES (?, ?, ?)", found)

    def held(self, topic: CID) -> list[CID]:
        """The checkpoints of ``topic`` noted here, oldest first."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT cid FROM held_checkpoints WHERE topic = ? "
                                "ORDER BY last_ms", (topic.raw,)).fetchall()
        return [CID.parse(bytes(raw)) for (raw,) in rows]

    def cut(self, topic: CID, before: float) -> int:
        """Drop the checkpoints of ``topic`` whose every event was created before
        ``before`` (seconds), with the index blocks held here; returns how many blocks."""
        with self._store.connection() as conn:
            rows = conn.execute("SELECT cid FROM held_checkpoints WHERE topic = ? "
                                "AND last_ms < ?", (topic.raw, int(before * 1000))).fetchall()
        if not rows:
            return 0
        gone: list[CID] = []
        for (raw,) in rows:
            cid = CID.parse(bytes(raw))
            block = self._block(cid)
            if block is None:
                continue
            try:
                root = Checkpoint.from_block(block, cid).index
            except CheckpointError:  # not what was noted (a damaged store): its row goes
                log.warning("held checkpoint %s of %s no longer parses", cid, topic)
                continue
            gone += self._index_of(root)
            gone.append(cid)
        self._records.forget(dht_key(cid) for cid in gone)
        self._store.delete_many(gone)
        with self._store.transaction() as conn:
            conn.executemany("DELETE FROM held_checkpoints WHERE topic = ? AND cid = ?",
                             [(topic.raw, bytes(raw)) for (raw,) in rows])
        self.dropped += len(gone)
        return len(gone)

    def _block(self, cid: CID) -> bytes | None:
        block = self._records.get(dht_key(cid))
        if block is None or not cid.verifies(block):
            block = self._store.get(cid)
        return block

    def _index_of(self, root: CID) -> list[CID]:
        """The index blocks under ``root`` held here (a block held elsewhere ends its
        branch: what is under it is not reachable from here)."""
        found: list[CID] = []
        stack = [(root, 0)]
        while stack and len(found) < MAX_WALK:
            cid, depth = stack.pop()
            block = self._block(cid)
            if block is None:
                continue
            try:
                node = IndexNode.from_block(block, cid)
            except CheckpointError:
                continue
            found.append(cid)
            if depth < MAX_INDEX_DEPTH:
                stack += [(child, depth + 1) for _, _, _, child in node.children]
        return found
