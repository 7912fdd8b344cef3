"""BATCH: the control messages of many topics for one neighbour, in one frame.

A node in thousands of topics would otherwise send thousands of small frames per period to
the same neighbour (HEADS, IHAVE, SHUFFLE, PRUNE, GRAFT, each naming one topic). The core
packs every such message it emits to one peer in one step into a BATCH
(:func:`pulsar.proto.batch.packing.coalesce`),
so control traffic costs one frame per neighbour per period. Only those kinds may be inside
(never a BATCH, never an event or a JOIN), at most :data:`MAX_BATCH` of them, and the
receiver handles them in order exactly as if they had come one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from pulsar.proto.fields import MessageError
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.repair.messages import Heads, HeadsDigest

__all__ = ["BATCH_BYTES", "BATCH_KINDS", "MAX_BATCH", "Batch", "BatchItem"]

MAX_BATCH: Final = 256
"""Messages in one BATCH."""
BATCH_BYTES: Final = 256 * 1024
"""The estimated encoded size at which the core starts another BATCH."""

BatchItem = Heads | HeadsDigest | IHave | Shuffle | Prune | Graft
BATCH_KINDS: Final = frozenset(cls.T for cls in (Heads, HeadsDigest, IHave, Shuffle, Prune, Graft))
"""The message types a BATCH may carry."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Several control messages for the receiver, to be handled in order."""

    messages: tuple[BatchItem, ...]
    T: ClassVar[str] = "batch"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"msgs"})

    def to_wire(self) -> dict[str, Any]:
        return {"t": self.T, "msgs": [m.to_wire() for m in self.messages]}

    @staticmethod
    def items_of(m: dict[str, Any]) -> list[dict[str, Any]]:
        """The maps of the messages a BATCH carries, checked for count and shape; the wire
        decoder decodes each one, allowing :data:`BATCH_KINDS` only."""
        items = m["msgs"]
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
            raise MessageError(f"batch.msgs must be a list of 1 to {MAX_BATCH} messages")
        if not all(isinstance(item, dict) for item in items):
            raise MessageError("batch.msgs holds messages (maps)")
        return items
