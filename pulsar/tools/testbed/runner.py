"""``pulsarcast testbed run SCENARIO``: run a scenario for each protocol, write traces.

For each protocol in turn (same workload, same faults, same seed): start one agent process
per node (:mod:`pulsar.tools.testbed.agent`), each node bootstrapping off a few already running;
let the topics' authors create them and the subscribers subscribe; hand every publisher its
timetable; play the fault timeline (SIGKILL and restart on the same data directory,
partitions and heals) while publishing; then let the network settle until every expected
delivery happened, or nothing was delivered for ``settle.quiet`` seconds, or ``settle.max``
passed. Once the nodes are stopped, what each node's durable delivery log holds (entries
logged by the end of the settle phase) is written next to its protocol's traces
(:mod:`pulsar.tools.testbed.delivery_logs`): the report's source for delivery and coverage, which
a crash cannot cut short as it cuts a trace. Node data directories live in a temporary
directory and are removed; traces, delivery logs and the manifest go to the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pulsar.tools.bench.control import WorkerProcess

from .delivery_logs import DELIVERY_LOGS, read_node_log, write_delivery_logs
from .kernel import KernelNetwork, unavailable
from .manifest import write_manifest
from .scenario import Scenario, ScenarioError, load_scenario
from .workload import FaultPlan, Plan, Publish, plan_workload

__all__ = ["run_scenario", "run_scenario_file"]

T = TypeVar("T")

SEEDS = 3
"""A starting node bootstraps off this many nodes already running."""
START_BATCH = 8
"""Nodes started at once (after the first)."""
CALL_TIMEOUT = 60.0
READY_TIMEOUT = 30.0
LEAD_TIME = 2.0
"""Seconds between handing out timetables and the first publish."""


def run_scenario_file(path: Path, out: Path | None, *, protocols: list[str] | None = None,
                      progress: bool = True, netns: bool = False) -> int:
    """The CLI entry point: exit status 0, or 2 for a scenario that cannot be run."""
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        print(f"pulsarcast testbed: {exc}", file=sys.stderr)
        return 2
    if protocols:
        unknown = set(protocols) - set(scenario.protocols)
        if unknown:
            print(f"pulsarcast testbed: {path} does not run {', '.join(sorted(unknown))}",
                  file=sys.stderr)
            return 2
    if netns and unavailable() is not None:
        print(f"pulsarcast testbed: --netns cannot run here: {unavailable()}", file=sys.stderr)
        return 2
    run_dir = out or Path("runs") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    asyncio.run(run_scenario(scenario, run_dir, protocols=protocols, progress=progress,
                             netns=netns))
    print(run_dir)
    return 0


async def run_scenario(scenario: Scenario, run_dir: Path, *,
                       protocols: list[str] | None = None,
                       progress: bool = True, netns: bool = False) -> dict[str, Any]:
    """Run every protocol of ``scenario``; return the manifest written to ``run_dir``.
    ``netns``: each node in a network namespace of its own, the scenario's network made by
    the kernel (:mod:`pulsar.tools.testbed.kernel`), one fresh network per protocol."""
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_workload(scenario)
    # SIGTERM ends the run like Ctrl-C: every protocol run's teardown (agents, namespaces)
    # still runs.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    manifest: dict[str, Any] = {"name": scenario.name, "scenario": scenario.to_dict(),
                                "network": "netns" if netns else "loopback", "protocols": {}}
    try:
        for protocol in protocols or scenario.protocols:
            shutil.rmtree(run_dir / protocol, ignore_errors=True)
            with tempfile.TemporaryDirectory(prefix=f"pulsarcast-{protocol}-",
                                             dir=_data_parent()) as data:
                kernel = (KernelNetwork(scenario.nodes, scenario.network, scenario.seed)
                          if netns else None)
                run = _ProtocolRun(scenario, plan, protocol, run_dir, Path(data), progress,
                                   kernel)
                manifest["protocols"][protocol] = await run.run()
            write_manifest(run_dir, manifest)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
    return manifest


class _ProtocolRun:
    def __init__(self, scenario: Scenario, plan: Plan, protocol: str, run_dir: Path,
                 data_root: Path, progress: bool, kernel: KernelNetwork | None = None) -> None:
        self.scenario = scenario
        self.plan = plan
        self.protocol = protocol
        self.trace_dir = run_dir / protocol
        self.data_root = data_root
        self.show = _Progress(protocol, progress)
        self.kernel = kernel
        self.rng = random.Random(scenario.seed)
        n = scenario.nodes
        self.agents: list[WorkerProcess | None] = [None] * n
        self.up = [False] * n
        self.ports = [0] * n
        self.lives = [0] * n
        self.peers: list[str] = [""] * n
        self.topic_cids: list[str] = []
        self.delivered = [0] * n
        self.faults: list[dict[str, Any]] = []
        self.publish_start = 0.0
        self.sent_publishes = 0
        self.expected_log = 0
        self.uncertain_log = 0
        self.handed: list[list[Publish]] = [[] for _ in range(n)]
        """The publishes handed to each node's current life."""

    async def run(self) -> dict[str, Any]:
        started = time.time()
        try:
            if self.kernel is not None:
                self.show.stage(f"building {self.scenario.nodes} network namespaces")
                await self.kernel.build()
            await self._start_all()
            await self._topics()
            await self._wait_ready()
            self.publish_start = time.time() + LEAD_TIME
            await self._hand_out(range(self.scenario.nodes), after=0.0)
            faults = asyncio.create_task(self._play_faults())
            try:
                publish_end = self.publish_start + self.plan.publishes[-1].at
                await self._settle(publish_end)
            finally:
                faults.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await faults
            ended = time.time()
            await self._each(lambda a: a.call("finish"), quiet=True)
        finally:
            await asyncio.gather(*(a.close() for a in self.agents if a is not None),
                                 return_exceptions=True)
            wire = None
            if self.kernel is not None:
                try:
                    if self.kernel.net.built:
                        wire = await self.kernel.wire()
                finally:
                    await self.kernel.close()
            self.show.done()
        logs = self._record_delivery_logs(ended)
        extra = {} if wire is None else {"wire": wire}
        return {
            **extra,
            "started": started,
            "publish_start": self.publish_start,
            "publish_end": publish_end,
            "ended": ended,
            "nodes": [{"index": i, "peer": p} for i, p in enumerate(self.peers)],
            "topics": [
                {"cid": cid, "name": f"topic-{t.index}", "author": t.author, "order": t.order,
                 "subscribers": list(t.subscribers)}
                for t, cid in zip(self.plan.topics, self.topic_cids, strict=True)
            ],
            "faults": self.faults,
            "expected_log_entries": self.expected_log,
            "uncertain_log_entries": self.uncertain_log,
            "delivered_log_entries": sum(self.delivered),
            "delivery_logs": logs,
        }

    def _record_delivery_logs(self, until: float) -> dict[str, Any]:
        """Read every node's delivery log from its (stopped) store into the run directory;
        return what the manifest says of it."""
        nodes = {node: read_node_log(self.data_root / f"node-{node}", self.topic_cids, until)
                 for node in range(self.scenario.nodes)}
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        write_delivery_logs(self.trace_dir / DELIVERY_LOGS, until, nodes)
        return {"file": f"{self.protocol}/{DELIVERY_LOGS}",
                "entries": sum(len(events) for entries in nodes.values() if entries
                               for events in entries.values()),
                "unreadable_nodes": [node for node, entries in nodes.items() if entries is None]}

    # ------------------------------------------------------------------ nodes

    async def _spawn(self, index: int) -> WorkerProcess:
        agent = await WorkerProcess.spawn(
            "pulsar.tools.testbed.agent", f"{self.protocol} node {index}",
            env_extra=None if self.kernel is None else self.kernel.agent_env(index))
        self.agents[index] = agent
        return agent

    async def _start(self, index: int, seeds: list[int]) -> None:
        agent = self.agents[index]
        assert agent is not None
        addresses = [self._address(s) for s in seeds]
        reply = await _timed(agent.call(
            "start", index=index, data_dir=str(self.data_root / f"node-{index}"),
            trace_path=str(self.trace_dir / f"node-{index}.jsonl"), protocol=self.protocol,
            seeds=addresses, port=self.ports[index], life=self.lives[index],
            network=_network(self.scenario, self.kernel is not None), seed=self.scenario.seed,
            host=self._host(index)))
        self.ports[index] = int(reply["address"][1])
        self.peers[index] = reply["peer"]
        self.up[index] = True

    def _host(self, index: int) -> str:
        return "127.0.0.1" if self.kernel is None else self.kernel.address(index)

    def _address(self, index: int) -> list[Any]:
        return [self._host(index), self.ports[index]]

    async def _start_all(self) -> None:
        n = self.scenario.nodes
        self.show.stage(f"starting {n} node processes")
        for first in range(0, n, 16):
            await asyncio.gather(*(self._spawn(i) for i in range(first, min(n, first + 16))))
        await self._start(0, [])
        for first in range(1, n, START_BATCH):
            batch = range(first, min(n, first + START_BATCH))
            await asyncio.gather(*(
                self._start(i, self.rng.sample(range(first), min(SEEDS, first)))
                for i in batch))
            self.show.stage(f"started {batch.stop}/{n} nodes")
        self.show.stage("proving contacts")
        await self._each(lambda a: a.call("prove"))

    async def _topics(self) -> None:
        self.show.stage(f"creating {len(self.plan.topics)} topics")
        created = await asyncio.gather(*(
            _timed(self._agent(t.author).call("create", name=f"topic-{t.index}", order=t.order))
            for t in self.plan.topics))
        self.topic_cids = [c["cid"] for c in created]
        self.show.stage("subscribing")
        await asyncio.gather(*(self._subscribe(i) for i in range(self.scenario.nodes)))

    def _topics_of(self, node: int) -> list[str]:
        return [self.topic_cids[t.index] for t in self.plan.topics if node in t.subscribers]

    async def _subscribe(self, node: int) -> None:
        mine = [self.topic_cids[t.index] for t in self.plan.topics
                if node in t.subscribers and t.author != node]
        agent = self._agent(node)
        if mine:
            await _timed(agent.call("subscribe", topics=mine))
        await _timed(agent.call("count", topics=self._topics_of(node)))

    async def _wait_ready(self) -> None:
        """Until every subscriber is connected for its topics (or a deadline: a network
        that cannot get there is part of what is measured)."""
        wanted = sum(len(t.subscribers) for t in self.plan.topics)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            ready = await self._ready_count()
            self.show.stage(f"joining topics: {ready}/{wanted} subscriptions connected")
            if ready >= wanted or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.5)  # polling interval

    async def _ready_count(self) -> int:
        total = 0
        for node in range(self.scenario.nodes):
            agent = self.agents[node]
            if agent is not None and self.up[node]:
                reply = await _timed(agent.call("count", topics=self._topics_of(node)))
                total += int(reply["ready"])
        return total

    def _agent(self, index: int) -> WorkerProcess:
        agent = self.agents[index]
        if agent is None or not self.up[index]:
            raise RuntimeError(f"node {index} is not running")
        return agent

    async def _each(self, call: Callable[[WorkerProcess], Awaitable[T]], *,
                    quiet: bool = False) -> list[T | BaseException] | None:
        """``call`` on every running agent at once; failures are returned (and raised
        unless ``quiet``)."""
        live = [a for a, up in zip(self.agents, self.up, strict=True) if a is not None and up]
        results = await asyncio.gather(*(_timed(call(a)) for a in live),
                                       return_exceptions=True)
        if not quiet:
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        return results

    # ------------------------------------------------------------------ workload, faults

    async def _hand_out(self, nodes: Any, *, after: float) -> None:
        """Give each node its publishes later than ``after`` seconds into the run."""
        for node in nodes:
            due = [p for p in self.plan.publishes_of(node) if p.at >= after]
            if not due:
                continue
            mine = [[p.at, self.topic_cids[p.topic]] for p in due]
            self.handed[node] += due
            self.sent_publishes += len(due)
            self.expected_log += sum(len(self.plan.topics[p.topic].subscribers) for p in due)
            await _timed(self._agent(node).call(
                "schedule", start_at=self.publish_start, publishes=mine,
                payload_bytes=self.scenario.workload.payload_bytes))

    async def _play_faults(self) -> None:
        for step in self.plan.faults:
            delay = self.publish_start + step.at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the scenario's timeline
            await self._fault(step)

    async def _fault(self, step: FaultPlan) -> None:
        record: dict[str, Any] = {"t": time.time(), "kind": step.kind,
                                  "nodes": list(step.nodes)}
        self.faults.append(record)
        if step.kind == "crash":
            await asyncio.gather(*(self._crash(node) for node in step.nodes))
        elif step.kind == "restart":
            # All at once: one after the other, a wave of 20 took minutes (each start
            # proves its contacts and resumes its subscriptions before it answers).
            results = await asyncio.gather(*(self._restart(n) for n in step.nodes),
                                           return_exceptions=True)
            for node, result in zip(step.nodes, results, strict=True):
                if isinstance(result, BaseException):
                    print(f"[{self.protocol}] node {node} did not restart: {result!r}",
                          file=sys.stderr)
        elif step.kind == "partition":
            cut = set(step.nodes)
            groups = [[self.peers[i] for i in sorted(cut)],
                      [self.peers[i] for i in range(self.scenario.nodes) if i not in cut]]
            record["groups"] = [sorted(cut), [i for i in range(self.scenario.nodes)
                                              if i not in cut]]
            if self.kernel is not None:
                await self.kernel.partition(record["groups"])
            else:
                await self._each(lambda a: a.call("partition", groups=groups), quiet=True)
        elif step.kind == "heal":
            if self.kernel is not None:
                await self.kernel.heal()
            else:
                await self._each(lambda a: a.call("heal"), quiet=True)

    async def _crash(self, node: int) -> None:
        agent = self.agents[node]
        if agent is None or not self.up[node]:
            return
        self.up[node] = False
        # What it acknowledged before the kill must reach every subscriber; what was due but
        # not yet acknowledged (a loaded node runs late) may or may not have gone out.
        try:
            acked = Counter((await _timed(agent.call("status")))["published_by_topic"])
        except (OSError, TimeoutError, RuntimeError, KeyError):
            acked = Counter()
        await agent.kill()
        # Due times are compared with the moment of the kill, not when the fault began:
        # the node went on publishing while it was asked for its count.
        killed_at = time.time() - self.publish_start
        handed, self.handed[node] = self.handed[node], []
        # What it would have published while down is never published.
        lost = [p for p in handed if p.at >= killed_at]
        self.expected_log -= sum(len(self.plan.topics[p.topic].subscribers) for p in lost)
        due = Counter(self.topic_cids[p.topic] for p in handed if p.at < killed_at)
        by_cid = {cid: len(t.subscribers) for cid, t in zip(self.topic_cids, self.plan.topics,
                                                              strict=True)}
        self.uncertain_log += sum(max(0, count - acked[cid]) * by_cid[cid]
                                  for cid, count in due.items())

    async def _restart(self, node: int) -> None:
        if self.up[node]:
            return
        self.lives[node] += 1
        await self._spawn(node)
        live = [i for i in range(self.scenario.nodes) if self.up[i]]
        await self._start(node, self.rng.sample(live, min(SEEDS, len(live))))
        await _timed(self._agent(node).call("count", topics=self._topics_of(node)))
        await self._hand_out([node], after=time.time() - self.publish_start)

    async def _settle(self, publish_end: float) -> None:
        settle = self.scenario.settle
        last_total, last_change = -1, time.monotonic()
        while True:
            await asyncio.sleep(1.0)  # polling interval
            replies = await self._each(lambda a: a.call("status"), quiet=True) or []
            live = [i for i in range(self.scenario.nodes) if self.up[i]]
            for node, reply in zip(live, replies, strict=False):
                if isinstance(reply, dict):
                    self.delivered[node] = int(reply["delivered"])
            total = sum(self.delivered)
            now = time.time()
            if total != last_total:
                last_total, last_change = total, time.monotonic()
            publishing = now < publish_end
            self.show.line(now - self.publish_start, total, self.expected_log,
                           sum(self.up), self.scenario.nodes, publishing)
            if publishing:
                continue
            if total >= self.expected_log and not self._restarts_pending(now):
                return
            if time.monotonic() - last_change > settle.quiet and not self._restarts_pending(
                    now):
                return
            if now - publish_end > settle.max:
                return

    def _restarts_pending(self, now: float) -> bool:
        return any(step.kind in ("restart", "heal") and self.publish_start + step.at > now
                   for step in self.plan.faults)


