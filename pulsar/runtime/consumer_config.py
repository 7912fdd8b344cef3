"""What a durable consumer is configured with, the bounds on it, and the errors of the
consumer API.

A consumer (:mod:`pulsar.runtime.consumers`) reads one topic's delivery log in order and
keeps its place; its settings use NATS JetStream's vocabulary, so people who know that find
their way: a *deliver policy* says where it starts, an *ack policy* whether and how what it
hands out must be acknowledged, ``ack_wait`` and ``backoff`` when an unacknowledged message
is delivered again, ``max_deliver`` how often before it is set aside, and a *replay policy*
whether it hands out the backlog at once or at the pace it arrived.

Kept apart from the state machine: the REST layer parses bodies into a
:class:`ConsumerConfig`, the store keeps it as JSON (:meth:`ConsumerConfig.to_json`) and
reads it back through the same checks, so a row edited by hand cannot smuggle in a value
the API would refuse.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

__all__ = [
    "ACK_KINDS", "DEFAULT_ACK_WAIT", "DEFAULT_MAX_ACK_PENDING", "MAX_ACK_IDS",
    "MAX_ACK_PENDING", "MAX_BACKOFF", "MAX_BATCH", "MAX_CONSUMERS_PER_TOPIC",
    "MAX_DELIVER_LIMIT", "MAX_EXPIRES", "MAX_NAME", "MAX_SEQ", "MAX_WAIT", "NAME_PATTERN",
    "AckKind", "AckPolicy", "CommitRefused", "ConsumerConfig", "ConsumerConfigError",
    "ConsumerError", "ConsumerExists", "ConsumerLimit", "ConsumerNotFound", "DeliverPolicy",
    "NotFollowed", "ReplayPolicy", "check_name",
]

DeliverPolicy = Literal["all", "last", "new", "start_seq", "start_time"]
AckPolicy = Literal["explicit", "none", "all"]
ReplayPolicy = Literal["instant", "original"]
AckKind = Literal["ack", "nak", "term", "progress"]
ACK_KINDS: Final[tuple[str, ...]] = get_args(AckKind)

MAX_NAME: Final = 64
NAME_PATTERN: Final = f"[A-Za-z0-9_-]{{1,{MAX_NAME}}}"
"""A consumer's name: what appears in URLs and log lines, so letters, digits, ``_`` and
``-`` only (no escaping anywhere)."""
MAX_CONSUMERS_PER_TOPIC: Final = 256
"""Consumers one topic may have on one node: each costs a row, its pending entries and a
share of every sweep."""
DEFAULT_ACK_WAIT: Final = 30.0
MAX_WAIT: Final = 86_400.0
"""Longest ``ack_wait``, ``backoff`` step or ``nak`` delay (seconds): a day."""
MAX_BACKOFF: Final = 64
"""Longest ``backoff`` list (its last step repeats for every later redelivery)."""
MAX_DELIVER_LIMIT: Final = 1_000_000
DEFAULT_MAX_ACK_PENDING: Final = 1000
MAX_ACK_PENDING: Final = 10_000
"""Largest ``max_ack_pending``: the unacknowledged entries a consumer may hold, each a
row; a fetch hands out no more while that many wait."""
MAX_BATCH: Final = 1000
"""Most messages one fetch hands out."""
MAX_EXPIRES: Final = 300.0
"""Longest a fetch waits for a first message (seconds)."""
MAX_ACK_IDS: Final = 1000
"""Most delivery ids one acknowledgement names."""
MAX_SEQ: Final = 10**18 - 1
"""Largest log position a ``start_seq`` or a delivery id may name (the API's cursor
bound)."""

_NAME = re.compile(NAME_PATTERN)
_POLICIES: Final = ("all", "last", "new")


class ConsumerError(Exception):
    """Base of what the consumer API raises about consumers (not about the log)."""


class ConsumerConfigError(ConsumerError, ValueError):
    """A consumer's settings are not acceptable: the message names the field."""


class ConsumerNotFound(ConsumerError, LookupError):
    """No consumer of that name on that topic at this node."""


class ConsumerExists(ConsumerError):
    """A consumer of that name exists with other settings: adding it again with the same
    settings is accepted (and changes nothing); with others it is refused rather than
    silently reconfigured, since moving its position could lose or repeat messages."""


class ConsumerLimit(ConsumerError):
    """The topic already has :data:`MAX_CONSUMERS_PER_TOPIC` consumers here."""


class CommitRefused(ConsumerError):
    """A commit (every position up to one settled at once) the consumer cannot take: its
    ``ack_policy`` is not ``all``, or the position is beyond the log."""


