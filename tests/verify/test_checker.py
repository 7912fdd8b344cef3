"""The checker against small hand-written histories: one clean run with every allowed
oddity (late subscriber, unsubscribe, kill and restart, a re-read, a revocation race, an
indeterminate publish), then one history per anomaly that must be found, named exactly."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pulsar.tools.verify import checker, history
from pulsar.tools.verify.checker import KINDS, Anomaly, CheckResult, check, excerpt, nearest_rank
from pulsar.tools.verify.history import HistoryError, HistoryWriter, Op, OpType, read_history

T1, T2 = "bafytopicone", "bafytopictwo"


def sha(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()


def peer(node: int) -> str:
    return f"12D3KooPeer{node}"


class Builder:
    """Builds a history in memory, one op per second unless told the time (``at``)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.now = 0.0
        self.payloads: dict[str, str] = {}  # cid -> payload, to write deliveries

    def at(self, t: float) -> Builder:
        assert t >= self.now
        self.now = t
        return self

    def op(self, process: str, type: OpType, f: str, node: int | None, topic: str | None,
           value: dict[str, Any] | None = None) -> Op:
        op = Op(len(self.ops), self.now, process, type, f, node, topic, value or {})
        self.ops.append(op)
        self.now += 1.0
        return op

    def complete(self, invoke: Op, type: OpType, value: dict[str, Any] | None = None) -> Op:
        return self.op(invoke.process, type, invoke.f, invoke.node, invoke.topic, value)

    def subscribe(self, node: int, topic: str) -> Op:
        return self.complete(self.op(f"sub-{node}", "invoke", "subscribe", node, topic), "ok")

    def unsubscribe(self, node: int, topic: str) -> Op:
        return self.complete(self.op(f"sub-{node}", "invoke", "unsubscribe", node, topic), "ok")

    def start_publish(self, node: int, topic: str, payload: str, *,
                      content_type: str = "text/plain", process: str | None = None) -> Op:
        return self.op(process or f"pub-{node}", "invoke", "publish", node, topic, {
            "publisher": peer(node), "payload_sha256": sha(payload),
            "content_type": content_type, "size": len(payload), "parent": None})

    def publish(self, node: int, topic: str, payload: str, cid: str | None = None,
                outcome: OpType = "ok", **kw: Any) -> tuple[Op, Op]:
        invoke = self.start_publish(node, topic, payload, **kw)
        return invoke, self.end_publish(invoke, payload, cid, outcome)

    def end_publish(self, invoke: Op, payload: str, cid: str | None,
                    outcome: OpType = "ok") -> Op:
        if cid is not None:
            self.payloads[cid] = payload
        if outcome == "ok":
            return self.complete(invoke, "ok", {"cid": cid, "parent": None})
        return self.complete(invoke, outcome, {"error": "timeout"})

    def deliver(self, node: int, topic: str, cid: str, seq: int, parents: tuple[str, ...] = (),
                *, payload: str | None = None, content_type: str = "text/plain") -> Op:
        return self.op(f"sub-{node}", "ok", "deliver", node, topic, {
            "cid": cid, "seq": seq, "parents": list(parents), "publisher": "x",
            "payload_sha256": sha(payload if payload is not None else self.payloads[cid]),
            "content_type": content_type})

    def nemesis(self, f: str, **value: Any) -> Op:
        return self.op("nemesis", "info", f, None, None, value)

    def replay(self, node: int, topic: str, entries: list[tuple[str, tuple[str, ...]]],
               payloads: dict[str, tuple[str, str]] | None = None) -> tuple[Op, Op]:
        invoke = self.op("replayer", "invoke", "replay", node, topic)
        payloads = payloads or {}
        ok = self.complete(invoke, "ok", {
            "cids": [c for c, _ in entries],
            "parents": {c: list(p) for c, p in entries},
            "payloads": {c: list(payloads[c]) if c in payloads
                         else [sha(self.payloads[c]), "text/plain"] for c, _ in entries}})
        return invoke, ok

    def revoke(self, topic: str, revoked: str) -> Op:
        return self.op("author", "invoke", "revoke", 0, topic, {"revoked": revoked})

    def version_seen(self, node: int, topic: str, revoked: str) -> Op:
        return self.op(f"sub-{node}", "ok", "version-seen", node, topic,
                       {"revoked": revoked, "version": "bafyversion2"})

    def check(self) -> CheckResult:
        return check(self.ops)


