"""Peer faults: summarised logs, a decaying score, and a ban — in isolation and on a node
flooded with malformed frames by an authenticated peer."""

from __future__ import annotations

import logging

import pytest

from dag import Identity
from pulsar.net.transport import Transport
from pulsar.runtime.peer_faults import FaultConfig, PeerFaults

from .conftest import Network, eventually

PEER = Identity.from_seed(b"f" * 32).peer_id


def test_faults_are_summarised_once_per_interval() -> None:
    faults = PeerFaults(FaultConfig(log_interval=10.0, ban_score=1e9))
    first = faults.fault(PEER, "malformed", "not DAG-CBOR", 0.0)
    assert first.log is not None and "1 malformed" in first.log and not first.ban
    assert all(faults.fault(PEER, "malformed", "x", 0.1 * i).log is None for i in range(1, 50))
    later = faults.fault(PEER, "rejected", "event for a tree we left", 10.5)
    assert later.log is not None and "49 malformed, 1 rejected" in later.log


def test_the_score_decays_and_a_ban_ends() -> None:
    config = FaultConfig(ban_score=10.0, half_life=1.0, ban_for=5.0)
    faults = PeerFaults(config)
    for _ in range(9):
        assert not faults.fault(PEER, "malformed", "x", 0.0).ban
    assert faults.score(PEER, 1.0) == pytest.approx(4.5)  # halved after one half-life
    assert not faults.fault(PEER, "malformed", "x", 1.0).ban  # 5.5: decayed below the bar
    verdicts = [faults.fault(PEER, "malformed", "x", 1.0) for _ in range(5)]
    assert [v.ban for v in verdicts] == [False, False, False, False, True]
    assert faults.banned(PEER, 5.9) and not faults.banned(PEER, 6.1)
    # Refusals an honest peer causes now and then weigh little.
    assert not PeerFaults(config).fault(PEER, "rejected", "x", 0.0).ban


async def test_a_flood_of_malformed_frames_is_logged_in_a_few_lines_and_banned(
    network: Network, caplog: pytest.LogCaptureFixture
) -> None:
    (node,) = await network.start(1)
    flooder = Transport(Identity.generate(), on_frame=lambda peer, frame: None)
    await flooder.listen("127.0.0.1", 0)
    try:
        caplog.set_level(logging.WARNING, logger="pulsar.node")
        garbage = b"\xff\x00 not a message"
        for _ in range(20_000):
            flooder.send_nowait(node.peer_id, node.address, garbage) or await flooder.send(
                node.peer_id, node.address, garbage)
        await eventually(lambda: node.metrics["peer_bans"] == 1, timeout=20)
        await eventually(
            lambda: node.metrics["rejected_frames"] + node.metrics["ignored_frames"] >= 20_000
            or not node.transport.address_of(flooder.peer_id), timeout=20)
        assert node.metrics["rejected_frames"] < 100  # the rest were ignored, not parsed
        lines = [r for r in caplog.records if r.name == "pulsar.node"]
        assert 1 <= len(lines) <= 5, [r.getMessage() for r in lines]
        assert "ignored for" in lines[-1].getMessage()
    finally:
        await flooder.close()
