"""The checker: what a history proves about the system, and nothing else.

:func:`check` reads only a history (:mod:`pulsar.tools.verify.history`): what the clients asked
and what they were told. It trusts no counter or log of the nodes. Every rule below is a
guarantee of pulsarcast; a history that breaks one yields an :class:`Anomaly` of that kind.

Words
-----
**Before / after** is history order. Times never decrease along a history, so this is the
time order, with equal times broken by the order the harness recorded the ops.

**Requests.** An ``invoke`` and the next ``ok``/``fail``/``info`` of the same process with the
same ``f`` are one request. A request still in flight at the end of the history is
indeterminate, as if it had ended ``info``. A completion of ``create``, ``publish``,
``subscribe``, ``unsubscribe``, ``revoke`` or ``replay`` with no invoke in flight, or a
second invoke of a process with one in flight, is a harness bug (:class:`HistoryError`).

**Events.** A publish is *acknowledged* when it ended ``ok``; its CID is the ok's ``cid``.
An *indeterminate* publish (``info``, or in flight at the end) has no CID: it is matched to
the first delivery or replay entry on its topic carrying its ``payload_sha256`` (the
workload never publishes one payload twice; a history that does is a :class:`HistoryError`),
and that CID becomes its CID. A *failed* publish is matched the same way, only to be
reported. A CID *matches a publish* when it is an acknowledged CID of that topic or the CID
an indeterminate publish was matched to. A *known event* of a topic is a CID that matches a
publish of it or was delivered on it at some node.

**Subscribed.** Node N is *subscribed to T from A to B* when N has a subscribe ``ok`` on T
before A and no unsubscribe *invoke* on N for T between the last such ``ok`` and B (an
unsubscribe that failed may have happened anyway). N is *down at the end* when its last
``kill`` op (target ``value["node"]``, else the op's node) has no ``restart`` after it. An
*eligible subscriber* of a publish is a node subscribed to its topic from the publish's
invoke to the end of the history and not down at the end.

**Revocation.** A revoke of peer P on T *counts* unless it failed. An event is *exempt*
(not required anywhere: its publish raced the revocation and may have been refused) when
its publisher was revoked on its topic by a counting revoke invoked before the publish
ended (its ok; for an indeterminate publish, its info or the end of the history). An event
whose publish ok precedes every counting revoke invoke of its publisher is required.

**Deliveries.** A ``deliver`` op is one read of node N's delivery log of topic T: CID at
position ``seq``. Reading the same (N, T, seq) twice is not a duplicate. The position of a
CID at N is the smallest seq it was read at; its arrival is the first read. The history is
assumed to end with a final read of every live subscriber's log.

Rules
-----
**lost** — an acknowledged, non-exempt event missing from an eligible subscriber at the
end of the history (one anomaly per event and node), or missing from a replay ``ok`` of its
topic invoked after the publish ok (one per event and replay).

**duplicated** — one CID read at two different seqs of one node's log of one topic (one
anomaly per node, topic and CID), or listed twice by one replay.

**causal** — at node N, an event at position s with a parent (from the delivery's
``parents``) that is a known event of the topic and either sits at a position after s, or
was never delivered at N although N was subscribed to the topic from the parent's publish
invoke to the event's arrival. (The second condition is deliberate: a node that subscribes
late starts its log at its subscription horizon and never delivers older ancestors.) In a
replay ``ok``: an entry listed before one of its parents, or whose parent is a known event
(or listed by that replay) but missing from it. A parent that is *exempt* and missing is
no anomaly: its publish raced a revocation, so a node that knows the revoking version
refuses it, while a publisher that had not heard of the version yet may have linked its
own event to it. One anomaly per (event, parent) pair.

**phantom** — a delivered or replayed CID that matches no publish: nobody published it, or
its payload belongs to a failed publish, or to an acknowledged publish with another CID, or
to an indeterminate publish already matched to another CID. Also: an event whose publisher
was revoked on its topic by a revoke ``ok`` before the publish's invoke, whose arrival at
node N is after a ``version-seen`` op showing N knew that revocation (any version-seen of
that topic and revoked peer at N; there is no op that grants a peer again).

**corrupt** — a delivery or replay entry whose ``payload_sha256`` or ``content_type`` differs
from its publish invoke's; two reads of one (N, T, seq) giving different CIDs; two publishes
acknowledged with one CID; and a non-exempt indeterminate publish that was seen (delivered
anywhere, or replayed) but is missing at an eligible subscriber at the end: indeterminate
publishes are all-or-nothing. One anomaly per missing node.

Measures
--------
**converge** — one value per ``heal``, ``restart`` and ``resume`` op, in history order: the
acknowledged, non-exempt events whose ok came before that op, paired with each eligible
subscriber that had not yet received them by then; the value is the time of the last of
those arrivals minus the op's time, 0.0 when nothing was missing, ``math.inf`` when one of
them never arrived (reported as lost). ``converge_p50/p99/max`` are nearest-rank percentiles
of those values, ``None`` without any. A node that is down or paused at the op, or is
stopped again before those arrivals, is left out of that op's value: its own restart or
resume measures its catch-up of the same events. Faults follow each other a few seconds
apart, so a value may include the next fault's time: ``converge_uninterrupted`` keeps the
values of recoveries that converged before the next fault began (and the run's last,
after which no fault comes), and ``converge_final`` is the last recovery's value.

**latencies** — for every first arrival of an acknowledged event at a node (any node), its
time minus the publish invoke's time, in arrival order. **acknowledged** is the number of
publish oks, **delivered** the number of distinct (node, topic, CID) deliveries.

Cost: one pass to index the history (dicts keyed by (node, topic, CID)), one to match
deliveries, then work proportional to the required (event, subscriber) pairs plus a sort:
O(n log n) for n ops, and replays cost O(events of the topic) each.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from .history import HistoryError, Op, _without_cyclic_gc

__all__ = [
    "KINDS",
    "Anomaly",
    "CheckResult",
    "Kind",
    "check",
    "excerpt",
    "nearest_rank",
]

Kind = Literal["lost", "duplicated", "causal", "phantom", "corrupt"]
KINDS: tuple[Kind, ...] = get_args(Kind)

_REQUESTS = frozenset({"create", "publish", "subscribe", "unsubscribe", "revoke", "replay"})
_RECOVERIES = frozenset({"heal", "restart", "resume"})
_NEVER = sys.maxsize  # an op index after every op: "not yet", "never"


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One broken guarantee, with the ops of the history that show it (their indices)."""

    kind: Kind
    topic: str
    cid: str | None
    node: int | None
    detail: str
    ops: tuple[int, ...]


