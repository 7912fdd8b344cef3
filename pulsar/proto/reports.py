"""What a room of the core reports back besides outputs for the driver."""

from __future__ import annotations

from dataclasses import dataclass

from dag import PeerId

__all__ = ["Refused"]


@dataclass(frozen=True, slots=True)
class Refused:
    """An input a room refused: the core counts it (``inputs_rejected``) and reports it
    (``Rejected``)."""

    peer: PeerId | None
    reason: str
