"""Turns a node's trace hooks into the records of :mod:`pulsar.testbed.trace`.

Copies of an event are classified here, per node: the first copy taken in by any way is a
``receive``, every later one a ``duplicate`` — so redundancy is measured the same way for
both protocols, whatever each one's core counts internally.
"""

from __future__ import annotations

from dag import CID, EventDescriptor, PeerId
from dag.cid import cid_of
from dag.codec import decode_fast

from ..proto.gossip_messages import Graft, Prune
from ..proto.messages import Event
from ..proto.repair_messages import Blocks, Want
from ..runtime.trace import Tracer
from .trace import TraceWriter, process_resources

__all__ = ["NodeTracer"]


class NodeTracer(Tracer):
    def __init__(self, writer: TraceWriter, life: int = 0) -> None:
        self.writer = writer
        self.life = life
        self._seen: set[CID] = set()
        self._hops: dict[CID, int] = {}

    # ------------------------------------------------------------------ hooks

    def sent(self, peer: PeerId, message: object, size: int) -> None:
        kind = type(message)
        if kind is Event:
            assert isinstance(message, Event)
            self.writer.write("send", peer=str(peer), topic=str(message.topic),
                              event=str(cid_of(message.block)), hop=message.hop, bytes=size,
                              msg="event")
        elif kind is Graft:
            assert isinstance(message, Graft)
            event = str(message.event) if message.event is not None else None
            self.writer.write("graft", peer=str(peer), topic=str(message.topic), event=event,
                              bytes=size)
        elif kind is Prune:
            assert isinstance(message, Prune)
            self.writer.write("prune", peer=str(peer), topic=str(message.topic), bytes=size)
        elif kind is Want:
            assert isinstance(message, Want)
            self.writer.write("backfill", peer=str(peer), topic=str(message.topic),
                              event=str(message.head), bytes=size)

    def received(self, peer: PeerId, message: object, size: int) -> None:
        kind = type(message)
        if kind is Event:
            assert isinstance(message, Event)
            self._copy(cid_of(message.block), str(peer), message.topic, message.hop, size,
                       "event")
        elif kind is Blocks:
            assert isinstance(message, Blocks)
            if message.blocks:
                share = size // len(message.blocks)
                for block in message.blocks:
                    self._copy(cid_of(block), str(peer), message.topic, None, share, "blocks")

    def fetched(self, cid: CID, block: bytes) -> None:
        # Only event blocks are copies (topic descriptors are fetched the same way).
        try:
            value = decode_fast(block)
        except Exception:
            return
        if isinstance(value, dict) and "publisher" in value and "topic" in value:
            raw = value["topic"]
            try:  # the fast decoder leaves links as raw CID bytes
                topic: CID | None = raw if isinstance(raw, CID) else CID(raw)
            except (TypeError, ValueError):
                topic = None
            self._copy(cid, None, topic, None, len(block), "dht")

    def delivered(self, topic: CID, event: EventDescriptor, hop: int) -> None:
        self.writer.write("deliver", topic=str(topic), event=str(event.cid), hop=hop)

    def published(self, event: EventDescriptor) -> None:
        self._seen.add(event.cid)
        size = len(event.payload) if isinstance(event.payload, bytes) else None
        self.writer.write("publish", topic=str(event.topic), event=str(event.cid),
                          parent=str(event.parent) if event.parent else None, bytes=size)

    # ------------------------------------------------------------------ resources

    def sample(self, sent: int, received: int, dht_sent: int, dht_received: int) -> None:
        cpu, rss = process_resources()
        self.writer.write("sample", cpu_s=round(cpu, 3), rss=rss, sent_bytes=sent,
                          recv_bytes=received, dht_sent_bytes=dht_sent,
                          dht_recv_bytes=dht_received, life=self.life)

    def _copy(self, cid: CID, peer: str | None, topic: CID | None, hop: int | None, size: int,
              via: str) -> None:
        kind = "duplicate" if cid in self._seen else "receive"
        self._seen.add(cid)
        self.writer.write(kind, peer=peer, topic=str(topic) if topic else None, event=str(cid),
                          hop=hop, bytes=size, msg=via)
