"""What a :class:`pulsar.Node` tells an observer about its traffic, for the testbed.

The node calls these hooks, when a tracer is configured, at the points only the runtime
sees: a frame decoded or encoded (with its size on the wire), an event delivered or
published, a block fetched from the DHT. The base class does nothing; the testbed's
:class:`pulsar.tools.testbed.tracer.NodeTracer` turns the calls into trace records. Keeping the
hooks this narrow keeps tracing out of the protocol cores, which stay pure.
"""

from __future__ import annotations

from dag import CID, EventDescriptor, PeerId

__all__ = ["Tracer"]


class Tracer:
    """No-op hooks; subclass and override the ones you need. Hooks run in the event loop
    on the node's hot path: they must be quick and must not raise."""

    def sent(self, peer: PeerId, message: object, size: int) -> None:
        """A message was encoded into a ``size``-byte frame for ``peer``."""

    def received(self, peer: PeerId, message: object, size: int) -> None:
        """A ``size``-byte frame from ``peer`` decoded to ``message``."""

    def delivered(self, topic: CID, event: EventDescriptor, hop: int) -> None:
        """``event`` was handed to the application (``hop``: of its first copy)."""

    def published(self, event: EventDescriptor) -> None:
        """This node published ``event`` (signed, stored and on its way)."""

    def fetched(self, cid: CID, block: bytes) -> None:
        """``block`` came back from a DHT fetch the protocol asked for."""
