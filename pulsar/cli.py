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
    if args.name == "transport":
        from .net.bench import bench_transport

        _print_json(asyncio.run(bench_transport(frames=args.events or 50_000)))
        return 0
    print(f"unknown benchmark {args.name!r}", file=sys.stderr)
    return 2


def _add_bench(sub: Any) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and print one JSON line of figures")
    bench.add_argument(
        "name", choices=["codec", "delivery", "dht", "tree", "transport"], help="which benchmark"
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

    from .devnet import run_devnet

    data_dir = Path(args.data_dir) if args.data_dir else None
    return asyncio.run(run_devnet(args.nodes, data_dir, args.json, args.base_port))


def _add_devnet(sub: Any) -> None:
    devnet = sub.add_parser("devnet", help="run a local network of nodes on 127.0.0.1")
    devnet.add_argument("--nodes", type=int, default=5, help="how many nodes (default 5)")
    devnet.add_argument("--data-dir", default=None, help="keep node data here (default: temp)")
    devnet.add_argument("--base-port", type=int, default=0, help="first port (default: any)")
    devnet.add_argument("--json", action="store_true", help="one JSON object per node")
    devnet.set_defaults(handler=_devnet)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulsarcast",
        description="Decentralised, persistent publish-subscribe over a Kademlia DHT.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_devnet(sub)
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
