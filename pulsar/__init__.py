"""Pulsarcast: the protocol, the embedded node, the CLI, the testbed and the simulator."""

from .config import NodeConfig
from .node import EventNotFound, LogEntry, Node, NotPersisted, PublishError, TopicNotFound
from .runtime.subscription import Subscription

__all__ = [
    "EventNotFound",
    "LogEntry",
    "Node",
    "NodeConfig",
    "NotPersisted",
    "PublishError",
    "Subscription",
    "TopicNotFound",
]
