"""Drive a core's heads-record write to completion, as a driver whose DHT took it.

A publish is acknowledged (``Published``) only once a heads record naming it is stored
at the write quorum; tests of other rules use this to get past that step."""

from __future__ import annotations

from typing import Any

from pulsar.proto import events as ev
from pulsar.proto.core import PulsarCore
from pulsar.proto.timers import RecordTimer

__all__ = ["record_written"]


def record_written(core: PulsarCore, out: list[Any], now: float, acks: int = 3) -> list[Any]:
    """``out`` followed by what firing its armed ``RecordTimer`` and answering the record
    write with ``acks`` acknowledgements produced (``Published`` among them)."""
    result = list(out)
    timers = [o.timer for o in out
              if isinstance(o, ev.SetTimer) and isinstance(o.timer, RecordTimer)]
    for timer in timers:
        fired = core.handle(ev.TimerFired(timer), now)
        result += fired
        for write in [o for o in fired if isinstance(o, ev.StoreRecord)]:
            result += core.handle(ev.RecordStored(write.record.topic, write.record.seq, acks),
                                  now)
    return result
