"""Advisories: what a node reports about its consumers as it happens, for whoever watches.

JetStream publishes an advisory when a message reaches its consumer's ``max_deliver``, when
one is terminated, and so on, so that an operator (or a dead-letter handler) sees poison
messages without polling counters. A node does the same on its own stream
(``GET /v1/node/advisories``, ``Consumers.advisories``): each advisory has a ``kind``, the
time, its fields, and an ``id`` that only grows.

Kinds:

* ``consumer.max_deliver`` — ``topic``, ``consumer``, ``seq``, ``deliveries``,
  ``max_deliver``: a message was set aside after its last allowed delivery;
* ``consumer.terminated`` — ``topic``, ``consumer``, ``seqs``: an application said ``term``;
* ``consumer.skipped`` — ``topic``, ``consumer``, ``first``, ``last``, ``count``: log
  positions the topic's retention cut before the consumer read them.

They are kept in memory, the newest :data:`KEPT` of them: a watcher that falls further
behind, or comes back after the node restarted, is told how far back the stream now
reaches (:meth:`Advisories.oldest`) rather than handed a silent gap. Ids are microseconds
of the wall clock, made strictly increasing, so ids after a restart are above those before
it (for a clock that did not step back) and a watcher's ``after`` keeps its meaning.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["KEPT", "Advisories", "Advisory"]

KEPT: Final = 1000
"""Advisories kept in memory (the newest)."""


@dataclass(frozen=True, slots=True)
class Advisory:
    id: int
    kind: str
    at: float
    fields: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "at": self.at, **self.fields}


class Advisories:
    """The node's advisories, newest :data:`KEPT` of them, and waiting for the next."""

    def __init__(self, clock: Callable[[], float] = time.time, kept: int = KEPT) -> None:
        self._clock = clock
        self._kept: deque[Advisory] = deque(maxlen=kept)
        self._last = 0
        self._dropped = 0
        """The id of the newest advisory no longer kept (0: none dropped yet)."""
        self.booted = self._next_id()
        """Advisories up to this id were made before this node started: gone."""
        self._waiters: list[asyncio.Future[None]] = []

    def _next_id(self) -> int:
        self._last = max(self._last + 1, int(self._clock() * 1_000_000))
        return self._last

    def emit(self, kind: str, **fields: Any) -> Advisory:
        """Record an advisory and wake whoever waits for one."""
        if len(self._kept) == self._kept.maxlen:
            self._dropped = self._kept[0].id
        advisory = Advisory(self._next_id(), kind, self._clock(), fields)
        self._kept.append(advisory)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        return advisory

    def after(self, after: int, limit: int = KEPT) -> list[Advisory]:
        """The advisories kept with an id above ``after``, oldest first, at most ``limit``."""
        found = [a for a in self._kept if a.id > after]
        return found[:limit]

    def oldest(self, after: int) -> int | None:
        """If advisories newer than ``after`` are gone (dropped, or made before this node
        started), the id from which the stream is whole again; None if nothing is missing."""
        lost = max(self._dropped, self.booted)
        return lost if after < lost else None

    async def wait(self, after: int, timeout: float) -> bool:
        """Wait until there is an advisory above ``after`` (True) or ``timeout`` passed."""
        if self._last > after and self.after(after, 1):
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return False
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return True
