"""Turns a node's trace hooks into the records of :mod:`pulsar.tools.testbed.trace`.

Copies of an event are classified here, per node: the first copy taken in by any way is a
``receive``, every later one a ``duplicate`` — so redundancy is measured the same way for
both protocols, whatever each one's core counts internally.
"""

from __future__ import annotations

from dag import CID, EventDescriptor, PeerId
from dag.cid import cid_of
from dag.codec import decode_fast
from pulsar.proto.gossip.messages import Graft, Prune
from pulsar.proto.repair.messages import Blocks, Want
from pulsar.proto.tree.messages import Event
from pulsar.runtime.trace import Tracer

from .trace import TraceWriter, process_resources

__all__ = ["NodeTracer"]


class NodeTracer(Tracer):
    """Text forms are cached: a peer id's base58 and a CID's base32 cost more than the rest
    of a record, and the same few peers, topics and events recur in every record."""

    def __init__(self, writer: TraceWriter, life: int = 0) -> None:
        self.writer = writer
        self.life = life
        self._seen: set[CID] = set()
        self._text: dict[object, str] = {}
        self._last_sent: tuple[bytes, str] | None = None
        self._sent_by_type: dict[str, int] = {}

    def _str(self, value: object) -> str:
        text = self._text.get(value)
        if text is None:
            if len(self._text) > 200_000:
                self._text.clear()
            text = self._text[value] = str(value)
        return text

    def _block_cid(self, block: bytes) -> str:
        # One EVENT message object is sent to every neighbour in turn: hash it once.
        last = self._last_sent
        if last is not None and last[0] is block:
            return last[1]
        text = self._str(cid_of(block))
        self._last_sent = (block, text)
        return text

    # ------------------------------------------------------------------ hooks

    def sent(self, peer: PeerId, message: object, size: int) -> None:
        kind = type(message)
        name = getattr(kind, "T", kind.__name__)
        self._sent_by_type[name] = self._sent_by_type.get(name, 0) + size
        if kind is Event:
            assert isinstance(message, Event)
            self.writer.write("send", peer=self._str(peer), topic=self._str(message.topic),
                              event=self._block_cid(message.block), hop=message.hop,
                              bytes=size, msg="event")
        elif kind is Graft:
            assert isinstance(message, Graft)
            event = str(message.event) if message.event is not None else None
            self.writer.write("graft", peer=self._str(peer), topic=self._str(message.topic),
                              event=event, bytes=size)
        elif kind is Prune:
            assert isinstance(message, Prune)
            self.writer.write("prune", peer=self._str(peer), topic=self._str(message.topic),
                              bytes=size)
        elif kind is Want:
            assert isinstance(message, Want)
            self.writer.write("backfill", peer=self._str(peer), topic=self._str(message.topic),
                              event=self._str(message.head), bytes=size)

    def received(self, peer: PeerId, message: object, size: int) -> None:
        kind = type(message)
        if kind is Event:
            assert isinstance(message, Event)
            self._copy(cid_of(message.block), self._str(peer), message.topic, message.hop, size,
                       "event")
        elif kind is Blocks:
            assert isinstance(message, Blocks)
            if message.blocks:
                share = size // len(message.blocks)
                for block in message.blocks:
                    self._copy(cid_of(block), self._str(peer), message.topic, None, share,
                               "blocks")

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
        self.writer.write("deliver", topic=self._str(topic), event=self._str(event.cid), hop=hop)

    def published(self, event: EventDescriptor) -> None:
        self._seen.add(event.cid)
        size = len(event.payload) if isinstance(event.payload, bytes) else None
        self.writer.write("publish", topic=self._str(event.topic), event=self._str(event.cid),
                          parent=str(event.parent) if event.parent else None, bytes=size)

    # ------------------------------------------------------------------ resources

    def sample(self, sent: int, received: int, dht_sent: int, dht_received: int,
               dht_by_rpc: dict[str, int] | None = None,
               overlay: dict[str, list[float | bool | None]] | None = None,
               counters: dict[str, int] | None = None,
               trees: dict[str, list[list[str]]] | None = None) -> None:
        cpu, rss = process_resources()
        self.writer.write("sample", cpu_s=round(cpu, 3), rss=rss, sent_bytes=sent,
                          recv_bytes=received, dht_sent_bytes=dht_sent,
                          dht_recv_bytes=dht_received, life=self.life,
                          sent_by_type=dict(self._sent_by_type),
                          dht_sent_by_rpc=dict(dht_by_rpc or {}),
                          overlay=dict(overlay or {}), counters=dict(counters or {}),
                          trees=dict(trees or {}))

    def _copy(self, cid: CID, peer: str | None, topic: CID | None, hop: int | None, size: int,
              via: str) -> None:
        kind = "duplicate" if cid in self._seen else "receive"
        self._seen.add(cid)
        self.writer.write(kind, peer=peer, topic=self._str(topic) if topic else None,
                          event=self._str(cid), hop=hop, bytes=size, msg=via)