def _data_parent() -> str | None:
    """Node data directories go to /dev/shm where there is one: a hundred nodes sharing one
    disk would make their SQLite checkpoints a shared bottleneck that machines of their own
    would not have (measured: a 30-node run published its 600 events in 64 s on disk, 38 s
    on tmpfs). ``PULSARCAST_TESTBED_DATA`` overrides."""
    chosen = os.environ.get("PULSARCAST_TESTBED_DATA")
    if chosen:
        return chosen
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _network(scenario: Scenario, by_kernel: bool) -> dict[str, float]:
    """The transport's fault injection: the scenario's, or none when the kernel makes it."""
    n = scenario.network
    if by_kernel:
        return {"latency": 0.0, "jitter": 0.0, "loss": 0.0}
    return {"latency": n.latency, "jitter": n.jitter, "loss": n.loss}


async def _timed(call: Awaitable[T]) -> T:
    async with asyncio.timeout(CALL_TIMEOUT):
        return await call


class _Progress:
    """A one-line progress display on stderr (redrawn in place on a terminal, a line every
    few seconds otherwise)."""

    def __init__(self, protocol: str, enabled: bool) -> None:
        self.protocol = protocol
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last_print = 0.0
        self.started = time.monotonic()

    def _write(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
            sys.stderr.flush()
        elif force or time.monotonic() - self.last_print >= 5.0:
            self.last_print = time.monotonic()
            print(text, file=sys.stderr, flush=True)

    def stage(self, what: str) -> None:
        self._write(f"[{self.protocol}] {what}", force=not self.tty)

    def line(self, elapsed: float, delivered: int, expected: int, up: int, nodes: int,
             publishing: bool) -> None:
        width = 30
        share = min(1.0, delivered / expected) if expected else 1.0
        bar = "#" * int(share * width) + "." * (width - int(share * width))
        phase = "publishing" if publishing else "settling"
        self._write(f"[{self.protocol}] {elapsed:6.1f}s {phase:10} [{bar}] {delivered}/"
                    f"{expected} deliveries ({share:.1%})  nodes up {up}/{nodes}")

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
