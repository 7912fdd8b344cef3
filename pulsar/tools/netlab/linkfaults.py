"""Network faults made by the kernel, on node-to-node traffic only.

Every fault applies to the data interface ``d0`` inside the nodes' namespaces
(:mod:`pulsar.tools.netlab.netns`); the management network (``m0``, the REST API) is never
touched. One :class:`LinkFaults` owns all of them and keeps them as data: a dict from
:data:`FaultId` to a frozen fault (:class:`Loss`, :class:`Partition`, :class:`Rate`,
:class:`Shape`). After every change it works out what each node's kernel should hold and
rewrites only what differs, so applying the same fault twice, healing in any order or
clearing what is not there is harmless.

What makes each fault (:meth:`LinkFaults.mechanism` says it for the report):

``loss``, ``partition`` → ``"nftables"``
    One table ``ip pcv`` per namespace, rewritten whole and atomically with ``nft -f -``
    run inside the namespace: ``numgen random mod 10000 < p·100 drop`` on ``d0``'s output
    (loss is egress only), ``ip daddr``/``ip saddr`` sets dropped on output and input
    (a partition blocks both directions, on both sides).
``rate`` → ``"tbf"``
    A TBF root qdisc on ``d0``, through pyroute2.
``shape`` (delay, jitter, reorder, duplicate, corrupt, loss) → ``"netem"`` or ``"nfqueue"``
    netem when the kernel has it (found out once per process by adding one on ``lo``);
    otherwise a table ``ip pcvq`` whose output chain (priority -10, so before ``pcv``: a
    partition also stops packets the shaper held back) sends ``d0``'s unmarked IPv4 packets
    to NFQUEUE ``N`` with ``bypass``, and a :mod:`pulsar.tools.netlab.nfqueue` process bound to
    ``N`` inside the namespace. The rule is the native nftables ``queue`` statement, or the
    xtables ``NFQUEUE`` target through nft_compat on kernels without ``CONFIG_NFT_QUEUE``
    (checked once). A new spec starts a new shaper on a fresh queue number, switches the
    rule to it atomically, then stops the old one, which releases what it held.

Overlapping faults: partitions add up (the union of blocked pairs); for loss, rate and
shape the most recent fault naming a node wins, and healing it brings back the one before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, NewType

from .netns import TestNetwork
from .nfqueue import (
    DEFAULT_MARK,
    NETLINK_NETFILTER,
    ShaperStats,
    ShapeSpec,
    set_queue_rule,
)

__all__ = [
    "FILTER_TABLE",
    "SHAPE_TABLE",
    "Fault",
    "FaultError",
    "FaultId",
    "FaultKind",
    "LinkFaults",
    "Loss",
    "Partition",
    "Rate",
    "Shape",
    "available",
    "blocked_pairs",
    "render_filter",
    "render_shape_table",
]

FaultKind = Literal["loss", "partition", "rate", "shape"]
FaultId = NewType("FaultId", int)

#: The nftables table (family ip) holding loss and partition rules in every namespace.
FILTER_TABLE = "pcv"
#: The nftables table (family ip) sending packets to the NFQUEUE shaper.
SHAPE_TABLE = "pcvq"
_SHAPE_CHAIN = "shape"
_DEVICE = "d0"
_TBF_HANDLE = 0x10000  # 1:
_NETEM_CHILD_HANDLE = 0x100000  # 10:


class FaultError(RuntimeError):
    """The kernel refused a fault (an ``nft`` error, a shaper that did not start...)."""


@dataclass(frozen=True, slots=True)
class Loss:
    nodes: frozenset[int]
    percent: float


@dataclass(frozen=True, slots=True)
class Partition:
    """Pairs ``(a, b)`` with ``a < b`` that cannot exchange any IPv4 packet."""

    blocked: frozenset[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Rate:
    nodes: frozenset[int]
    kbit: int
    burst_bytes: int
    latency_ms: float


@dataclass(frozen=True, slots=True)
class Shape:
    nodes: frozenset[int]
    spec: ShapeSpec


Fault = Loss | Partition | Rate | Shape


def available() -> str | None:
    """None when faults can be made here (beyond :func:`pulsar.tools.netlab.netns.available`),
    else the reason: the ``nft`` tool (Debian package ``nftables``) is required."""
    if shutil.which("nft") is None:
        return "the nft command is missing (apt-get install nftables)"
    return None


def blocked_pairs(groups: Sequence[Sequence[int]], size: int) -> frozenset[tuple[int, int]]:
    """Every pair of nodes (of ``0..size-1``) that shares no group: what a partition into
    ``groups`` blocks. A node in two groups bridges them; a node in none is cut off."""
    members = [frozenset(group) for group in groups]
    for group in members:
        for node in group:
            if not 0 <= node < size:
                raise ValueError(f"node {node} not in a network of {size}")
    return frozenset(
        (a, b)
        for a, b in itertools.combinations(range(size), 2)
        if not any(a in group and b in group for group in members)
    )


def render_filter(
    blocked_peers: Sequence[str], loss_percent: float, *, table: str = FILTER_TABLE
) -> str:
    """The ``nft -f`` script that makes ``table`` hold exactly these rules on ``d0``
    (an empty table is deleted). Deleting and re-adding in one script is atomic."""
    script = [f"table ip {table}", f"delete table ip {table}"]
    if not blocked_peers and loss_percent <= 0:
        return "\n".join(script) + "\n"
    output = [f'oifname != "{_DEVICE}" accept']
    incoming = [f'iifname != "{_DEVICE}" accept']
    if blocked_peers:
        peers = ", ".join(sorted(blocked_peers))
        output.append(f"ip daddr {{ {peers} }} drop")
        incoming.append(f"ip saddr {{ {peers} }} drop")
    if loss_percent >= 100:
        output.append("drop")
    elif loss_percent > 0:
        output.append(f"numgen random mod 10000 < {round(loss_percent * 100)} drop")
    script.append(f"table ip {table} {{")
    for chain, hook, rules in (("output", "output", output), ("input", "input", incoming)):
        script.append(f"    chain {chain} {{")
        script.append(f"        type filter hook {hook} priority 0; policy accept;")
        script.extend(f"        {rule}" for rule in rules)
        script.append("    }")
    script.append("}")
    return "\n".join(script) + "\n"


def render_shape_table(
    queue: int | None, *, native: bool, mark: int = DEFAULT_MARK, table: str = SHAPE_TABLE
) -> str:
    """The ``nft -f`` script for the queueing table: None deletes it. With ``native``
    False the ``shape`` chain is left empty for :func:`pulsar.tools.netlab.nfqueue.set_queue_rule`
    to fill (xtables target)."""
    script = [f"table ip {table}", f"delete table ip {table}"]
    if queue is None:
        return "\n".join(script) + "\n"
    script += [
        f"table ip {table} {{",
        "    chain output {",
        "        type filter hook output priority -10; policy accept;",
        f'        oifname "{_DEVICE}" meta mark != {mark:#x} jump {_SHAPE_CHAIN}',
        "    }",
        f"    chain {_SHAPE_CHAIN} {{",
    ]
    if native:
        script.append(f"        queue num {queue} bypass")
    script += ["    }", "}"]
    return "\n".join(script) + "\n"


@dataclass(frozen=True, slots=True)
class _NodeState:
    """What one namespace's kernel holds, as far as faults go."""

    blocked_peers: frozenset[str] = frozenset()
    loss_percent: float = 0.0
    rate: Rate | None = None
    shape: ShapeSpec | None = None


