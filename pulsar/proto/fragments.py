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
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from dag import CID, EventDescriptor, PeerId, cid_of
from dag.chunks import MAX_DEPTH, parse_node
from dag.cid import DAG_CBOR, RAW
from dag.errors import ChunkError

from . import events as ev
from .events import Out
from .fragment_messages import MAX_WANTED, Fragment, FWant, IDontWant
from .messages import MAX_ALSO, Event
from .timers import FragmentStall, FragmentTick

__all__ = ["Completed", "FragmentConfig", "Fragments", "Outgoing", "Partial"]

_UNWANTED = 4096
"""(peer, event) IDONTWANT pairs remembered for events not being sent yet."""
_WANT_SOURCES = 3
"""Peers one stalled event asks at a time."""


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


@dataclass(slots=True)
class Outgoing:
    """A large event being sent: its blocks available so far (in order) and, per target,
    the next one it gets (-1: the EVENT first)."""

    topic: CID
    event: CID
    plain: Event | None
    """The event unflagged (for targets left without blocks when it is given up)."""
    targets: list[PeerId]
    started: float
    heads: dict[PeerId, Event] = field(default_factory=dict)
    """The EVENT each target gets first (flagged; with ``also`` for a helper); a target
    with none here already has it (it was named in an ``also``)."""
    announce: list[PeerId] = field(default_factory=list)
    """Targets that get the EVENT from here and the blocks from a helper."""
    helping: set[PeerId] = field(default_factory=set)
    """Targets named in an ``also``: the node that named them sends them no blocks, so
    their IDONTWANT (said to every neighbour when the EVENT came) does not stop ours."""
    blocks: list[tuple[CID, bytes]] = field(default_factory=list)
    next: dict[PeerId, int] = field(default_factory=dict)
    complete: bool = False
    held: bool = False
    """Store-and-forward: nothing goes out until the payload is complete."""
    size: int = 0
    cursor: int = 0


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


