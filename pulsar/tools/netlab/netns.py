"""The test network: one Linux network namespace per node, joined by two bridges.

Layout for ``TestNetwork("pcv", 3)`` (names in the root namespace stay under 16 bytes)::

    root namespace                                namespace pcv{i}, i = 0..2
    bridge pcvd (no address) ── veth pcv{i}d ═══ d0  198.18.0.(10+i)/24   data
    bridge pcvm 198.19.0.1/24 ── veth pcv{i}m ═══ m0  198.19.0.(10+i)/24   management

Why two networks: :mod:`pulsar.tools.netlab.linkfaults` faults ``d0`` only, so the harness keeps
reaching every node's REST API over ``m0`` whatever the schedule does to node-to-node
traffic. The management bridge isolates its ports from one another (bridge port flag
``isolated``), so two nodes can never talk over it and a partition cannot be bypassed: each
node reaches the host (198.19.0.1) and nothing else there. Both address ranges are RFC 2544
benchmarking networks, no node has a default route, and IPv6 is off in the namespaces and on
the root-side interfaces, so nothing leaves the namespaces this module makes.

Lifetime: :meth:`TestNetwork.build` first removes whatever an earlier run with the same
prefix left behind (:func:`cleanup_leftovers`, which also works after the harness was
SIGKILLed); :meth:`TestNetwork.destroy` SIGKILLs every process still inside the
namespaces, then deletes links and namespaces. A ``with`` block, ``atexit`` and a SIGTERM
handler make Ctrl-C, SIGTERM and exceptions tear the network down. The handler raises
``SystemExit`` and is installed only by a build in the main thread, and only if SIGTERM
still has its default action (a harness that builds from a worker thread, or has its own
handler, unwinds itself). A forked copy of this process (``multiprocessing``, a library's
helper) never runs the teardown: the handler exits it at once and
:meth:`~TestNetwork.destroy` is a no-op outside the building process.

One network at a time per host and *slot*: the management bridge owns 198.19.0.1/24 in
the root namespace, so :meth:`TestNetwork.build` and :func:`cleanup_leftovers` take an
``flock`` on ``/run/pulsarcast-verify.lock`` (released by the kernel when the holder dies)
and wait for another run to finish; a leftover bridge of a dead run that still holds
198.19.0.1 is removed whatever its prefix. Slot ``k`` > 0 uses 198.18.k.0/24 and
198.19.k.0/24 (host 198.19.k.1) and its own lock ``/run/pulsarcast-verify-k.lock``, so a
``pulsarcast verify`` (slot 0) and a testbed run in namespaces (slot 1) can share a host
when given different prefixes. One process holds one network at a time.

Nothing here forks the Python process. :func:`in_namespace` runs a function in a
short-lived thread that has ``setns(2)``-ed into the namespace (a network namespace belongs
to a thread, not to the process): sockets it opens live there, processes it starts with
``subprocess`` (no ``preexec_fn``: only CPython's C code runs between ``fork`` and ``exec``)
start there, and pyroute2's netlink socket (:func:`with_rtnl`) talks to that namespace's
kernel. Namespaces are created the same way (``unshare(2)`` in a thread, then pyroute2's
bind mount), not with pyroute2's forking helpers, which a multi-threaded harness should
avoid.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import IO, Any, TypeVar

__all__ = [
    "DATA_NETWORK",
    "HOST_MGMT_ADDRESS",
    "MAX_NODES",
    "MGMT_NETWORK",
    "NETNS_DIR",
    "InterfaceCounters",
    "TestNetwork",
    "available",
    "cleanup_leftovers",
    "enter",
    "ensure_neighbour_room",
    "in_namespace",
    "namespace_pids",
    "neighbour_limits",
    "with_rtnl",
]

#: Node-to-node protocol traffic: node i is 198.18.0.(10+i) (RFC 2544 benchmarking range);
#: slot k uses 198.18.k.0/24.
DATA_NETWORK = "198.18.0.0/24"
#: Harness-to-node REST traffic: node i is 198.19.0.(10+i), the host 198.19.0.1.
MGMT_NETWORK = "198.19.0.0/24"
HOST_MGMT_ADDRESS = "198.19.0.1"
#: 10 + 239 = 249: the last node address stays below the broadcast address.
MAX_NODES = 240
MAX_SLOT = 15
"""Slots 0..15: a network's third address byte."""
#: Where named network namespaces are bind-mounted (as ``ip netns`` and pyroute2 do).
NETNS_DIR = "/run/netns"

