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
arrived and verified. The core delivers a large event only when its payload is complete:
receiving yields a :class:`Completed` among its outputs (``FragOut``) when it is, or when
it gave up on it.

Layout: the receiving half lives in :mod:`pulsar.proto.fragments.receiving`, the sending
half in :mod:`pulsar.proto.fragments.sending`; this module holds the configuration and
:class:`Fragments`, the one object the core talks to, which composes the two and owns the
metrics they share.
"""

from __future__ import annotations

from collections.abc import Callable

from dag import CID, EventDescriptor, PeerId
from pulsar.proto.events import Out
from pulsar.proto.tree.messages import Event

from .config import FragmentConfig
from .messages import Fragment, FWant, IDontWant
from .receiving import Completed, FragOut, Partial, Receiver
from .sending import Outgoing, Sender
from .timers import FragmentStall

__all__ = ["Completed", "FragOut", "Fragments", "Outgoing", "Partial"]


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
    ) -> FragOut:
        """A large event's EVENT arrived (flagged ``frags``): expect its chunk tree, queue it
        for ``targets`` as it comes, and tell ``tell`` IDONTWANT."""
        return self._receiver.receive(topic, event, hop, sender, head, targets, tell, now, also)

    def on_fragment(self, peer: PeerId, msg: Fragment, now: float) -> FragOut:
        return self._receiver.on_fragment(peer, msg, now)

    def on_fetched(self, cid: CID, block: bytes | None, now: float) -> FragOut:
        return self._receiver.on_fetched(cid, block, now)

    def on_stall(self, timer: FragmentStall, now: float) -> FragOut:
        """No fragment for ``stall_timeout``: ask the neighbours, the DHT, then give up."""
        return self._receiver.on_stall(timer, now)
