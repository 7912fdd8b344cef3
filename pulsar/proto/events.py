"""The closed sets of inputs and outputs of the protocol cores.

Inputs (what the driver feeds in with ``handle(event, now)``): a message from a peer, an
application command, a timer firing, a peer going away, the result of a fetch or store.
Outputs (what the driver must carry out): send a message, set a timer, deliver an event,
store a block locally or in the DHT, fetch a block, report the outcome of a publish, and
report a rejected input (for logs and metrics). Timers are values: the core emits
``SetTimer(delay, timer)`` and later receives ``TimerFired(timer)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dag import CID, EventDescriptor, PeerId, TopicDescriptor

__all__ = [
    "BlockFetched",
    "Deliver",
    "DhtStored",
    "Fetch",
    "InEvent",
    "OutEvent",
    "PeerDown",
    "Publish",
    "PublishFailed",
    "Published",
    "Received",
    "Rejected",
    "Send",
    "SendFailed",
    "SetTimer",
    "StoreDht",
    "StoreLocal",
    "Subscribe",
    "TimerFired",
    "Unsubscribe",
]


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class Received:
    peer: PeerId
    message: object


@dataclass(frozen=True, slots=True)
class PeerDown:
    """The transport lost the connection to ``peer`` (or could not reach it)."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class SendFailed:
    """A ``Send`` to ``peer`` could not be delivered after the transport's retries."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer: object


@dataclass(frozen=True, slots=True)
class BlockFetched:
    """Result of a ``Fetch``; ``block`` is None when nobody had it."""

    cid: CID
    block: bytes | None


@dataclass(frozen=True, slots=True)
class DhtStored:
    """Result of a ``StoreDht``: how many DHT nodes acknowledged (0 = only local)."""

    cid: CID
    acks: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Join ``topic``'s tree and deliver its events (``deliver=False``: relay only).

    ``since`` is when the subscription began (default: now); events created before it are
    not backfilled, and ``replay=True`` semantics are ``since=0``. ``heads`` are the heads
    the durable store remembers, so a restarted node backfills only what it missed."""

    topic: TopicDescriptor
    deliver: bool = True
    since: float | None = None
    heads: tuple[CID, ...] = ()


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    topic: CID


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``payload`` on the tree of ``topic``; ``request`` identifies the outcome."""

    topic: CID
    payload: bytes | CID
    parent: CID | None
    request: int


InEvent = (
    Received
    | PeerDown
    | SendFailed
    | TimerFired
    | BlockFetched
    | DhtStored
    | Subscribe
    | Unsubscribe
    | Publish
)


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class Send:
    peer: PeerId
    message: object


@dataclass(frozen=True, slots=True)
class SetTimer:
    delay: float
    timer: object


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand ``event`` to the application subscribed to the tree ``topic``."""

    topic: CID
    event: EventDescriptor
    hop: int


@dataclass(frozen=True, slots=True)
class StoreLocal:
    cid: CID
    block: bytes


@dataclass(frozen=True, slots=True)
class StoreDht:
    """Store in the DHT; the driver answers with ``DhtStored``. Stores local too."""

    cid: CID
    block: bytes


@dataclass(frozen=True, slots=True)
class Fetch:
    """Get a block (local store, then DHT); the driver answers with ``BlockFetched``."""

    cid: CID


@dataclass(frozen=True, slots=True)
class Published:
    request: int
    event: EventDescriptor


@dataclass(frozen=True, slots=True)
class PublishFailed:
    request: int
    reason: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """An input refused, for the log and metrics: a peer's fault, never a crash."""

    peer: PeerId | None
    reason: str


OutEvent = (
    Send | SetTimer | Deliver | StoreLocal | StoreDht | Fetch | Published | PublishFailed | Rejected
)
