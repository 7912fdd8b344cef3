"""Driving node processes from a parent: the line protocol of benchmarks and the testbed.

Why processes: a node's per-event work (Ed25519, SQLite, DHT packing) is CPU-bound Python
and one event loop uses one core, so a network meant to use the whole machine — or a node
that must be killed like a real crash — runs in processes of its own. Each child is
``python -m <module>``, serving :class:`CommandWorker` commands; the parent holds a
:class:`WorkerProcess` per child.

The protocol: one JSON object per line on the child's stdin (a command,
``{"cmd": name, ...arguments}``), one JSON object per line back on the protocol channel (the
child's original stdout). Commands run one at a time, in order, and each gets exactly one
reply, ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``; a child may also send
``{"progress": {...}}`` lines at any time. Anything else the child prints (log records,
stray prints) goes to stderr, so it can never corrupt the protocol. ``stop`` is read even
while another command runs: it cancels that command, stops the worker and ends the
process; end of stdin (the parent went away) does the same, so a parent that fails or dies
leaves no nodes running behind it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, ClassVar

from pulsar.runtime.loop import run as run_loop

__all__ = ["CommandWorker", "WorkerProcess", "run_worker"]


class CommandWorker:
    """The child side: subclasses name their command methods in :attr:`commands`."""

    commands: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, channel: IO[str]) -> None:
        self.channel = channel

    def send(self, message: dict[str, Any]) -> None:
        self.channel.write(json.dumps(message, separators=(",", ":")) + "\n")
        self.channel.flush()

    async def handle(self, request: dict[str, Any]) -> None:
        """Run one command and send its reply (errors included)."""
        name = request.pop("cmd", None)
        try:
            if name not in self.commands:
                raise ValueError("unknown command")
            reply = getattr(self, name)(**request)
            if asyncio.iscoroutine(reply):
                reply = await reply
            self.send({"ok": True, **(reply or {})})
        except Exception as exc:
            self.send({"ok": False, "error": f"{name}: {exc!r}"})

    async def stop(self) -> None:
        """Stop everything this worker runs (called once, at the end)."""


async def _commands() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _serve(worker: CommandWorker) -> None:
    """Read commands; run them in order on a separate task, so ``stop`` (or end of input)
    is seen even while a long command is waiting."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def runner() -> None:
        while True:
            await worker.handle(await queue.get())

    commands = await _commands()
    running = asyncio.create_task(runner())
    try:
        while line := await commands.readline():
            request = json.loads(line)
            if request.get("cmd") == "stop":
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
                await worker.stop()
                worker.send({"ok": True})
                return
            queue.put_nowait(request)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await worker.stop()


def run_worker(make: Callable[[IO[str]], CommandWorker]) -> None:
    """Run one worker until told to stop or until stdin closes."""
    # The parent decides when to stop (Ctrl-C reaches the whole process group): it then
    # sends ``stop`` or closes stdin, and the nodes are stopped properly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr

    async def main() -> None:
        await _serve(make(channel))

    try:
        run_loop(main())
    finally:
        channel.close()


class WorkerProcess:
    """The parent side: one child process, its replies and its latest progress."""

    def __init__(self, label: str, process: asyncio.subprocess.Process) -> None:
        self.label = label
        self.process = process
        self.progress: dict[str, Any] = {}
        # Replies come back in the order the commands were sent; each call queues its future
        # in the same step as it writes its command, so calls from concurrent tasks pair up.
        self._waiting: collections.deque[asyncio.Future[dict[str, Any] | None]] = (
            collections.deque())
        self._ended = False
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def spawn(cls, module: str, label: str, *, quiet: bool = False,
                    env_extra: dict[str, str] | None = None) -> WorkerProcess:
        """Start ``python -m module``. ``quiet`` sends the child's stderr (its logs) to
        /dev/null instead of ours; ``env_extra`` adds to the child's environment."""
        # A source checkout works without installation too: the child imports the same
        # packages this process did.
        source = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ) | (env_extra or {})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL if quiet else None,
            env=env,
            limit=256 * 1024 * 1024,  # a statistics reply is one (long) line
        )
        return cls(label, process)

    async def _read(self) -> None:
        """Replies go to :meth:`call`; progress lines update :attr:`progress`."""
        assert self.process.stdout is not None
        try:
            while line := await self.process.stdout.readline():
                message = json.loads(line)
                if "progress" in message:
                    self.progress = message["progress"]
                elif self._waiting:
                    future = self._waiting.popleft()
                    if not future.done():
                        future.set_result(message)
        except (ValueError, asyncio.LimitOverrunError) as exc:
            print(f"{self.label}: unreadable output ({exc!r})", file=sys.stderr)
        finally:
            self._ended = True  # end of stream: no reply will come
            while self._waiting:
                future = self._waiting.popleft()
                if not future.done():
                    future.set_result(None)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def call(self, command: str, **arguments: Any) -> dict[str, Any]:
        """Send one command and wait for its reply; a worker error becomes a RuntimeError."""
        assert self.process.stdin is not None
        if self._ended:
            raise RuntimeError(f"{self.label} has exited (before {command!r})")
        future: asyncio.Future[dict[str, Any] | None] = (
            asyncio.get_running_loop().create_future())
        self._waiting.append(future)
        try:
            self.process.stdin.write(json.dumps({"cmd": command, **arguments}).encode() + b"\n")
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise RuntimeError(f"{self.label} is gone (during {command!r})") from None
        reply = await future
        if reply is None:
            raise RuntimeError(f"{self.label} exited during {command!r}")
        if not reply["ok"]:
            raise RuntimeError(f"{self.label}: {reply['error']}")
        return reply

    async def kill(self) -> None:
        """SIGKILL: the child gets no chance to flush or say goodbye (a crash)."""
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        with contextlib.suppress(Exception):
            await self._reader

    async def close(self) -> None:
        """Ask the worker to stop its nodes; kill it if that fails or it does not exit in
        time. Always waits for the process, so none is left behind (not even a zombie)."""
        stopped = False
        try:
            if self.process.returncode is None:
                async with asyncio.timeout(30):
                    await self.call("stop")
                stopped = True
        except Exception as exc:
            if self.process.returncode is None:
                print(f"{self.label} did not stop ({exc!r}); killing it", file=sys.stderr)
        finally:
            if self.process.stdin is not None:
                self.process.stdin.close()
            if not stopped and self.process.returncode is None:
                self.process.kill()
            try:
                async with asyncio.timeout(10):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
            with contextlib.suppress(Exception):
                await self._reader
