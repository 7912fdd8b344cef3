"""Pulsarcast: the protocol, the embedded node, the CLI, the testbed and the simulator.

The names below are loaded on first use (PEP 562), not when ``pulsar`` is imported:
importing ``pulsar.tools.spark`` (what every Spark executor does) or ``pulsar.proto`` must not
start by loading the node, the DHT and ``kademlia``. ``from pulsar import Node`` works as
before."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import NodeConfig
    from .node import (
        BeforeRetention,
        EventNotFound,
        LogEntry,
        Node,
        NotPersisted,
        NotRecorded,
        PayloadTooLarge,
        PublishError,
        StorageFull,
        TopicNotFound,
    )
    from .runtime.subscription import Subscription

__all__ = [
    "BeforeRetention",
    "EventNotFound",
    "LogEntry",
    "Node",
    "NodeConfig",
    "NotPersisted",
    "NotRecorded",
    "PayloadTooLarge",
    "PublishError",
    "StorageFull",
    "Subscription",
    "TopicNotFound",
]

_WHERE = {
    "NodeConfig": ".config",
    "BeforeRetention": ".node",
    "EventNotFound": ".node",
    "LogEntry": ".node",
    "Node": ".node",
    "NotPersisted": ".node",
    "NotRecorded": ".node",
    "PayloadTooLarge": ".node",
    "PublishError": ".node",
    "StorageFull": ".node",
    "TopicNotFound": ".node",
    "Subscription": ".runtime.subscription",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'pulsar' has no attribute {name!r}")
    value = getattr(import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
