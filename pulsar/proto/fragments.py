"""Large events along the tree: fragments relayed as they arrive, IDONTWANT, staggered and
paced sends, bounded partial state with an explicit give-up and repair.

Why: an event whose payload only links a chunk tree in the DHT makes every subscriber pull
the chunks from the same k DHT holders (a thundering herd, and latency in DHT look-ups
rather than tree hops). Here the chunk-tree blocks themselves travel the tree as FRAGMENT
messages right behind the event (see ``docs/protocol.md``), as GossipSub's large-message
work proposes (``gossipsub-large-messages-paper.txt``).

Two halves, one per direction, both sans-I/O:

* **Receiving** (:class:`Partial`, one per large event being received): every fragment is
  checked against a CID the node already trusts — the event's signed payload link names the
  root, each verified node names its children — before it is stored or forwarded; anything
  else is dropped. The chunk tree's declared size is checked against
  ``max_event_size`` and the bytes that arrive against the declared size. At most
  ``max_partial`` events (``max_partial_bytes`` declared) are received at once; the oldest
  gives way. An event whose fragments stop coming asks the peers known to have it (FWANT),
  then the DHT, then is given up: it is delivered without its payload in the local store,
  and the application's read pulls the payload from the DHT (the later repair).
* **Sending** (:class:`Outgoing`, one per large event being sent): each target first gets
  the EVENT (flagged ``frags``), then the blocks in pre-order. Targets are served in groups
  of ``stagger_group`` (the paper's staggered sends): the next group starts once the earlier
  ones have everything available so far, or after ``stagger_timeout``. With ``rate`` (the
  uplink's bytes/s) fragments are paced by a token bucket and taken round-robin across the
  events queued, so a small event (never queued here) goes out ahead of the rest of a big
  one and one big event does not hold another back. A peer that said IDONTWANT, or went
  down, is dropped from every target list. At most ``fanout`` targets get the blocks
  from this node; the others get the EVENT from it and the blocks from one of those
  helpers, named in the helper's EVENT (``also``): a star-shaped tree's root would
  otherwise send one copy per member, and cut-through pipelines best along a deep path.

Cut-through: with ``cut_through`` a relay queues each verified fragment for its targets at
once; without it (store-and-forward, the baseline) it sends nothing until the whole payload
arrived and verified. The core delivers a large event only when its payload is complete
(:meth:`Fragments.take_completed`).

Layout: the receiving half lives in :mod:`pulsar.proto.fragment_receiving`, the sending
half in :mod:`pulsar.proto.fragment_sending`; this module holds the configuration and
:class:`Fragments`, the one object the core talks to, which composes the two and owns the
metrics they share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dag import CID, EventDescriptor, PeerId

from .events import Out
from .fragment_messages import Fragment, FWant, IDontWant
from .fragment_receiving import Completed, Partial, Receiver
from .fragment_sending import Outgoing, Sender
from .messages import Event
from .timers import FragmentStall

__all__ = ["Completed", "FragmentConfig", "Fragments", "Outgoing", "Partial"]


@dataclass(frozen=True, slots=True)
class FragmentConfig:
    """How large events travel; defaults for a laptop on a home uplink."""

    enabled: bool = True
    """Push the chunk tree of large events down the tree (False: the event carries only
    the link and every reader pulls the payload from the DHT, as before)."""
    threshold: int = 32 * 1024
    """Payloads above this travel as fragments (the driver splits them)."""
    max_event_size: int = 16 * 1024 * 1024
    """The largest payload a node publishes or receives; larger publishes fail at once."""
    cut_through: bool = True
    """Relay each fragment as soon as it is verified (False: store-and-forward)."""
    idontwant: bool = True
    """Tell the other neighbours at once when a large event starts arriving."""
    fanout: int = 3
    """Targets this node pushes a large event's blocks to itself; every other target gets
    the EVENT from it and the blocks from one of those, asked by the EVENT's ``also``
    (0: no limit). A star-shaped tree would otherwise have its root's uplink carry N
    copies; this turns the payload's path into a tree of degree ``fanout``."""
    stagger_group: int = 2
    """Targets served at a time per event (0: all at once)."""
    stagger_timeout: float = 0.5
    """After this long a group's successor starts even if the group is not caught up."""
    rate: float | None = None
    """The uplink's bytes/s for pacing fragments (None: hand them to the transport at
    once; then only staggering orders them)."""
    burst: int = 64 * 1024
    """Bytes the pacer may release at once."""
    tick: float = 0.01
    """Pacing tick (seconds)."""
    max_partial: int = 8
    """Large events received at once; the oldest is given up for a new one."""
    max_partial_bytes: int = 64 * 1024 * 1024
    """Their declared payload sizes together."""
    max_fragments: int = 8192
    """Blocks one event's chunk tree may have (16 MiB in 6 KiB leaves is 2,754)."""
    max_outgoing_bytes: int = 64 * 1024 * 1024
    """Fragment bytes held to be sent; beyond it the oldest sending is dropped (its
    targets repair)."""
    stall_timeout: float = 5.0
    """No fragment for this long: ask the neighbours, then the DHT, then give up."""
    want_rounds: int = 2
    """FWANT rounds before the DHT is asked."""
    fetch_parallel: int = 32
    """DHT fetches of missing blocks at once, per event."""

    def __post_init__(self) -> None:
        if self.threshold < 1 or self.max_event_size < self.threshold:
            raise ValueError("need 1 <= threshold <= max_event_size")
        if self.stagger_group < 0 or self.max_partial < 1 or self.max_fragments < 2:
            raise ValueError("stagger_group >= 0, max_partial >= 1, max_fragments >= 2")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("rate must be positive bytes/s or None")
        if not (self.tick > 0 and self.stall_timeout > 0 and self.stagger_timeout > 0):
            raise ValueError("tick, stall_timeout and stagger_timeout must be positive")


