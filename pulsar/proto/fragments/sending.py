"""The sending half of the fragment layer: large events pushed along the tree.

Owns :class:`Outgoing` (one per large event being sent) and :class:`Sender`: the targets
and helpers (``fanout``, ``also``), the EVENT first then the blocks in pre-order, staggered
groups, token-bucket pacing round-robin across events, IDONTWANT and FWANT answers, and the
bound on bytes held to be sent. See :mod:`pulsar.proto.fragments.layer` for the whole design.

Why separate: pacing and staggering are about this node's uplink and know nothing of
verifying what arrives; the receiving half (:mod:`pulsar.proto.fragments.receiving`) only
feeds verified blocks in here and asks for a sending to be started or abandoned.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dag import CID, PeerId, cid_of
from dag.cid import DAG_CBOR, RAW
from pulsar.proto import events as ev
from pulsar.proto.events import Out
from pulsar.proto.tree.messages import MAX_ALSO, Event

from .messages import Fragment, FWant, IDontWant
from .timers import FragmentTick

if TYPE_CHECKING:
    from .config import FragmentConfig

__all__ = ["Outgoing", "Sender"]

_UNWANTED = 4096
"""(peer, event) IDONTWANT pairs remembered for events not being sent yet."""


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


class Sender:
    """The sending state of one node's fragment layer (config and metrics are the
    :class:`~pulsar.proto.fragments.layer.Fragments` ones, shared)."""

    def __init__(self, config: FragmentConfig, metrics: dict[str, int]) -> None:
        self.config = config
        self.metrics = metrics
        self._sending: OrderedDict[CID, Outgoing] = OrderedDict()
        self._sending_bytes = 0
        self._answers: list[Outgoing] = []
        """FWANT answers (no EVENT first), paced like the rest."""
        self._unwanted: OrderedDict[tuple[PeerId, CID], None] = OrderedDict()
        self._tokens = float(self.config.burst)
        self._last_refill: float | None = None
        self._tick_armed = False
        self._rr = 0

    def sending(self, event: CID) -> Outgoing | None:
        """The sending of ``event``, if any."""
        return self._sending.get(event)

    def publish(
        self, topic: CID, head: Event, blocks: list[tuple[CID, bytes]], targets: list[PeerId],
        now: float, fresh: set[PeerId] | None = None,
    ) -> Out:
        """A large event held whole (its chunk tree in ``blocks``, pre-order) goes to
        ``targets`` (``fresh``: those that need the EVENT too; default all)."""
        fresh = set(targets) if fresh is None else fresh
        out = self.new_outgoing(topic, head, targets, fresh, now, held=False)
        if out is not None:
            seen: set[CID] = set()
            for cid, block in blocks:
                if cid not in seen:  # a payload may repeat a chunk: it travels once
                    seen.add(cid)
                    self.add_block(out, cid, block)
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

    def new_outgoing(
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

    def add_block(self, out: Outgoing, cid: CID, block: bytes) -> None:
        out.blocks.append((cid, block))
        out.size += len(block)
        self._sending_bytes += len(block)
        while self._sending_bytes > self.config.max_outgoing_bytes and self._sending:
            oldest = next(iter(self._sending.values()))
            self.metrics["outgoing_dropped"] += 1
            self.drop_outgoing(oldest)
            if oldest is out:
                break

    def drop_outgoing(self, out: Outgoing) -> None:
        if self._sending.get(out.event) is out:
            del self._sending[out.event]
        self._sending_bytes -= out.size
        out.size = 0

    def on_idontwant(self, peer: PeerId, msg: IDontWant) -> Out:
        """``peer`` has these events: it gets none of their fragments from here."""
        for event in msg.events:
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

    def close(self, topic: CID) -> None:
        """The node left ``topic``'s tree: forget what it was sending."""
        for out in list(self._sending.values()):
            if out.topic == topic:
                self.drop_outgoing(out)

    def abandon(self, event: CID) -> Out:
        """The payload of ``event`` will not arrive: targets that never got its EVENT get
        it unflagged (they deliver it and read the payload from the DHT); the sending is
        dropped."""
        out: Out = []
        sending = self._sending.get(event)
        if sending is not None:
            plain = sending.plain
            assert plain is not None
            for peer in sending.announce:
                out.append(ev.Send(peer, plain))
            for peer, index in sending.next.items():
                if index < 0:
                    out.append(ev.Send(peer, plain))
            self.drop_outgoing(sending)
        return out

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
                self.drop_outgoing(item)
        self._answers = [a for a in self._answers
                         if any(i < len(a.blocks) for i in a.next.values())]
