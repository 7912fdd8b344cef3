"""A discrete-event simulator that drives the very same protocol cores as the runtime.

:class:`SimNetwork` is the network (links, faults, routing tables, DHT);
:func:`~pulsar.tools.sim.scenarios.run_sim` runs the reference scenarios on it for
``pulsarcast sim`` (``docs/simulator.md``)."""

from .network import SimNetwork, SimNode

__all__ = ["SimNetwork", "SimNode"]
