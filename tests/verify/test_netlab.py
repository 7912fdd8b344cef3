"""The verify tool's test network and its kernel-made link faults.

The pure parts (nftables scripts, partition pairs, the shaper's policy) run anywhere; the
rest builds real namespaces, so it needs root (skipped otherwise, with the reason). Traffic
is real UDP between small child processes started inside the namespaces; every wait polls
against a deadline, and the only fixed windows are those that prove an absence.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import selectors
import signal
import string
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pulsar.tools.netlab import linkfaults, netns, nfqueue
from pulsar.tools.netlab.linkfaults import (
    FaultError,
    LinkFaults,
    _NodeState,
    blocked_pairs,
    render_filter,
    render_shape_table,
)
from pulsar.tools.netlab.netns import InterfaceCounters, TestNetwork, cleanup_leftovers
from pulsar.tools.netlab.nfqueue import QueuedPacket, ShaperCore, ShaperStats, ShapeSpec
from tests.helpers.netslot import skip_unless_slot_free

ROOT = Path(__file__).resolve().parents[2]
PORT = 7000

# A UDP probe run inside a namespace: "serve" echoes every datagram back (and prints
# "ready" once bound); "ping" sends numbered datagrams one after the other and reports
# round-trip times; "burst" sends them all, then collects replies until each seq has
# `want` replies or `wait` seconds pass. Reports are one JSON line.
PROBE = r"""
import json, socket, sys, time
mode = sys.argv[1]
if mode == "serve":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(sys.argv[2])))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(65535)
        s.sendto(data, peer)
dst, port, count, size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
wait, want = float(sys.argv[6]), int(sys.argv[7])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def send(i):
    try:  # a datagram nftables drops on output fails with EPERM: it is lost, no more
        s.sendto(payload(i), (dst, port))
    except PermissionError:
        pass
def payload(i):
    head = f"seq:{i}:".encode()
    return head + b"x" * max(0, size - len(head))
replies, good, rtts = {}, {}, []
def note(data):
    try:
        i = int(data.split(b":")[1])
    except (IndexError, ValueError):
        return None
    replies[i] = replies.get(i, 0) + 1
    if data == payload(i):
        good[i] = good.get(i, 0) + 1
    return i
if mode == "ping":
    for i in range(count):
        start = time.monotonic()
        send(i)
        s.settimeout(wait)
        try:
            while note(s.recv(65535)) != i:
                pass
            rtts.append((time.monotonic() - start) * 1000)
        except socket.timeout:
            pass
else:
    for i in range(count):
        send(i)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not (
        len(replies) == count and min(replies.values()) >= want
    ):
        s.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            note(s.recv(65535))
        except socket.timeout:
            break
print(json.dumps({"replies": sum(replies.values()), "good": sum(good.values()),
                  "per_seq": sorted(replies.values()), "rtts": rtts}), flush=True)
