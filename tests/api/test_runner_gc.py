"""``pulsarcast node`` holds the garbage collector back while the node rejoins its trees,
then freezes what is alive (pulsar.tools.runner)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from pulsar.tools import runner
from tests.waiting import eventually


class _Resuming:
    """What the freezer reads of a node: its metrics, ``topics_to_resume`` going down."""

    def __init__(self, left: int) -> None:
        self.left = left

    @property
    def metrics(self) -> dict[str, int]:
        return {"topics_to_resume": self.left}


async def test_the_collector_comes_back_frozen_once_the_resume_is_done() -> None:
    node: Any = _Resuming(3)
    gc.disable()
    try:
        frozen_before = gc.get_freeze_count()
        freezer = asyncio.ensure_future(runner._freeze_after_resume(node))
        await asyncio.sleep(0)
        assert not gc.isenabled() and not freezer.done()  # still resuming: held back
        node.left = 0
        await eventually(lambda: freezer.done(), timeout=5, what="the freezer to finish")
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen_before
    finally:
        gc.unfreeze()
        gc.enable()


async def test_a_stop_during_the_resume_gives_the_collector_back() -> None:
    node: Any = _Resuming(10)
    gc.disable()
    try:
        freezer = asyncio.ensure_future(runner._freeze_after_resume(node))
        await asyncio.sleep(0)
        freezer.cancel()
        await asyncio.gather(freezer, return_exceptions=True)
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()
