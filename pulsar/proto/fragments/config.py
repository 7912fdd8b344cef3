"""The settings of the fragment layer (:mod:`pulsar.proto.fragments.layer`): how large events
travel, and the bounds on what a node holds of them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FragmentConfig"]


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
