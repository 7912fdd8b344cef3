"""The node processes of a verify run, and the faults the OS makes on them.

Each node is a real ``pulsarcast node`` process in its own network namespace
(:class:`~pulsar.tools.netlab.netns.TestNetwork`): its p2p port on the data network (where the
kernel faults traffic), its REST API on the management network (never faulted: the
clients' view of a node is its API, and a partition must not look like a dead API).

Process faults are the operating system's, not ours:

* ``kill``: ``SIGKILL`` to the node's process group (no flush, no goodbye), and later a
  start on the same data directory and port.
* ``pause``: ``SIGSTOP`` / ``SIGCONT`` (the node keeps its sockets; peers see silence).
* clock skew: every node runs under libfaketime (Debian's ``faketime``) with an offset
  file it re-reads every second, so a node's wall clock moves minutes ahead or behind
  without a restart; its monotonic clock is left alone (timers stay sane, as on a host
  whose NTP stepped the clock).
* a full disk: each data directory is a size-capped tmpfs; the fault fills it with a
  filler file, the heal deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import aiohttp

from pulsar.tools.netlab.netns import TestNetwork

__all__ = ["FAKETIME_LIB", "Cluster", "NodeProcess", "P2P_PORT", "API_PORT"]

P2P_PORT = 7000
API_PORT = 8700
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
"""Debian's libfaketime (``apt-get install faketime``); without it skew faults are refused."""
START_TIMEOUT = 60.0


@dataclass
class NodeProcess:
    index: int
    data_dir: Path
    skew_file: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Cluster:
    """``size`` node processes (plus spares, e.g. a fresh replayer) on a test network."""

    def __init__(
        self, net: TestNetwork, run_dir: Path, token: str, *, disk_mib: int,
        min_acks: int = 1, bootstrap: int = 3,
    ) -> None:
        self.net = net
        self.run_dir = run_dir
        self.token = token
        self.disk_mib = disk_mib
        self.min_acks = min_acks
        self.bootstrap = bootstrap
        self.nodes: dict[int, NodeProcess] = {}
        self._logs: list[IO[bytes]] = []
        self.skew_supported = FAKETIME_LIB.exists()

    # ------------------------------------------------------------------ addresses

    def api_url(self, index: int) -> str:
        return f"http://{self.net.mgmt_address(index)}:{API_PORT}"

    def p2p(self, index: int) -> str:
        return f"{self.net.data_address(index)}:{P2P_PORT}"

    # ------------------------------------------------------------------ lifecycle

    def prepare(self, index: int) -> NodeProcess:
        """The node's data directory: a tmpfs of ``disk_mib`` MiB, mounted once."""
        data = self.run_dir / "nodes" / f"node-{index}"
        data.mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(data):
            subprocess.run(
                [
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    f"size={self.disk_mib}m,mode=0700",
                    "tmpfs",
                    str(data),
                ],
                check=True,
            )
        skew = self.run_dir / "nodes" / f"skew-{index}"
        skew.write_text("+0\n")
        node = NodeProcess(index, data, skew, self.run_dir / "logs" / f"node-{index}.log")
        node.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.nodes[index] = node
        return node

    async def start(self, index: int, seeds: list[int] | None = None) -> None:
        """Start (or restart) node ``index`` and wait until its API answers."""
        node = self.nodes.get(index) or self.prepare(index)
        if node.running:
            return
        if seeds is None:
            seeds = [i for i in range(min(self.bootstrap, len(self.nodes))) if i != index]
        argv = [
            sys.executable,
            "-m",
            "pulsar",
            "node",
            "--data-dir",
            str(node.data_dir),
            "--host",
            self.net.data_address(index),
            "--port",
            str(P2P_PORT),
            "--api-host",
            self.net.mgmt_address(index),
            "--api-port",
            str(API_PORT),
            "--token",
            self.token,
            "--min-acks",
            str(self.min_acks),
        ]
        for seed in seeds:
            argv += ["--bootstrap", self.p2p(seed)]
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if self.skew_supported:
            env.update(
                {
                    "LD_PRELOAD": str(FAKETIME_LIB),
                    "FAKETIME_TIMESTAMP_FILE": str(node.skew_file),
                    "FAKETIME_CACHE_DURATION": "1",
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                }
            )
        log = open(node.log_path, "ab")  # noqa: SIM115 - closed in stop_all
        self._logs.append(log)
        log.write(f"--- start {node.starts} at {time.time():.3f}\n".encode())
        log.flush()
        node.process = self.net.spawn(index, argv, env=env, stdout=log, stderr=log)
        node.starts += 1
        node.paused = False
        await self._wait_ready(node)

    async def _wait_ready(self, node: NodeProcess) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        url = self.api_url(node.index) + "/v1/health"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if not node.running:
                    raise RuntimeError(f"node {node.index} exited at start; see {node.log_path}")
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.2)
        raise RuntimeError(f"node {node.index} did not answer within {START_TIMEOUT} s")

    def kill(self, index: int) -> None:
        """SIGKILL the node's process group: a crash, not a stop."""
        node = self.nodes[index]
        if node.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait()
        node.paused = False

    def pause(self, index: int) -> None:
        node = self.nodes[index]
        if node.running and not node.paused:
            os.killpg(node.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            node.paused = True

    def resume(self, index: int) -> None:
        node = self.nodes[index]
        if node.running and node.paused:
            os.killpg(node.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
            node.paused = False

    def skew(self, index: int, offset_s: float) -> None:
        """Move the node's wall clock ``offset_s`` seconds (0 heals); read within 1 s."""
        if not self.skew_supported:
            raise RuntimeError(
                f"clock skew needs libfaketime at {FAKETIME_LIB} (apt-get install faketime)"
            )
        self.nodes[index].skew_file.write_text(f"{offset_s:+.0f}\n")

    def fill_disk(self, index: int) -> int:
        """Fill the node's tmpfs, leaving about 1 MiB; returns the bytes written."""
        data = self.nodes[index].data_dir
        free = os.statvfs(data).f_bavail * os.statvfs(data).f_frsize
        size = max(0, free - 1024 * 1024)
        chunk = b"\0" * (1024 * 1024)
        written = 0
        try:
            with open(data / "filler", "wb") as file:
                while written < size:
                    written += file.write(chunk[: min(len(chunk), size - written)])
        except OSError:
            pass  # full already: that is the point
        return written

    def free_disk(self, index: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.nodes[index].data_dir / "filler").unlink()

    def stop_all(self) -> None:
        """Kill every node and unmount the data directories (the run's files stay)."""
        for index, node in self.nodes.items():
            if node.process is not None and node.process.poll() is None:
                if node.paused:
                    self.resume(index)
                self.kill(index)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def unmount_all(self) -> None:
        for node in self.nodes.values():
            if os.path.ismount(node.data_dir):
                subprocess.run(["umount", "-l", str(node.data_dir)], check=False)