def only(result: CheckResult, kind: str) -> list[Anomaly]:
    """The anomalies of ``kind``, after asserting there is no other kind."""
    others = {k: n for k, n in result.counts.items() if n and k != kind}
    assert others == {}, result.anomalies
    return result.anomalies[kind]


def named(found: list[Anomaly]) -> list[tuple[str | None, int | None]]:
    return [(a.cid, a.node) for a in found]


def test_public_surface() -> None:
    assert checker.__all__ == [
        "KINDS", "Anomaly", "CheckResult", "Kind", "check", "excerpt", "nearest_rank"]
    assert history.__all__ == [
        "FIELDS", "HistoryError", "HistoryWriter", "Op", "OpType", "read_history"]
    assert KINDS == ("lost", "duplicated", "causal", "phantom", "corrupt")


# --- a clean history ---------------------------------------------------------------------


def clean_history() -> Builder:
    b = Builder()
    create = b.op("pub-0", "invoke", "create", 0, None,
                  {"name": "one", "linking": "LAST_SEEN", "allowed": None})
    b.complete(create, "ok", {"cid": T1})
    create = b.op("pub-0", "invoke", "create", 0, None,
                  {"name": "two", "linking": "CUSTOM", "allowed": [peer(0), peer(1)]})
    b.complete(create, "ok", {"cid": T2})
    for node in (1, 2):
        b.subscribe(node, T1)
    for node in (2, 3):
        b.subscribe(node, T2)
    # T1: node 3 joins late, after c1: it never delivers c1, and need not.
    b.publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0)
    b.deliver(2, T1, "c1", 0)
    b.subscribe(3, T1)
    b.publish(0, T1, "e2", "c2")
    b.deliver(1, T1, "c2", 1, ("c1",))
    b.deliver(1, T1, "c2", 1, ("c1",))  # re-read after a reconnect: same seq, no duplicate
    b.deliver(2, T1, "c2", 1, ("c1",))
    b.deliver(3, T1, "c2", 0, ("c1",))
    # Node 2 is killed, misses c3 while down, gets it after its restart.
    b.nemesis("kill", node=2)
    b.publish(0, T1, "e3", "c3")
    b.deliver(1, T1, "c3", 2, ("c2",))
    b.deliver(3, T1, "c3", 1, ("c2",))
    b.nemesis("restart", node=2)
    b.deliver(2, T1, "c3", 2, ("c2",))
    # Node 1 unsubscribes: c4 is not required there.
    b.unsubscribe(1, T1)
    b.nemesis("fault", id=1, kind="partition", nodes=[3])
    b.publish(0, T1, "e4", "c4")
    b.deliver(2, T1, "c4", 3, ("c3",))
    b.nemesis("heal", id=1, kind="partition", nodes=[3])
    b.deliver(3, T1, "c4", 2, ("c3",))
    b.replay(4, T1, [("c1", ()), ("c2", ("c1",)), ("c3", ("c2",)), ("c4", ("c3",))])
    # T2: f1 by peer 1; then peer 1 is revoked while it publishes f2 (not required: it
    # may be refused, here it reached node 2 only).
    b.publish(1, T2, "f1", "d1")
    b.deliver(2, T2, "d1", 0)
    b.deliver(3, T2, "d1", 0)
    racing = b.start_publish(1, T2, "f2")
    revoke = b.revoke(T2, peer(1))
    b.end_publish(racing, "f2", "d2")
    b.complete(revoke, "ok", {"version": "bafyversion2"})
    b.deliver(2, T2, "d2", 1, ("d1",))
    b.version_seen(2, T2, peer(1))
    b.version_seen(3, T2, peer(1))
    # An indeterminate publish by node 0 that took effect: everywhere.
    b.publish(0, T2, "g1", outcome="info")
    b.payloads["d3"] = "g1"
    b.deliver(3, T2, "d3", 1, ("d1",))
    b.deliver(2, T2, "d3", 2, ("d2",))
    return b


