"""The event loop pulsarcast's processes run on.

``uvloop`` (libuv's loop, a well-kept C extension) by default: the node spends a large
share of each delivery in the loop itself and in socket calls, which libuv makes cheaper
(docs/evaluation.md, "Publish latency, throughput and CPU per delivery", has the figures
with and without it). ``PULSARCAST_LOOP=asyncio`` (or ``pulsarcast --loop asyncio``)
runs on the standard library's loop instead; so does a platform without uvloop. The
choice is an environment variable so that the processes a command starts (devnet nodes,
benchmark workers, testbed nodes) make the same one.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

__all__ = ["LAG_TICK", "LOOP_ENV", "LOOPS", "LagMeter", "loop_name", "run"]

LOOP_ENV: Final = "PULSARCAST_LOOP"
LOOPS: Final = ("uvloop", "asyncio")

T = TypeVar("T")


def loop_name() -> str:
    """The loop :func:`run` uses: the environment's choice, else uvloop if installed."""
    chosen = os.environ.get(LOOP_ENV, "").strip().lower()
    if chosen and chosen not in LOOPS:
        raise ValueError(f"{LOOP_ENV} must be one of {', '.join(LOOPS)}, not {chosen!r}")
    if chosen == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if chosen == "uvloop":
            raise ValueError(f"{LOOP_ENV}=uvloop, but uvloop is not installed") from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


LAG_TICK: Final = 0.1
"""Seconds between two looks of :class:`LagMeter` (ten wake-ups a second: nothing to an
idle node, and a stall shorter than this is not one an operator needs to hear about)."""


class LagMeter:
    """How late the event loop runs what is due: a task that sleeps :data:`LAG_TICK` and
    measures how much longer it took. A long stall (a full garbage collection, a slow
    synchronous call) shows as one large lag; ``max_ms`` is the largest since the start
    (``loop_lag_max_ms`` in a node's metrics; a benchmark takes a finer ``tick``)."""

    __slots__ = ("max_ms", "tick", "ticks", "worst")

    def __init__(self, tick: float = LAG_TICK) -> None:
        self.tick = tick
        self.worst = 0.0
        """The largest lag, in seconds."""
        self.max_ms = 0
        self.ticks = 0

    async def run(self) -> None:
        """Measure until cancelled."""
        while True:
            start = time.perf_counter()
            await asyncio.sleep(self.tick)  # the ticker's period, not synchronisation
            late = time.perf_counter() - start - self.tick
            self.ticks += 1
            if late > self.worst:
                self.worst = late
                self.max_ms = int(late * 1000)
