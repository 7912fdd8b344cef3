"""A short ``pulsarcast verify`` run: five real node processes in network namespaces, every
fault kind once on a fixed seed, checked from the client history (docs/verification.md).

Skipped, with the reason, where the machine cannot make network namespaces (not root)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from pulsar.tools.netlab.netns import available
from pulsar.tools.verify.checker import KINDS
from pulsar.tools.verify.cluster import FAKETIME_LIB
from pulsar.tools.verify.nemesis import schedule
from pulsar.tools.verify.runner import PREFIX, run_verify
from pulsar.tools.verify.scenario import FAULT_KINDS, Scenario
from tests.helpers.netslot import skip_unless_slot_free

pytestmark = pytest.mark.slow

SCENARIO = Scenario(nodes=5, duration=75.0, seed=11, rate=4.0, fault_gap=(0.5, 1.0),
                    fault_length=(2.0, 3.0), settle=60.0, disk_mib=96)


def test_the_schedule_holds_every_fault_kind_and_replays_from_its_seed() -> None:
    plan = schedule(SCENARIO)
    assert {f.kind for f in plan} == set(FAULT_KINDS)
    assert plan == schedule(SCENARIO)  # same seed, same faults
    assert plan != schedule(SCENARIO.with_(seed=12))
    assert all(f.heal_at <= SCENARIO.duration for f in plan)
    assert all(b.at >= a.heal_at for a, b in itertools.pairwise(plan))


def _missing() -> str | None:
    """Why this machine cannot run a verify with every fault kind, or None."""
    if available() is not None:
        return available()
    if shutil.which("nft") is None:
        return "no nft (apt-get install nftables)"
    if not FAKETIME_LIB.exists():
        return f"no libfaketime at {FAKETIME_LIB} (apt-get install faketime)"
    return None


@pytest.mark.skipif(_missing() is not None, reason=f"verify cannot run here: {_missing()}")
async def test_a_short_verify_run_finds_no_anomaly(tmp_path: Path) -> None:
    skip_unless_slot_free()
    outcome = await run_verify(SCENARIO, tmp_path / "run", quiet=True)
    summary = outcome.summary
    # Every fault kind was made, each by the mechanism the report names.
    assert {f["kind"] for f in outcome.faults} == set(FAULT_KINDS)
    assert all(f["mechanism"] for f in outcome.faults)
    # The promises held: no anomaly of any kind, events were acknowledged and delivered,
    # and the fresh node's replay was checked (it is in the history).
    assert summary["anomalies"] == dict.fromkeys(KINDS, 0), (tmp_path / "run" / "report.md"
                                                             ).read_text()[:4000]
    assert summary["acknowledged"] > 50 and summary["delivered"] > 4 * 50
    history = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    replays = [op for op in map(json.loads, history) if op["f"] == "replay"]
    assert [r["type"] for r in replays].count("ok") == 3
    assert summary["wire_bytes_per_delivery"] > 0
    assert summary["converge_p99_s"] is not None
    # The report and its last JSON line are there; nothing of the network is left.
    assert (tmp_path / "run" / "report.md").exists()
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    assert not [p for p in Path("/run/netns").glob(f"{PREFIX}*")]
