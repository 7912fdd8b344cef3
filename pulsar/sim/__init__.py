"""A discrete-event simulator that drives the very same protocol cores as the runtime."""

from .network import SimNetwork, SimNode

__all__ = ["SimNetwork", "SimNode"]
