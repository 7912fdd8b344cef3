"""``pulsarcast bench NAME``: which benchmark each name runs, and its flags.

Each benchmark's module is imported only when it runs, so ``pulsarcast --help`` stays
instant; every one prints its figures as one JSON line on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pulsar.runtime.loop import run as run_loop

__all__ = ["add_bench", "run_bench"]


def _print_json(figures: dict[str, Any]) -> None:
    print(json.dumps(figures, sort_keys=False), flush=True)


LARGE_LINK_MS = 100.0
"""``bench large``'s one-way link latency unless ``--link-ms`` says otherwise."""


def _large_link_ms(args: argparse.Namespace) -> float:
    return LARGE_LINK_MS if args.link_ms is None else float(args.link_ms)


def run_bench(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.name`` names; its figures go to stdout as one JSON line."""
    if args.name == "codec":
        from pulsar.tools.bench.codec import bench_codec

        _print_json(bench_codec(events=args.events or 2000, seconds=args.seconds or 1.0))
        return 0
    if args.name == "dht":
        from pulsar.tools.bench.dht import bench_dht

        _print_json(run_loop(bench_dht(nodes=args.nodes or 20, blocks=args.events or 2000)))
        return 0
    if args.name == "tree":
        from pulsar.tools.bench.tree import bench_tree

        _print_json(run_loop(bench_tree(nodes=args.nodes or 50, events=args.events or 500)))
        return 0
    if args.name == "delivery":
        from pulsar.tools.bench.delivery import bench_delivery

        figures = bench_delivery(
            nodes=args.nodes or 30,
            events=args.events or 300,
            history=args.history or 10_000,
            seed=args.seed,
        )
        _print_json(run_loop(figures))
        return 0
    if args.name == "publish":
        from pulsar.tools.bench.publish import bench_publish

        figures = bench_publish(nodes=args.nodes or 20, events=args.events or 200,
                                processes=args.processes, against=args.against)
        try:
            _print_json(run_loop(figures))
        except ValueError as exc:  # bad arguments, said before anything is measured
            print(f"pulsarcast bench publish: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.name == "topics":
        from pulsar.tools.bench.topics import bench_topics

        figures = bench_topics(topics=args.topics or 1000, idle=args.seconds or 10.0)
        _print_json(run_loop(figures))
        return 0
    if args.name == "restart":
        from pulsar.tools.bench.restart import bench_restart

        try:
            restarted = bench_restart(topics=args.topics or 10_000, restarts=args.runs or 4)
            _print_json(run_loop(restarted))
        except ValueError as exc:
            print(f"pulsarcast bench restart: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.name == "abuse":
        from pulsar.tools.bench.abuse import bench_abuse

        _print_json(run_loop(bench_abuse(events=args.events or 40)))
        return 0
    if args.name == "api":
        # The API sits above the node (api -> pulsar); only the command line reaches up to it.
        from pulsar.tools.bench.api import bench_api

        _print_json(run_loop(bench_api(events=args.events or 10_000)))
        return 0
    if args.name == "spark":
        from pulsar.tools.bench.spark import bench_spark

        _print_json(bench_spark(events=args.events or 100_000))
        return 0
    if args.name == "transport":
        from pulsar.tools.bench.net import bench_transport

        _print_json(run_loop(bench_transport(frames=args.events or 50_000)))
        return 0
    if args.name == "large" and args.sim:
        from pulsar.tools.sim.large import sim_large

        _print_json(sim_large(nodes=args.nodes or 1000, events=args.events or 3,
                              mbps=args.mbps, link_ms=_large_link_ms(args), seed=args.seed,
                              interval=args.seconds or 4.0))
        return 0
    if args.name == "replay-memory":
        from pulsar.tools.bench.replay_memory import bench_replay_memory

        _print_json(bench_replay_memory(events=args.events or 1_000_000))
        return 0
    if args.name == "catchup":
        from pulsar.tools.bench.catchup import bench_catchup

        _print_json(run_loop(bench_catchup(events=args.events or 100_000,
                                           link_ms=args.link_ms or 0.0, order=args.order)))
        return 0
    if args.name == "consumers":
        from pulsar.tools.bench.consumers import bench_consumers

        _print_json(run_loop(bench_consumers(events=args.events or 3000)))
        return 0
    if args.name == "retention":
        from pulsar.tools.bench.retention import bench_retention

        try:
            figures = bench_retention(rate=args.rate or 50.0, seconds=args.seconds or 1800.0,
                                      max_events=args.events or 10_000, keys=args.keys)
            _print_json(run_loop(figures))
        except ValueError as exc:
            print(f"pulsarcast bench retention: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.name == "seek":
        from pulsar.tools.bench.seek import bench_seek

        _print_json(bench_seek(events=args.events or 1_000_000, seed=args.seed))
        return 0
    if args.name == "large":
        from pulsar.tools.bench.large import bench_large

        _print_json(run_loop(bench_large(
            nodes=args.nodes or 30, events=args.events or 5, mbps=args.mbps,
            link_ms=_large_link_ms(args), interval=args.seconds or 4.0, seed=args.seed,
        )))
        return 0
    print(f"unknown benchmark {args.name!r}", file=sys.stderr)
    return 2


def add_bench(sub: Any) -> None:
    """Register ``pulsarcast bench`` on the command line's subparsers."""
    bench = sub.add_parser("bench", help="run a benchmark and print one JSON line of figures")
    bench.add_argument(
        "name",
        choices=["abuse", "api", "catchup", "codec", "consumers", "delivery", "dht", "large",
                 "publish", "replay-memory", "restart", "retention", "seek", "spark", "topics",
                 "tree", "transport"],
        help="which benchmark",
    )
    bench.add_argument("--events", type=int, default=None,
                       help="workload size (retention: the topic's max_events, 10000; "
                            "catchup: the topic's events, 100000, 10%% of them missed; "
                            "consumers: the backlog, 3000)")
    bench.add_argument("--nodes", type=int, default=None, help="network size")
    bench.add_argument("--seconds", type=float, default=None,
                       help="time per measured rate (codec: 1); idle window (topics: 10); "
                            "publishing time (retention: 1800)")
    bench.add_argument("--topics", type=int, default=None,
                       help="topics known (topics: 1000; restart: 10000)")
    bench.add_argument("--runs", type=int, default=None,
                       help="restarts, alternating --gc default and freeze (restart: 4)")
    bench.add_argument("--keys", type=int, default=None,
                       help="retention: a compacted topic with this many keys instead of "
                            "max_events")
    bench.add_argument(
        "--history", type=int, default=None, help="events to backfill and replay (delivery)"
    )
    bench.add_argument("--rate", type=float, default=None,
                       help="events published per second (retention: 50)")
    bench.add_argument("--seed", type=int, default=1,
                       help="fault and crash seed (delivery); link seed (large)")
    bench.add_argument("--processes", type=int, default=None,
                       help="worker processes for the subscribers (publish; 0: all nodes in "
                            "this process; default one per CPU)")
    bench.add_argument("--against", default=None, metavar="REV",
                       help="publish: also measure this git revision (before the write quorum: "
                            "2015a5e) in the same run")
    bench.add_argument("--mbps", type=float, default=50.0,
                       help="uplink of every node, Mbit/s (large: 50)")
    bench.add_argument("--link-ms", type=float, default=None,
                       help="one-way link latency, ms (large: 100; catchup: 0)")
    bench.add_argument("--order", choices=["walk-first", "reconcile-first"],
                       default="walk-first",
                       help="catchup: which of the two away nodes comes back first")
    bench.add_argument("--sim", action="store_true",
                       help="large: run the workload in the simulator (default 1000 nodes)")
    bench.set_defaults(handler=run_bench)