_LOCK_PATH = "/run/pulsarcast-verify.lock"


def _lock_path(slot: int) -> str:
    return _LOCK_PATH if slot == 0 else f"/run/pulsarcast-verify-{slot}.lock"


def _host_address(slot: int) -> str:
    return f"198.19.{slot}.1"


def _check_slot(slot: int) -> None:
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(f"slot must be within [0, {MAX_SLOT}], not {slot}")
_CLONE_NEWNET = 0x40000000
_IFNAMSIZ = 16
_PREFIX = re.compile(r"[a-z](?:[a-z0-9]*[a-z])?")
_NAMESPACE_NAME = re.compile(r"[a-z][a-z0-9]*[a-z][0-9]+|[a-z][0-9]+")
_LINK_NAME = re.compile(r"[a-z][a-z0-9]*[dm]")

_T = TypeVar("_T")
_File = int | IO[Any] | None


@dataclass(frozen=True, slots=True)
class InterfaceCounters:
    """The kernel's counters of one interface (``IFLA_STATS64``), read at one moment."""

    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    rx_dropped: int
    tx_dropped: int

    def __sub__(self, earlier: InterfaceCounters) -> InterfaceCounters:
        """What happened between ``earlier`` and this reading."""
        return InterfaceCounters(
            rx_bytes=self.rx_bytes - earlier.rx_bytes,
            tx_bytes=self.tx_bytes - earlier.tx_bytes,
            rx_packets=self.rx_packets - earlier.rx_packets,
            tx_packets=self.tx_packets - earlier.tx_packets,
            rx_dropped=self.rx_dropped - earlier.rx_dropped,
            tx_dropped=self.tx_dropped - earlier.tx_dropped,
        )


# --- entering a namespace -----------------------------------------------------------------

_libc: Any = None


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python >= 3.12
    if setns is not None:
        setns(fd, _CLONE_NEWNET)
        return
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def enter(path: str) -> None:
    """Move the calling thread into the network namespace at ``path``, for good.

    Called first thing by a process that has not started any thread yet, this moves the
    whole process (threads it starts later inherit the namespace): how a child started by
    asyncio's subprocess support, which cannot run code in a chosen namespace before
    ``exec``, gets there (``PULSARCAST_NETNS`` in :mod:`pulsar.tools.testbed.agent`)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(fd)
    finally:
        os.close(fd)


def in_namespace(path: str, function: Callable[[], _T]) -> _T:
    """Run ``function`` in a fresh thread that has joined the network namespace at ``path``
    and return its result (or raise its exception).

    Sockets it creates stay in that namespace, and so do processes it forks. The calling
    thread is never moved, so nothing else in the process changes namespace."""
    results: list[_T] = []
    errors: list[BaseException] = []

    def enter_and_call() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            results.append(function())
        except BaseException as error:  # handed to the caller below
            errors.append(error)

    thread = threading.Thread(target=enter_and_call, name=f"netns:{os.path.basename(path)}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def with_rtnl(path: str, function: Callable[[Any], _T]) -> _T:
    """Call ``function`` with a pyroute2 ``IPRoute`` opened inside the namespace at ``path``
    (by :func:`in_namespace`), and close it.

    Why not ``IPRoute(netns=...)``: pyroute2 forks a helper process for that, and forking a
    multi-threaded harness is how deadlocks happen; a thread is also ~5x faster."""
    from pyroute2 import IPRoute

    def call() -> _T:
        with IPRoute(groups=0) as ipr:
            return function(ipr)

    return in_namespace(path, call)


def _create_namespace(name: str) -> None:
    """Create the named network namespace without forking: a throwaway thread unshares a
    new one and pyroute2 bind-mounts it at ``NETNS_DIR/name`` (as ``ip netns add`` does)."""
    from pyroute2 import netns

    def unshare_and_attach() -> None:
        global _libc
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        if _libc.unshare(_CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"unshare: {os.strerror(code)}")
        netns.attach(name, threading.get_native_id())

    errors: list[BaseException] = []

    def run() -> None:
        try:
            unshare_and_attach()
        except BaseException as error:  # handed to the caller below
            errors.append(error)

    thread = threading.Thread(target=run, name=f"netns-create:{name}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def namespace_pids(path: str) -> list[int]:
    """The processes whose network namespace is the one bind-mounted at ``path``."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, a zombie, or a kernel thread
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            pids.append(int(entry))
    return pids