def test_a_clean_history_has_no_anomaly() -> None:
    b = clean_history()
    result = b.check()
    assert result.counts == dict.fromkeys(KINDS, 0), result.anomalies
    assert result.ok
    assert result.acknowledged == 6
    assert result.delivered == 15  # distinct (node, topic, CID): the re-read counts once
    # The restart (node 2 gets c3 one op later), then the heal (node 3 gets c4 one op later).
    assert result.converge == [1.0, 1.0]
    assert result.converge_p50 == 1.0 and result.converge_max == 1.0
    assert len(result.latencies) == 13  # every (node, acknowledged CID) delivered
    assert all(x > 0 for x in result.latencies)


def test_no_heal_no_convergence_figures() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0)
    result = b.check()
    assert result.ok and result.converge == []
    assert (result.converge_p50, result.converge_p99, result.converge_max) == (None,) * 3
    assert result.latencies == [2.0]  # invoke at t=2, delivered at t=4


# --- lost --------------------------------------------------------------------------------


def test_lost_at_an_eligible_subscriber_only() -> None:
    b = Builder()
    subscribed = {node: b.subscribe(node, T1) for node in (1, 2, 3, 4)}
    b.nemesis("kill", node=4)  # down at the end: not eligible
    invoke, ok = b.publish(0, T1, "e1", "c1")
    b.subscribe(5, T1)  # subscribed after the publish: not eligible
    b.unsubscribe(3, T1)  # unsubscribed before the end: not eligible
    b.deliver(1, T1, "c1", 0)
    found = only(b.check(), "lost")
    assert named(found) == [("c1", 2)]
    assert found[0].topic == T1
    assert found[0].ops == (subscribed[2].index, invoke.index, ok.index)


def test_lost_from_a_replay() -> None:
    b = Builder()
    b.publish(0, T1, "e1", "c1")
    b.publish(0, T1, "e2", "c2")
    invoke = b.op("replayer", "invoke", "replay", 7, T1)
    b.publish(0, T1, "e3", "c3")  # acknowledged after the replay began: not required
    b.payloads["c2"] = "e2"
    ok = b.complete(invoke, "ok", {"cids": ["c1"], "parents": {"c1": []},
                                   "payloads": {"c1": [sha("e1"), "text/plain"]}})
    found = only(b.check(), "lost")
    assert named(found) == [("c2", 7)]
    assert invoke.index in found[0].ops and ok.index in found[0].ops


def test_revocation_race_is_exempt_but_earlier_events_are_required() -> None:
    b = Builder()
    b.subscribe(2, T2)
    b.publish(1, T2, "f1", "d1")  # ok before the revoke: required
    racing = b.start_publish(1, T2, "f2")
    revoke = b.revoke(T2, peer(1))
    b.end_publish(racing, "f2", "d2")  # ok after the revoke's invoke: not required
    b.complete(revoke, "ok", {"version": "bafyversion2"})
    assert named(only(b.check(), "lost")) == [("d1", 2)]


def test_a_failed_revoke_exempts_nothing() -> None:
    b = Builder()
    b.subscribe(2, T2)
    racing = b.start_publish(1, T2, "f2")
    revoke = b.revoke(T2, peer(1))
    b.end_publish(racing, "f2", "d2")
    b.complete(revoke, "fail", {"error": "503"})
    assert named(only(b.check(), "lost")) == [("d2", 2)]


