"""The errors :class:`pulsar.Node`'s API raises, re-exported by ``pulsar`` and ``pulsar.node``.

They are defined here, below the node, because the parts of the runtime raise them
themselves: the driver fails a command with them, the write-behind refuses new work on a
full disk, payload handling refuses what it could not store. An application catches the
very same classes from ``pulsar`` without these modules importing the node.
"""

from __future__ import annotations

__all__ = [
    "BeforeRetention", "EventNotFound", "NotPersisted", "NotRecorded", "PayloadTooLarge",
    "PublishError", "StorageFull", "TopicNotFound",
]


class PublishError(RuntimeError):
    """A publish the topic's rules refused, or that could not reach a publisher."""


class NotPersisted(PublishError):
    """Fewer DHT nodes than ``min_acks`` stored the event (or topic): it was not published.
    The network, not the caller, is at fault; trying again later may succeed."""


class NotRecorded(NotPersisted):
    """The event was stored and sent on, but no heads record naming it reached
    ``min_acks`` DHT nodes: it may still be delivered (an indeterminate outcome), yet a
    reader of the topic's CID alone might not find it, so the publish is not
    acknowledged."""


class StorageFull(PublishError):
    """The node's disk cannot take the write (full, or writes are failing): refused
    before anything was stored or sent. Retry once space is freed."""


class PayloadTooLarge(PublishError, ValueError):
    """The payload is over the node's limit (``core.fragments.max_event_size``): refused at
    once, before anything is stored or sent."""


class TopicNotFound(LookupError):
    """No valid topic descriptor could be found for a CID (locally or in the DHT)."""


class EventNotFound(LookupError):
    """No valid event descriptor could be found for a CID (locally or in the DHT)."""


class BeforeRetention(LookupError):
    """A read of a topic's log from a position its retention policy has already cut: the
    entries after ``after`` up to ``retained_from`` are gone. Read from ``retained_from``
    (or from the start, which is there) instead."""

    def __init__(self, topic: object, after: int, retained_from: int) -> None:
        super().__init__(
            f"the log of {topic} keeps positions from {retained_from} (the topic's retention "
            f"policy cut what came before); position {after} is before that")
        self.after = after
        self.retained_from = retained_from