def _kill_all(path: str, deadline: float) -> None:
    """SIGKILL every process in the namespace at ``path`` until none is left or time is up."""
    while True:
        pids = [pid for pid in namespace_pids(path) if pid != os.getpid()]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _write_sysctl(path: str, value: str) -> None:
    with contextlib.suppress(OSError), open(path, "w") as handle:
        handle.write(value)


_NEIGH = "/proc/sys/net/ipv4/neigh/default/gc_thresh{}"


def neighbour_limits(size: int) -> tuple[int, int, int]:
    """The ARP table thresholds (``gc_thresh1..3``) a network of ``size`` nodes needs.

    The kernel's neighbour table is one table for every namespace, its limits set in the
    root namespace only (default 128 / 512 / 1024 entries). A full mesh of ``size`` nodes
    holds up to ``size * (size - 1)`` entries: 50 nodes already pass 1024, and beyond the
    hard limit the kernel refuses new entries ("neighbor table overflow"), so a node that
    started late cannot send a single packet (its UDP sends fail with ENOBUFS). Room for two
    such networks (a verify run beside a testbed run) plus the host's own."""
    hard = 2 * size * size + 1024
    return hard // 8, hard // 2, hard


def ensure_neighbour_room(size: int) -> None:
    """Raise the host's ARP table thresholds to :func:`neighbour_limits` where lower.
    Never lowers them (another network may be using the room); a host-wide change that
    docs/operations.md names."""
    for number, wanted in enumerate(neighbour_limits(size), start=1):
        path = _NEIGH.format(number)
        try:
            with open(path) as handle:
                current = int(handle.read().strip())
        except (OSError, ValueError):
            continue
        if current < wanted:
            _write_sysctl(path, str(wanted))


# --- leftovers and availability -----------------------------------------------------------


def _check_prefix(prefix: str) -> None:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"prefix {prefix!r}: lower-case letters and digits, starting and ending with a "
            "letter (a trailing digit would make prefix 'a1' + node 0 read as 'a' + node 10)"
        )


def _remove_namespace(name: str) -> None:
    from pyroute2 import netns

    path = os.path.join(NETNS_DIR, name)
    _kill_all(path, time.monotonic() + 5.0)
    with contextlib.suppress(FileNotFoundError):
        netns.remove(name)


def _delete_links(names: Sequence[str]) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute(groups=0) as ipr:
        for name in names:
            for index in ipr.link_lookup(ifname=name):
                try:
                    ipr.link("del", index=index)
                except NetlinkError as error:  # a veth goes with its peer's namespace
                    if error.code != errno.ENODEV:
                        raise


def _root_links() -> list[str]:
    from pyroute2 import IPRoute

    with IPRoute(groups=0) as ipr:
        return [str(link.get_attr("IFLA_IFNAME")) for link in ipr.get_links()]


def cleanup_leftovers(prefix: str, *, lock_timeout: float = 120.0, slot: int = 0) -> None:
    """Remove every namespace, bridge and veth whose name starts with ``prefix`` and has the
    shape of a :class:`TestNetwork`'s (``{p}{i}``, ``{p}d``, ``{p}m``, ``{p}{i}d``,
    ``{p}{i}m``), first SIGKILLing the processes inside those namespaces.

    Takes the host lock of ``slot`` first, so it never tears down a network another process
    is still using: it waits for that run to end (at most ``lock_timeout`` seconds). Names
    of another shape (``pcvd-hub``) are never touched. A network of this process with a
    matching prefix is marked destroyed (its :meth:`~TestNetwork.destroy` becomes a no-op),
    since what it owned is gone. Safe to call when nothing is left."""
    from pyroute2 import netns

    _check_prefix(prefix)
    _check_slot(slot)
    _acquire_host(lock_timeout, slot)
    try:
        with _registry_lock:
            for network in list(_live.values()):
                if network.prefix.startswith(prefix):
                    network._forget()
        for name in netns.listnetns():
            if name.startswith(prefix) and _NAMESPACE_NAME.fullmatch(name):
                _remove_namespace(name)
        ours = [n for n in _root_links() if n.startswith(prefix) and _LINK_NAME.fullmatch(n)]
        _delete_links(ours)
    finally:
        _release_host()


_availability: list[str | None] = []


