"""One ``pulsarcast verify`` run, start to end.

1. Build the test network (one namespace per node, plus one for a fresh replayer), mount
   each node's tmpfs, start the nodes, create topics and subscribe (:mod:`.workload`).
2. For ``duration`` seconds: publishers and readers run while the nemesis makes the
   scheduled faults (:mod:`.nemesis`), one at a time, each healed on schedule.
3. Heal everything, restart what is down, let the network converge (at most ``settle``
   seconds, until the checker finds nothing missing), read every log one last time.
4. SIGKILL every publisher (nodes 0-2), start a fresh node and replay each topic from its
   CID alone through it.
5. Check the history (:mod:`.checker`) and write the report (:mod:`.report`).

Everything the run made is torn down on the way out, also on Ctrl-C and on errors: the
namespaces, veths, bridges, nftables rules and shaper processes (:mod:`.netns`), the node
processes and the tmpfs mounts. The run directory keeps the history, node logs and report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.auth import TOKEN_PREFIX
from pulsar.tools.netlab.linkfaults import LinkFaults
from pulsar.tools.netlab.netns import TestNetwork, available, cleanup_leftovers

from .checker import check
from .cluster import Cluster
from .history import HistoryWriter, read_history
from .nemesis import PlannedFault, schedule
from .report import RunResult
from .scenario import Scenario
from .workload import Workload

__all__ = ["RunResult", "run_verify"]

PREFIX = "pcv"
"""Names of everything a run makes start with this (``cleanup_leftovers`` removes them)."""
PUBLISHERS = (0, 1, 2)


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.start = time.monotonic()

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.start:7.1f}s] {text}", file=sys.stderr, flush=True)


async def run_verify(scenario: Scenario, run_dir: Path, *, quiet: bool = False) -> RunResult:
    """Run ``scenario`` and return its checked result; the report is in ``run_dir``."""
    # pyroute2 runs its netlink sockets on an event loop of its own: its blocking calls
    # cannot run inside ours, so every netlink step runs in a worker thread.
    reason = await asyncio.to_thread(available)
    if reason is not None:
        raise RuntimeError(f"pulsarcast verify cannot run here: {reason}")
    run_dir.mkdir(parents=True, exist_ok=True)
    say = _Progress(quiet)
    plan = schedule(scenario)
    say(
        f"seed {scenario.seed}: {scenario.nodes} nodes, {scenario.duration:.0f} s, "
        f"{len(plan)} faults ({', '.join(sorted({f.kind for f in plan}))})"
    )
    (run_dir / "scenario.json").write_text(
        json.dumps(
            {
                "scenario": {k: getattr(scenario, k) for k in scenario.__dataclass_fields__},
                "faults": [f.describe() | {"at": f.at} for f in plan],
            },
            indent=1,
        )
    )
    await asyncio.to_thread(cleanup_leftovers, PREFIX)
    net = TestNetwork(PREFIX, scenario.nodes + 1)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    cluster = Cluster(net, run_dir, token, disk_mib=scenario.disk_mib,
                      min_acks=scenario.min_acks)
    history = HistoryWriter(run_dir / "history.jsonl")
    faults_done: list[dict[str, Any]] = []
    wire: dict[int, int] = {}
    links: LinkFaults | None = None
    # SIGTERM ends the run like Ctrl-C: the teardown below still runs.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await asyncio.to_thread(net.build)
        links = LinkFaults(net, seed=scenario.seed)
        for i in range(scenario.nodes):
            await cluster.start(i, seeds=[j for j in range(min(3, i))])
        say(f"{scenario.nodes} nodes up")
        before = {i: await asyncio.to_thread(_wire, net, i) for i in range(scenario.nodes + 1)}
        workload = Workload(
            history,
            cluster.api_url,
            token,
            scenario.nodes,
            seed=scenario.seed,
            rate=scenario.rate,
            large_every=scenario.large_every,
            large_bytes=scenario.large_bytes,
            alive=lambda i: (
                i in cluster.nodes and cluster.nodes[i].running and not cluster.nodes[i].paused
            ),
        )
        try:
            await workload.setup()
            say("topics created, subscribers in")
            workload.start(scenario.duration)
            nemesis = _Nemesis(cluster, links, history, say)
            await nemesis.run(plan, scenario.duration)
            faults_done = nemesis.done
            await workload.stop_publishing()
            say(f"workload over: {workload.published_ok} publishes acknowledged; converging")
            await _converge(cluster, workload, history, run_dir, scenario, say)
            for i in PUBLISHERS:
                # Not a "kill": their logs were read in full above and are judged as
                # those of live subscribers; from here on only the replay is.
                history.record("nemesis", "info", "retire", i, None, {"node": i})
                cluster.kill(i)
            fresh = scenario.nodes
            await cluster.start(fresh, seeds=list(range(3, scenario.nodes)))
            say("publishers gone; a fresh node replays each topic from its CID")
            await workload.replay(fresh)
        finally:
            await workload.close()
            wire = {
                i: await asyncio.to_thread(_wire, net, i) - before.get(i, 0)
                for i in range(scenario.nodes + 1)
            }
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
        history.close()
        if links is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(links.close)
        cluster.stop_all()
        cluster.unmount_all()
        await asyncio.to_thread(net.destroy)
    result = check(read_history(run_dir / "history.jsonl", allow_torn_tail=True))
    outcome = RunResult(scenario, run_dir, result, faults_done, wire)
    from .report import write_report  # matplotlib is optional: loaded only here

    outcome.summary = write_report(
        outcome, read_history(run_dir / "history.jsonl"), links_mechanisms=_mechanisms(faults_done)
    )
    return outcome


def _wire(net: TestNetwork, i: int) -> int:
    """Bytes sent and received on node ``i``'s data interface (the kernel's counters)."""
    with contextlib.suppress(Exception):
        counters = net.counters(i)
        return int(counters.rx_bytes + counters.tx_bytes)
    return 0


def _mechanisms(done: list[dict[str, Any]]) -> dict[str, str]:
    return {f["kind"]: f.get("mechanism", "") for f in done}


async def _converge(
    cluster: Cluster,
    workload: Workload,
    history: HistoryWriter,
    run_dir: Path,
    scenario: Scenario,
    say: Callable[[str], None],
) -> None:
    """Restart what is down, then read until the checker finds nothing lost (at most
    ``settle`` s). Stopping early reads only what clients were told: no node is asked
    whether it is done."""
    for i, node in sorted(cluster.nodes.items()):
        if not node.running:
            await cluster.start(i)
            history.record("nemesis", "info", "restart", i, None, {"node": i, "final": True})
    deadline = time.monotonic() + scenario.settle
    while True:
        for i in range(scenario.nodes):
            await workload.read(i)
        began = time.monotonic()
        lost = check(read_history(run_dir / "history.jsonl", allow_torn_tail=True)).counts
        # Checking a long history takes seconds: poll no more often than twice its cost.
        pause = max(1.0, 2 * (time.monotonic() - began))
        if lost.get("lost", 0) == 0 and lost.get("corrupt", 0) == 0:
            say("converged: every acknowledged event is at every eligible subscriber")
            return
        if time.monotonic() > deadline:
            say(f"not converged after {scenario.settle:.0f} s: {lost}")
            return
        await asyncio.sleep(pause)


class _Nemesis:
    """Makes the planned faults on time and records each as an ``info`` op."""

    def __init__(
        self,
        cluster: Cluster,
        links: LinkFaults,
        history: HistoryWriter,
        say: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.links = links
        self.history = history
        self.say = say
        self.done: list[dict[str, Any]] = []

    async def run(self, plan: list[PlannedFault], duration: float) -> None:
        started = time.monotonic()
        for fault in plan:
            await asyncio.sleep(max(0.0, started + fault.at - time.monotonic()))
            mechanism = await self._start(fault)
            self.history.record(
                "nemesis", "info", "fault", None, None, {**fault.describe(), "mechanism": mechanism}
            )
            self.say(
                f"fault {fault.id} {fault.kind} on {list(fault.nodes)} "
                f"({mechanism}) for {fault.length:.1f} s"
            )
            await asyncio.sleep(max(0.0, started + fault.heal_at - time.monotonic()))
            await self._heal(fault)
            self.history.record(
                "nemesis",
                "info",
                "heal",
                None,
                None,
                {"id": fault.id, "kind": fault.kind, "nodes": list(fault.nodes)},
            )
            self.done.append({**fault.describe(), "at": fault.at, "mechanism": mechanism})
        await asyncio.sleep(max(0.0, started + duration - time.monotonic()))

    async def _start(self, fault: PlannedFault) -> str:
        nodes, p = list(fault.nodes), fault.params
        match fault.kind:
            case "loss":
                await asyncio.to_thread(self.links.loss, nodes, p["percent"])
                return str(self.links.mechanism("loss"))
            case "delay" | "reorder" | "duplicate" | "corrupt":
                await asyncio.to_thread(
                    lambda: self.links.shape(
                        nodes,
                        delay_ms=p.get("delay_ms", 0),
                        jitter_ms=p.get("jitter_ms", 0),
                        reorder_pct=p.get("reorder_pct", 0),
                        duplicate_pct=p.get("duplicate_pct", 0),
                        corrupt_pct=p.get("corrupt_pct", 0),
                    )
                )
                return str(self.links.mechanism("shape"))
            case "rate":
                await asyncio.to_thread(self.links.rate, nodes, p["kbit"])
                return str(self.links.mechanism("rate"))
            case kind if kind.startswith("partition-"):
                await asyncio.to_thread(self.links.partition, p["groups"])
                return str(self.links.mechanism("partition"))
            case "kill" | "kill-restart":
                for i in nodes:
                    self.cluster.kill(i)
                    self.history.record("nemesis", "info", "kill", i, None, {"node": i})
                return "SIGKILL"
            case "pause":
                for i in nodes:
                    self.cluster.pause(i)
                    self.history.record("nemesis", "info", "pause", i, None, {"node": i})
                return "SIGSTOP"
            case "skew-ahead" | "skew-behind":
                for i in nodes:
                    self.cluster.skew(i, p["offset_s"])
                return "libfaketime"
            case "disk-full":
                for i in nodes:
                    self.cluster.fill_disk(i)
                return "tmpfs"
        raise ValueError(f"unknown fault kind {fault.kind!r}")

    async def _heal(self, fault: PlannedFault) -> None:
        nodes = list(fault.nodes)
        match fault.kind:
            case "kill-restart":
                for i in nodes:
                    await self.cluster.start(i)
                    self.history.record("nemesis", "info", "restart", i, None, {"node": i})
            case "kill":
                pass  # down until the end of the workload
            case "pause":
                for i in nodes:
                    self.cluster.resume(i)
                    self.history.record("nemesis", "info", "resume", i, None, {"node": i})
            case "skew-ahead" | "skew-behind":
                for i in nodes:
                    self.cluster.skew(i, 0)
            case "disk-full":
                for i in nodes:
                    self.cluster.free_disk(i)
            case _:
                await asyncio.to_thread(self.links.clear_all)
