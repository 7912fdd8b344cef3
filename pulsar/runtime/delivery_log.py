"""Reading this node's delivery log: history, pages, cursors, and waiting for it to grow.

Every event the node delivers is appended, once per event-loop iteration, to the durable
log of its topic (:class:`~pulsar.runtime.writes.WriteBehind`); the log's sequence numbers
are the cursors the REST API, stream resume and Spark offsets hand out. :class:`DeliveryLog`
is the read side behind ``Node.history``, ``Node.log_entries`` and the rest: each read
first writes what is pending, so a reader sees every delivery made before it asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from dag import CID, EventDescriptor

from .errors import BeforeRetention
from .node_state import NodeState
from .writes import WriteBehind

__all__ = ["DeliveryLog", "LogEntry"]


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One delivered event at its position in this node's delivery log of a topic."""

    seq: int
    event: EventDescriptor
    delivered_at: float


class DeliveryLog:
    """The read side of the delivery log in ``state``, consistent with ``writes``: pending
    appends are flushed before each read, and :meth:`wait` wakes on the flush that grows
    the log. The arguments are documented on the ``Node`` methods that delegate here."""

    __slots__ = ("_state", "_writes")

    def __init__(self, state: NodeState, writes: WriteBehind) -> None:
        self._state = state
        self._writes = writes

    async def history(
        self,
        topic_cid: CID,
        *,
        since: CID | int | float | None = None,
        until: CID | int | float | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[EventDescriptor]:
        """``Node.history``: the events delivered for ``topic_cid``, in delivery order."""
        after = self._position(topic_cid, since, 0) or 0
        last = self._position(topic_cid, until, None)
        remaining = limit
        while remaining is None or remaining > 0:
            size = 1000 if remaining is None else min(1000, remaining)
            entries = self.entries(topic_cid, after=after, limit=size)
            if not entries:
                return
            for entry in entries:
                if last is not None and entry.seq > last:
                    return
                yield entry.event
                after = entry.seq
                if remaining is not None:
                    remaining -= 1
                    if remaining == 0:
                        return

    def entries(
        self,
        topic_cid: CID,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int = 1000,
        descending: bool = False,
    ) -> list[LogEntry]:
        """``Node.log_entries``: one page of the log, parsed."""
        rows = self.blocks(
            topic_cid, after=after, before=before, limit=limit, descending=descending
        )
        entries = []
        for seq, cid, delivered_at, block in rows:
            if block is None:  # pruned by the operator: the position stays, the event went
                continue
            # Verified (signatures, rights) when it was delivered; parsed again for its
            # fields, which re-checks its CID and encoding but not the signatures.
            event = EventDescriptor.from_block(block, cid, verify_signature=False)
            entries.append(LogEntry(seq, event, delivered_at))
        return entries

    def blocks(
        self,
        topic_cid: CID,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int = 1000,
        descending: bool = False,
    ) -> list[tuple[int, CID, float, bytes | None]]:
        """``Node.log_blocks``: one page of the log as stored, not parsed. Reading on from
        a position the topic's retention policy has cut raises :class:`BeforeRetention`
        (reading from the start, ``after=0``, begins at the first position kept)."""
        self._writes.flush()
        if after > 0 and not descending:
            retained_from = self._state.log_retained_from(topic_cid)
            if after < retained_from - 1:
                raise BeforeRetention(topic_cid, after, retained_from)
        return self._state.log_blocks(
            topic_cid, after_seq=after, limit=limit, descending=descending, before_seq=before
        )

    @property
    def stopped(self) -> bool:
        """The node stops: waits end at once and the log is not read any more."""
        return self._writes.stopped

    def position(self, topic_cid: CID, value: CID | int | float | None) -> int:
        """``Node.log_position``: a cursor for ``value``; 0 for None."""
        return self._position(topic_cid, value, 0) or 0

    def last_position(self, topic_cid: CID) -> int:
        """``Node.last_position``: the newest position of the log (0 if empty)."""
        self._writes.flush()
        return self._state.log_last_seq(topic_cid)

    async def wait(self, topic_cid: CID, after: int, timeout: float) -> bool:
        """``Node.wait_for_log``: until the log holds a position beyond ``after``; False
        on timeout, on unsubscribe and once the node stops."""
        if self._writes.stopped:
            return False
        if self.last_position(topic_cid) > after:
            return True
        grew = self._writes.log_grew(topic_cid)
        grew.clear()
        try:
            async with asyncio.timeout(timeout):
                await grew.wait()
        except TimeoutError:
            pass
        return not self._writes.stopped and self.last_position(topic_cid) > after

    def _position(
        self, topic: CID, value: CID | int | float | None, default: int | None
    ) -> int | None:
        if value is None:
            return default
        if isinstance(value, CID):
            seq = self._state.log_seq_of(topic, value)
            if seq is None:
                raise KeyError(f"event {value} is not in this node's log of {topic}")
            return seq
        if isinstance(value, bool):
            raise TypeError("since/until must be a CID, a sequence number or a timestamp")
        if isinstance(value, int):
            return value
        return self._state.log_seq_at_time(topic, float(value))
