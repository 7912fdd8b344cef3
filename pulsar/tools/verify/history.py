"""The history of a verification run: what every client asked and what it was told.

A history is a JSON-lines file, one :class:`Op` per line, in the order the harness recorded
them. It is the only evidence :mod:`pulsar.tools.verify.checker` looks at: the nodes' own counters
and logs are not evidence, what the clients were told is.

The format is Jepsen's. A client (a **process**: ``"pub-3"``, ``"sub-2"``, ``"nemesis"``,
``"replayer"``) records an ``invoke`` before it sends a request and, when the request ends,
exactly one completion with the same process and ``f``:

- ``ok``: it happened;
- ``fail``: it definitely did not happen (the node refused: 4xx, 503);
- ``info``: nobody knows (timeout, connection reset, node killed mid-request).

A process has at most one request in flight: a client that wants two at once uses two
process names. Things that are observed rather than requested (a delivery read from a
node's log, a fault made by the nemesis, a node seen to know a topic version) are single
ops, recorded with :meth:`HistoryWriter.record`.

Each line is a JSON object with exactly the keys ``index`` (0, 1, 2, ... in file order),
``time`` (seconds since the run started, one monotonic clock, never decreasing along the
file), ``process``, ``type`` (``invoke``/``ok``/``fail``/``info``), ``f`` (the operation),
``node`` (the node index the client talked to, or null), ``topic`` (a topic CID string, or
null) and ``value`` (an object; what it holds depends on ``f``, see the checker). Because
times never decrease along the file, "op A happened before op B" and "A comes before B in
the file" are the same thing; ties in time are broken by file order, which is the order
the harness saw things happen.

:class:`HistoryWriter` flushes every line as it writes it, so a harness that crashes keeps
everything it had recorded; :func:`read_history` checks every line and names the line of
the first thing it cannot accept.
"""

from __future__ import annotations

import gc
import json
import math
import os
import threading
import time as _time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Literal, get_args

__all__ = [
    "FIELDS",
    "HistoryError",
    "HistoryWriter",
    "Op",
    "OpType",
    "read_history",
]

OpType = Literal["invoke", "ok", "fail", "info"]
"""How an op ends a request (or ``invoke``: starts one)."""

_OP_TYPES: frozenset[str] = frozenset(get_args(OpType))

FIELDS: tuple[str, ...] = ("index", "time", "process", "type", "f", "node", "topic", "value")
"""The keys of one line, in the order they are written."""
_FIELD_SET = frozenset(FIELDS)


class HistoryError(ValueError):
    """A history that cannot be read or checked: a malformed line, an op that breaks the
    format's rules (a completion with no invoke, a time going backwards), a value missing
    what its ``f`` requires. A harness bug, never a finding about the system under test."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def _is_int(x: object) -> bool:
    # bool is an int subclass; true/false in JSON are never an index or a node.
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True, slots=True)
class Op:
    """One line of a history. Validated at construction, so a checker can rely on the
    types; ``value`` is checked only for being an object (its keys depend on ``f``)."""

    index: int
    time: float
    process: str
    type: OpType
    f: str
    node: int | None
    topic: str | None
    value: dict[str, Any]

    def __post_init__(self) -> None:
        if not _is_int(self.index) or self.index < 0:
            raise HistoryError(f"index must be an integer >= 0, not {self.index!r}")
        t = self.time
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise HistoryError(f"time must be a finite number, not {t!r}")
        if isinstance(t, int):
            object.__setattr__(self, "time", float(t))
        if not isinstance(self.process, str) or not self.process:
            raise HistoryError(f"process must be a non-empty string, not {self.process!r}")
        if self.type not in _OP_TYPES:
            raise HistoryError(f"type must be one of {sorted(_OP_TYPES)}, not {self.type!r}")
        if not isinstance(self.f, str) or not self.f:
            raise HistoryError(f"f must be a non-empty string, not {self.f!r}")
        if self.node is not None and (not _is_int(self.node) or self.node < 0):
            raise HistoryError(f"node must be an integer >= 0 or null, not {self.node!r}")
        if self.topic is not None and (not isinstance(self.topic, str) or not self.topic):
            raise HistoryError(f"topic must be a non-empty string or null, not {self.topic!r}")
        if not isinstance(self.value, dict):
            raise HistoryError(f"value must be an object, not {self.value!r}")

    def to_json(self) -> str:
        """One line (without the newline). NaN and infinities are refused: not JSON."""
        return json.dumps(
            {
                "index": self.index,
                "time": self.time,
                "process": self.process,
                "type": self.type,
                "f": self.f,
                "node": self.node,
                "topic": self.topic,
                "value": self.value,
            },
            separators=(",", ":"),
            allow_nan=False,
        )

    @classmethod
    def parse(cls, text: str) -> Op:
        """The op one line holds; :class:`HistoryError` says what is wrong otherwise."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"not JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(raw, dict):
            raise HistoryError(f"expected a JSON object, got {type(raw).__name__}")
        if raw.keys() != _FIELD_SET:
            missing = [k for k in FIELDS if k not in raw]
            if missing:
                raise HistoryError(f"missing key(s): {', '.join(missing)}")
            extra = sorted(k for k in raw if k not in _FIELD_SET)
            raise HistoryError(f"unknown key(s): {', '.join(extra)}")
        return cls(**raw)


