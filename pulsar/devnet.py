"""A local network of nodes in one process, for trying pulsarcast out (``make run``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from .config import NodeConfig
from .node import Node

__all__ = ["Devnet", "run_devnet"]


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
        for i in range(self.count):
            port = self.base_port + i if self.base_port else 0
            seeds = tuple(n.address for n in self.nodes[-3:])
            config = NodeConfig(data_dir=self.data_dir / f"node-{i}", port=port, bootstrap=seeds)
            self.nodes.append(await Node.start(config))
            if progress is not None:
                progress(i + 1, self.count)
        await asyncio.gather(*(n._routing.prove_known(5.0) for n in self.nodes))
        return self.nodes

    async def stop(self) -> None:
        await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)


def _describe(index: int, node: Node) -> dict[str, Any]:
    host, port = node.address
    return {
        "node": index,
        "peer_id": str(node.peer_id),
        "address": f"{host}:{port}",
        "data_dir": str(node.config.data_dir),
    }


async def run_devnet(count: int, data_dir: Path | None, as_json: bool, base_port: int) -> int:
    """Start the devnet, print how to reach each node, run until SIGINT/SIGTERM."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="devnet-")))
        net = Devnet(data_dir, count, base_port)

        def progress(done: int, total: int) -> None:
            if not as_json:
                print(f"\rstarting nodes: {done}/{total}", end="", file=sys.stderr, flush=True)

        try:
            await net.start(progress)
            if not as_json:
                print(file=sys.stderr)
            for i, node in enumerate(net.nodes):
                info = _describe(i, node)
                if as_json:
                    print(json.dumps(info), flush=True)
                else:
                    print(f"node {i}: {info['peer_id']} at {info['address']} ({info['data_dir']})")
            if not as_json:
                print("devnet running; press Ctrl-C to stop", file=sys.stderr, flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await net.stop()
    return 0