class Fragments:
    """The fragment layer of one node (see the module docstring): a :class:`Receiver`
    and a :class:`Sender` sharing this object's ``config`` and ``metrics``."""

    def __init__(self, config: FragmentConfig | None = None) -> None:
        self.config = config or FragmentConfig()
        self.metrics: dict[str, int] = {
            "fragments_received": 0,
            "fragments_sent": 0,
            "fragments_duplicate": 0,
            "fragments_unexpected": 0,
            "fragments_bad": 0,
            "fragments_saved": 0,
            "idontwant_sent": 0,
            "fwant_sent": 0,
            "fwant_answered": 0,
            "fragment_fetches": 0,
            "large_completed": 0,
            "large_given_up": 0,
            "outgoing_dropped": 0,
        }
        self._sender = Sender(self.config, self.metrics)
        self._receiver = Receiver(self.config, self.metrics, self._sender)

    # ------------------------------------------------------------------ queries

    def receiving(self, event: CID) -> bool:
        return self._receiver.receiving(event)

    def fetching(self, cid: CID) -> bool:
        return self._receiver.fetching(cid)

    def take_completed(self) -> list[Completed]:
        return self._receiver.take_completed()

    # ------------------------------------------------------------------ sending

    def publish(
        self, topic: CID, head: Event, blocks: list[tuple[CID, bytes]], targets: list[PeerId],
        now: float, fresh: set[PeerId] | None = None,
    ) -> Out:
        """A large event held whole (its chunk tree in ``blocks``, pre-order) goes to
        ``targets`` (``fresh``: those that need the EVENT too; default all)."""
        return self._sender.publish(topic, head, blocks, targets, now, fresh)

    def add_target(
        self, topic: CID, head: Event, blocks: list[tuple[CID, bytes]], peer: PeerId,
        now: float,
    ) -> None:
        """One more peer wants a large event we hold whole (it grafted a lazy link)."""
        self._sender.add_target(topic, head, blocks, peer, now)

    def delegate(self, event: CID, peers: list[PeerId]) -> bool:
        """A peer that sent us ``event`` asks us to push its blocks to ``peers`` too. False
        if we are not sending it (the caller starts a sending)."""
        return self._sender.delegate(event, peers)

    def on_idontwant(self, peer: PeerId, msg: IDontWant) -> Out:
        """``peer`` has these events: a source if they stall, and it gets none of their
        fragments from here."""
        self._receiver.on_idontwant(peer, msg)
        return self._sender.on_idontwant(peer, msg)

    def on_fwant(self, peer: PeerId, msg: FWant, lookup: Callable[[CID], bytes | None]) -> Out:
        """Answer with the blocks we hold, paced like the rest."""
        return self._sender.on_fwant(peer, msg, lookup)

    def peer_down(self, peer: PeerId) -> None:
        self._sender.peer_down(peer)
        self._receiver.peer_down(peer)

    def close(self, topic: CID) -> None:
        """The node left ``topic``'s tree: forget what it was sending and receiving."""
        self._sender.close(topic)
        self._receiver.close(topic)

    def pump(self, now: float) -> Out:
        """Release what may go now, within the pacing budget; arms the tick while anything
        waits."""
        return self._sender.pump(now)

    def on_tick(self, now: float) -> Out:
        return self._sender.on_tick(now)

    # ------------------------------------------------------------------ receiving

    def receive(
        self, topic: CID, event: EventDescriptor, hop: int, sender: PeerId, head: Event,
        targets: list[PeerId], tell: list[PeerId], now: float,
        also: tuple[PeerId, ...] = (),
    ) -> Out:
        """A large event's EVENT arrived (flagged ``frags``): expect its chunk tree, queue it
        for ``targets`` as it comes, and tell ``tell`` IDONTWANT."""
        return self._receiver.receive(topic, event, hop, sender, head, targets, tell, now, also)

    def on_fragment(self, peer: PeerId, msg: Fragment, now: float) -> Out:
        return self._receiver.on_fragment(peer, msg, now)

    def on_fetched(self, cid: CID, block: bytes | None, now: float) -> Out:
        return self._receiver.on_fetched(cid, block, now)

    def on_stall(self, timer: FragmentStall, now: float) -> Out:
        """No fragment for ``stall_timeout``: ask the neighbours, the DHT, then give up."""
        return self._receiver.on_stall(timer, now)