"""


def _prefix() -> str:
    return "pcvt" + "".join(secrets.choice(string.ascii_lowercase) for _ in range(4))


def _read_line(process: subprocess.Popen[bytes], timeout: float = 10.0) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(deadline - time.monotonic()):
                return process.stdout.readline().decode()
    raise AssertionError("no line from the child in time")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.communicate()


@contextmanager
def _server(net: TestNetwork, node: int, port: int = PORT) -> Iterator[None]:
    process = net.spawn(
        node, [sys.executable, "-c", PROBE, "serve", str(port)], stdout=subprocess.PIPE
    )
    try:
        assert _read_line(process).strip() == "ready"
        yield
    finally:
        _stop(process)


def _probe(
    net: TestNetwork,
    node: int,
    dst: str,
    *,
    mode: str = "burst",
    count: int = 20,
    size: int = 200,
    wait: float = 2.0,
    want: int = 1,
) -> dict[str, object]:
    argv = [sys.executable, "-c", PROBE, mode, dst, str(PORT), str(count), str(size), str(wait)]
    done = net.run(node, [*argv, str(want)], timeout=30.0)
    assert done.returncode == 0, done.stderr.decode()
    report: dict[str, object] = json.loads(done.stdout)
    return report


def _median(values: object) -> float:
    assert isinstance(values, list) and values
    ordered = sorted(float(v) for v in values)
    return ordered[len(ordered) // 2]


def _leftovers(prefix: str) -> list[str]:
    from pyroute2 import IPRoute
    from pyroute2 import netns as pr_netns

    found = [name for name in pr_netns.listnetns() if name.startswith(prefix)]
    with IPRoute() as ipr:
        found += [
            str(link.get_attr("IFLA_IFNAME"))
            for link in ipr.get_links()
            if str(link.get_attr("IFLA_IFNAME")).startswith(prefix)
        ]
    return found


@pytest.fixture(scope="module")
def _root() -> None:
    reason = netns.available() or linkfaults.available()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def root_only(_root: None) -> None:
    # Checked before each test (and each class's shared network), not once per module: a
    # verify run may take the slot between two tests.
    skip_unless_slot_free()


# --- pure parts ---------------------------------------------------------------------------


def test_public_api_is_pinned() -> None:
    assert sorted(netns.__all__) == [
        "DATA_NETWORK",
        "HOST_MGMT_ADDRESS",
        "InterfaceCounters",
        "MAX_NODES",
        "MGMT_NETWORK",
        "NETNS_DIR",
        "TestNetwork",
        "available",
        "cleanup_leftovers",
        "ensure_neighbour_room",
        "enter",
        "in_namespace",
        "namespace_pids",
        "neighbour_limits",
        "with_rtnl",
    ]
    assert sorted(linkfaults.__all__) == [
        "FILTER_TABLE",
        "Fault",
        "FaultError",
        "FaultId",
        "FaultKind",
        "LinkFaults",
        "Loss",
        "Partition",
        "Rate",
        "SHAPE_TABLE",
        "Shape",
        "available",
        "blocked_pairs",
        "render_filter",
        "render_shape_table",
    ]
    assert sorted(nfqueue.__all__) == [
        "DEFAULT_MARK",
        "Decision",
        "QueueSocket",
        "QueuedPacket",
        "Release",
        "ShapeSpec",
        "ShaperCore",
        "ShaperStats",
        "decide",
        "main",
        "run",
        "set_queue_rule",
    ]


def test_names_and_addresses_follow_the_plan() -> None:
    net = TestNetwork("pcvx", 3)
    assert [net.namespace(i) for i in range(3)] == ["pcvx0", "pcvx1", "pcvx2"]
    assert net.data_address(2) == "198.18.0.12"
    assert net.mgmt_address(0) == "198.19.0.10"
    assert net.host_address == "198.19.0.1"
    with pytest.raises(IndexError):
        net.data_address(3)
    for bad in ("", "Pcv", "pcv1", "pcv-x", "a" * 14):
        with pytest.raises(ValueError):
            TestNetwork(bad, 3)
    other = TestNetwork("pctx", 3, slot=1)  # a second network on the same host
    assert other.data_address(2) == "198.18.1.12"
    assert other.mgmt_address(0) == "198.19.1.10"
    assert other.host_address == "198.19.1.1"
    for slot in (-1, 16):
        with pytest.raises(ValueError):
            TestNetwork("pctx", 3, slot=slot)


def test_the_arp_table_has_room_for_a_full_mesh_of_two_networks() -> None:
    """The kernel's neighbour table is shared by every namespace: 50 testbed nodes beside a
    25-node verify run overflowed the default 1024 entries, and late nodes could not send."""
    low, soft, hard = netns.neighbour_limits(100)
    assert hard >= 2 * 100 * 99 + 512 and low <= soft <= hard
    assert netns.neighbour_limits(5)[2] >= 1024  # never below the kernel's default


def test_counters_subtract() -> None:
    later = InterfaceCounters(10, 20, 3, 4, 1, 0)
    earlier = InterfaceCounters(4, 5, 1, 1, 0, 0)
    assert later - earlier == InterfaceCounters(6, 15, 2, 3, 1, 0)


def test_partition_shapes_as_blocked_pairs() -> None:
    assert blocked_pairs([[0, 1], [2, 3]], 4) == {(0, 2), (0, 3), (1, 2), (1, 3)}
    # A bridge node (2) reaches both sides; the sides do not reach each other.
    assert blocked_pairs([[0, 2], [1, 2]], 3) == {(0, 1)}
    # A ring of 4: only neighbours talk.
    ring = [[0, 1], [1, 2], [2, 3], [3, 0]]
    assert blocked_pairs(ring, 4) == {(0, 2), (1, 3)}
    # A node in no group is cut off.
    assert blocked_pairs([[0, 1]], 3) == {(0, 2), (1, 2)}
    with pytest.raises(ValueError):
        blocked_pairs([[0, 5]], 3)


def test_filter_script_is_exactly_the_faults() -> None:
    script = render_filter(["198.18.0.12", "198.18.0.11"], 25.0)
    assert script.startswith("table ip pcv\ndelete table ip pcv\n")
    assert "ip daddr { 198.18.0.11, 198.18.0.12 } drop" in script
    assert "ip saddr { 198.18.0.11, 198.18.0.12 } drop" in script
    assert "numgen random mod 10000 < 2500 drop" in script
    assert 'oifname != "d0" accept' in script
    # No fault: the table is only deleted.
    assert render_filter([], 0.0) == "table ip pcv\ndelete table ip pcv\n"
    assert "queue num 7 bypass" in render_shape_table(7, native=True)
    assert "queue" not in render_shape_table(7, native=False).split("jump")[1]


class _LocalNetwork(TestNetwork):
    """Spawns in this namespace: enough to start a (fake) shaper without root."""

    def spawn(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs.pop("env", None)
        return subprocess.Popen(list(argv), **kwargs)


def test_a_shaper_that_cannot_start_says_why(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'cannot bind queue 0: EPERM' >&2\nexit 3\n")
    fake.chmod(0o755)
    faults = LinkFaults(_LocalNetwork("pcvx", 3), shaper="nfqueue", python=str(fake))
    with pytest.raises(FaultError, match="cannot bind queue 0: EPERM"):
        faults._start_shaper(1, ShapeSpec(delay_ms=10.0))


class _Recorder(LinkFaults):
    """LinkFaults with the kernel left out: records what each node would be given."""

    def __init__(self) -> None:
        super().__init__(TestNetwork("pcvx", 3))
        self.given: dict[int, _NodeState] = {}

    def _apply_node(self, node: int, want: _NodeState, have: _NodeState | None) -> None:
        self.given[node] = want


def test_overlapping_faults_latest_wins_and_heal_restores() -> None:
    links = _Recorder()
    first = links.loss([0, 1], 10)
    second = links.loss([1], 50)
    assert [links.given[n].loss_percent for n in (0, 1)] == [10, 50]
    assert links.heal(second)
    assert links.given[1].loss_percent == 10
    links.partition([[0], [1, 2]])
    links.partition_pairs({(2, 1)})
    assert links.given[1].blocked_peers == {"198.18.0.10", "198.18.0.12"}
    links.clear_loss([0])
    assert links.given[0].loss_percent == 0 and first in links.active()
    links.clear_all()
    assert links.active() == {}
    assert links.given[1].blocked_peers == frozenset()


class _FakeRtnl:
    """Records pyroute2 ``tc`` calls: the netem path cannot run on a kernel without netem."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def link_lookup(self, ifname: str) -> list[int]:
        return [7]

    def tc(self, *args: object, **kwargs: object) -> None:
        self.calls.append((args, kwargs))