def nearest_rank(values: Sequence[float], percent: float) -> float | None:
    """The nearest-rank percentile (the smallest value with at least ``percent`` % of the
    values at or below it); ``None`` for no values. Always one of the values: no
    interpolation between a converged heal and one that never converged."""
    if not values:
        return None
    if not 0 < percent <= 100:
        raise ValueError(f"percent must be in (0, 100], not {percent}")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percent / 100 * len(ordered))) - 1]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What :func:`check` found. ``anomalies`` always has every kind of :data:`KINDS`."""

    anomalies: dict[str, list[Anomaly]]
    acknowledged: int
    delivered: int
    converge: list[float]
    latencies: list[float]
    converge_uninterrupted: list[float] = field(default_factory=list)
    """The values of ``converge`` whose wait no later fault interrupted: converged before
    the next fault began, or after the run's last heal."""

    @property
    def converge_final(self) -> float | None:
        """After the last recovery of the run, when every fault is over."""
        return self.converge[-1] if self.converge else None

    @property
    def converge_uninterrupted_p99(self) -> float | None:
        return nearest_rank(self.converge_uninterrupted, 99)

    @property
    def counts(self) -> dict[str, int]:
        return {kind: len(found) for kind, found in self.anomalies.items()}

    @property
    def ok(self) -> bool:
        return not any(self.anomalies.values())

    @property
    def converge_p50(self) -> float | None:
        return nearest_rank(self.converge, 50)

    @property
    def converge_p99(self) -> float | None:
        return nearest_rank(self.converge, 99)

    @property
    def converge_max(self) -> float | None:
        return max(self.converge) if self.converge else None


