"""The testbed in network namespaces: latency made by the kernel, bytes from its counters.

Skipped, with the reason, where the machine cannot make network namespaces (not root)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from pulsar.tools.netlab.netns import NETNS_DIR
from pulsar.tools.testbed.kernel import PREFIX, unavailable
from pulsar.tools.testbed.manifest import load_manifest
from pulsar.tools.testbed.runner import run_scenario
from pulsar.tools.testbed.scenario import Fault, Network, Scenario, Settle, Workload

pytestmark = pytest.mark.slow

SCENARIO = Scenario(
    name="netns-check",
    nodes=6,
    seed=5,
    workload=Workload(topics=2, max_subscribers=0.8, min_subscribers=3, events=24, rate=8.0,
                      order_topics=1),
    network=Network(latency=0.05, jitter=0.1),
    faults=(Fault(at=1.0, kind="partition", nodes=(1,), heal_after=1.0),),
    settle=Settle(quiet=10.0, max=60.0),
    protocols=("pulsarcast",),
)


def _payload_bytes(trace: Path) -> int:
    """The node's own count of what it sent (transport plus DHT), last sample of its life."""
    last = None
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "sample":
            last = record
    assert last is not None
    return int(last["sent_bytes"]) + int(last["dht_sent_bytes"])


def _missing() -> str | None:
    """Why this machine cannot run the testbed in namespaces with kernel faults, or None."""
    if unavailable() is not None:
        return unavailable()
    if shutil.which("nft") is None:
        return "no nft (apt-get install nftables)"
    return None


@pytest.mark.skipif(_missing() is not None, reason=f"cannot run here: {_missing()}")
async def test_a_run_in_namespaces_counts_wire_bytes_and_delivers_everything(
        tmp_path: Path) -> None:
    manifest = await run_scenario(SCENARIO, tmp_path / "run", progress=False, netns=True)
    assert manifest["network"] == "netns"
    run = manifest["protocols"]["pulsarcast"]
    # Latency and partitions were made by the kernel, and the nodes lived on its subnet.
    assert run["wire"]["mechanisms"]["latency"] in ("netem", "nfqueue")
    assert run["wire"]["mechanisms"]["partition"] == "nftables"
    assert [f["kind"] for f in run["faults"]] == ["partition", "heal"]
    # Every published event reached every subscriber of its topic. (A publish from the
    # partitioned node can be refused with 503: the kernel cuts its DHT traffic too.)
    traces = sorted((tmp_path / "run" / "pulsarcast").glob("node-*.jsonl"))
    published: Counter[str] = Counter()
    for trace in traces:
        for line in trace.read_text().splitlines():
            record = json.loads(line)
            if record["kind"] == "publish":
                published[record["topic"]] += 1
    subscribers = {t["cid"]: len(t["subscribers"]) for t in run["topics"]}
    expected = sum(n * subscribers[topic] for topic, n in published.items())
    assert sum(published.values()) >= SCENARIO.workload.events // 2
    assert run["delivered_log_entries"] == expected
    # The wire carries every payload byte the nodes counted, plus headers, handshakes and
    # acknowledgements: more than the payload, and not absurdly more.
    payload = sum(_payload_bytes(p) for p in traces)
    wire = run["wire"]["tx_bytes"]
    assert payload < wire < 20 * payload
    assert len(run["wire"]["per_node_tx_bytes"]) == SCENARIO.nodes
    assert all(b > 0 for b in run["wire"]["per_node_tx_bytes"])
    assert load_manifest(tmp_path / "run")["protocols"]["pulsarcast"]["wire"] == run["wire"]
    # Nothing of the network is left.
    assert not list(Path(NETNS_DIR).glob(f"{PREFIX}[0-9]*"))