def test_qdiscs_for_rate_and_netem_shape() -> None:
    from pulsar.tools.netlab.linkfaults import Rate, _set_qdiscs

    ipr = _FakeRtnl()
    rate = Rate(frozenset({0}), 1000, 6056, 100.0)
    _set_qdiscs(ipr, rate, ShapeSpec(delay_ms=50, jitter_ms=5, reorder_pct=10, corrupt_pct=1))
    (delete, _), (tbf, tbf_options), (netem, netem_options) = ipr.calls
    assert delete[0] == "del" and tbf == ("add", "tbf", 7) and netem == ("add", "netem", 7)
    assert tbf_options["rate"] == "1000kbit" and tbf_options["latency"] == 100_000
    assert netem_options["parent"] == 0x10001 and netem_options["delay"] == 50_000
    assert netem_options["jitter"] == 5_000 and netem_options["prob_reorder"] == 10
    ipr = _FakeRtnl()
    _set_qdiscs(ipr, None, ShapeSpec(delay_ms=10))
    assert ipr.calls[1][1]["handle"] == 0x10000 and "parent" not in ipr.calls[1][1]


def _packet(i: int, size: int = 60) -> QueuedPacket:
    header = bytes([0x45]) + bytes(19)
    return QueuedPacket(i, 0x0800, 3, header + bytes([i % 256]) * (size - 20))