# --- duplicated --------------------------------------------------------------------------


def test_duplicate_across_a_restart() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1")
    first = b.deliver(1, T1, "c1", 0)
    b.deliver(1, T1, "c1", 0)  # a re-read: not a duplicate
    b.nemesis("kill", node=1)
    b.nemesis("restart", node=1)
    again = b.deliver(1, T1, "c1", 1)
    found = only(b.check(), "duplicated")
    assert named(found) == [("c1", 1)]
    assert found[0].ops == (first.index, again.index)


# --- causal ------------------------------------------------------------------------------


def test_delivered_before_its_parent() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1")
    b.publish(0, T1, "e2", "c2")
    b.deliver(1, T1, "c2", 0, ("c1",))
    b.deliver(1, T1, "c1", 1)
    found = only(b.check(), "causal")
    assert named(found) == [("c2", 1)]
    assert "c1" in found[0].detail


def test_parent_never_delivered() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1")
    b.publish(0, T1, "e2", "c2")
    b.deliver(1, T1, "c2", 0, ("c1",))
    result = b.check()
    assert named(result.anomalies["causal"]) == [("c2", 1)]
    assert named(result.anomalies["lost"]) == [("c1", 1)]
    assert result.counts == {"lost": 1, "duplicated": 0, "causal": 1, "phantom": 0,
                             "corrupt": 0}


def test_a_parent_that_raced_a_revocation_may_be_missing_below_a_child() -> None:
    """Node 1 published d2 while node 0 revoked it; node 2, not knowing the revocation yet,
    published d3 on d2. Where the revocation is known d2 is refused, so d3 goes without it
    (live and in a replay): no anomaly. The same missing parent, not exempt, is one."""
    b = Builder()
    b.subscribe(3, T2)
    racing = b.start_publish(1, T2, "f2")
    revoke = b.revoke(T2, peer(1))
    b.end_publish(racing, "f2", "d2")
    b.complete(revoke, "ok", {"version": "bafyversion2"})
    b.publish(2, T2, "f3", "d3")
    b.deliver(3, T2, "d3", 0, ("d2",))
    b.replay(7, T2, [("d3", ("d2",))])
    assert b.check().ok
    b = Builder()
    b.subscribe(3, T2)
    b.publish(1, T2, "f2", "d2")
    b.publish(2, T2, "f3", "d3")
    b.deliver(3, T2, "d3", 0, ("d2",))
    b.replay(7, T2, [("d3", ("d2",))])
    result = b.check()
    assert named(result.anomalies["causal"]) == [("d3", 3), ("d3", 7)]


def test_unknown_parent_is_not_an_event() -> None:
    # A parent link to something that is no known event of the topic (the topic root, a
    # version) says nothing about order.
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0, ("bafysomethingelse",))
    assert b.check().ok


def test_replay_listing_a_child_before_its_parent() -> None:
    b = Builder()
    b.publish(0, T1, "e1", "c1")
    b.publish(0, T1, "e2", "c2")
    b.replay(7, T1, [("c2", ("c1",)), ("c1", ())])
    assert named(only(b.check(), "causal")) == [("c2", 7)]


# --- phantom -----------------------------------------------------------------------------


def test_phantom_never_published() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0)
    b.deliver(1, T1, "cghost", 1, ("c1",), payload="nobody")
    b.deliver(1, T1, "cghost", 1, ("c1",), payload="nobody")  # once per node and CID
    found = only(b.check(), "phantom")
    assert named(found) == [("cghost", 1)]


def test_phantom_failed_publish_that_shows_up() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", outcome="fail")
    b.deliver(1, T1, "cfailed", 0, payload="e1")
    b.replay(7, T1, [("cfailed", ())], {"cfailed": (sha("e1"), "text/plain")})
    found = only(b.check(), "phantom")
    assert named(found) == [("cfailed", 1), ("cfailed", 7)]
    assert "fail" in found[0].detail


