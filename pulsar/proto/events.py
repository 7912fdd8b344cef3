"""The closed sets of inputs and outputs of the protocol cores.

Inputs (what the driver feeds in with ``handle(event, now)``): a message from a peer, an
application command, a timer firing, a peer going away, the result of a fetch or store.
Outputs (what the driver must carry out): send a message, set a timer, deliver an event,
store a block locally or in the DHT, fetch a block, store or fetch heads records, report
the outcome of a command, and report a rejected input (for logs and metrics).

Both sets are closed unions (:data:`InEvent`, :data:`OutEvent`) and so are the messages
(:data:`Message`) and timers (:data:`~pulsar.proto.timers.Timer`) they carry: the cores
and the driver ``match`` on them with ``assert_never`` in the default case, so adding a
kind without handling it everywhere is a type error, not a silent drop.

Commands carry a ``request`` number chosen by the driver; each ends with exactly one
``Published`` / ``TopicReady`` or ``CommandFailed`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dag import (
    CID,
    EventDescriptor,
    EventLinking,
    PeerId,
    PublishRule,
    Retention,
    TopicDescriptor,
)
from dag.records import HeadsRecord

from .batch.messages import Batch
from .flood.messages import Subs
from .fragments.messages import Fragment, FWant, IDontWant
from .gossip.messages import Graft, IHave, Prune, Shuffle
from .membership.messages import (
    Disconnect,
    ForwardJoin,
    HvJoin,
    Interests,
    Neighbor,
    NeighborReply,
    ViewShuffle,
    ViewShuffleReply,
)
from .repair.messages import Blocks, Heads, HeadsDigest, Joined, Want
from .timers import Timer
from .tree.messages import Event, Join, Leave, Ping, Pong, RequestToPublish

__all__ = [
    "BlockFetched",
    "Reconcile",
    "Reconciled",
    "CommandFailed",
    "CreateTopic",
    "FailureKind",
    "Deliver",
    "DhtStored",
    "RecordStored",
    "Fetch",
    "FetchRecords",
    "Flush",
    "HistoryCut",
    "CheckpointMade",
    "GapReported",
    "InEvent",
    "KeepPublished",
    "Message",
    "OutEvent",
    "PeerDown",
    "Publish",
    "Published",
    "Received",
    "RecordsFetched",
    "Rejected",
    "Send",
    "Start",
    "SendFailed",
    "SetTimer",
    "StoreDht",
    "StoreLocal",
    "StoreRecord",
    "Subscribe",
    "TimerFired",
    "TopicChanges",
    "TopicReady",
    "Unsubscribe",
    "UpdateTopic",
    "VersionAdopted",
]

Message = (
    Join
    | Leave
    | Event
    | RequestToPublish
    | Ping
    | Pong
    | IHave
    | Graft
    | Prune
    | Shuffle
    | Want
    | Blocks
    | Heads
    | HeadsDigest
    | Joined
    | Subs
    | Batch
    | Fragment
    | IDontWant
    | FWant
    | HvJoin
    | ForwardJoin
    | Neighbor
    | NeighborReply
    | Disconnect
    | ViewShuffle
    | ViewShuffleReply
    | Interests
)
"""Every message a peer can send (what :func:`pulsar.proto.codec.decode_message` returns)."""



# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class Received:
    peer: PeerId
    message: Message


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
    timer: Timer


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
class RecordStored:
    """Result of a ``StoreRecord``: how many DHT nodes acknowledged the record of
    ``topic`` with sequence number ``seq`` (0 when nobody did, or a holder had a newer
    one). Publishes wait for it: see ``Publishing`` (acknowledged = recorded)."""

    topic: CID
    seq: int
    acks: int


@dataclass(frozen=True, slots=True)
class RecordsFetched:
    """Result of a ``FetchRecords``: the valid heads records found (signature and key
    checked by the driver's DHT), at most one per publisher; empty when none was found."""

    topic: CID
    records: tuple[HeadsRecord, ...]
    request: int = 0
    """The ``FetchRecords.request`` this answers."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Join ``topic``'s tree and deliver its events (``deliver=False``: relay only).

    ``since`` is when the subscription began (default: now); events created before it are
    not backfilled, and ``replay=True`` semantics are ``since=0``. ``heads`` are the heads
    the durable store remembers and ``versions`` the later topic versions it knows (oldest
    first), so a restarted node backfills only what it missed, judges events by the
    latest rules and links its next event to what it saw last. ``unannounced`` are this
    node's own published events it has not delivered yet (see ``KeepPublished``): it
    learns them as heads (its store has the blocks), delivers them and tells its
    neighbours, and writes its heads record again."""

    topic: TopicDescriptor
    deliver: bool = True
    since: float | None = None
    heads: tuple[CID, ...] = ()
    versions: tuple[TopicDescriptor, ...] = ()
    unannounced: tuple[CID, ...] = ()


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    topic: CID


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``payload`` on the tree of ``topic``; ``request`` identifies the outcome.
    ``parent`` is a CUSTOM link (LAST_SEEN topics refuse one); ``content_type`` the
    payload's media type and ``key`` the event's key (compaction), both signed into it."""

    topic: CID
    payload: bytes | CID
    parent: CID | None
    request: int
    content_type: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """Algorithm 1: create a topic (and its meta topic) authored by this node, store both
    in the DHT and become the root of both trees; answered by ``TopicReady``."""

    request: int
    name: str
    allowed_publishers: tuple[PeerId, ...] | None = None
    request_to_publish: tuple[PeerId, ...] | bool | None = None
    event_linking: EventLinking = EventLinking.LAST_SEEN
    subtopics: tuple[tuple[str, CID], ...] = ()
    retention: Retention | None = None


@dataclass(frozen=True, slots=True)
class TopicChanges:
    """What an update changes; None keeps the current value (``keep_all`` drops the
    retention policy: every event is kept again)."""

    name: str | None = None
    allowed_publishers: PublishRule | None = None
    request_to_publish: PublishRule | None = None
    event_linking: EventLinking | None = None
    subtopics: tuple[tuple[str, CID], ...] | None = None
    retention: Retention | None = None
    keep_all: bool = False


@dataclass(frozen=True, slots=True)
class UpdateTopic:
    """A new version of ``topic`` (its first version's CID): built on the latest version,
    recording the topic's heads at this moment, stored, and announced on the meta topic;
    answered by ``TopicReady`` once the announcement is published."""

    request: int
    topic: CID
    changes: TopicChanges = field(default_factory=TopicChanges)


@dataclass(frozen=True, slots=True)
class Flush:
    """The node is stopping: carry out now what was deferred (the heads records armed to
    be written after the last publishes), so a clean stop leaves the DHT up to date."""


@dataclass(frozen=True, slots=True)
class HistoryCut:
    """The node's retention policy cut ``topic``'s log down to events created at or after
    ``before`` (seconds since the epoch: the oldest entry kept). What was cut must not come
    back as new: a backfilled event created before it (less the horizon slack) is settled
    as history, not delivered again, exactly as one from before the subscription."""

    topic: CID
    before: float


@dataclass(frozen=True, slots=True)
class CheckpointMade:
    """This node, the author, made (or had made before a restart) ``checkpoint``, the
    newest checkpoint of ``topic`` (:mod:`dag.checkpoints`): its heads record names it
    from now on, and is written at once so readers can seek."""

    topic: CID
    checkpoint: CID


@dataclass(frozen=True, slots=True)
class Start:
    """The node can reach the network (its DHT has contacts): enter the membership
    overlay. Until then the core keeps no neighbours of its own."""


@dataclass(frozen=True, slots=True)
class Reconciled:
    """Events of ``topic`` that a range reconciliation with ``peer`` found missing here
    (see :class:`Reconcile`), in the peer's delivery order. The driver parsed each block
    and checked its CID and signatures (on another thread: libsodium runs without the
    interpreter lock); the core judges the rest (topic, lineage, rights) as for a
    backfilled block and takes them in. ``done``: the reconciliation is over (whatever it
    fetched or not), so the topic's gaps ask for what is still missing as usual."""

    peer: PeerId
    topic: CID
    events: tuple[EventDescriptor, ...]
    done: bool = False


InEvent = (
    Received
    | PeerDown
    | SendFailed
    | TimerFired
    | BlockFetched
    | DhtStored
    | RecordStored
    | RecordsFetched
    | Subscribe
    | Unsubscribe
    | Publish
    | CreateTopic
    | UpdateTopic
    | Flush
    | Start
    | HistoryCut
    | CheckpointMade
    | Reconciled
)


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class Send:
    peer: PeerId
    message: Message


@dataclass(frozen=True, slots=True)
class SetTimer:
    delay: float
    timer: Timer


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
class StoreRecord:
    """Put this node's signed heads record in the DHT; the driver answers with
    ``RecordStored`` (publishes acknowledged by the core wait for it)."""

    record: HeadsRecord


@dataclass(frozen=True, slots=True)
class FetchRecords:
    """Look up the heads records of ``topic`` written by ``publishers``; the driver
    answers with ``RecordsFetched`` (always, even when it found nothing), carrying the same
    ``request``: 0 for the core's own syncs, a command's request for an ``UpdateTopic``
    that changes publishing rights."""

    topic: CID
    publishers: tuple[PeerId, ...]
    request: int = 0


@dataclass(frozen=True, slots=True)
class VersionAdopted:
    """``version`` is now the latest known version of the tree ``topic``: persist it so a
    restart judges by it and builds on it (it is also stored as a block)."""

    topic: CID
    version: TopicDescriptor


@dataclass(frozen=True, slots=True)
class KeepPublished:
    """This node published ``event`` on the tree ``topic``: the driver keeps it durably
    (before it lets anyone see the publish acknowledged) until it delivers the event itself,
    and passes what it kept back in ``Subscribe.unannounced`` after a restart. Without it a
    publisher killed after the DHT quorum but before its one tree copy arrived (or any
    HEADS or IHAVE named the event) would lose an acknowledged event."""

    topic: CID
    event: CID


@dataclass(frozen=True, slots=True)
class Published:
    request: int
    event: EventDescriptor


@dataclass(frozen=True, slots=True)
class TopicReady:
    """A ``CreateTopic`` or ``UpdateTopic`` is done: ``topic`` is stored and in use."""

    request: int
    topic: TopicDescriptor


FailureKind = Literal["refused", "invalid", "unpersisted", "unrecorded"]
"""Why a command failed, for what the caller may do: ``refused`` (the topic's rules, or
the node's state, say no), ``invalid`` (the command itself is malformed: settings the
schema refuses), ``unpersisted`` (too few DHT nodes stored it: try again when the network
is there) or ``unrecorded`` (the event was stored and sent, but no heads record naming it
reached the write quorum: it may still be delivered)."""


@dataclass(frozen=True, slots=True)
class CommandFailed:
    """The command ``request`` failed; ``reason`` says why in words for the caller, and
    ``kind`` what the caller may do about it (:data:`FailureKind`)."""

    request: int
    reason: str
    kind: FailureKind = "refused"


@dataclass(frozen=True, slots=True)
class Rejected:
    """An input refused, for the log and metrics: a peer's fault, never a crash."""

    peer: PeerId | None
    reason: str


@dataclass(frozen=True, slots=True)
class GapReported:
    """Delivery of ``topic`` went on without ``missing`` (an event that was still missing
    when the gap opened at ``since``). ``released`` events were delivered before their
    ancestor. ``reason``: ``timeout``, ``overflow`` (``max_pending``), ``evicted``
    (``max_gaps``) or ``invalid`` (the missing event exists but fails verification). For
    the runtime's log and metrics; the application may also be told."""

    topic: CID
    missing: CID
    since: float
    released: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reconcile:
    """Backfill met a gap too deep to walk (an answer of ``reconcile_after`` blocks did
    not reach what this node holds): reconcile ``topic``'s history with ``peer`` by
    ranges and fetch the difference, then answer with :class:`Reconciled` (``done``).
    The topic's gaps wait meanwhile, at most ``reconcile_timeout``."""

    topic: CID
    peer: PeerId


OutEvent = (
    Send
    | SetTimer
    | Deliver
    | StoreLocal
    | StoreDht
    | Fetch
    | StoreRecord
    | FetchRecords
    | VersionAdopted
    | KeepPublished
    | Published
    | TopicReady
    | CommandFailed
    | Rejected
    | GapReported
    | Reconcile
)

Out = list[OutEvent]