class Fragments:
    """The fragment layer of one node (see the module docstring)."""

    def __init__(self, config: FragmentConfig | None = None) -> None:
        self.config = config or FragmentConfig()
        self._partials: OrderedDict[CID, Partial] = OrderedDict()
        self._partial_bytes = 0
        self._sending: OrderedDict[CID, Outgoing] = OrderedDict()
        self._sending_bytes = 0
        self._answers: list[Outgoing] = []
        """FWANT answers (no EVENT first), paced like the rest."""
        self._unwanted: OrderedDict[tuple[PeerId, CID], None] = OrderedDict()
        self._fetches: dict[CID, CID] = {}
        """Block being fetched from the DHT -> the event that misses it."""
        self._completed: list[Completed] = []
        self._tokens = float(self.config.burst)
        self._last_refill: float | None = None
        self._tick_armed = False
        self._rr = 0
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

    # ------------------------------------------------------------------ queries

    def receiving(self, event: CID) -> bool:
        return event in self._partials

    def fetching(self, cid: CID) -> bool:
        return cid in self._fetches

    def take_completed(self) -> list[Completed]:
        done, self._completed = self._completed, []
        return done

    # ------------------------------------------------------------------ sending

    def publish(
        self, topic: CID, head: Event, blocks: list[tuple[CID, bytes]], targets: list[PeerId],
        now: float, fresh: set[PeerId] | None = None,
    ) -> Out:
        """A large event held whole (its chunk tree in ``blocks``, pre-order) goes to
        ``targets`` (``fresh``: those that need the EVENT too; default all)."""
        fresh = set(targets) if fresh is None else fresh
        out = self._new_outgoing(topic, head, targets, fresh, now, held=False)
        if out is not None:
            seen: set[CID] = set()
            for cid, block in blocks:
                if cid not in seen:  # a payload may repeat a chunk: it travels once
                    seen.add(cid)
                    self._add_block(out, cid, block)
            out.complete = True
        return []

    def add_target(
        self, topic: CID, head: Event, blocks: list[tuple[CID, bytes]], peer: PeerId,
        now: float,
    ) -> None:
        """One more peer wants a large event we hold whole (it grafted a lazy link): it
        gets the EVENT flagged and the chunk tree, like any target."""
        sending = self._sending.get(cid_of(head.block))
        if sending is None:
            self.publish(topic, head, blocks, [peer], now)
        elif peer not in sending.next:
            sending.targets.append(peer)
            sending.heads[peer] = head
            sending.next[peer] = -1

    def delegate(self, event: CID, peers: list[PeerId]) -> bool:
        """A peer that sent us ``event`` asks us to push its blocks to ``peers`` too (they
        have the EVENT). False if we are not sending it (the caller starts a sending)."""
        sending = self._sending.get(event)
        if sending is None:
            return False
        for peer in peers:
            if peer not in sending.next:
                sending.targets.append(peer)
                sending.next[peer] = 0
                sending.helping.add(peer)
        return True

    def _new_outgoing(
        self, topic: CID, head: Event, targets: list[PeerId], fresh: set[PeerId], now: float,
        *, held: bool, keep: bool = False,
    ) -> Outgoing | None:
        """Start sending ``head``'s event to ``targets`` (``fresh``: those that do not have
        the EVENT yet; the others were named in an ``also``). With ``keep``, a sending with
        no target is made too (a relay keeps the blocks for a later ``also``)."""
        event = cid_of(head.block)
        wanted = [p for p in targets if p not in fresh or (p, event) not in self._unwanted]
        if (not wanted and not keep) or event in self._sending:
            return None
        plain = Event(head.topic, head.block, head.hop)
        out = Outgoing(topic, event, plain, [], now, held=held)
        limit = self.config.fanout
        if limit:
            # Enough helpers that none is named more than MAX_ALSO peers to help.
            limit = max(limit, math.ceil(len(wanted) / (MAX_ALSO + 1)))
        direct = wanted[:limit] if limit and len(wanted) > limit else wanted
        helped: dict[PeerId, list[PeerId]] = {p: [] for p in direct}
        for i, peer in enumerate(wanted[len(direct):]):
            helped[direct[i % len(direct)]].append(peer)
            if peer in fresh:
                out.announce.append(peer)
        for peer in direct:
            if helped[peer]:
                out.heads[peer] = Event(head.topic, head.block, head.hop, True,
                                        tuple(helped[peer]))
            elif peer in fresh:
                out.heads[peer] = head
        out.targets = list(direct)
        out.next = {p: (-1 if p in out.heads else 0) for p in direct}
        out.helping = {p for p in direct if p not in fresh}
        self._sending[event] = out
        return out

    def _add_block(self, out: Outgoing, cid: CID, block: bytes) -> None:
        out.blocks.append((cid, block))
        out.size += len(block)
        self._sending_bytes += len(block)
        while self._sending_bytes > self.config.max_outgoing_bytes and self._sending:
            oldest = next(iter(self._sending.values()))
            self.metrics["outgoing_dropped"] += 1
            self._drop_outgoing(oldest)
            if oldest is out:
                break

    def _drop_outgoing(self, out: Outgoing) -> None:
        if self._sending.get(out.event) is out:
            del self._sending[out.event]
        self._sending_bytes -= out.size
        out.size = 0

    def on_idontwant(self, peer: PeerId, msg: IDontWant) -> Out:
        """``peer`` has these events: it gets none of their fragments from here."""
        for event in msg.events:
            partial = self._partials.get(event)
            if partial is not None:
                partial.sources[peer] = None
            out = self._sending.get(event)
            if out is not None and peer in out.helping:
                continue
            if out is not None and peer in out.next:
                self.metrics["fragments_saved"] += len(out.blocks) - max(0, out.next[peer])
                del out.next[peer]
                out.targets.remove(peer)
                continue
            self._unwanted[(peer, event)] = None
            if len(self._unwanted) > _UNWANTED:
                self._unwanted.popitem(last=False)
        return []

    def on_fwant(self, peer: PeerId, msg: FWant, lookup: Callable[[CID], bytes | None]) -> Out:
        """Answer with the blocks we hold (from what we are sending, else the store): a
        FRAGMENT each, paced like the rest; the others are left unsaid. A peer still queued
        for this event's fragments here is not answered: its turn will come."""
        sending = self._sending.get(msg.event)
        if sending is not None and peer in sending.next:
            return []
        held = {} if sending is None else dict(sending.blocks)
        answer = Outgoing(msg.topic, msg.event, None, [peer], 0.0, complete=True)
        answer.next = {peer: 0}
        for cid in msg.cids:
            if cid.codec not in (RAW, DAG_CBOR):
                continue
            block = held.get(cid) or lookup(cid)
            if block is not None:
                answer.blocks.append((cid, block))
        if answer.blocks:
            self.metrics["fwant_answered"] += 1
            if len(self._answers) < 256:
                self._answers.append(answer)
        return []

    def peer_down(self, peer: PeerId) -> None:
        for out in [*self._sending.values(), *self._answers]:
            if peer in out.next:
                del out.next[peer]
                out.targets.remove(peer)
        for partial in self._partials.values():
            partial.sources.pop(peer, None)

    def close(self, topic: CID) -> None:
        """The node left ``topic``'s tree: forget what it was sending and receiving."""
        for out in list(self._sending.values()):
            if out.topic == topic:
                self._drop_outgoing(out)
        for partial in list(self._partials.values()):
            if partial.topic == topic:
                self._forget(partial)

    def pump(self, now: float) -> Out:
        """Release what may go now: EVENTs and fragments to the eligible targets,
        round-robin across events, within the pacing budget. Arms the tick while anything
        waits."""
        if not self._sending and not self._answers:
            return []
        cfg = self.config
        if cfg.rate is not None:
            if self._last_refill is not None:
                self._tokens = min(
                    float(cfg.burst), self._tokens + cfg.rate * (now - self._last_refill)
                )
            self._last_refill = now
        out: Out = []
        queues: list[Outgoing] = [*self._sending.values(), *self._answers]
        for item in queues:
            # Every target learns of the event at once (so it neither repairs it nor takes
            # it from elsewhere, and says IDONTWANT); the blocks are staggered, and held
            # back until complete without cut-through.
            for peer in item.announce:
                out.append(ev.Send(peer, item.heads.get(peer) or self._flagged(item)))
            item.announce = []
            for peer, index in item.next.items():
                if index < 0:
                    out.append(self._emit(item, peer))
        waiting_for_time = False
        # Round-robin across events, carried over between pumps: the event after the one
        # served last goes first, so a big event cannot starve the others of the budget.
        start = self._rr % len(queues)
        queues = queues[start:] + queues[:start]
        while self._tokens > 0 or cfg.rate is None:
            progress = False
            for item in queues:
                pick = self._pick(item, now)
                if pick is None:
                    continue
                if isinstance(pick, str):
                    waiting_for_time = True
                    continue
                out.append(self._emit(item, pick))
                self._rr += 1
                progress = True
                if cfg.rate is not None and self._tokens <= 0:
                    break
            if not progress:
                break
        self._retire()
        if self._tick_armed:
            return out
        if cfg.rate is not None and self._has_work(now):
            self._tick_armed = True
            out.append(ev.SetTimer(cfg.tick, FragmentTick()))
        elif waiting_for_time:
            self._tick_armed = True
            out.append(ev.SetTimer(cfg.stagger_timeout / 4, FragmentTick()))
        return out

    def on_tick(self, now: float) -> Out:
        self._tick_armed = False
        return self.pump(now)

    def _pick(self, item: Outgoing, now: float) -> PeerId | str | None:
        """The next target of ``item`` to serve, round-robin among the eligible; "later"
        if some target waits only for its group's turn; None if nothing is due.

        Group ``g`` (targets ``g*stagger_group`` on) is eligible once ``g`` stagger
        timeouts passed, or once every earlier group has all the blocks available so far
        (the uplink would idle otherwise)."""
        if item.held or not item.targets:
            return None
        available = len(item.blocks)
        nxt = item.next
        group = self.config.stagger_group
        targets = item.targets
        if group:
            level = int((now - item.started) / self.config.stagger_timeout)
            for i, peer in enumerate(targets):
                if nxt[peer] < available:
                    level = max(level, i // group)
                    break
            eligible = min(len(targets), (level + 1) * group)
        else:
            eligible = len(targets)
        start = item.cursor if item.cursor < eligible else 0
        for k in range(eligible):
            i = (start + k) % eligible
            if nxt[targets[i]] < available:
                item.cursor = i + 1
                return targets[i]
        for peer in targets[eligible:]:
            if nxt[peer] < available:
                return "later"
        return None

    def _emit(self, item: Outgoing, peer: PeerId) -> ev.OutEvent:
        index = item.next[peer]
        if index < 0:
            head = item.heads[peer]
            item.next[peer] = 0
            if self.config.rate is not None:
                self._tokens -= len(head.block)
            return ev.Send(peer, head)
        cid, block = item.blocks[index]
        item.next[peer] = index + 1
        if self.config.rate is not None:
            self._tokens -= len(block)
        self.metrics["fragments_sent"] += 1
        return ev.Send(peer, Fragment(item.topic, item.event, cid, block))

    @staticmethod
    def _flagged(item: Outgoing) -> Event:
        assert item.plain is not None
        return Event(item.plain.topic, item.plain.block, item.plain.hop, True)

    def _has_work(self, now: float) -> bool:
        for item in [*self._sending.values(), *self._answers]:
            if not item.held and any(i < len(item.blocks) for i in item.next.values()):
                return True
        return False

    def _retire(self) -> None:
        """Forget sendings that are complete and fully sent."""
        for item in list(self._sending.values()):
            if item.complete and all(i >= len(item.blocks) for i in item.next.values()):
                self._drop_outgoing(item)
        self._answers = [a for a in self._answers
                         if any(i < len(a.blocks) for i in a.next.values())]

    # ------------------------------------------------------------------ receiving

    def receive(
        self, topic: CID, event: EventDescriptor, hop: int, sender: PeerId, head: Event,
        targets: list[PeerId], tell: list[PeerId], now: float,
        also: tuple[PeerId, ...] = (),
    ) -> Out:
        """A large event's EVENT arrived (flagged ``frags``): expect its chunk tree, queue it
        for ``targets`` as it comes (held until complete without cut-through), and tell
        ``tell`` (the other neighbours) IDONTWANT."""
        cfg = self.config
        root = event.payload
        assert isinstance(root, CID)
        out: Out = []
        if root.codec != DAG_CBOR:
            self._completed.append(Completed(topic, event, hop, sender, True, "root not a node"))
            return out
        while len(self._partials) >= cfg.max_partial:
            oldest = next(iter(self._partials.values()))
            out += self._give_up(oldest, "too many large events at once")
        partial = Partial(topic, event, hop, sender, now, {root: None}, now)
        partial.sources[sender] = None
        self._partials[event.cid] = partial
        fresh = set(targets)
        every = targets + [p for p in also if p not in fresh]
        self._new_outgoing(topic, head, every, fresh, now, held=not cfg.cut_through, keep=True)
        if cfg.idontwant and tell:
            message = IDontWant(topic, (event.cid,))
            for peer in tell:
                out.append(ev.Send(peer, message))
                self.metrics["idontwant_sent"] += 1
        out.append(ev.SetTimer(cfg.stall_timeout, FragmentStall(topic, event.cid, 0)))
        return out

    def on_fragment(self, peer: PeerId, msg: Fragment, now: float) -> Out:
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

    def on_fetched(self, cid: CID, block: bytes | None, now: float) -> Out:
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

    def _take(self, partial: Partial, cid: CID, block: bytes, now: float) -> Out:
        """A verified block of ``partial``'s chunk tree: learn what it names, keep it, queue
        it for the targets; complete the event when nothing is missing."""
        cfg = self.config
        self.metrics["fragments_received"] += 1
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
                    self._give_up(oldest, "too many bytes of large events at once")
            if any(link.codec not in (RAW, DAG_CBOR) for link in links):
                return self._give_up(partial, "chunk tree links something else")
            partial.nodes[cid] = (size, links)
            for link in links:
                if link in partial.missing or link in partial.nodes or link in partial.leaves:
                    continue
                partial.missing[link] = None
                partial.expected += 1
            if partial.expected > cfg.max_fragments:
                return self._give_up(partial, "chunk tree has too many blocks")
        else:
            partial.leaves[cid] = len(block)
            partial.received += len(block)
            if partial.size is not None and partial.received > partial.size:
                return self._give_up(partial, "chunk tree holds more than it declares")
        del partial.missing[cid]
        partial.last_progress = now
        out: Out = [ev.StoreLocal(cid, block)]
        sending = self._sending.get(partial.event.cid)
        if sending is not None:
            self._add_block(sending, cid, block)
        if not partial.missing:
            if not _sizes_add_up(partial):
                return out + self._give_up(partial, "chunk tree sizes do not add up")
            self.metrics["large_completed"] += 1
            self._forget(partial)
            if sending is not None:
                sending.complete = True
                sending.held = False
            self._completed.append(
                Completed(partial.topic, partial.event, partial.hop, partial.sender, False)
            )
        return out

    def on_stall(self, timer: FragmentStall, now: float) -> Out:
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
        out: Out = []
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

    def _give_up(self, partial: Partial, reason: str) -> Out:
        """Stop receiving ``partial``: the core delivers it (the payload is read from the
        DHT later), targets that never got its EVENT get it unflagged, so they too deliver
        it and read the payload from the DHT."""
        self.metrics["large_given_up"] += 1
        self._forget(partial)
        self._completed.append(
            Completed(partial.topic, partial.event, partial.hop, partial.sender, True, reason)
        )
        out: Out = []
        sending = self._sending.get(partial.event.cid)
        if sending is not None:
            plain = sending.plain
            assert plain is not None
            for peer in sending.announce:
                out.append(ev.Send(peer, plain))
            for peer, index in sending.next.items():
                if index < 0:
                    out.append(ev.Send(peer, plain))
            self._drop_outgoing(sending)
        return out

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
