"""What the durable consumers answer: a message handed out, a consumer's info, what an
acknowledgement did (:mod:`pulsar.runtime.consumers`; the REST layer renders these)."""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID, EventDescriptor

from .consumer_config import AckKind, ConsumerConfig
from .consumer_share import GroupInfo

__all__ = ["AckResult", "ConsumerInfo", "ConsumerMessage"]


@dataclass(frozen=True, slots=True)
class ConsumerMessage:
    """One event handed out by a consumer: the event at log position ``seq``, delivered
    for the ``count``-th time. ``id`` (the position) is what an acknowledgement names; it
    stays the same when the event is delivered again."""

    seq: int
    event: EventDescriptor
    delivered_at: float
    """When this node logged the event (not when the consumer handed it out)."""
    count: int

    @property
    def id(self) -> int:
        return self.seq


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """A consumer's settings and where it is (``GET .../consumers/{name}``)."""

    topic: CID
    config: ConsumerConfig
    created_at: float
    start: int
    """The log position its deliver policy resolved to (it delivers what follows)."""
    delivered: int
    """The last log position it handed out for the first time."""
    ack_floor: int
    """Every position up to this one is acknowledged (or terminated, set aside, skipped)."""
    num_pending: int
    """Log entries after ``delivered``: not handed out yet."""
    num_ack_pending: int
    """Handed out and not acknowledged."""
    num_redelivered: int
    """Of those, delivered more than once."""
    num_terminated: int
    num_max_deliver_reached: int
    num_skipped: int
    last_skipped: tuple[int, int] | None
    redeliveries: int
    """Redeliveries since it was made."""
    group: GroupInfo | None = None

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True, slots=True)
class AckResult:
    """What an acknowledgement did: ``done`` are the ids it applied to; ``unknown`` those
    not pending (never delivered, already acknowledged or terminated, set aside, or any id
    of a consumer with ``ack_policy=none``)."""

    kind: AckKind
    done: tuple[int, ...]
    unknown: tuple[int, ...]