class HistoryWriter:
    """Appends ops to a new history file, numbering and timestamping them.

    Every line is flushed as soon as it is written: the history must survive the harness
    (a crash, a SIGKILL of the run) up to its last recorded op. Not fsynced: the harness
    crashing is the risk, not the machine. Safe to call from several threads (one lock
    orders index, time and the write, so times never decrease along the file).

    ``clock`` returns seconds on a monotonic clock; the first call is time zero. Tests
    inject a fake one.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = _time.monotonic,
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0
        self._file: IO[str] = open(path, "x", encoding="utf-8")  # noqa: SIM115
        self._start = clock()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def invoke(
        self,
        process: str,
        f: str,
        node: int | None,
        topic: str | None,
        value: dict[str, Any] | None = None,
    ) -> Op:
        """Record that ``process`` is about to ask ``node`` for ``f``."""
        return self.record(process, "invoke", f, node, topic, value)

    def complete(
        self,
        invoke_op: Op,
        type: OpType,
        value: dict[str, Any] | None = None,
        *,
        topic: str | None = None,
    ) -> Op:
        """Record how the request ``invoke_op`` ended; process, f, node and topic are
        copied from it, except ``topic`` when given (a create's ok names the new topic)."""
        if invoke_op.type != "invoke":
            raise ValueError(f"op {invoke_op.index} is not an invoke")
        if type == "invoke":
            raise ValueError("a completion is ok, fail or info")
        return self.record(
            invoke_op.process,
            type,
            invoke_op.f,
            invoke_op.node,
            invoke_op.topic if topic is None else topic,
            value,
        )

    def record(
        self,
        process: str,
        type: OpType,
        f: str,
        node: int | None,
        topic: str | None,
        value: dict[str, Any] | None = None,
    ) -> Op:
        """Record one op now (deliveries, faults, observations use this directly)."""
        with self._lock:
            op = Op(
                index=self._next,
                time=self._clock() - self._start,
                process=process,
                type=type,
                f=f,
                node=node,
                topic=topic,
                value={} if value is None else value,
            )
            line = op.to_json()  # before numbering: an unserialisable value writes nothing
            self._file.write(line + "\n")
            self._file.flush()
            self._next += 1
            return op


@contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a million acyclic objects are built: each
    collection rescans everything built so far, which nearly doubled the time of reading
    or checking a 10^6-op history. Reference counting still frees everything."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_history(path: str | os.PathLike[str], *, allow_torn_tail: bool = False) -> list[Op]:
    """Every op of a history file, checked line by line.

    Raises :class:`HistoryError` (a ``ValueError``) naming ``path:line`` on the first
    line that is not an op, whose index is not its position, or whose time is before the
    previous one. ``allow_torn_tail`` drops a last line that has no newline and does not
    parse: what a harness killed in the middle of a write leaves.
    """
    ops: list[Op] = []
    last_time = 0.0
    with _without_cyclic_gc(), open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            try:
                if not line.strip():
                    raise HistoryError("empty line")
                op = Op.parse(line)
            except HistoryError as exc:
                if allow_torn_tail and not line.endswith("\n"):
                    break
                raise HistoryError(f"{os.fspath(path)}:{lineno}: {exc}", line=lineno) from None
            where = f"{os.fspath(path)}:{lineno}"
            if op.index != len(ops):
                raise HistoryError(
                    f"{where}: index {op.index}, expected {len(ops)} (indices count lines)",
                    line=lineno,
                )
            if op.time < last_time:
                raise HistoryError(
                    f"{where}: time {op.time} is before the previous op's {last_time}",
                    line=lineno,
                )
            last_time = op.time
            ops.append(op)
    return ops
