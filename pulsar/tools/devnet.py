"""A local network of nodes in one process, for trying pulsarcast out (``make run``; the
process around it, with a REST API on each node, is :mod:`pulsar.tools.runner`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pulsar.config import NodeConfig
from pulsar.node import Node
from pulsar.proto.config import LONE_NODE, CoreConfig

__all__ = ["Devnet"]


class Devnet:
    """``count`` nodes on 127.0.0.1, each bootstrapped off the ones started before it.
    Data directories are ``data_dir/node-<i>``, so a devnet restarted on the same
    directory keeps its identities, topics and subscriptions."""

    def __init__(self, data_dir: Path, count: int, base_port: int = 0) -> None:
        self.data_dir = data_dir
        self.count = count
        self.base_port = base_port
        self.nodes: list[Node] = []

    async def start(self, progress: Any = None) -> list[Node]:
        # A devnet of one is alone on purpose: nobody else can store its blocks, so its
        # acknowledgements mean "committed to this node's disk" (min_acks 0,
        # docs/operations.md), where any larger devnet needs one other DHT node.
        core = LONE_NODE if self.count == 1 else CoreConfig()
        for i in range(self.count):
            port = self.base_port + i if self.base_port else 0
            seeds = tuple(n.address for n in self.nodes[-3:])
            config = NodeConfig(data_dir=self.data_dir / f"node-{i}", port=port, bootstrap=seeds,
                                core=core)
            self.nodes.append(await Node.start(config))
            if progress is not None:
                progress(i + 1, self.count)
        await asyncio.gather(*(n._routing.prove_known(5.0) for n in self.nodes))
        return self.nodes

    async def stop(self) -> None:
        await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