def test_shaper_core_delays_reorders_and_drains() -> None:
    core = ShaperCore(ShapeSpec(delay_ms=50, jitter_ms=20), random.Random(1), max_held=100)
    for i in range(50):
        assert core.admit(_packet(i), now=0.0) is None
    assert core.due(0.029) == []
    released = core.due(0.071)
    assert [r.packet_id for r in released] != list(range(50))  # jitter reorders
    assert sorted(r.packet_id for r in released) == list(range(50))
    assert core.next_release() is None
    stats = core.stats()
    assert (stats.received, stats.delayed, stats.max_held) == (50, 50, 50)


def test_shaper_core_duplicates_corrupts_drops_and_overflows() -> None:
    spec = ShapeSpec(delay_ms=10, duplicate_pct=100, corrupt_pct=100)
    core = ShaperCore(spec, random.Random(2), max_held=3)
    releases = [core.admit(_packet(i), now=0.0) for i in range(5)]
    assert releases[:3] == [None, None, None]
    overflowed = [r for r in releases[3:] if r is not None]
    assert len(overflowed) == 2  # beyond max_held: released at once
    for release in overflowed + core.drain():
        assert release.accept and release.payload is not None and release.copy == release.payload
        original = _packet(release.packet_id).payload
        changed = [k for k in range(len(original)) if original[k] != release.payload[k]]
        assert len(changed) == 1 and changed[0] >= 20  # one byte, after the IP header
    lossy = ShaperCore(ShapeSpec(loss_pct=100, reorder_pct=100), random.Random(3))
    dropped = lossy.admit(_packet(1), now=0.0)
    assert dropped is not None and not dropped.accept
    line = core.stats().to_json()
    assert ShaperStats.parse(line) == core.stats()
    with pytest.raises(ValueError):
        ShapeSpec(loss_pct=101)


def test_shaper_decisions_replay_with_the_seed() -> None:
    spec = ShapeSpec(delay_ms=5, jitter_ms=5, duplicate_pct=30, corrupt_pct=30, loss_pct=30)
    runs = []
    for _ in range(2):
        rng = random.Random(42)
        runs.append([nfqueue.decide(spec, rng, _packet(i).payload) for i in range(100)])
    assert runs[0] == runs[1]


# --- on real namespaces ---------------------------------------------------------------------


@pytest.fixture(scope="class")
def net(_root: None) -> Iterator[TestNetwork]:
    """One 3-node network shared by a class's tests."""
    skip_unless_slot_free()
    with TestNetwork(_prefix(), 3) as network:
        yield network


