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
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

__all__ = ["LOOP_ENV", "LOOPS", "loop_name", "run"]

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