def excerpt(history: Sequence[Op], anomaly: Anomaly, around: int = 3) -> list[Op]:
    """The ops of ``anomaly`` with ``around`` ops either side of each, in history order
    (``history`` as given to :func:`check`: op ``i`` at position ``i``)."""
    if around < 0:
        raise ValueError("around must be >= 0")
    keep: set[int] = set()
    for index in anomaly.ops:
        if not 0 <= index < len(history) or history[index].index != index:
            raise ValueError(f"op {index} is not at position {index} of this history")
        keep.update(range(max(0, index - around), min(len(history), index + around + 1)))
    return [history[i] for i in sorted(keep)]


def check(history: Sequence[Op]) -> CheckResult:
    """Check every rule of this module's docstring against ``history`` (op ``i`` at
    position ``i``, times never decreasing, as :func:`~pulsar.tools.verify.history.read_history`
    returns). Raises :class:`HistoryError` for a history that breaks the format."""
    with _without_cyclic_gc():
        return _Checker(history).run()


# --- reading values: the format is checked where it is used, naming the op ---------------


def _bad(op: Op, what: str) -> HistoryError:
    return HistoryError(f"op {op.index} ({op.process} {op.type} {op.f}): {what}")


def _str(op: Op, key: str) -> str:
    x = op.value.get(key)
    if not isinstance(x, str):
        raise _bad(op, f"value[{key!r}] must be a string, not {x!r}")
    return x


def _int(op: Op, key: str) -> int:
    x = op.value.get(key)
    if not isinstance(x, int) or isinstance(x, bool):
        raise _bad(op, f"value[{key!r}] must be an integer, not {x!r}")
    return x


def _strs(op: Op, x: Any, what: str) -> tuple[str, ...]:
    if not isinstance(x, list) or not all(isinstance(s, str) for s in x):
        raise _bad(op, f"{what} must be a list of strings, not {x!r}")
    return tuple(x)


def _topic(op: Op) -> str:
    if op.topic is None:
        raise _bad(op, "needs a topic")
    return op.topic


def _node(op: Op) -> int:
    if op.node is None:
        raise _bad(op, "needs a node")
    return op.node


def _target(op: Op) -> int:
    """The node a kill/restart acts on: ``value["node"]``, else the op's node."""
    x = op.value.get("node", op.node)
    if not isinstance(x, int) or isinstance(x, bool):
        raise _bad(op, f"needs the node it acts on, not {x!r}")
    return x


# --- what the index holds (mutable: filled during one pass, private) ----------------------


@dataclass(slots=True)
class _Publish:
    invoke: Op
    end: Op | None  # the completion; None: in flight at the end of the history
    topic: str
    publisher: str
    sha: str
    content_type: str
    cid: str | None = None  # the ok's CID, or the CID an indeterminate publish matched
    seen_at: int | None = None  # where an indeterminate publish was first matched

    @property
    def outcome(self) -> str:
        return "info" if self.end is None else self.end.type

    @property
    def end_index(self) -> int:
        return _NEVER if self.end is None else self.end.index


@dataclass(slots=True)
class _Seen:
    """One CID in one node's delivery log of one topic."""

    first: Op  # the first read: the arrival
    parents: tuple[str, ...]
    seqs: dict[int, int]  # seq -> first op reading it there

    @property
    def position(self) -> int:
        return min(self.seqs)


@dataclass(slots=True)
class _Replay:
    invoke: Op
    ok: Op
    topic: str
    cids: tuple[str, ...]
    parents: dict[str, tuple[str, ...]]
    payloads: dict[str, tuple[str, str]]