def test_phantom_after_the_revocation_reached_the_node() -> None:
    b = Builder()
    for node in (2, 3):
        b.subscribe(node, T2)
    revoke = b.revoke(T2, peer(1))
    b.complete(revoke, "ok", {"version": "bafyversion2"})
    b.version_seen(2, T2, peer(1))
    b.publish(1, T2, "late", "dlate")  # node 1 had not heard yet: ok
    b.deliver(2, T2, "dlate", 0)  # node 2 knew: must have refused it
    b.deliver(3, T2, "dlate", 0)  # node 3: not known to know, allowed
    b.version_seen(3, T2, peer(1))
    found = only(b.check(), "phantom")
    assert named(found) == [("dlate", 2)]


# --- corrupt -----------------------------------------------------------------------------


def test_corrupt_payload() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0, payload="tampered")
    found = only(b.check(), "corrupt")
    assert named(found) == [("c1", 1)]
    assert "payload_sha256" in found[0].detail


def test_corrupt_content_type_in_delivery_and_replay() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.publish(0, T1, "e1", "c1", content_type="application/json")
    b.deliver(1, T1, "c1", 0, content_type="text/plain")
    b.replay(7, T1, [("c1", ())])  # replayed as text/plain too
    found = only(b.check(), "corrupt")
    assert named(found) == [("c1", 1), ("c1", 7)]
    assert all("content_type" in a.detail for a in found)


def test_partial_indeterminate_publish() -> None:
    b = Builder()
    for node in (1, 2, 3):
        b.subscribe(node, T1)
    b.publish(0, T1, "maybe", outcome="info")
    b.payloads["cmaybe"] = "maybe"
    b.deliver(1, T1, "cmaybe", 0)
    found = only(b.check(), "corrupt")
    assert named(found) == [("cmaybe", 2), ("cmaybe", 3)]


def test_indeterminate_publish_seen_nowhere_is_fine() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.start_publish(0, T1, "inflight")  # never completed: indeterminate
    assert b.check().ok


# --- convergence -------------------------------------------------------------------------


def test_convergence_values() -> None:
    b = Builder()
    b.subscribe(1, T1)
    b.subscribe(2, T1)
    b.at(10).publish(0, T1, "e1", "c1")  # invoke 10, ok 11
    b.nemesis("fault", id=1, kind="partition", nodes=[2])  # 12
    b.deliver(1, T1, "c1", 0)  # 13
    b.at(15).nemesis("heal", id=1, kind="partition", nodes=[2])
    b.at(17.5).deliver(2, T1, "c1", 0)  # 2.5 s after the heal
    b.at(20).publish(0, T1, "e2", "c2")
    b.deliver(1, T1, "c2", 1, ("c1",))
    b.deliver(2, T1, "c2", 1, ("c1",))
    b.at(30).nemesis("heal", id=2, kind="loss", nodes=[1])  # nothing missing
    b.publish(0, T1, "e3", "c3")
    b.deliver(1, T1, "c3", 2, ("c2",))
    b.at(40).nemesis("heal", id=3, kind="partition", nodes=[2])  # c3 never reaches 2
    result = b.check()
    assert result.converge == [2.5, 0.0, math.inf]
    assert result.converge_p50 == 2.5
    assert result.converge_p99 == math.inf and result.converge_max == math.inf
    assert named(only(result, "lost")) == [("c3", 2)]
    assert result.latencies == [3.0, 7.5, 2.0, 3.0, 2.0]


def test_convergence_leaves_out_a_node_that_is_down_until_it_restarts() -> None:
    """A killed node's lag is not the network's: a heal while it is down converges when
    the running nodes have everything; its own restart measures its catch-up."""
    b = Builder()
    b.subscribe(1, T1)
    b.subscribe(2, T1)
    b.at(5).nemesis("kill", node=2)
    b.at(10).publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0)
    b.at(15).nemesis("heal", id=1, kind="loss", nodes=[0, 1, 2])  # 2 is down: 0.0
    b.at(20).nemesis("restart", node=2)
    b.at(23).deliver(2, T1, "c1", 0)  # 3 s after its restart
    result = b.check()
    assert result.converge == [0.0, 3.0]
    assert result.ok


