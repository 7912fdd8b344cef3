"""What ``Node.subscribe`` returns: an async iterator of a topic's events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dag import CID, EventDescriptor

__all__ = ["Subscription"]

_END = object()


class Subscription(AsyncIterator[EventDescriptor]):
    """Events of one topic, each once, in the order this node accepted them.

    The in-memory queue is not bounded: a slow consumer never makes the node drop events,
    at the price of memory while it lags. Consumers that may lag far behind should read
    the durable log instead (``Node.history`` / ``Node.log_entries`` with a cursor, or the
    REST stream), which costs no memory. ``close()`` (or the node's unsubscribe/stop) ends
    the iteration. Only events delivered after ``subscribe()`` returned reach the queue;
    after a restart, what the node backfilled before the application subscribed again is
    in the log, not here.
    """

    def __init__(self, topic: CID) -> None:
        self.topic = topic
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._closed = False

    def _push(self, event: EventDescriptor) -> None:
        if not self._closed:
            self._queue.put_nowait(event)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_END)

    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        return self._queue.qsize()

    async def get(self, timeout: float | None = None) -> EventDescriptor:
        """The next event; ``StopAsyncIteration`` once closed, ``TimeoutError`` on timeout."""
        item = await asyncio.wait_for(self._queue.get(), timeout)
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        assert isinstance(item, EventDescriptor)
        return item

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> EventDescriptor:
        return await self.get()
