"""The ``pulsarcast`` command line.

Subcommands are registered in small functions so each feature owns its flags; heavy imports
happen inside the handlers, so ``pulsarcast --help`` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _print_json(figures: dict[str, Any]) -> None:
    print(json.dumps(figures, sort_keys=False), flush=True)


def _bench(args: argparse.Namespace) -> int:
    if args.name == "codec":
        from .bench.codec import bench_codec

        _print_json(bench_codec(events=args.events or 2000, seconds=args.seconds))
        return 0
    if args.name == "dht":
        from dht.bench import bench_dht

        _print_json(asyncio.run(bench_dht(nodes=args.nodes or 20, blocks=args.events or 2000)))
        return 0
    if args.name == "tree":
        from .bench.tree import bench_tree

        _print_json(asyncio.run(bench_tree(nodes=args.nodes or 50, events=args.events or 500)))
        return 0
    if args.name == "delivery":
        from .bench.delivery import bench_delivery

        figures = bench_delivery(
            nodes=args.nodes or 30,
            events=args.events or 300,
            history=args.history or 10_000,
            seed=args.seed,
        )
        _print_json(asyncio.run(figures))
        return 0
    if args.name == "api":
        # The API sits above the node (api -> pulsar); only the command line reaches up to it.
        from api.bench import bench_api

        _print_json(asyncio.run(bench_api(events=args.events or 10_000)))
        return 0
    if args.name == "transport":
        from .net.bench import bench_transport

        _print_json(asyncio.run(bench_transport(frames=args.events or 50_000)))
        return 0
    print(f"unknown benchmark {args.name!r}", file=sys.stderr)
    return 2


def _add_bench(sub: Any) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and print one JSON line of figures")
    bench.add_argument(
        "name",
        choices=["api", "codec", "delivery", "dht", "tree", "transport"],
        help="which benchmark",
    )
    bench.add_argument("--events", type=int, default=None, help="workload size")
    bench.add_argument("--nodes", type=int, default=None, help="network size")
    bench.add_argument("--seconds", type=float, default=1.0, help="time per measured rate")
    bench.add_argument(
        "--history", type=int, default=None, help="events to backfill and replay (delivery)"
    )
    bench.add_argument("--seed", type=int, default=1, help="fault and crash seed (delivery)")
    bench.set_defaults(handler=_bench)


def _devnet(args: argparse.Namespace) -> int:
    from pathlib import Path

    # The API sits above the node (api -> pulsar); only the command line reaches up to it.
    from api.runner import run_devnet

    data_dir = Path(args.data_dir) if args.data_dir else None
    return asyncio.run(run_devnet(args.nodes, data_dir, args.json, args.base_port,
                                  args.api_base_port, args.api_host))


def _add_devnet(sub: Any) -> None:
    devnet = sub.add_parser("devnet", help="run a local network of nodes, each with its REST "
                            "API, on 127.0.0.1")
    devnet.add_argument("--nodes", type=int, default=5, help="how many nodes (default 5)")
    devnet.add_argument("--data-dir", default=None, help="keep node data here (default: temp)")
    devnet.add_argument("--base-port", type=int, default=0,
                        help="first p2p port (default: any free one)")
    devnet.add_argument("--api-base-port", type=int, default=0,
                        help="first REST API port (default: any free one)")
    devnet.add_argument("--api-host", default="127.0.0.1", help="REST API bind address")
    devnet.add_argument("--json", action="store_true", help="one JSON object per node "
                        "(url, token, peer_id, address, data_dir)")
    devnet.set_defaults(handler=_devnet)


def _node(args: argparse.Namespace) -> int:
    from pathlib import Path

    from api.runner import run_node

    from .config import NodeConfig

    bootstrap = tuple(_host_port(b) for b in args.bootstrap)
    config = NodeConfig(data_dir=Path(args.data_dir), host=args.host, port=args.port,
                        bootstrap=bootstrap)
    return asyncio.run(run_node(config, args.api_host, args.api_port, args.token, args.json))


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"--bootstrap takes HOST:PORT, not {value!r}")
    return host, int(port)


def _add_node(sub: Any) -> None:
    node = sub.add_parser("node", help="run one node with its REST API until Ctrl-C")
    node.add_argument("--data-dir", required=True, help="key, database and API token live here")
    node.add_argument("--host", default="127.0.0.1", help="p2p bind address")
    node.add_argument("--port", type=int, default=0, help="p2p port, UDP and TCP (default any)")
    node.add_argument("--bootstrap", action="append", default=[], metavar="HOST:PORT",
                      help="a node to join through (repeatable)")
    node.add_argument("--api-host", default="127.0.0.1", help="REST API bind address")
    node.add_argument("--api-port", type=int, default=8700, help="REST API port (default 8700)")
    node.add_argument("--token", default=None,
                      help="API token (default: generated into the data dir)")
    node.add_argument("--json", action="store_true", help="print the node's details as JSON")
    node.set_defaults(handler=_node)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulsarcast",
        description="Decentralised, persistent publish-subscribe over a Kademlia DHT.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_devnet(sub)
    _add_node(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