def available() -> str | None:
    """None when this machine can build a :class:`TestNetwork`; else why not (for skips)."""
    if _availability:
        return _availability[0]
    reason: str | None = None
    if not sys.platform.startswith("linux"):
        reason = "network namespaces need Linux"
    elif os.geteuid() != 0:
        reason = "building network namespaces, veths and bridges needs root"
    else:
        try:
            from pyroute2 import IPRoute, netns
        except ImportError:  # pragma: no cover - a declared dependency
            reason = "pyroute2 is not installed"
        else:
            name = f"pcvp{os.getpid()}x"  # at most 12 bytes: also a valid interface name
            try:
                _create_namespace(name)
                with IPRoute(groups=0) as ipr:
                    ipr.link("add", ifname=name, kind="bridge")
                    ipr.link("del", index=ipr.link_lookup(ifname=name)[0])
            except Exception as error:
                reason = f"cannot create a network namespace and a bridge: {error}"
            finally:
                with contextlib.suppress(Exception):
                    netns.remove(name)
    _availability.append(reason)
    return reason


# --- the process-wide registry, the host lock, signals --------------------------------------

_registry_lock = threading.RLock()
_live: dict[str, TestNetwork] = {}
_host_lock_fd: int | None = None
_host_lock_slot = 0
_host_lock_users = 0
_previous_sigterm: Any = None
_atexit_registered = False


_owner_pid = os.getpid()


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    """Unwind (``with`` blocks and atexit tear the network down) in the process that
    installed the handler; a forked child (pyroute2 forks helpers) just dies, as SIGTERM's
    default would make it, and must never run our teardown."""
    if os.getpid() != _owner_pid:
        os._exit(128 + signum)
    raise SystemExit(128 + signum)


def _destroy_all() -> None:
    with _registry_lock:
        networks = list(_live.values())
    for network in networks:
        with contextlib.suppress(Exception):
            network.destroy()


def _acquire_host(timeout: float, slot: int) -> None:
    global _host_lock_fd, _host_lock_users, _previous_sigterm, _atexit_registered, _owner_pid
    global _host_lock_slot
    with _registry_lock:
        if _host_lock_users and slot != _host_lock_slot:
            raise RuntimeError(
                f"this process holds test network slot {_host_lock_slot}, not {slot}: "
                "one network at a time"
            )
        if _host_lock_users == 0:
            path = _lock_path(slot)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        os.close(fd)
                        raise TimeoutError(
                            f"another test network holds {path} for more than {timeout} s"
                        ) from None
                    time.sleep(0.05)
            _host_lock_fd = fd
            _host_lock_slot = slot
            main = threading.current_thread() is threading.main_thread()
            if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                _owner_pid = os.getpid()
                _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
            if not _atexit_registered:
                atexit.register(_destroy_all)
                _atexit_registered = True
        _host_lock_users += 1


def _release_host() -> None:
    global _host_lock_fd, _host_lock_users, _previous_sigterm
    with _registry_lock:
        _host_lock_users -= 1
        if _host_lock_users > 0 or _host_lock_fd is None:
            return
        os.close(_host_lock_fd)
        _host_lock_fd = None
        if _previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, _previous_sigterm)
            _previous_sigterm = None


# --- the network ----------------------------------------------------------------------------


