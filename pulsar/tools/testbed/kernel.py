"""Testbed runs in network namespaces: faults made by the kernel, bytes from its counters.

``pulsarcast testbed run SCENARIO --netns`` puts every agent process in a network namespace
of its own (:class:`pulsar.tools.netlab.netns.TestNetwork`, prefix ``pct``, slot 1, so it can
share a host with a ``pulsarcast verify`` run) and has the kernel make the scenario's
network instead of the transport's fault injector:

* ``[network] latency`` and ``jitter`` (a hold of ``latency + U(0, jitter)`` per frame) become
  a delay of ``latency + jitter / 2`` ± ``jitter / 2`` on every packet a node sends: the same
  range and mean, per packet instead of per frame, with netem where the kernel has it and
  the NFQUEUE shaper where it does not (:mod:`pulsar.tools.netlab.linkfaults`);
* ``[network] loss`` (a probability per frame) becomes the same probability per packet sent,
  dropped by nftables. TCP resends what it loses, so the application loses no frame: what
  is measured is what a lossy link costs in retransmissions and delay;
* partitions block both directions between the groups with nftables; crashes are SIGKILLs
  of the agent process, as on loopback.

Every packet goes through the kernel, DHT datagrams and TCP acknowledgements included, and
from the time the network is built: bootstrap, topic creation and subscription pay the
same delay and loss as the workload. :meth:`KernelNetwork.wire` reads each namespace's
``d0`` counters (``IFLA_STATS64``): ``tx_bytes`` counts every frame a node put on its link,
Ethernet, IP and TCP/UDP headers, Noise framing, handshakes, keepalives and retransmissions
included; packets nftables dropped before the device are not sent and not counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pulsar.tools.netlab.linkfaults import FaultId, LinkFaults
from pulsar.tools.netlab.netns import InterfaceCounters, TestNetwork, available, cleanup_leftovers

from .scenario import Network

__all__ = ["NETNS_ENV", "PREFIX", "SLOT", "KernelNetwork", "unavailable"]

PREFIX = "pct"
"""Names of everything a testbed network makes start with this."""
SLOT = 1
"""198.18.1.0/24 and its own host lock: apart from ``pulsarcast verify`` (slot 0)."""
NETNS_ENV = "PULSARCAST_NETNS"
"""The agent enters the namespace this names before it opens a socket."""


def unavailable() -> str | None:
    """Why testbed runs in namespaces cannot run here (not root, no namespaces), or None."""
    return available()


class KernelNetwork:
    """One namespace per node, with the scenario's standing link faults applied to all."""

    def __init__(self, nodes: int, network: Network, seed: int) -> None:
        self.net = TestNetwork(PREFIX, nodes, slot=SLOT)
        self.network = network
        self.faults = LinkFaults(self.net, seed=seed)
        self._partition: FaultId | None = None
        self._start: list[InterfaceCounters] = []
        self.mechanisms: dict[str, str] = {}

    async def build(self) -> None:
        """Build the namespaces, apply latency and loss, take the counters' starting point."""
        await asyncio.to_thread(cleanup_leftovers, PREFIX, slot=SLOT)
        await asyncio.to_thread(self.net.build)
        everyone = range(self.net.size)
        n = self.network
        if n.latency or n.jitter:
            half = n.jitter / 2
            await asyncio.to_thread(self.faults.shape, everyone,
                                    delay_ms=(n.latency + half) * 1000, jitter_ms=half * 1000)
            self.mechanisms["latency"] = self.faults.mechanism("shape")
        if n.loss:
            await asyncio.to_thread(self.faults.loss, everyone, n.loss * 100)
            self.mechanisms["loss"] = self.faults.mechanism("loss")
        self._start = await asyncio.to_thread(self._read)

    def address(self, node: int) -> str:
        return self.net.data_address(node)

    def agent_env(self, node: int) -> dict[str, str]:
        return {NETNS_ENV: self.net.namespace_path(node)}

    async def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Only nodes of one group can talk until :meth:`heal` (one partition at a time)."""
        await self.heal()
        self._partition = await asyncio.to_thread(self.faults.partition, groups)
        self.mechanisms["partition"] = self.faults.mechanism("partition")

    async def heal(self) -> None:
        if self._partition is not None:
            fault, self._partition = self._partition, None
            await asyncio.to_thread(self.faults.heal, fault)

    async def wire(self) -> dict[str, Any]:
        """What every node sent and received on its link since :meth:`build`."""
        now = await asyncio.to_thread(self._read)
        per_node = [later - earlier for later, earlier in zip(now, self._start, strict=True)]
        return {
            "source": "kernel interface counters (d0, IFLA_STATS64) since the network was built",
            "tx_bytes": sum(c.tx_bytes for c in per_node),
            "rx_bytes": sum(c.rx_bytes for c in per_node),
            "tx_packets": sum(c.tx_packets for c in per_node),
            "rx_packets": sum(c.rx_packets for c in per_node),
            "per_node_tx_bytes": [c.tx_bytes for c in per_node],
            "mechanisms": dict(self.mechanisms),
        }

    def _read(self) -> list[InterfaceCounters]:
        return [self.net.counters(i) for i in range(self.net.size)]

    async def close(self) -> None:
        """Stop the shapers and remove everything (also after an error midway)."""
        await asyncio.to_thread(self.faults.close)
        await asyncio.to_thread(self.net.destroy)
