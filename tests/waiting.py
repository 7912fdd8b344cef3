"""Waiting in tests without fixed sleeps: poll a condition until a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 5.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` (plain or async) until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(interval)