def test_convergence_leaves_out_a_node_killed_before_it_caught_up() -> None:
    """A node killed just after a heal, before the events reached it, catches up after its
    restart: that restart's value counts the wait, the heal's does not."""
    b = Builder()
    b.subscribe(1, T1)
    b.subscribe(2, T1)
    b.at(10).publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0)
    b.at(15).nemesis("heal", id=1, kind="loss", nodes=[0, 1, 2])  # 1 has it; 2 runs
    b.at(16.5).nemesis("kill", node=2)  # before c1 reached it
    b.at(40).nemesis("restart", node=2)
    b.at(42).deliver(2, T1, "c1", 0)
    result = b.check()
    assert result.converge == [0.0, 2.0]
    assert result.ok


def test_a_pause_of_a_killed_node_does_not_bring_it_back() -> None:
    """The schedule may pause a node that a kill already took down: the SIGSTOP and
    SIGCONT reach no process. The resume is no recovery and does not make the node
    count as running: its catch-up is its restart's to measure (the 25-node seed 5 once
    charged a dead node's end-of-run catch-up, 42.9 s, to such a resume)."""
    b = Builder()
    b.subscribe(1, T1)
    b.subscribe(2, T1)
    b.at(5).nemesis("kill", node=2)
    b.at(10).publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0)
    b.at(20).nemesis("pause", node=2)
    b.at(25).nemesis("resume", node=2)  # 2 is still dead
    b.at(60).nemesis("restart", node=2)
    b.at(62).deliver(2, T1, "c1", 0)
    result = b.check()
    assert result.converge == [2.0]  # the restart's alone
    assert result.ok


def test_convergence_cut_into_by_the_next_fault_is_kept_apart() -> None:
    """A heal followed at once by a partition: the wait that follows is partly the
    partition's; it stays in ``converge`` but not in ``converge_uninterrupted``."""
    b = Builder()
    b.subscribe(1, T1)
    b.subscribe(2, T1)
    b.at(10).publish(0, T1, "e1", "c1")
    b.deliver(1, T1, "c1", 0)
    b.at(15).nemesis("heal", id=1, kind="loss", nodes=[0, 1, 2])
    b.at(16.5).nemesis("fault", id=2, kind="partition", nodes=[2])
    b.at(21).nemesis("heal", id=2, kind="partition", nodes=[2])
    b.at(22.5).deliver(2, T1, "c1", 0)
    result = b.check()
    assert result.converge == [7.5, 1.5]
    assert result.converge_uninterrupted == [1.5]
    assert result.converge_uninterrupted_p99 == 1.5 and result.converge_final == 1.5
    assert result.ok


