"""Per-node traces of a testbed run: one JSON object per line, one file per node.

Layout of a run directory (``pulsarcast testbed run`` writes it, ``pulsarcast report``
reads it)::

    RUN_DIR/run.json                       the manifest (see pulsar.tools.testbed.manifest)
    RUN_DIR/<protocol>/node-<index>.jsonl  the records of one node (all its lives: a node
                                           restarted after a crash appends to its file)

``<protocol>`` is ``pulsarcast`` or ``floodsub``. A node killed mid-write may leave a last
line cut short; readers skip lines that are not a whole JSON object.

Every record has ``t`` (wall-clock Unix seconds, float; all processes of a run share the
machine's clock), ``node`` (the node's index in the run) and ``kind``. The other fields,
by kind (absent fields are null):

=============  ================================================================================
``publish``    ``topic``, ``event`` (CIDs as base32 text), ``parent`` (the event's parent link
               or null), ``bytes`` (payload size). Written when the event is signed and on its
               way, by the node that published it.
``send``       an EVENT message sent: ``peer`` (receiver's peer id), ``topic``, ``event``,
               ``hop`` (the hop count in the message), ``bytes`` (frame size), ``msg``
               ("event").
``receive``    the first copy of an event this node took in: ``peer`` (sender), ``topic``,
               ``event``, ``hop``, ``bytes``, ``msg`` ("event" for the tree/flood, "blocks" for
               a backfill answer, "dht" for a fetch from the DHT).
``duplicate``  a later copy of an event already taken in; same fields as ``receive``.
``deliver``    the event handed to the application: ``topic``, ``event``, ``hop`` (hop count
               of the first copy; 0 at its publisher).
``graft``      a GRAFT sent (lazy repair asks a lazy peer for the event): ``peer``, ``topic``,
               ``event`` (the first one asked for), ``bytes``.
``prune``      a PRUNE sent (a redundant eager link demoted to lazy): ``peer``, ``topic``,
               ``bytes``.
``backfill``   a WANT sent for missing ancestors: ``peer``, ``topic``, ``event`` (the event
               whose ancestors are wanted), ``bytes``.
``sample``     resource use, about once a second and at the end: ``cpu_s`` (CPU seconds this
               node's process used so far), ``rss`` (resident memory, bytes), ``sent_bytes`` /
               ``recv_bytes`` (pub-sub transport payload bytes so far, all message types),
               ``dht_sent_bytes`` / ``dht_recv_bytes`` (DHT datagram bytes so far), ``life``
               (0 for the first start, +1 per restart: counters restart from 0 with the
               process), ``sent_by_type`` (pub-sub frame bytes sent so far by message
               type, e.g. ``{"event": ..., "heads": ..., "ihave": ...}``),
               ``dht_sent_by_rpc`` (DHT datagram bytes sent so far by RPC: requests by
               name, answers as ``name+answer``, e.g. ``{"store": ..., "find_node+answer":
               ...}``), ``overlay`` (the membership layer's active neighbours:
               ``{peer: [srtt_ms or null, near]}``, ``near`` true for a proximity slot),
               ``counters`` (the node's protocol and DHT counters so far), ``trees`` (this
               node's tree edges: ``{topic: [[parents], [children]]}``).
=============  ================================================================================

Copies of an event payload, for RMR, are the ``receive`` and ``duplicate`` records; every
message type a protocol sends is counted in the ``sample`` byte totals.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["KINDS", "REPAIR_MSGS", "TraceWriter", "process_resources"]

KINDS = frozenset(
    {"publish", "send", "receive", "duplicate", "deliver", "graft", "prune", "backfill", "sample"}
)

REPAIR_MSGS = ("blocks", "dht")
"""``msg`` of copies taken by repair (a backfill answer, a DHT fetch) rather than by the
tree or flood; a graft's answer is an EVENT message and so counts as "event"."""

_FLUSH_EVERY = 1024
"""Records buffered before a write; a crash loses at most this many (plus the cut line)."""


class TraceWriter:
    """Appends records of one node to its JSON-lines file, buffered.

    ``flush()`` is called by the owner about once a second and at the end; a record is one
    ``write`` of whole lines, so a crash leaves at most one partial line at the end."""

    def __init__(self, path: Path, node: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.node = node
        cut = _ends_mid_line(path)
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        if cut:  # a killed earlier life left half a line: do not glue our first record to it
            self._file.write("\n")
        self._buffer: list[str] = []
        self.records = 0

    def write(self, kind: str, **fields: Any) -> None:
        """Append one record. String fields must be identifiers (CIDs, peer ids, names):
        they are written without JSON escaping, because ``json.dumps`` per record was a
        sixth of a busy node's time; anything else goes through ``json``."""
        parts = [f'{{"t":{time.time()!r},"node":{self.node},"kind":"{kind}"']
        for name, value in fields.items():
            if value is None:
                parts.append(f',"{name}":null')
            elif type(value) is str and value.isalnum():
                parts.append(f',"{name}":"{value}"')
            elif type(value) is int or type(value) is float:
                parts.append(f',"{name}":{value!r}')
            else:
                parts.append(f',"{name}":{json.dumps(value)}')
        parts.append("}")
        self._buffer.append("".join(parts))
        self.records += 1
        # A publish defines what is expected of everyone else: never lose one to a crash.
        if kind == "publish" or len(self._buffer) >= _FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self._file.write("\n".join(self._buffer) + "\n")
            self._buffer.clear()
            self._file.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()


def _ends_mid_line(path: Path) -> bool:
    try:
        with open(path, "rb") as existing:
            existing.seek(0, os.SEEK_END)
            if existing.tell() == 0:
                return False
            existing.seek(-1, os.SEEK_END)
            return existing.read(1) != b"\n"
    except FileNotFoundError:
        return False


def process_resources() -> tuple[float, int]:
    """(CPU seconds used by this process, resident memory in bytes). Linux reads the current
    RSS from /proc; elsewhere the peak RSS stands in for it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    try:
        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = usage.ru_maxrss * 1024
    return cpu, rss
