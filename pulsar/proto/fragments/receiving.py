"""The receiving half of the fragment layer: partial payloads, verification, stalls and
give-up.

Owns :class:`Partial` (one per large event being received), :class:`Completed` and
:class:`Receiver`: every fragment is checked against a CID already trusted before it is
stored or relayed, declared sizes against the limits and the bytes that arrive, the bound
on events (and bytes) received at once, and the stall ladder (FWANT, then the DHT, then
give up). See :mod:`pulsar.proto.fragments.layer` for the whole design.

Why separate: what a node accepts is a safety question, apart from how it paces what it
relays; this half hands each verified block to the sending half
(:mod:`pulsar.proto.fragments.sending`) and never reaches into its queues.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dag import CID, EventDescriptor, PeerId
from dag.chunks import MAX_DEPTH, parse_node
from dag.cid import DAG_CBOR, RAW
from dag.errors import ChunkError
from pulsar.proto import events as ev
from pulsar.proto.events import Out, OutEvent
from pulsar.proto.tree.messages import Event

from .messages import MAX_WANTED, Fragment, FWant, IDontWant
from .sending import Sender
from .timers import FragmentStall

if TYPE_CHECKING:
    from .config import FragmentConfig

__all__ = ["Completed", "FragOut", "Partial", "Receiver"]

_WANT_SOURCES = 3
"""Peers one stalled event asks at a time."""


@dataclass(slots=True)
class Partial:
    """A large event being received: what is still missing, and who has it."""

    topic: CID
    event: EventDescriptor
    hop: int
    sender: PeerId
    started: float
    missing: dict[CID, None]
    last_progress: float
    size: int | None = None
    """Declared by the root node, once it arrived."""
    received: int = 0
    """Bytes of the distinct leaves verified so far."""
    expected: int = 1
    """Distinct blocks named so far (the root, and the links of the nodes that arrived)."""
    nodes: dict[CID, tuple[int, list[CID]]] = field(default_factory=dict)
    """Verified nodes: declared size and links (a payload may repeat a leaf or a whole
    subtree, so sizes are added up over the structure once it is complete)."""
    leaves: dict[CID, int] = field(default_factory=dict)
    """Verified leaves and their sizes."""
    sources: dict[PeerId, None] = field(default_factory=dict)
    stage: int = 0
    """0: the tree; 1..want_rounds: FWANT rounds; then the DHT."""
    stall_seq: int = 0
    fetching: set[CID] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Completed:
    """A large event received in full (``gave_up`` False), or given up: the core delivers
    it either way (given up, its payload is read from the DHT)."""

    topic: CID
    event: EventDescriptor
    hop: int
    sender: PeerId
    gave_up: bool
    reason: str = ""


FragOut = list[OutEvent | Completed]
"""What receiving yields: outputs, and the large events it completed or gave up."""


class Receiver:
    """The receiving state of one node's fragment layer (config and metrics are the
    :class:`~pulsar.proto.fragments.layer.Fragments` ones, shared); verified blocks go to
    ``sender``."""

    def __init__(self, config: FragmentConfig, metrics: dict[str, int], sender: Sender) -> None:
        self.config = config
        self.metrics = metrics
        self._sender = sender
        self._partials: OrderedDict[CID, Partial] = OrderedDict()
        self._partial_bytes = 0
        self._fetches: dict[CID, CID] = {}
        """Block being fetched from the DHT -> the event that misses it."""

    def receiving(self, event: CID) -> bool:
        return event in self._partials

    def fetching(self, cid: CID) -> bool:
        return cid in self._fetches

    def on_idontwant(self, peer: PeerId, msg: IDontWant) -> None:
        """``peer`` has these events: it is a source to ask if they stall."""
        for event in msg.events:
            partial = self._partials.get(event)
            if partial is not None:
                partial.sources[peer] = None

    def peer_down(self, peer: PeerId) -> None:
        for partial in self._partials.values():
            partial.sources.pop(peer, None)

    def close(self, topic: CID) -> None:
        """The node left ``topic``'s tree: forget what it was receiving."""
        for partial in list(self._partials.values()):
            if partial.topic == topic:
                self._forget(partial)

    def receive(
        self, topic: CID, event: EventDescriptor, hop: int, sender: PeerId, head: Event,
        targets: list[PeerId], tell: list[PeerId], now: float,
        also: tuple[PeerId, ...] = (),
    ) -> FragOut:
        """A large event's EVENT arrived (flagged ``frags``): expect its chunk tree, queue it
        for ``targets`` as it comes (held until complete without cut-through), and tell
        ``tell`` (the other neighbours) IDONTWANT."""
        cfg = self.config
        root = event.payload
        assert isinstance(root, CID)
        out: FragOut = []
        if root.codec != DAG_CBOR:
            return [Completed(topic, event, hop, sender, True, "root not a node")]
        while len(self._partials) >= cfg.max_partial:
            oldest = next(iter(self._partials.values()))
            out += self._give_up(oldest, "too many large events at once")
        partial = Partial(topic, event, hop, sender, now, {root: None}, now)
        partial.sources[sender] = None
        self._partials[event.cid] = partial
        fresh = set(targets)
        every = targets + [p for p in also if p not in fresh]
        self._sender.new_outgoing(
            topic, head, every, fresh, now, held=not cfg.cut_through, keep=True
        )
        if cfg.idontwant and tell:
            message = IDontWant(topic, (event.cid,))
            for peer in tell:
                out.append(ev.Send(peer, message))
                self.metrics["idontwant_sent"] += 1
        out.append(ev.SetTimer(cfg.stall_timeout, FragmentStall(topic, event.cid, 0)))
        return out

    def on_fragment(self, peer: PeerId, msg: Fragment, now: float) -> FragOut:
        partial = self._partials.get(msg.event)
        if partial is None or partial.topic != msg.topic:
            # Late (the event completed) or never announced: not kept, never forwarded.
            self.metrics["fragments_unexpected"] += 1
            return []
        if msg.cid not in partial.missing:
            self.metrics["fragments_duplicate"] += 1
            return []
        if not msg.cid.verifies(msg.block):
            self.metrics["fragments_bad"] += 1
            return [ev.Rejected(peer, f"fragment {msg.cid} of {msg.event} fails its CID")]
        partial.sources[peer] = None
        return self._take(partial, msg.cid, msg.block, now)

    def on_fetched(self, cid: CID, block: bytes | None, now: float) -> FragOut:
        event = self._fetches.pop(cid, None)
        partial = None if event is None else self._partials.get(event)
        if partial is None:
            return []
        partial.fetching.discard(cid)
        if block is None or not cid.verifies(block):
            return self._give_up(partial, f"block {cid} found nowhere")
        if cid not in partial.missing:
            return []
        out = self._take(partial, cid, block, now)
        if partial.event.cid in self._partials:
            out += self._fetch_more(partial)
        return out

    def _take(self, partial: Partial, cid: CID, block: bytes, now: float) -> FragOut:
        """A verified block of ``partial``'s chunk tree: learn what it names, keep it, queue
        it for the targets; complete the event when nothing is missing."""
        cfg = self.config
        self.metrics["fragments_received"] += 1
        evicted: FragOut = []
        if cid.codec == DAG_CBOR:
            try:
                size, links = parse_node(cid, block)
            except ChunkError as exc:
                return self._give_up(partial, str(exc))
            if partial.size is None:
                if size > cfg.max_event_size:
                    return self._give_up(partial, f"payload of {size} bytes is over the limit")
                partial.size = size
                self._partial_bytes += size
                while self._partial_bytes > cfg.max_partial_bytes and len(self._partials) > 1:
                    oldest = next(iter(self._partials.values()))
                    if oldest is partial:
                        break
                    evicted += self._give_up(oldest, "too many bytes of large events at once")
            if any(link.codec not in (RAW, DAG_CBOR) for link in links):
                return evicted + self._give_up(partial, "chunk tree links something else")
            partial.nodes[cid] = (size, links)
            for link in links:
                if link in partial.missing or link in partial.nodes or link in partial.leaves:
                    continue
                partial.missing[link] = None
                partial.expected += 1
            if partial.expected > cfg.max_fragments:
                return evicted + self._give_up(partial, "chunk tree has too many blocks")
        else:
            partial.leaves[cid] = len(block)
            partial.received += len(block)
            if partial.size is not None and partial.received > partial.size:
                return self._give_up(partial, "chunk tree holds more than it declares")
        del partial.missing[cid]
        partial.last_progress = now
        out: FragOut = [*evicted, ev.StoreLocal(cid, block)]
        sending = self._sender.sending(partial.event.cid)
        if sending is not None:
            self._sender.add_block(sending, cid, block)
        if not partial.missing:
            if not _sizes_add_up(partial):
                return out + self._give_up(partial, "chunk tree sizes do not add up")
            self.metrics["large_completed"] += 1
            self._forget(partial)
            if sending is not None:
                sending.complete = True
                sending.held = False
            out.append(Completed(partial.topic, partial.event, partial.hop, partial.sender, False))
        return out

    def on_stall(self, timer: FragmentStall, now: float) -> FragOut:
        """No fragment for ``stall_timeout``: ask the neighbours that have the event, then
        the DHT, then give up."""
        partial = self._partials.get(timer.event)
        if partial is None or timer.seq != partial.stall_seq:
            return []
        cfg = self.config
        partial.stall_seq += 1
        quiet = now - partial.last_progress
        if quiet < cfg.stall_timeout * 0.99:
            # Progress since the check was armed: look again when it would be stalled
            # (never sooner than a hundredth of the timeout: float time must move on).
            delay = max(cfg.stall_timeout - quiet, cfg.stall_timeout / 100)
            again = FragmentStall(partial.topic, timer.event, partial.stall_seq)
            return [ev.SetTimer(delay, again)]
        partial.stage += 1
        out: FragOut = []
        if partial.stage <= cfg.want_rounds and partial.sources:
            cids = tuple(list(partial.missing)[:MAX_WANTED])
            want = FWant(partial.topic, timer.event, cids)
            for peer in list(partial.sources)[-_WANT_SOURCES:]:
                out.append(ev.Send(peer, want))
                self.metrics["fwant_sent"] += 1
        elif partial.stage <= cfg.want_rounds + 1:
            out += self._fetch_more(partial)
        else:
            return self._give_up(partial, "no fragment from the tree, neighbours or the DHT")
        out.append(ev.SetTimer(cfg.stall_timeout,
                               FragmentStall(partial.topic, timer.event, partial.stall_seq)))
        return out

    def _fetch_more(self, partial: Partial) -> Out:
        out: Out = []
        for cid in partial.missing:
            if len(partial.fetching) >= self.config.fetch_parallel:
                break
            if cid in partial.fetching or cid in self._fetches:
                continue
            partial.fetching.add(cid)
            self._fetches[cid] = partial.event.cid
            self.metrics["fragment_fetches"] += 1
            out.append(ev.Fetch(cid))
        return out

    def _give_up(self, partial: Partial, reason: str) -> FragOut:
        """Stop receiving ``partial``: the core delivers it (the payload is read from the
        DHT later), targets that never got its EVENT get it unflagged, so they too deliver
        it and read the payload from the DHT."""
        self.metrics["large_given_up"] += 1
        self._forget(partial)
        gave_up = Completed(partial.topic, partial.event, partial.hop, partial.sender, True, reason)
        return [*self._sender.abandon(partial.event.cid), gave_up]

    def _forget(self, partial: Partial) -> None:
        if self._partials.pop(partial.event.cid, None) is not None and partial.size is not None:
            self._partial_bytes -= partial.size
        for cid in partial.fetching:
            self._fetches.pop(cid, None)
        partial.fetching.clear()


def _sizes_add_up(partial: Partial) -> bool:
    """Every node of the complete tree declares the size its children hold (as
    :func:`dag.chunks.assemble` checks), so the payload is exactly the root's size."""
    totals: dict[CID, int] = dict(partial.leaves)
    pending = [cid for cid in partial.nodes]
    # Children before parents: repeat until every node is summed (depth is bounded).
    for _ in range(MAX_DEPTH + 1):
        left = []
        for cid in pending:
            size, links = partial.nodes[cid]
            if all(link in totals for link in links):
                if sum(totals[link] for link in links) != size:
                    return False
                totals[cid] = size
            else:
                left.append(cid)
        pending = left
        if not pending:
            break
    root = partial.event.payload
    return not pending and isinstance(root, CID) and totals.get(root) == partial.size