@pytest.mark.usefixtures("root_only")
class TestOnANetwork:
    """One 3-node network for the traffic tests; faults are cleared after each."""

    @pytest.fixture
    def links(self, net: TestNetwork) -> Iterator[LinkFaults]:
        faults = LinkFaults(net, seed=7)
        try:
            yield faults
        finally:
            faults.clear_all()

    def test_echo_on_data_network_and_api_reachable_from_host(self, net: TestNetwork) -> None:
        with _server(net, 1):
            report = _probe(net, 0, net.data_address(1))
            assert report["good"] == 20
            # The host (root namespace) reaches node 1 over the management network.
            import socket

            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.settimeout(2.0)
                sock.sendto(b"seq:0:host", (net.mgmt_address(1), PORT))
                assert sock.recv(100) == b"seq:0:host"
            # Nodes never reach each other over the management bridge (isolated ports).
            assert _probe(net, 0, net.mgmt_address(1), count=3, wait=0.5)["replies"] == 0

    def test_counters_grow_by_at_least_the_bytes_sent(self, net: TestNetwork) -> None:
        before = (net.counters(0), net.counters(1))
        with _server(net, 1):
            report = _probe(net, 0, net.data_address(1), count=50, size=1000)
        assert report["good"] == 50
        sent, received = net.counters(0) - before[0], net.counters(1) - before[1]
        assert sent.tx_bytes >= 50 * 1000 and sent.tx_packets >= 50
        assert received.rx_bytes >= 50 * 1000 and sent.rx_bytes >= 50 * 1000

    def test_partition_blocks_then_heals(self, net: TestNetwork, links: LinkFaults) -> None:
        with _server(net, 1):
            fault = links.partition([[0], [1, 2]])
            assert links.mechanism("partition") == "nftables"
            assert _probe(net, 0, net.data_address(1), count=5, wait=0.5)["replies"] == 0
            assert _probe(net, 2, net.data_address(1), count=5)["good"] == 5
            assert links.heal(fault) and not links.heal(fault)
            assert _probe(net, 0, net.data_address(1), count=5)["good"] == 5
            # A bridge: 2 talks to both sides, 0 and 1 not to each other.
            links.partition([[0, 2], [1, 2]])
            assert _probe(net, 0, net.data_address(1), count=5, wait=0.5)["replies"] == 0
            assert _probe(net, 2, net.data_address(1), count=5)["good"] == 5
            links.clear_partition()
            assert _probe(net, 0, net.data_address(1), count=5)["good"] == 5

    def test_full_loss_blocks_and_clearing_restores(
        self, net: TestNetwork, links: LinkFaults
    ) -> None:
        with _server(net, 1):
            links.loss([0], 100)
            assert _probe(net, 0, net.data_address(1), count=10, wait=0.5)["replies"] == 0
            links.loss([0], 0)
            assert _probe(net, 0, net.data_address(1), count=10)["good"] == 10
            links.loss([0], 100)
            links.clear_loss()
            assert _probe(net, 0, net.data_address(1), count=10)["good"] == 10

    def test_rate_limits_with_tbf(self, net: TestNetwork, links: LinkFaults) -> None:
        with _server(net, 1):
            links.rate([0], 256)  # 32 kB/s: 40 x 1000 B cannot pass in 0.5 s
            assert links.mechanism("rate") == "tbf"
            report = _probe(net, 0, net.data_address(1), count=40, size=1000, wait=0.5)
            assert isinstance(report["replies"], int) and report["replies"] < 40
            links.clear_rate()
            assert _probe(net, 0, net.data_address(1), count=40, size=1000)["good"] == 40

    def test_shaped_delay_raises_the_round_trip(self, net: TestNetwork, links: LinkFaults) -> None:
        with _server(net, 1):
            base = _median(_probe(net, 0, net.data_address(1), mode="ping", count=10)["rtts"])
            links.shape([0], delay_ms=50)
            assert links.mechanism("shape") in ("netem", "nfqueue")
            shaped = _probe(net, 0, net.data_address(1), mode="ping", count=10)
            assert _median(shaped["rtts"]) >= base + 40
            links.clear_shape()
            after = _median(_probe(net, 0, net.data_address(1), mode="ping", count=10)["rtts"])
            assert after < base + 40

    def test_duplicates_arrive_twice(self, net: TestNetwork, links: LinkFaults) -> None:
        with _server(net, 1):
            links.shape([0], duplicate_pct=100)
            report = _probe(net, 0, net.data_address(1), count=20, want=2)
            assert report["per_seq"] == [2] * 20

    def test_corrupted_datagrams_vanish_or_arrive_altered(
        self, net: TestNetwork, links: LinkFaults
    ) -> None:
        with _server(net, 1):
            links.shape([0], corrupt_pct=100)
            report = _probe(net, 0, net.data_address(1), count=20, wait=0.5)
            assert report["good"] == 0
            links.clear_shape()
            if links.mechanism("shape") == "nfqueue":
                assert links.shaper_stats()[0].corrupted >= 20
            assert _probe(net, 0, net.data_address(1), count=20)["good"] == 20

    def test_a_dead_shaper_fails_open(self, net: TestNetwork, links: LinkFaults) -> None:
        if links.mechanism("shape") != "nfqueue":
            pytest.skip("netem shapes here: no shaper process")
        with _server(net, 1):
            links.shape([0], delay_ms=20)
            shaper = links._shapers[0].process
            os.kill(shaper.pid, signal.SIGKILL)
            shaper.wait(timeout=5)
            assert _probe(net, 0, net.data_address(1), count=10)["good"] == 10