class NotFollowed(ConsumerError, LookupError):
    """The topic is not followed by this node: it has no delivery log to consume."""


def check_name(name: object) -> str:
    """``name`` if it is a valid consumer name; :class:`ConsumerConfigError` otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConsumerConfigError(f"name must be 1..{MAX_NAME} characters of A-Z, a-z, 0-9, "
                                  "'_' and '-'")
    return name


def _seconds(value: object, field: str, *, zero: bool = False) -> float:
    """A duration in seconds: a JSON number, finite, positive (or zero when allowed), at
    most :data:`MAX_WAIT`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConsumerConfigError(f"{field} must be a number of seconds")
    seconds = float(value)
    low_ok = seconds >= 0 if zero else seconds > 0
    if not math.isfinite(seconds) or not low_ok or seconds > MAX_WAIT:
        bound = "0" if zero else "more than 0"
        raise ConsumerConfigError(f"{field} must be {bound} and at most {MAX_WAIT:g} seconds")
    return seconds


def _integer(value: object, field: str, low: int, high: int) -> int:
    # JSON has one number type: 3.0 is the integer 3 (as JSON Schema says).
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or not low <= value <= high:
        raise ConsumerConfigError(f"{field} must be an integer in {low}..{high}")
    return value


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A durable consumer's settings (validated on construction).

    ``deliver_policy``: where a new consumer starts — ``all`` (the oldest entry the log
    holds), ``last`` (its newest entry), ``new`` (only what is logged after it was made),
    ``start_seq`` (the log position ``start_seq``) or ``start_time`` (the first entry
    delivered at or after ``start_time``, seconds since the epoch). It is resolved to a log
    position once, when the consumer is made.

    ``ack_policy``: ``explicit`` (each message must be acknowledged, or it is delivered
    again), ``all`` (acknowledging one acknowledges every earlier one too) or ``none``
    (handing a message out is enough). ``ack_wait``: seconds before an unacknowledged
    message is delivered again; ``backoff``, when given, replaces it: the n-th redelivery
    waits ``backoff[min(n - 1, len - 1)]``. ``max_deliver``: deliveries of one message
    before, timing out once more, it is set aside (-1: no limit). ``max_ack_pending``:
    unacknowledged messages it may hold; a fetch hands out no more while that many wait.

    ``replay_policy``: ``instant`` (the backlog as fast as it is fetched) or ``original``
    (each new message no sooner after the previous one than it was logged after it).
    """

    name: str
    deliver_policy: DeliverPolicy = "all"
    start_seq: int | None = None
    start_time: float | None = None
    ack_policy: AckPolicy = "explicit"
    ack_wait: float = DEFAULT_ACK_WAIT
    max_deliver: int = -1
    backoff: tuple[float, ...] = ()
    replay_policy: ReplayPolicy = "instant"
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING
    group: str | None = None
    """Consumers of the same ``group`` on the same topic, on any nodes, share its events:
    each is handed out by one member (:mod:`pulsar.runtime.consumer_groups`)."""

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.group is not None:
            if not isinstance(self.group, str) or not _NAME.fullmatch(self.group):
                raise ConsumerConfigError(f"group must be 1..{MAX_NAME} characters of A-Z, "
                                          "a-z, 0-9, '_' and '-'")
            if self.ack_policy != "explicit":
                raise ConsumerConfigError(
                    "a group consumer's ack_policy must be explicit: the other members learn "
                    "from each acknowledgement what not to take over")
        if self.deliver_policy not in get_args(DeliverPolicy):
            raise ConsumerConfigError("deliver_policy must be all, last, new, "
                                      "{\"start_seq\": n} or {\"start_time\": t}")
        if (self.start_seq is not None) != (self.deliver_policy == "start_seq"):
            raise ConsumerConfigError("start_seq goes with deliver_policy start_seq only")
        if (self.start_time is not None) != (self.deliver_policy == "start_time"):
            raise ConsumerConfigError("start_time goes with deliver_policy start_time only")
        if self.start_seq is not None:
            _integer(self.start_seq, "deliver_policy.start_seq", 1, MAX_SEQ)
        if self.start_time is not None and (
                isinstance(self.start_time, bool)
                or not isinstance(self.start_time, int | float)
                or not math.isfinite(self.start_time)):
            raise ConsumerConfigError("deliver_policy.start_time must be seconds since the "
                                      "epoch (a number)")
        if self.ack_policy not in get_args(AckPolicy):
            raise ConsumerConfigError("ack_policy must be explicit, none or all")
        if self.replay_policy not in get_args(ReplayPolicy):
            raise ConsumerConfigError("replay_policy must be instant or original")
        _seconds(self.ack_wait, "ack_wait")
        if self.max_deliver != -1:
            _integer(self.max_deliver, "max_deliver (-1 for no limit)", 1, MAX_DELIVER_LIMIT)
        if not isinstance(self.backoff, tuple) or len(self.backoff) > MAX_BACKOFF:
            raise ConsumerConfigError(f"backoff must be a list of at most {MAX_BACKOFF} "
                                      "durations")
        for step in self.backoff:
            _seconds(step, "every backoff step")
        _integer(self.max_ack_pending, "max_ack_pending", 1, MAX_ACK_PENDING)

    def wait_after(self, count: int) -> float:
        """Seconds a message delivered ``count`` times waits for its acknowledgement before
        it is due again: ``backoff[min(count - 1, len - 1)]`` or ``ack_wait``."""
        if self.backoff:
            return self.backoff[min(count, len(self.backoff)) - 1]
        return self.ack_wait

    def exhausted(self, count: int) -> bool:
        """Whether a message delivered ``count`` times may not be delivered again."""
        return self.max_deliver != -1 and count >= self.max_deliver

    def to_json(self) -> dict[str, Any]:
        """The settings as the REST API shows and takes them (and the store keeps them)."""
        policy: Any = self.deliver_policy
        if self.start_seq is not None:
            policy = {"start_seq": self.start_seq}
        elif self.start_time is not None:
            policy = {"start_time": self.start_time}
        settings = {"name": self.name, "deliver_policy": policy,
                    "ack_policy": self.ack_policy, "ack_wait": self.ack_wait,
                    "max_deliver": self.max_deliver, "backoff": list(self.backoff),
                    "replay_policy": self.replay_policy,
                    "max_ack_pending": self.max_ack_pending}
        if self.group is not None:  # absent, not null: a consumer of no group is as before
            settings["group"] = self.group
        return settings

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConsumerConfig:
        """Settings from their JSON form (:meth:`to_json`; absent fields take their
        defaults). :class:`ConsumerConfigError` for unknown fields and bad values, JSON
        types included (a string where a number belongs)."""
        unknown = set(data) - _FIELDS
        if unknown:
            raise ConsumerConfigError(f"unknown consumer settings {sorted(unknown)}; known: "
                                      f"{sorted(_FIELDS)}")
        settings: dict[str, Any] = {"name": check_name(data.get("name"))}
        policy = data.get("deliver_policy", "all")
        if isinstance(policy, dict) and len(policy) == 1 and "start_seq" in policy:
            settings["deliver_policy"] = "start_seq"
            settings["start_seq"] = _integer(policy["start_seq"], "deliver_policy.start_seq",
                                             1, MAX_SEQ)
        elif isinstance(policy, dict) and len(policy) == 1 and "start_time" in policy:
            settings["deliver_policy"] = "start_time"
            when = policy["start_time"]
            settings["start_time"] = float(when) if isinstance(when, int | float) and not \
                isinstance(when, bool) else when
        elif isinstance(policy, str) and policy in _POLICIES:
            settings["deliver_policy"] = policy
        else:
            raise ConsumerConfigError("deliver_policy must be all, last, new, "
                                      "{\"start_seq\": n} or {\"start_time\": t}")
        for field in ("ack_policy", "replay_policy"):
            if field in data:
                if not isinstance(data[field], str):
                    raise ConsumerConfigError(f"{field} must be a string")
                settings[field] = data[field]
        if "ack_wait" in data:
            settings["ack_wait"] = _seconds(data["ack_wait"], "ack_wait")
        if "max_deliver" in data:
            value = data["max_deliver"]
            if type(value) is float and value.is_integer():
                value = int(value)
            settings["max_deliver"] = value
            if type(value) is not int:
                raise ConsumerConfigError("max_deliver must be an integer (-1 for no limit)")
        if "backoff" in data:
            steps = data["backoff"]
            if not isinstance(steps, list | tuple) or len(steps) > MAX_BACKOFF:
                raise ConsumerConfigError(f"backoff must be a list of at most {MAX_BACKOFF} "
                                          "durations")
            settings["backoff"] = tuple(_seconds(s, "every backoff step") for s in steps)
        if "max_ack_pending" in data:
            settings["max_ack_pending"] = _integer(data["max_ack_pending"], "max_ack_pending",
                                                   1, MAX_ACK_PENDING)
        if data.get("group") is not None:
            settings["group"] = data["group"]
        return cls(**settings)


_FIELDS: Final = frozenset({"name", "deliver_policy", "ack_policy", "ack_wait", "max_deliver",
                            "backoff", "replay_policy", "max_ack_pending", "group"})