class _Checker:
    def __init__(self, history: Sequence[Op]) -> None:
        self.history = history
        self.found: dict[str, list[Anomaly]] = {kind: [] for kind in KINDS}
        self.publishes: list[_Publish] = []
        self.acknowledged = 0
        self.acked: dict[tuple[str, str], _Publish] = {}
        self.matched: dict[tuple[str, str], _Publish] = {}  # indeterminate/failed, by CID
        self.by_sha: dict[tuple[str, str], _Publish] = {}
        self.subs: dict[tuple[int, str], list[int]] = {}  # subscribe ok indices
        self.unsubs: dict[tuple[int, str], list[int]] = {}  # unsubscribe invoke indices
        self.subscribers: dict[str, set[int]] = {}
        self.ordered: dict[str, list[int]] = {}  # subscribers, sorted once
        self.down: set[int] = set()
        self.revoke_invoke: dict[tuple[str, str], int] = {}  # (topic, peer) -> first
        self.revoke_ok: dict[tuple[str, str], int] = {}
        self.version_seen: dict[tuple[int, str, str], int] = {}  # (node, topic, peer)
        self.seen: dict[tuple[int, str, str], _Seen] = {}
        self.at_seq: dict[tuple[int, str, int], tuple[str, int]] = {}
        # (op index, node, topic, cid, payload_sha256, content_type), read once
        self.deliveries: list[tuple[int, int, str, str, str, str]] = []
        self.replays: list[_Replay] = []
        self.recoveries: list[Op] = []
        self.fault_starts: list[int] = []  # indices of "fault" ops, in order
        self.uninterrupted: list[float] = []
        self.stops: dict[int, list[tuple[int, int]]] = {}
        """Per node, the op-index intervals it was killed or paused (end: restart/resume)."""
        self.reported: set[tuple[object, ...]] = set()

    def run(self) -> CheckResult:
        self._index()
        self._match_all()
        self._duplicated()
        pairs = self._lost()
        self._lost_from_replays()
        self._causal()
        self._phantom_after_revocation()
        self._partial()
        for found in self.found.values():
            found.sort(key=lambda a: (a.ops, a.node if a.node is not None else -1, a.cid or ""))
        return CheckResult(
            anomalies=dict(self.found),
            acknowledged=self.acknowledged,
            delivered=len(self.seen),
            converge=self._converge(pairs),
            latencies=self._latencies(),
            converge_uninterrupted=self.uninterrupted,
        )

    def _report(
        self,
        kind: Kind,
        topic: str,
        cid: str | None,
        node: int | None,
        detail: str,
        ops: Iterable[int | None],
        *,
        once: tuple[object, ...] | None = None,
    ) -> None:
        """Record an anomaly; ``once`` is a key that reports it only the first time."""
        if once is not None:
            if (kind, *once) in self.reported:
                return
            self.reported.add((kind, *once))
        indices = tuple(sorted({i for i in ops if i is not None and i != _NEVER}))
        self.found[kind].append(Anomaly(kind, topic, cid, node, detail, indices))

    # --- pass 1: index -------------------------------------------------------------------

    def _index(self) -> None:
        pending: dict[str, Op] = {}
        last_time = -math.inf
        for position, op in enumerate(self.history):
            if op.index != position:
                raise HistoryError(f"op at position {position} has index {op.index}")
            if op.time < last_time:
                raise _bad(op, f"time {op.time} is before the previous op's {last_time}")
            last_time = op.time
            if op.type == "invoke":
                busy = pending.get(op.process)
                if busy is not None:
                    raise _bad(op, f"invoked while op {busy.index} ({busy.f}) is in flight")
                pending[op.process] = op
                continue
            invoked = pending.get(op.process)
            if invoked is not None and invoked.f == op.f:
                del pending[op.process]
                self._request(invoked, op)
            elif op.f in _REQUESTS:
                raise _bad(op, "a completion with no invoke in flight")
            else:
                self._single(op)
        for invoked in pending.values():
            self._request(invoked, None)
        for times in self.unsubs.values():
            times.sort()

    def _request(self, invoke: Op, end: Op | None) -> None:
        f, ok = invoke.f, end is not None and end.type == "ok"
        if f == "publish":
            self._publish(invoke, end)
        elif f == "subscribe" and end is not None and ok:
            node, topic = _node(invoke), _topic(invoke)
            self.subs.setdefault((node, topic), []).append(end.index)
            self.subscribers.setdefault(topic, set()).add(node)
        elif f == "unsubscribe":
            self.unsubs.setdefault((_node(invoke), _topic(invoke)), []).append(invoke.index)
        elif f == "revoke" and (end is None or end.type != "fail"):
            key = (_topic(invoke), _str(invoke, "revoked"))
            self.revoke_invoke[key] = min(self.revoke_invoke.get(key, _NEVER), invoke.index)
            if end is not None and ok:
                self.revoke_ok[key] = min(self.revoke_ok.get(key, _NEVER), end.index)
        elif f == "replay" and end is not None and ok:
            self.replays.append(self._replay(invoke, end))

    def _publish(self, invoke: Op, end: Op | None) -> None:
        pub = _Publish(
            invoke=invoke,
            end=end,
            topic=_topic(invoke),
            publisher=_str(invoke, "publisher"),
            sha=_str(invoke, "payload_sha256"),
            content_type=_str(invoke, "content_type"),
        )
        earlier = self.by_sha.get((pub.topic, pub.sha))
        if earlier is not None:
            raise _bad(
                invoke,
                f"payload already published by op {earlier.invoke.index}: "
                "matching indeterminate publishes needs unique payloads",
            )
        self.by_sha[(pub.topic, pub.sha)] = pub
        self.publishes.append(pub)
        if end is not None and end.type == "ok":
            self.acknowledged += 1
            pub.cid = _str(end, "cid")
            first = self.acked.get((pub.topic, pub.cid))
            if first is not None:
                self._report(
                    "corrupt",
                    pub.topic,
                    pub.cid,
                    invoke.node,
                    f"two publishes acknowledged with one CID (first: op {first.invoke.index})",
                    (first.invoke.index, first.end_index, invoke.index, end.index),
                )
                return
            self.acked[(pub.topic, pub.cid)] = pub

    def _replay(self, invoke: Op, ok: Op) -> _Replay:
        cids = _strs(ok, ok.value.get("cids"), "value['cids']")
        raw_parents, raw_payloads = ok.value.get("parents"), ok.value.get("payloads")
        if not isinstance(raw_parents, dict) or not isinstance(raw_payloads, dict):
            raise _bad(ok, "value['parents'] and value['payloads'] must be objects")
        parents: dict[str, tuple[str, ...]] = {}
        payloads: dict[str, tuple[str, str]] = {}
        for cid in cids:
            if cid not in raw_parents or cid not in raw_payloads:
                raise _bad(ok, f"{cid} has no entry in value['parents'] or value['payloads']")
            parents[cid] = _strs(ok, raw_parents[cid], f"value['parents'][{cid!r}]")
            payload = _strs(ok, raw_payloads[cid], f"value['payloads'][{cid!r}]")
            if len(payload) != 2:
                raise _bad(ok, f"value['payloads'][{cid!r}] must be [sha256, content_type]")
            payloads[cid] = (payload[0], payload[1])
        return _Replay(invoke, ok, _topic(invoke), cids, parents, payloads)

    def _single(self, op: Op) -> None:
        f = op.f
        if f == "deliver":
            self._deliver(op)
        elif f == "version-seen":
            key = (_node(op), _topic(op), _str(op, "revoked"))
            self.version_seen[key] = min(self.version_seen.get(key, _NEVER), op.index)
        elif f == "kill":
            self.down.add(_target(op))
            self._stop_begins(_target(op), op.index)
        elif f == "pause":
            self._stop_begins(_target(op), op.index)
        elif f in ("restart", "resume"):
            node = _target(op)
            if f == "resume" and node in self.down:
                return  # SIGCONT to a killed node: it stays down until its restart
            if f == "restart":
                self.down.discard(node)
            self._stop_ends(node, op.index)
            self.recoveries.append(op)
        elif f in _RECOVERIES:
            self.recoveries.append(op)
        elif f == "fault":
            self.fault_starts.append(op.index)

    def _stop_begins(self, node: int, index: int) -> None:
        stops = self.stops.setdefault(node, [])
        if not stops or stops[-1][1] != _NEVER:
            stops.append((index, _NEVER))

    def _stop_ends(self, node: int, index: int) -> None:
        stops = self.stops.get(node)
        if stops and stops[-1][1] == _NEVER:
            stops[-1] = (stops[-1][0], index)

    def _deliver(self, op: Op) -> None:
        if op.type != "ok":
            raise _bad(op, "a delivery is recorded as ok")
        node, topic, cid, seq = _node(op), _topic(op), _str(op, "cid"), _int(op, "seq")
        sha, content_type = _str(op, "payload_sha256"), _str(op, "content_type")
        seen = self.seen.get((node, topic, cid))
        if seen is None:
            parents = _strs(op, op.value.get("parents"), "value['parents']")
            seen = self.seen[(node, topic, cid)] = _Seen(op, parents, {})
        seen.seqs.setdefault(seq, op.index)
        there = self.at_seq.setdefault((node, topic, seq), (cid, op.index))
        if there[0] != cid:
            self._report(
                "corrupt",
                topic,
                cid,
                node,
                f"seq {seq} read as {there[0]} (op {there[1]}), now as {cid}",
                (there[1], op.index),
                once=(node, topic, seq, cid),
            )
        self.deliveries.append((op.index, node, topic, cid, sha, content_type))

    # --- pass 2: match deliveries and replay entries to publishes ------------------------

    def _publish_of(self, topic: str, cid: str) -> _Publish | None:
        pub = self.acked.get((topic, cid))
        if pub is None:
            pub = self.matched.get((topic, cid))
        return pub if pub is not None and pub.outcome != "fail" else None

    def _match(self, topic: str, cid: str, sha: str, at: int) -> tuple[_Publish | None, str]:
        """The publish this entry is, or None and why it is a phantom."""
        pub = self.acked.get((topic, cid)) or self.matched.get((topic, cid))
        if pub is None:
            pub = self.by_sha.get((topic, sha))
            if pub is None:
                return None, "matches no publish"
            if pub.outcome == "ok":
                return None, (
                    f"payload of the publish acknowledged as {pub.cid} "
                    f"(op {pub.invoke.index}) under another CID"
                )
            if pub.cid is not None:
                return None, (
                    f"payload of publish op {pub.invoke.index}, already seen as {pub.cid}"
                )
            pub.cid, pub.seen_at = cid, at
            self.matched[(topic, cid)] = pub
        if pub.outcome == "fail":
            assert pub.end is not None
            error = pub.end.value.get("error", "")
            return None, (f"its publish (op {pub.invoke.index}) was told fail "
                          f"(op {pub.end.index}: {error})")
        return pub, ""

    def _compare(self, pub: _Publish, sha: str, content_type: str) -> str:
        wrong = []
        if sha != pub.sha:
            wrong.append(f"payload_sha256 {sha}, published {pub.sha}")
        if content_type != pub.content_type:
            wrong.append(f"content_type {content_type!r}, published {pub.content_type!r}")
        return "; ".join(wrong)

    def _match_all(self) -> None:
        for index, node, topic, cid, sha, content_type in self.deliveries:
            pub, why = self._match(topic, cid, sha, index)
            if pub is None:
                self._report(
                    "phantom",
                    topic,
                    cid,
                    node,
                    f"delivered: {why}",
                    (index,),
                    once=(node, topic, cid),
                )
                continue
            wrong = self._compare(pub, sha, content_type)
            if wrong:
                self._report(
                    "corrupt",
                    topic,
                    cid,
                    node,
                    f"delivered with {wrong}",
                    (pub.invoke.index, index),
                    once=(node, topic, cid),
                )
        for replay in self.replays:
            where, topic, at = replay.ok.index, replay.topic, replay.invoke.node
            listed: set[str] = set()
            for cid in replay.cids:
                if cid in listed:
                    self._report(
                        "duplicated",
                        topic,
                        cid,
                        at,
                        "listed twice by one replay",
                        (replay.invoke.index, where),
                        once=(where, cid),
                    )
                    continue
                listed.add(cid)
                sha, content_type = replay.payloads[cid]
                pub, why = self._match(topic, cid, sha, replay.ok.index)
                if pub is None:
                    self._report(
                        "phantom", topic, cid, at, f"replayed: {why}", (replay.invoke.index, where)
                    )
                    continue
                wrong = self._compare(pub, sha, content_type)
                if wrong:
                    self._report(
                        "corrupt",
                        topic,
                        cid,
                        at,
                        f"replayed with {wrong}",
                        (pub.invoke.index, replay.invoke.index, where),
                    )

    # --- pass 3: the rules ---------------------------------------------------------------

    def _subscribed(self, node: int, topic: str, start: int, until: int) -> int | None:
        """The subscribe ok that makes ``node`` subscribed to ``topic`` from op ``start``
        to op ``until`` (see the module docstring), or None."""
        oks = self.subs.get((node, topic))
        if not oks:
            return None
        i = bisect_left(oks, start) - 1
        if i < 0:
            return None
        unsubs = self.unsubs.get((node, topic), [])
        j = bisect_right(unsubs, oks[i])
        if j < len(unsubs) and unsubs[j] <= until:
            return None
        return oks[i]

    def _eligible(self, pub: _Publish) -> Iterable[tuple[int, int]]:
        """(node, subscribe ok index) of every eligible subscriber of ``pub``."""
        nodes = self.ordered.get(pub.topic)
        if nodes is None:
            nodes = self.ordered[pub.topic] = sorted(self.subscribers.get(pub.topic, ()))
        for node in nodes:
            if node in self.down:
                continue
            sub = self._subscribed(node, pub.topic, pub.invoke.index, _NEVER)
            if sub is not None:
                yield node, sub

    def _exempt(self, pub: _Publish) -> bool:
        revoked = self.revoke_invoke.get((pub.topic, pub.publisher))
        return revoked is not None and revoked < pub.end_index

    def _exempt_cid(self, topic: str, cid: str) -> bool:
        pub = self._publish_of(topic, cid)
        return pub is not None and self._exempt(pub)

    def _duplicated(self) -> None:
        for (node, topic, cid), seen in self.seen.items():
            if len(seen.seqs) > 1:
                seqs = sorted(seen.seqs)
                self._report(
                    "duplicated", topic, cid, node, f"delivered at seqs {seqs}", seen.seqs.values()
                )

    def _lost(self) -> list[tuple[int, int, int]]:
        """Report lost events; return the (ok index, arrival index, node) of every
        required (event, eligible subscriber) pair, for convergence."""
        pairs: list[tuple[int, int, int]] = []
        for pub in self.acked.values():
            if self._exempt(pub):
                continue
            assert pub.cid is not None and pub.end is not None
            for node, sub in self._eligible(pub):
                seen = self.seen.get((node, pub.topic, pub.cid))
                pairs.append((pub.end.index, _NEVER if seen is None else seen.first.index, node))
                if seen is None:
                    self._report(
                        "lost",
                        pub.topic,
                        pub.cid,
                        node,
                        f"acknowledged, never delivered at subscriber node {node}",
                        (pub.invoke.index, pub.end.index, sub),
                    )
        return pairs

    def _lost_from_replays(self) -> None:
        by_topic: dict[str, list[_Publish]] = {}
        for pub in self.acked.values():
            by_topic.setdefault(pub.topic, []).append(pub)
        for pubs in by_topic.values():
            pubs.sort(key=lambda p: p.end_index)
        for replay in self.replays:
            pubs = by_topic.get(replay.topic, [])
            before = bisect_left([p.end_index for p in pubs], replay.invoke.index)
            listed = set(replay.cids)
            for pub in pubs[:before]:
                if pub.cid not in listed and not self._exempt(pub):
                    self._report(
                        "lost",
                        pub.topic,
                        pub.cid,
                        replay.invoke.node,
                        f"acknowledged before replay op {replay.invoke.index}, missing from it",
                        (pub.invoke.index, pub.end_index, replay.invoke.index, replay.ok.index),
                    )

    def _known(self, topic: str, cid: str, delivered: set[tuple[str, str]]) -> bool:
        return (topic, cid) in delivered or self._publish_of(topic, cid) is not None

    def _causal(self) -> None:
        delivered = {(topic, cid) for (_, topic, cid) in self.seen}
        for (node, topic, cid), seen in self.seen.items():
            at = seen.position
            for parent in seen.parents:
                if parent == cid or not self._known(topic, parent, delivered):
                    continue
                had = self.seen.get((node, topic, parent))
                if had is not None:
                    if had.position > at:
                        self._report(
                            "causal",
                            topic,
                            cid,
                            node,
                            f"delivered at seq {at}, its parent {parent} at seq {had.position}",
                            (seen.seqs[at], had.seqs[had.position]),
                        )
                    continue
                pub = self._publish_of(topic, parent)
                if pub is None or self._exempt(pub):
                    continue  # an exempt parent may be refused where the revocation is known
                sub = self._subscribed(node, topic, pub.invoke.index, seen.first.index)
                if sub is not None:
                    self._report(
                        "causal",
                        topic,
                        cid,
                        node,
                        f"delivered at seq {at}, its parent {parent} never",
                        (pub.invoke.index, sub, seen.seqs[at]),
                    )
        for replay in self.replays:
            where, topic = replay.ok.index, replay.topic
            position: dict[str, int] = {}
            for i, cid in enumerate(replay.cids):
                position.setdefault(cid, i)
            for i, cid in enumerate(replay.cids):
                if position[cid] != i:
                    continue
                for parent in replay.parents[cid]:
                    p = position.get(parent)
                    if p is not None and p > i:
                        why = f"listed at {i}, its parent {parent} at {p}"
                    elif p is None and self._known(topic, parent, delivered) \
                            and not self._exempt_cid(topic, parent):
                        why = f"listed at {i}, its parent {parent} missing"
                    else:
                        continue
                    self._report(
                        "causal",
                        topic,
                        cid,
                        replay.invoke.node,
                        f"replay: {why}",
                        (replay.invoke.index, where),
                    )

    def _phantom_after_revocation(self) -> None:
        for (node, topic, cid), seen in self.seen.items():
            pub = self._publish_of(topic, cid)
            if pub is None:
                continue
            revoked = self.revoke_ok.get((topic, pub.publisher))
            if revoked is None or pub.invoke.index < revoked:
                continue
            knew = self.version_seen.get((node, topic, pub.publisher))
            if knew is not None and seen.first.index > knew:
                self._report(
                    "phantom",
                    topic,
                    cid,
                    node,
                    f"published by {pub.publisher} after its revocation (op "
                    f"{revoked}), delivered after node {node} knew it (op {knew})",
                    (revoked, knew, pub.invoke.index, seen.first.index),
                )

    def _partial(self) -> None:
        for pub in self.publishes:
            if pub.outcome != "info" or pub.cid is None or self._exempt(pub):
                continue
            for node, sub in self._eligible(pub):
                if (node, pub.topic, pub.cid) not in self.seen:
                    self._report(
                        "corrupt",
                        pub.topic,
                        pub.cid,
                        node,
                        f"indeterminate publish seen (op {pub.seen_at}) but never "
                        f"delivered at subscriber node {node}",
                        (pub.invoke.index, pub.end_index, pub.seen_at, sub),
                    )

    # --- measures ------------------------------------------------------------------------

    def _converge(self, pairs: list[tuple[int, int, int]]) -> list[float]:
        """Per recovery op: the last arrival, among the nodes running at that op, of the
        events acknowledged before it (a node that is down or paused then is not lagging
        behind the network: its own restart or resume measures its catch-up). A node
        stopped again before it had them all is left out the same way: its next restart
        or resume counts the same events. Values whose wait the next fault did not cut
        into are also kept apart (``uninterrupted``)."""
        by_node: dict[int, tuple[list[int], list[int]]] = {}
        for ok, arrival, node in sorted(pairs):
            acked_at, latest = by_node.setdefault(node, ([], []))
            acked_at.append(ok)
            latest.append(max(arrival, latest[-1]) if latest else arrival)
        values: list[float] = []
        for op in self.recoveries:
            last = -1
            for node, (acked_at, latest) in by_node.items():
                if self._down_at(node, op.index):
                    continue
                k = bisect_left(acked_at, op.index)
                if k and not self._stopped_between(node, op.index, latest[k - 1]):
                    last = max(last, latest[k - 1])
            if last < op.index:
                values.append(0.0)
            elif last == _NEVER:
                values.append(math.inf)
            else:
                values.append(self.history[last].time - op.time)
            following = bisect_right(self.fault_starts, op.index)
            if following == len(self.fault_starts) or last < self.fault_starts[following]:
                self.uninterrupted.append(values[-1])
        return values

    def _stopped_between(self, node: int, start: int, end: int) -> bool:
        """Whether ``node`` was killed or paused after op ``start`` and before op ``end``:
        its lag from then on is its own restart's or resume's to measure, not this op's."""
        return any(start < stop < end for stop, _ in self.stops.get(node, ()))

    def _down_at(self, node: int, index: int) -> bool:
        """Whether ``node`` was killed (not yet restarted) or paused (not yet resumed) at
        op ``index``; the recovery op that ends a stop counts as running."""
        return any(start < index < end for start, end in self.stops.get(node, ()))

    def _latencies(self) -> list[float]:
        out: list[float] = []
        for (_, topic, cid), seen in self.seen.items():
            pub = self.acked.get((topic, cid))
            if pub is not None:
                out.append(seen.first.time - pub.invoke.time)
        return out