@pytest.mark.usefixtures("root_only")
class TestLifetime:
    def test_cleanup_leftovers_removes_everything(self) -> None:
        prefix = _prefix()
        net = TestNetwork(prefix, 2)
        net.build()
        sleeper = net.spawn(1, ["sleep", "60"])
        assert len(_leftovers(prefix)) == 2 + 2 + 4  # namespaces, bridges, veths
        cleanup_leftovers(prefix)
        assert _leftovers(prefix) == []
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
        net.destroy()  # a no-op now: what it owned is gone

    def test_a_second_network_builds_over_an_abandoned_one(self) -> None:
        prefix = _prefix()
        first = TestNetwork(prefix, 2)
        first.build()
        sleeper = first.spawn(0, ["sleep", "60"])
        with TestNetwork(prefix, 2) as second, _server(second, 1):
            assert _probe(second, 0, second.data_address(1), count=3)["good"] == 3
        assert _leftovers(prefix) == []
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
        first.destroy()

    def _harness(self, prefix: str) -> subprocess.Popen[bytes]:
        code = (
            "import subprocess, sys, time\n"
            "from pulsar.tools.netlab.netns import TestNetwork\n"
            f"with TestNetwork({prefix!r}, 2) as net:\n"
            "    quiet = {'stdout': subprocess.DEVNULL, 'stderr': subprocess.DEVNULL}\n"
            "    net.spawn(0, ['sleep', '60'], **quiet)\n"
            "    print('built', flush=True)\n"
            "    time.sleep(60)\n"
        )
        return subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def test_a_sigkilled_harness_leaves_nothing_the_next_run_trips_over(self) -> None:
        prefix = _prefix()
        harness = self._harness(prefix)
        try:
            assert _read_line(harness, timeout=20).strip() == "built"
        finally:
            harness.kill()
            harness.communicate()
        assert _leftovers(prefix)  # SIGKILL: nothing was torn down
        with TestNetwork(prefix, 2) as net, _server(net, 1):
            assert _probe(net, 0, net.data_address(1), count=3)["good"] == 3
        assert _leftovers(prefix) == []

    def test_sigterm_tears_the_network_down(self) -> None:
        prefix = _prefix()
        harness = self._harness(prefix)
        try:
            assert _read_line(harness, timeout=20).strip() == "built"
            harness.send_signal(signal.SIGTERM)
            assert harness.wait(timeout=20) == 143
        finally:
            if harness.poll() is None:
                harness.kill()
            harness.communicate()
        assert _leftovers(prefix) == []