def test_nearest_rank() -> None:
    assert nearest_rank([], 50) is None
    assert nearest_rank([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert nearest_rank([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    assert nearest_rank([5.0], 1) == 5.0


# --- excerpt and harness errors -----------------------------------------------------------


def test_excerpt_shows_the_ops_around_an_anomaly() -> None:
    b = Builder()
    b.subscribe(1, T1)  # ops 0, 1
    b.publish(0, T1, "e1", "c1")  # ops 2, 3
    b.subscribe(2, T1)  # ops 4, 5
    b.publish(0, T1, "e2", "c2")  # ops 6, 7
    b.deliver(1, T1, "c2", 0)  # op 8
    b.deliver(2, T1, "c2", 0)  # op 9
    found = only(b.check(), "lost")
    assert named(found) == [("c1", 1)]
    assert found[0].ops == (1, 2, 3)
    assert [op.index for op in excerpt(b.ops, found[0], around=1)] == [0, 1, 2, 3, 4]
    assert [op.index for op in excerpt(b.ops, found[0], around=0)] == [1, 2, 3]


def test_harness_bugs_are_errors_not_findings() -> None:
    b = Builder()
    b.op("pub-0", "ok", "publish", 0, T1, {"cid": "c1"})
    with pytest.raises(HistoryError, match="no invoke in flight"):
        b.check()
    b = Builder()
    b.start_publish(0, T1, "a")
    b.start_publish(0, T1, "b")
    with pytest.raises(HistoryError, match="in flight"):
        b.check()
    b = Builder()
    b.publish(0, T1, "same", "c1")
    b.publish(1, T1, "same", "c2")
    with pytest.raises(HistoryError, match="unique payloads"):
        b.check()
    b = Builder()
    b.op("sub-1", "ok", "deliver", 1, T1, {"cid": "c1"})
    with pytest.raises(HistoryError, match=r"op 0 .*seq"):
        b.check()


# --- the file format ----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


def test_writer_and_reader_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path, clock=FakeClock()) as w:
        create = w.invoke("pub-0", "create", 0, None, {"name": "one", "linking": "LAST_SEEN",
                                                        "allowed": None})
        created = w.complete(create, "ok", {"cid": T1}, topic=T1)
        publish = w.invoke("pub-0", "publish", 0, T1, {"publisher": peer(0),
                                                       "payload_sha256": sha("x"),
                                                       "content_type": "text/plain",
                                                       "size": 1, "parent": None})
        # Flushed line by line: a reader sees it all while the writer is still open.
        assert len(read_history(path)) == 3
        done = w.complete(publish, "info", {"error": "timeout"})
        fault = w.record("nemesis", "info", "fault", None, None,
                         {"id": 1, "kind": "partition", "nodes": [1, 2]})
    written = [create, created, publish, done, fault]
    assert read_history(path) == written
    assert [op.index for op in written] == [0, 1, 2, 3, 4]
    assert [op.time for op in written] == [0.25, 0.5, 0.75, 1.0, 1.25]
    assert created.topic == T1 and created.f == "create" and created.process == "pub-0"
    assert done.node == 0 and done.topic == T1 and done.type == "info"
    with pytest.raises(FileExistsError):  # never overwrites a history
        HistoryWriter(path)


def test_writer_refuses_what_json_cannot_hold(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:
        with pytest.raises(ValueError):
            w.record("x", "ok", "deliver", 1, T1, {"bad": math.nan})
        w.record("x", "ok", "deliver", 1, T1, {})
    assert [op.index for op in read_history(path)] == [0]


def line(**over: Any) -> str:
    base: dict[str, Any] = {"index": 0, "time": 0.5, "process": "p", "type": "ok",
                            "f": "deliver", "node": 1, "topic": T1, "value": {}}
    base.update(over)
    return json.dumps(base)


@pytest.mark.parametrize(("second", "message"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    (line(index=1, type="done"), "type must be one of"),
    (line(index=1, node=True), "node must be"),
    (line(index=1, time=float("inf")).replace("Infinity", "1e999"), "time must be"),
    (json.dumps({"index": 1, "time": 1.0}), "missing key"),
    (line(index=1, extra=1), "unknown key"),
    (line(index=2), "index 2, expected 1"),
    (line(index=1, time=0.1), "before the previous"),
    ("", "empty line"),
])
def test_a_bad_line_is_named(tmp_path: Path, second: str, message: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(line() + "\n" + second + "\n" + line(index=2) + "\n")
    with pytest.raises(HistoryError, match=message) as caught:
        read_history(path)
    assert f"{path}:2: " in str(caught.value)
    assert caught.value.line == 2
    assert isinstance(caught.value, ValueError)


def test_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(line() + "\n" + line(index=1)[:20])
    with pytest.raises(HistoryError, match=":2: not JSON"):
        read_history(path)
    assert len(read_history(path, allow_torn_tail=True)) == 1