class TestNetwork:
    """``size`` nodes, each in network namespace ``f"{prefix}{i}"``, on a data bridge and a
    management bridge (see the module docstring for the layout and the lifetime rules)."""

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(
        self, prefix: str, size: int, *, lock_timeout: float = 120.0, slot: int = 0
    ) -> None:
        _check_prefix(prefix)
        _check_slot(slot)
        if not 1 <= size <= MAX_NODES:
            raise ValueError(f"size must be within [1, {MAX_NODES}]")
        longest = f"{prefix}{size - 1}d"
        if len(longest) >= _IFNAMSIZ:
            raise ValueError(f"prefix {prefix!r} too long: interface {longest!r} > 15 bytes")
        self._prefix = prefix
        self._size = size
        self._slot = slot
        self._lock_timeout = lock_timeout
        self._built = False
        self._holds_host = False
        self._pid = os.getpid()
        self._children: list[subprocess.Popen[bytes]] = []

    # -- names and addresses

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def size(self) -> int:
        return self._size

    @property
    def slot(self) -> int:
        return self._slot

    @property
    def host_address(self) -> str:
        """The root namespace's address on the management network."""
        return _host_address(self._slot)

    def _check(self, i: int) -> None:
        if not 0 <= i < self._size:
            raise IndexError(f"node {i} not in a network of {self._size}")

    def namespace(self, i: int) -> str:
        self._check(i)
        return f"{self._prefix}{i}"

    def namespace_path(self, i: int) -> str:
        return os.path.join(NETNS_DIR, self.namespace(i))

    def data_address(self, i: int) -> str:
        self._check(i)
        return f"198.18.{self._slot}.{10 + i}"

    def mgmt_address(self, i: int) -> str:
        self._check(i)
        return f"198.19.{self._slot}.{10 + i}"

    def _root_link_names(self) -> list[str]:
        veths = [f"{self._prefix}{i}{end}" for i in range(self._size) for end in "dm"]
        return [*veths, self.data_bridge(), self.mgmt_bridge()]

    def data_bridge(self) -> str:
        return f"{self._prefix}d"

    def mgmt_bridge(self) -> str:
        return f"{self._prefix}m"

    # -- lifetime

    def __enter__(self) -> TestNetwork:
        self.build()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.destroy()

    @property
    def built(self) -> bool:
        return self._built

    def build(self) -> None:
        """Create bridges, namespaces, veths and addresses; a no-op when already built."""
        if self._built:
            return
        self._pid = os.getpid()
        with _registry_lock:
            for prefix in _live:
                if prefix != self._prefix:
                    raise RuntimeError(f"test network {prefix!r} is up: one network at a time")
        _acquire_host(self._lock_timeout, self._slot)
        self._holds_host = True
        try:
            cleanup_leftovers(self._prefix, slot=self._slot)
            self._take_host_address()
            ensure_neighbour_room(self._size)
            with _registry_lock:
                _live[self._prefix] = self
            self._built = True
            self._create()
        except BaseException:
            self.destroy()
            raise

    def _take_host_address(self) -> None:
        """Make sure no other bridge holds our host address (198.19.0.1 for slot 0): a
        leftover of a dead run with another prefix is removed (we hold the slot's lock, so
        its owner is gone); a live network of this process is an error."""
        from pyroute2 import IPRoute

        with IPRoute(groups=0) as ipr:
            holders = {
                ipr.get_links(addr["index"])[0].get_attr("IFLA_IFNAME")
                for addr in ipr.get_addr(family=socket.AF_INET)
                if addr.get_attr("IFA_ADDRESS") == self.host_address
            }
        for name in holders:
            other = name[:-1]
            with _registry_lock:
                if other in _live:
                    raise RuntimeError(
                        f"test network {other!r} is up in this process: one network at a time"
                    )
            if name.endswith("m") and _PREFIX.fullmatch(other):
                cleanup_leftovers(other, slot=self._slot)
            else:
                raise RuntimeError(f"{name} already holds {self.host_address}: not ours")

    def _create(self) -> None:
        from pyroute2 import IPRoute

        for i in range(self._size):
            _create_namespace(self.namespace(i))
            in_namespace(self.namespace_path(i), _disable_ipv6)
        with IPRoute(groups=0) as ipr:
            bridges = {}
            for name in (self.data_bridge(), self.mgmt_bridge()):
                ipr.link("add", ifname=name, kind="bridge")
                _write_sysctl(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", "1")
                bridges[name] = ipr.link_lookup(ifname=name)[0]
            mgmt = bridges[self.mgmt_bridge()]
            ipr.addr("add", index=mgmt, address=self.host_address, prefixlen=24)
            for index in bridges.values():
                ipr.link("set", index=index, state="up")
            for i in range(self._size):
                name = self.namespace(i)
                for inner, bridge in (("d0", self.data_bridge()), ("m0", self.mgmt_bridge())):
                    outer = f"{name}{inner[0]}"
                    # An open descriptor, not a name: pyroute2 would create a missing one.
                    fd = os.open(self.namespace_path(i), os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        peer = {"ifname": inner, "net_ns_fd": fd}
                        ipr.link("add", ifname=outer, kind="veth", peer=peer)
                    finally:
                        os.close(fd)
                    _write_sysctl(f"/proc/sys/net/ipv6/conf/{outer}/disable_ipv6", "1")
                    index = ipr.link_lookup(ifname=outer)[0]
                    ipr.link("set", index=index, master=bridges[bridge])
                    if inner == "m0":
                        # Nodes reach the host over the management bridge, never each other.
                        ipr.brport("set", index=index, isolated=1)
                    ipr.link("set", index=index, state="up")
        for i in range(self._size):
            addresses = (("d0", self.data_address(i)), ("m0", self.mgmt_address(i)))

            def configure(inside: Any, addresses: tuple[tuple[str, str], ...] = addresses) -> None:
                inside.link("set", index=inside.link_lookup(ifname="lo")[0], state="up")
                for inner, address in addresses:
                    index = inside.link_lookup(ifname=inner)[0]
                    inside.addr("add", index=index, address=address, prefixlen=24)
                    inside.link("set", index=index, state="up")

            self.with_rtnl(i, configure)

    def destroy(self) -> None:
        """SIGKILL what runs in the namespaces, delete links and namespaces. Idempotent.
        A no-op in a forked child: the network belongs to the process that built it."""
        if os.getpid() != self._pid:
            return
        if self._built:
            self._built = False
            deadline = time.monotonic() + 10.0
            for i in range(self._size):
                _kill_all(self.namespace_path(i), deadline)
            self._reap()
            with contextlib.suppress(Exception):
                _delete_links(self._root_link_names())
            for i in range(self._size):
                with contextlib.suppress(Exception):
                    _remove_namespace(self.namespace(i))
        self._forget()

    def _reap(self) -> None:
        children, self._children = self._children, []
        for child in children:
            with contextlib.suppress(Exception):
                if child.poll() is None:
                    child.kill()
                child.wait(timeout=5.0)

    def _forget(self) -> None:
        """Stop owning anything: leave the registry and give up our share of the host lock."""
        self._built = False
        self._reap()
        with _registry_lock:
            if _live.get(self._prefix) is self:
                del _live[self._prefix]
            if self._holds_host:
                self._holds_host = False
                _release_host()

    # -- inside the namespaces

    def _require_built(self) -> None:
        if not self._built:
            raise RuntimeError(f"test network {self._prefix!r} is not built")

    def spawn(
        self,
        i: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: _File = subprocess.DEVNULL,
        stdout: _File = None,
        stderr: _File = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside namespace ``i``, in a new session and process group (so
        ``os.killpg(proc.pid, SIGKILL or SIGSTOP)`` reaches it and its children).

        The process is SIGKILLed and reaped by :meth:`destroy` if still running."""
        self._require_built()
        path = self.namespace_path(i)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                list(argv),
                env=None if env is None else dict(env),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=cwd,
                start_new_session=True,
            )

        child = in_namespace(path, start)
        # Kept (not weakly) so that destroy() reaps even the ones the caller dropped.
        self._children = [c for c in self._children if c.returncode is None]
        self._children.append(child)
        return child

    def run(
        self, i: int, argv: Sequence[str], *, input: bytes | None = None, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` inside namespace ``i`` to completion, capturing its output."""
        child = self.spawn(
            i,
            argv,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = child.communicate(input, timeout=timeout)
        except BaseException:
            child.kill()
            child.communicate()
            raise
        return subprocess.CompletedProcess(list(argv), child.returncode, out, err)

    def open_socket(self, i: int, family: int, kind: int, proto: int = 0) -> socket.socket:
        """A socket that lives in namespace ``i`` (e.g. a netlink socket for its nftables)."""
        self._require_built()
        return in_namespace(self.namespace_path(i), lambda: socket.socket(family, kind, proto))

    def with_rtnl(self, i: int, function: Callable[[Any], _T]) -> _T:
        """``function(ipr)`` with a pyroute2 ``IPRoute`` inside namespace ``i`` (see the
        module-level :func:`with_rtnl`); the ``IPRoute`` must not escape ``function``."""
        self._require_built()
        return with_rtnl(self.namespace_path(i), function)

    def pids(self, i: int) -> list[int]:
        """The processes running inside namespace ``i``."""
        return namespace_pids(self.namespace_path(i))

    def counters(self, i: int) -> InterfaceCounters:
        """``d0``'s counters inside namespace ``i``, from the kernel (``IFLA_STATS64``)."""

        def read(ipr: Any) -> Any:
            return ipr.link("get", index=ipr.link_lookup(ifname="d0")[0])[0].get_attr(
                "IFLA_STATS64"
            )

        stats = self.with_rtnl(i, read)
        return InterfaceCounters(
            rx_bytes=int(stats["rx_bytes"]),
            tx_bytes=int(stats["tx_bytes"]),
            rx_packets=int(stats["rx_packets"]),
            tx_packets=int(stats["tx_packets"]),
            rx_dropped=int(stats["rx_dropped"]),
            tx_dropped=int(stats["tx_dropped"]),
        )

    def __repr__(self) -> str:
        state = "built" if self._built else "not built"
        return f"TestNetwork({self._prefix!r}, {self._size}) [{state}]"


def _disable_ipv6() -> None:
    """Inside a fresh namespace: no IPv6 (no link-local chatter on d0/m0, IPv4 rules only)."""
    for scope in ("all", "default"):
        _write_sysctl(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6", "1")