@dataclass(slots=True)
class _Shaper:
    process: subprocess.Popen[bytes]
    queue: int
    spec: ShapeSpec
    stderr: IO[bytes]


# Kernel facts, found out once per process.
_probe_lock = threading.Lock()
_netem: list[bool] = []
_native_queue: list[bool] = []


class LinkFaults:
    """The faults on ``net``'s data links; see the module docstring.

    ``seed`` seeds the shapers (each gets one derived from it, the node and its queue
    number), so a schedule replays. ``shaper`` forces a shape mechanism ("auto": netem if
    the kernel has it). Methods may be called from any thread, one at a time."""

    def __init__(
        self,
        net: TestNetwork,
        *,
        seed: int = 0,
        shaper: Literal["auto", "netem", "nfqueue"] = "auto",
        python: str = sys.executable,
    ) -> None:
        self.net = net
        self.seed = seed
        self.shaper = shaper
        self.python = python
        self._faults: dict[FaultId, Fault] = {}
        # What each node's kernel holds; None: unknown (a change failed half-way), so the
        # next change rewrites all of it.
        self._applied: dict[int, _NodeState | None] = {}
        self._shapers: dict[int, _Shaper] = {}
        self._last_stats: dict[int, ShaperStats] = {}
        self._ids = itertools.count(1)
        self._queues = itertools.count()
        self._lock = threading.RLock()

    # -- faults

    def loss(self, nodes: Iterable[int], percent: float) -> FaultId:
        """Drop ``percent`` % of the packets these nodes send on ``d0``."""
        if not 0.0 <= percent <= 100.0:
            raise ValueError("percent must be within [0, 100]")
        return self._add(Loss(self._nodes(nodes), float(percent)))

    def partition(self, groups: Sequence[Sequence[int]]) -> FaultId:
        """Only nodes sharing a group can talk (see :func:`blocked_pairs`)."""
        return self._add(Partition(blocked_pairs(groups, self.net.size)))

    def partition_pairs(self, blocked: Iterable[tuple[int, int]]) -> FaultId:
        """Block exactly these pairs, both directions (the primitive under partition)."""
        pairs = set()
        for a, b in blocked:
            self._nodes((a, b))
            if a == b:
                raise ValueError(f"a node cannot be cut from itself: ({a}, {b})")
            pairs.add((min(a, b), max(a, b)))
        return self._add(Partition(frozenset(pairs)))

    def rate(
        self,
        nodes: Iterable[int],
        kbit: int,
        *,
        burst_bytes: int | None = None,
        latency_ms: float = 100.0,
    ) -> FaultId:
        """Limit what these nodes send on ``d0`` to ``kbit`` kbit/s (TBF); packets wait at
        most ``latency_ms`` in the bucket's queue, then are dropped."""
        if kbit <= 0:
            raise ValueError("kbit must be positive")
        burst = burst_bytes if burst_bytes is not None else max(4 * 1514, kbit * 1000 // 8 // 50)
        return self._add(Rate(self._nodes(nodes), int(kbit), int(burst), float(latency_ms)))

    def shape(
        self,
        nodes: Iterable[int],
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        reorder_pct: float = 0.0,
        duplicate_pct: float = 0.0,
        corrupt_pct: float = 0.0,
        loss_pct: float = 0.0,
    ) -> FaultId:
        """Delay (± jitter), reorder, duplicate, corrupt and lose what these nodes send."""
        spec = ShapeSpec(
            delay_ms=float(delay_ms),
            jitter_ms=float(jitter_ms),
            reorder_pct=float(reorder_pct),
            duplicate_pct=float(duplicate_pct),
            corrupt_pct=float(corrupt_pct),
            loss_pct=float(loss_pct),
        )
        return self._add(Shape(self._nodes(nodes), spec))

    # -- undoing them

    def heal(self, fault_id: FaultId) -> bool:
        """Undo one fault; False if it was not active (already healed or cleared)."""
        with self._lock:
            if self._faults.pop(fault_id, None) is None:
                return False
            self._apply()
            return True

    def clear_loss(self, nodes: Iterable[int] | None = None) -> None:
        self._clear(Loss, nodes)

    def clear_partition(self) -> None:
        self._clear(Partition, None)

    def clear_rate(self, nodes: Iterable[int] | None = None) -> None:
        self._clear(Rate, nodes)

    def clear_shape(self, nodes: Iterable[int] | None = None) -> None:
        self._clear(Shape, nodes)

    def clear_all(self) -> None:
        """Undo every fault: all nodes' links are clean afterwards."""
        with self._lock:
            self._faults.clear()
            self._apply()

    def close(self) -> None:
        """Clear everything and stop the shapers. After the network was destroyed (which
        killed the shapers) it only forgets them."""
        with self._lock:
            if self.net.built:
                self.clear_all()
                return
            self._faults.clear()
            self._applied.clear()
            for node, shaper in list(self._shapers.items()):
                self._stop_shaper(node, shaper)
            self._shapers.clear()

    def __enter__(self) -> LinkFaults:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- reading

    def active(self) -> dict[FaultId, Fault]:
        with self._lock:
            return dict(self._faults)

    def mechanism(self, kind: FaultKind) -> str:
        """What makes faults of ``kind`` on this machine, for the report."""
        if kind in ("loss", "partition"):
            return "nftables"
        if kind == "rate":
            return "tbf"
        if kind == "shape":
            return "netem" if self._use_netem() else "nfqueue"
        raise ValueError(f"unknown fault kind {kind!r}")

    def shaper_stats(self) -> dict[int, ShaperStats]:
        """The counts of each node's last stopped NFQUEUE shaper."""
        with self._lock:
            return dict(self._last_stats)

    # -- internals: state

    def _nodes(self, nodes: Iterable[int]) -> frozenset[int]:
        chosen = frozenset(int(node) for node in nodes)
        for node in chosen:
            if not 0 <= node < self.net.size:
                raise ValueError(f"node {node} not in a network of {self.net.size}")
        return chosen

    def _add(self, fault: Fault) -> FaultId:
        with self._lock:
            fault_id = FaultId(next(self._ids))
            self._faults[fault_id] = fault
            try:
                self._apply()
            except BaseException:
                del self._faults[fault_id]
                with contextlib.suppress(Exception):
                    self._apply()
                raise
            return fault_id

    def _clear(self, kind: type[Fault], nodes: Iterable[int] | None) -> None:
        chosen = None if nodes is None else self._nodes(nodes)
        with self._lock:
            for fault_id, fault in list(self._faults.items()):
                if not isinstance(fault, kind):
                    continue
                if chosen is None or isinstance(fault, Partition):
                    del self._faults[fault_id]
                    continue
                left = fault.nodes - chosen
                if not left:
                    del self._faults[fault_id]
                else:
                    self._faults[fault_id] = dataclasses.replace(fault, nodes=left)
            self._apply()

    def _desired(self, node: int) -> _NodeState:
        blocked: set[str] = set()
        loss = 0.0
        rate: Rate | None = None
        shape: ShapeSpec | None = None
        for fault in self._faults.values():  # insertion order: later faults win
            if isinstance(fault, Partition):
                for a, b in fault.blocked:
                    if node in (a, b):
                        blocked.add(self.net.data_address(b if node == a else a))
            elif node in fault.nodes:
                if isinstance(fault, Loss):
                    loss = fault.percent
                elif isinstance(fault, Rate):
                    rate = fault
                else:
                    shape = fault.spec
        return _NodeState(frozenset(blocked), loss, rate, shape)

    def _apply(self) -> None:
        errors: list[str] = []
        for node in range(self.net.size):
            want = self._desired(node)
            have = self._applied.get(node, _NodeState())
            if want == have:
                continue
            try:
                self._apply_node(node, want, have)
            except (OSError, FaultError, subprocess.SubprocessError) as error:
                errors.append(f"node {node}: {error}")
                self._applied[node] = None
            else:
                self._applied[node] = want
        if errors:
            raise FaultError("; ".join(errors))

    def _apply_node(self, node: int, want: _NodeState, have: _NodeState | None) -> None:
        """Rewrite what differs between ``have`` and ``want`` (all of it if unknown)."""

        def changed(*names: str) -> bool:
            return have is None or any(getattr(want, n) != getattr(have, n) for n in names)

        if changed("blocked_peers", "loss_percent"):
            self._nft(node, render_filter(sorted(want.blocked_peers), want.loss_percent))
        if self._use_netem():
            if changed("rate", "shape"):
                self._tc(node, want.rate, want.shape)
        else:
            if changed("rate"):
                self._tc(node, want.rate, None)
            if changed("shape"):
                self._switch_shaper(node, want.shape)

    # -- internals: the kernel

    def _nft(self, node: int, script: str) -> None:
        done = self.net.run(node, ["nft", "-f", "-"], input=script.encode(), timeout=20.0)
        if done.returncode != 0:
            raise FaultError(f"nft: {done.stderr.decode(errors='replace').strip()}")

    def _tc(self, node: int, rate: Rate | None, netem: ShapeSpec | None) -> None:
        self.net.with_rtnl(node, lambda ipr: _set_qdiscs(ipr, rate, netem))

    def _use_netem(self) -> bool:
        if self.shaper != "auto":
            return self.shaper == "netem"
        with _probe_lock:
            if not _netem:
                _netem.append(self._probe_netem())
            return _netem[0]

    def _probe_netem(self) -> bool:
        return bool(self.net.with_rtnl(0, _try_netem))

    def _native_queue(self) -> bool:
        with _probe_lock:
            if not _native_queue:
                probe = f"{SHAPE_TABLE}probe"
                script = render_shape_table(0, native=True, table=probe)
                done = self.net.run(0, ["nft", "-f", "-"], input=script.encode(), timeout=20.0)
                _native_queue.append(done.returncode == 0)
                cleanup = render_shape_table(None, native=True, table=probe)
                self.net.run(0, ["nft", "-f", "-"], input=cleanup.encode(), timeout=20.0)
            return _native_queue[0]

    def _switch_shaper(self, node: int, spec: ShapeSpec | None) -> None:
        """Point the node's queue rule at a new shaper (or remove it), then stop the old
        shaper, which releases what it still holds."""
        old = self._shapers.pop(node, None)
        try:
            if spec is None:
                self._nft(node, render_shape_table(None, native=True))
            else:
                shaper = self._start_shaper(node, spec)
                self._shapers[node] = shaper
                native = self._native_queue()
                if old is None or native:
                    self._nft(node, render_shape_table(shaper.queue, native=native))
                if not native:
                    try:
                        self._set_queue_rule(node, shaper.queue)
                    except FileNotFoundError:  # the table went missing: make it again
                        self._nft(node, render_shape_table(shaper.queue, native=False))
                        self._set_queue_rule(node, shaper.queue)
        finally:
            if old is not None:
                self._stop_shaper(node, old)

    def _set_queue_rule(self, node: int, queue: int) -> None:
        sock = self.net.open_socket(node, socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        with sock:
            sock.bind((0, 0))
            set_queue_rule(sock, SHAPE_TABLE, _SHAPE_CHAIN, queue)

    def _start_shaper(self, node: int, spec: ShapeSpec) -> _Shaper:
        queue = next(self._queues) % 0x10000
        seed = self.seed * 1_000_003 + node * 10_007 + queue
        argv = [
            self.python,
            "-m",
            "pulsar.tools.netlab.nfqueue",
            f"--queue={queue}",
            f"--seed={seed}",
            f"--mark={DEFAULT_MARK:#x}",
            *spec.argv(),
        ]
        root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the shaper
        process = self.net.spawn(node, argv, env=env, stdout=subprocess.PIPE, stderr=stderr)
        shaper = _Shaper(process, queue, spec, stderr)
        line = _read_line(process, deadline=time.monotonic() + 15.0)
        if line.strip() != b"ready":
            self._stop_shaper(node, shaper, keep_stats=False, close_stderr=False)
            stderr.seek(0)
            detail = stderr.read().decode(errors="replace").strip() or line.decode(errors="replace")
            stderr.close()
            raise FaultError(f"the NFQUEUE shaper of node {node} did not start: {detail}")
        return shaper

    def _stop_shaper(
        self, node: int, shaper: _Shaper, *, keep_stats: bool = True, close_stderr: bool = True
    ) -> None:
        process = shaper.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        try:
            out, _ = process.communicate(timeout=10.0)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        if keep_stats:
            for line in reversed(out.decode(errors="replace").splitlines()):
                with contextlib.suppress(ValueError):
                    self._last_stats[node] = ShaperStats.parse(line)
                    break
        if close_stderr and not shaper.stderr.closed:
            shaper.stderr.close()


def _set_qdiscs(ipr: Any, rate: Rate | None, netem: ShapeSpec | None) -> None:
    """Make ``d0``'s root qdisc: TBF for a rate, netem for a shape, netem as the TBF's
    child (class 1:1) for both, so shaped packets are also rate-limited; the default for
    neither. Untested on this kernel (no netem): pinned by a test with a fake pyroute2."""
    from pyroute2.netlink.exceptions import NetlinkError

    index = ipr.link_lookup(ifname=_DEVICE)[0]
    try:
        ipr.tc("del", index=index, handle=_TBF_HANDLE, root=True)
    except NetlinkError as error:
        if error.code not in (errno.ENOENT, errno.EINVAL):
            raise
    if rate is not None:
        ipr.tc(
            "add",
            "tbf",
            index,
            handle=_TBF_HANDLE,
            rate=f"{rate.kbit}kbit",
            burst=rate.burst_bytes,
            latency=int(rate.latency_ms * 1000),  # microseconds
        )
    if netem is not None:
        where: dict[str, Any] = {"handle": _TBF_HANDLE}
        if rate is not None:
            where = {"handle": _NETEM_CHILD_HANDLE, "parent": _TBF_HANDLE | 1}
        ipr.tc("add", "netem", index, **where, **_netem_options(netem))


def _try_netem(ipr: Any) -> bool:
    """Whether the kernel has netem: add one on ``lo``, then remove it."""
    from pyroute2.netlink.exceptions import NetlinkError

    index = ipr.link_lookup(ifname="lo")[0]
    try:
        ipr.tc("add", "netem", index, handle=_TBF_HANDLE, delay=1000)
    except NetlinkError:
        return False
    with contextlib.suppress(NetlinkError):
        ipr.tc("del", index=index, handle=_TBF_HANDLE, root=True)
    return True


def _netem_options(spec: ShapeSpec) -> dict[str, Any]:
    options: dict[str, Any] = {
        "delay": int(spec.delay_ms * 1000),
        "jitter": int(spec.jitter_ms * 1000),
        "loss": spec.loss_pct,
        "duplicate": spec.duplicate_pct,
    }
    if spec.reorder_pct and spec.delay_ms:
        options["prob_reorder"] = spec.reorder_pct
    if spec.corrupt_pct:
        options["prob_corrupt"] = spec.corrupt_pct
    return options


def _read_line(process: subprocess.Popen[bytes], deadline: float) -> bytes:
    """One line of ``process``'s stdout, or what came before it exited or time ran out."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0]
