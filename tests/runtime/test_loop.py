"""The event loop the tools and the node run on."""

from __future__ import annotations

import asyncio
import time

import pytest

from pulsar.runtime import loop
from pulsar.runtime.loop import LAG_TICK, LagMeter
from tests.waiting import eventually


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_by_default_and_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loop.LOOP_ENV, raising=False)
    assert loop.loop_name() == "uvloop"
    assert loop.run(_loop_module()).startswith("uvloop")
    monkeypatch.setenv(loop.LOOP_ENV, "asyncio")
    assert loop.loop_name() == "asyncio"
    assert loop.run(_loop_module()).startswith("asyncio")


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loop.LOOP_ENV, "trio")
    with pytest.raises(ValueError, match="PULSARCAST_LOOP must be one of uvloop, asyncio"):
        loop.loop_name()


async def test_the_lag_meter_sees_a_stall_of_the_loop() -> None:
    meter = LagMeter()
    task = asyncio.ensure_future(meter.run())
    try:
        await eventually(lambda: meter.ticks >= 1, timeout=5, what="a first tick")
        before = meter.ticks
        time.sleep(3 * LAG_TICK)  # the stall itself: the loop runs nothing meanwhile
        await eventually(lambda: meter.ticks > before, timeout=5, what="the tick after")
        assert meter.max_ms >= 1000 * 2 * LAG_TICK
    finally:
        task.cancel()
