"""A pure-Python NFQUEUE packet shaper: delay, jitter, reorder, duplicate, corrupt, drop.

Why this exists: the kernels ``pulsarcast verify`` runs on do not always have netem
(``CONFIG_NET_SCH_NETEM``), but every one of them has NFQUEUE, which hands each packet to a
user-space process and waits for its verdict. One ``python -m pulsar.tools.netlab.nfqueue`` process
runs inside a node's network namespace; an nftables rule there sends the node's outgoing
data-network packets to its queue (:mod:`pulsar.tools.netlab.linkfaults` installs the rule).

What happens to each packet (one seeded ``random.Random``, four draws per packet, always in
this order, so a run with the same seed and the same packets replays exactly):

1. ``loss_pct``: the verdict is ``NF_DROP``.
2. ``corrupt_pct``: one byte after the IPv4 header is XOR-ed with a non-zero value and the
   modified packet is accepted (the kernel then sends it with its now wrong UDP/TCP checksum,
   so the receiver's stack usually discards it).
3. ``duplicate_pct``: the packet is accepted and a copy is sent through a raw IP socket whose
   packets carry ``--mark``; the rule lets marked packets pass, so the copy is not queued again.
4. delay: ``reorder_pct`` of the packets are released at once; the others are held until
   ``delay_ms`` plus a uniform draw in ``[-jitter_ms, +jitter_ms]`` (never below zero).
   Packets overtake each other when their draws differ: that is the reordering.

Bounded memory: at most ``--max-held`` packets wait in the heap; beyond that a packet is
accepted at once (counted as ``overflowed``). Fail-open: the queue is configured with
``NFQA_CFG_F_FAIL_OPEN`` (a full kernel queue accepts) and the nftables rule carries
``bypass`` (no process bound: accept), so a dead shaper never black-holes the link. SIGTERM
(or SIGINT) releases every held packet, unbinds, prints the statistics as one JSON line on
standard output and exits 0.

The protocol is spoken directly over an ``AF_NETLINK``/``NETLINK_NETFILTER`` socket with
:mod:`struct` (nfnetlink_queue: ``NFQNL_MSG_CONFIG``, ``NFQNL_MSG_PACKET``,
``NFQNL_MSG_VERDICT``), so no compiled binding is needed. The same module can write the
queueing rule itself (:func:`set_queue_rule`) through nf_tables' xtables compatibility target
``NFQUEUE``, for kernels built without the native nftables ``queue`` expression
(``CONFIG_NFT_QUEUE``), which is the case on the machine this was written on.

The packet policy (:class:`ShaperCore`) does no I/O; :class:`QueueSocket` does the netlink
side and :func:`run` joins the two with ``poll``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from types import FrameType

__all__ = [
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

# --- netlink and nfnetlink constants (linux/netlink.h, linux/netfilter/nfnetlink*.h) -----

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
SO_MARK = 36

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF

NFNL_SUBSYS_QUEUE = 3
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11

NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_PAYLOAD = 10

NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_FAIL_OPEN = 1 << 0

NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_PACKET = 2

NF_DROP = 0
NF_ACCEPT = 1

# nf_tables (linux/netfilter/nf_tables.h) and the xtables NFQUEUE target (xt_NFQUEUE.h).
NFPROTO_IPV4 = 2
NFT_MSG_NEWRULE = 6
NFT_MSG_DELRULE = 8
NFTA_RULE_TABLE = 1
NFTA_RULE_CHAIN = 2
NFTA_RULE_EXPRESSIONS = 4
NFTA_LIST_ELEM = 1
NFTA_EXPR_NAME = 1
NFTA_EXPR_DATA = 2
NFTA_TARGET_NAME = 1
NFTA_TARGET_REV = 2
NFTA_TARGET_INFO = 3
NFQ_FLAG_BYPASS = 0x01

#: The packet mark of reinjected duplicates ("PC"): the rule lets these pass unqueued.
DEFAULT_MARK = 0x5043

_NLMSGHDR = struct.Struct("=IHHII")
_NLATTR = struct.Struct("=HH")
_NFGENMSG_HEAD = struct.Struct("=BB")  # family, version; res_id follows, big-endian
_PACKET_HDR = struct.Struct(">IHB")  # packet_id, hw_protocol, hook
_VERDICT_HDR = struct.Struct(">II")  # verdict, packet id
_CONFIG_CMD = struct.Struct(">BxH")  # command, pad, pf
_CONFIG_PARAMS = struct.Struct(">IB")  # copy_range, copy_mode
_NFQ_INFO_V3 = struct.Struct("=HHHxx")  # queuenum, queues_total, flags; XT_ALIGN(6) = 8

_COPY_RANGE = 0xFFFF
_RECV_SIZE = 1 << 17


# --- the packet policy (no I/O) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShapeSpec:
    """What the shaper does to a link's packets; every percentage is in [0, 100]."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    reorder_pct: float = 0.0
    duplicate_pct: float = 0.0
    corrupt_pct: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms"):
            if not 0.0 <= getattr(self, name) <= 60_000.0:
                raise ValueError(f"{name} must be within [0, 60000] ms")
        for name in ("reorder_pct", "duplicate_pct", "corrupt_pct", "loss_pct"):
            if not 0.0 <= getattr(self, name) <= 100.0:
                raise ValueError(f"{name} must be within [0, 100]")

    def argv(self) -> list[str]:
        """The command-line options of :func:`main` that describe this spec."""
        return [
            f"--delay-ms={self.delay_ms!r}",
            f"--jitter-ms={self.jitter_ms!r}",
            f"--reorder-pct={self.reorder_pct!r}",
            f"--duplicate-pct={self.duplicate_pct!r}",
            f"--corrupt-pct={self.corrupt_pct!r}",
            f"--loss-pct={self.loss_pct!r}",
        ]


@dataclass(frozen=True, slots=True)
class Decision:
    """What happens to one packet: drawn by :func:`decide` before anything is done."""

    drop: bool
    delay_s: float
    corrupt_at: int | None
    corrupt_xor: int
    duplicate: bool


def decide(spec: ShapeSpec, rng: random.Random, packet: bytes) -> Decision:
    """Draw the fate of ``packet`` (an IPv4 packet): four draws from ``rng``, two more for a
    corruption and one more for a jittered delay, so the sequence of decisions depends only
    on the seed and on the sequence of packets."""
    lose = rng.random() * 100.0 < spec.loss_pct
    corrupt = rng.random() * 100.0 < spec.corrupt_pct
    duplicate = rng.random() * 100.0 < spec.duplicate_pct
    hold = rng.random() * 100.0 >= spec.reorder_pct
    corrupt_at: int | None = None
    corrupt_xor = 0
    if corrupt:
        header = (packet[0] & 0x0F) * 4 if packet else 0
        position = rng.random()
        corrupt_xor = rng.randrange(1, 256)
        if len(packet) > header:
            corrupt_at = header + int(position * (len(packet) - header))
    delay_s = 0.0
    if hold and (spec.delay_ms > 0 or spec.jitter_ms > 0):
        jitter = rng.uniform(-spec.jitter_ms, spec.jitter_ms) if spec.jitter_ms else 0.0
        delay_s = max(0.0, spec.delay_ms + jitter) / 1000.0
    return Decision(
        drop=lose,
        delay_s=delay_s,
        corrupt_at=corrupt_at,
        corrupt_xor=corrupt_xor,
        duplicate=duplicate and not lose,
    )


@dataclass(frozen=True, slots=True)
class QueuedPacket:
    """One packet the kernel handed over (``NFQNL_MSG_PACKET``)."""

    packet_id: int
    hw_protocol: int
    hook: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Release:
    """A verdict to send: ``payload`` is the modified packet (None: unchanged) and ``copy``
    a duplicate to reinject after the accept (None: no duplicate)."""

    packet_id: int
    accept: bool
    payload: bytes | None = None
    copy: bytes | None = None


@dataclass(frozen=True, slots=True)
class ShaperStats:
    """Counts over a shaper's life, printed as one JSON line when it stops."""

    received: int = 0
    dropped: int = 0
    corrupted: int = 0
    duplicated: int = 0
    delayed: int = 0
    undelayed: int = 0
    overflowed: int = 0
    max_held: int = 0
    verdict_errors: int = 0

    def to_json(self) -> str:
        return json.dumps({"stats": asdict(self)}, sort_keys=True)

    @classmethod
    def parse(cls, line: str) -> ShaperStats:
        """The inverse of :meth:`to_json`; raises ``ValueError`` on anything else."""
        try:
            fields = json.loads(line)["stats"]
            return cls(**{key: int(value) for key, value in fields.items()})
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise ValueError(f"not a shaper statistics line: {line!r}") from error


@dataclass(slots=True)
class _Counts:
    received: int = 0
    dropped: int = 0
    corrupted: int = 0
    duplicated: int = 0
    delayed: int = 0
    undelayed: int = 0
    overflowed: int = 0
    max_held: int = 0
    verdict_errors: int = 0


@dataclass(slots=True)
class ShaperCore:
    """The shaper's state: packets held in a heap ordered by release time.

    Every entry point takes ``now`` (a ``time.monotonic()`` reading), so tests drive it
    with a fake clock; the caller sends the returned :class:`Release` verdicts."""

    spec: ShapeSpec
    rng: random.Random
    max_held: int = 4096
    _heap: list[tuple[float, int, Release]] = field(default_factory=list)
    _seq: int = 0
    _counts: _Counts = field(default_factory=_Counts)

    def admit(self, packet: QueuedPacket, now: float) -> Release | None:
        """Decide ``packet``'s fate: a release to send now, or None when it is held."""
        counts = self._counts
        counts.received += 1
        decision = decide(self.spec, self.rng, packet.payload)
        if decision.drop:
            counts.dropped += 1
            return Release(packet.packet_id, accept=False)
        payload: bytes | None = None
        if decision.corrupt_at is not None:
            changed = bytearray(packet.payload)
            changed[decision.corrupt_at] ^= decision.corrupt_xor
            payload = bytes(changed)
            counts.corrupted += 1
        copy: bytes | None = None
        if decision.duplicate:
            copy = payload if payload is not None else packet.payload
            counts.duplicated += 1
        release = Release(packet.packet_id, accept=True, payload=payload, copy=copy)
        if decision.delay_s <= 0.0:
            counts.undelayed += 1
            return release
        if len(self._heap) >= self.max_held:
            counts.overflowed += 1
            return release
        counts.delayed += 1
        self._seq += 1
        heapq.heappush(self._heap, (now + decision.delay_s, self._seq, release))
        counts.max_held = max(counts.max_held, len(self._heap))
        return None

    def due(self, now: float) -> list[Release]:
        """The held packets whose release time has come, in release order."""
        out: list[Release] = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def next_release(self) -> float | None:
        """When the next held packet is due (None: nothing is held)."""
        return self._heap[0][0] if self._heap else None

    def drain(self) -> list[Release]:
        """Every held packet, in release order: what a stopping shaper sends at once."""
        out = [entry[2] for entry in sorted(self._heap)]
        self._heap.clear()
        return out

    def held(self) -> int:
        return len(self._heap)

    def note_verdict_error(self) -> None:
        self._counts.verdict_errors += 1

    def stats(self) -> ShaperStats:
        return ShaperStats(**{name: getattr(self._counts, name) for name in _Counts.__slots__})


# --- netlink encoding --------------------------------------------------------------------


def _attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _nested(kind: int, *attrs: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, b"".join(attrs))


def _message(
    msg_type: int, flags: int, seq: int, family: int, res_id: int, body: bytes = b""
) -> bytes:
    payload = _NFGENMSG_HEAD.pack(family, 0) + struct.pack(">H", res_id) + body
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), msg_type, flags, seq, 0) + payload


def _messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload) of every netlink message in one datagram."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, msg_type, flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            return
        yield msg_type, flags, seq, data[offset + _NLMSGHDR.size : offset + length]
        offset += (length + 3) & ~3


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    offset = 0
    while offset + _NLATTR.size <= len(data):
        length, kind = _NLATTR.unpack_from(data, offset)
        if length < _NLATTR.size or offset + length > len(data):
            break
        out[kind & NLA_TYPE_MASK] = data[offset + _NLATTR.size : offset + length]
        offset += (length + 3) & ~3
    return out


def _error_code(payload: bytes) -> int:
    """The (positive) errno of an ``NLMSG_ERROR`` payload; 0 is an acknowledgement."""
    return -struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else errno.EPROTO


def _netfilter_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    return sock


def _await_acks(sock: socket.socket, seqs: set[int], timeout: float) -> list[bytes]:
    """Read until every message in ``seqs`` is acknowledged; raise ``OSError`` on the first
    error. Returns the other datagrams read meanwhile (queued packets, for the caller)."""
    others: list[bytes] = []
    deadline = time.monotonic() + timeout
    pending = set(seqs)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
            raise TimeoutError(f"no netlink acknowledgement for messages {sorted(pending)}")
        data = sock.recv(_RECV_SIZE)
        unrelated = True
        for msg_type, _flags, seq, payload in _messages(data):
            if msg_type == NLMSG_ERROR and seq in pending:
                unrelated = False
                code = _error_code(payload)
                if code:
                    raise OSError(code, f"netlink request {seq}: {os.strerror(code)}")
                pending.discard(seq)
        if unrelated:
            others.append(data)
    return others


# --- the queue -----------------------------------------------------------------------------


class QueueSocket:
    """A netlink socket bound to one NFQUEUE number in the calling process's namespace."""

    def __init__(self, queue: int, *, maxlen: int = 8192) -> None:
        if not 0 <= queue <= 0xFFFF:
            raise ValueError("queue number must be within [0, 65535]")
        self.queue = queue
        self._seq = 0
        self._sock = _netfilter_socket()
        self._backlog: list[bytes] = []
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
            self._sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
            self._config(_attr(NFQA_CFG_CMD, _CONFIG_CMD.pack(NFQNL_CFG_CMD_BIND, 0)))
            flags = struct.pack(">I", NFQA_CFG_F_FAIL_OPEN)
            self._config(
                _attr(NFQA_CFG_PARAMS, _CONFIG_PARAMS.pack(_COPY_RANGE, NFQNL_COPY_PACKET)),
                _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen)),
                _attr(NFQA_CFG_MASK, flags),
                _attr(NFQA_CFG_FLAGS, flags),
            )
        except BaseException:
            self._sock.close()
            raise

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    def _config(self, *attrs: bytes) -> None:
        seq = self._next_seq()
        msg_type = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG
        flags = NLM_F_REQUEST | NLM_F_ACK
        self._sock.send(
            _message(msg_type, flags, seq, socket.AF_UNSPEC, self.queue, b"".join(attrs))
        )
        self._backlog.extend(_await_acks(self._sock, {seq}, timeout=5.0))

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self) -> tuple[list[QueuedPacket], int]:
        """Every packet readable now without blocking, and the number of error messages
        (answers to verdicts the kernel refused) read along the way."""
        packets: list[QueuedPacket] = []
        errors = 0
        datagrams, self._backlog = self._backlog, []
        for _ in range(256):
            try:
                datagrams.append(self._sock.recv(_RECV_SIZE, socket.MSG_DONTWAIT))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                if error.errno == errno.ENOBUFS:
                    continue
                raise
        packet_type = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
        for data in datagrams:
            for msg_type, _flags, _seq, payload in _messages(data):
                if msg_type == NLMSG_ERROR:
                    errors += _error_code(payload) != 0
                    continue
                if msg_type != packet_type or len(payload) < 4:
                    continue
                attrs = _attrs(payload[4:])
                header = attrs.get(NFQA_PACKET_HDR)
                if header is None or len(header) < _PACKET_HDR.size:
                    continue
                packet_id, hw_protocol, hook = _PACKET_HDR.unpack_from(header)
                packets.append(
                    QueuedPacket(packet_id, hw_protocol, hook, bytes(attrs.get(NFQA_PAYLOAD, b"")))
                )
        return packets, errors

    def verdict(self, packet_id: int, accept: bool, payload: bytes | None = None) -> None:
        """Send a verdict; with ``payload``, the packet is replaced by those bytes."""
        body = _attr(
            NFQA_VERDICT_HDR, _VERDICT_HDR.pack(NF_ACCEPT if accept else NF_DROP, packet_id)
        )
        if payload is not None:
            body += _attr(NFQA_PAYLOAD, payload)
        msg_type = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT
        message = _message(
            msg_type, NLM_F_REQUEST, self._next_seq(), socket.AF_UNSPEC, self.queue, body
        )
        self._sock.send(message)

    def close(self) -> None:
        """Unbind (best effort: closing the socket unbinds too) and close."""
        if self._sock.fileno() < 0:
            return
        msg_type = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG
        attr = _attr(NFQA_CFG_CMD, _CONFIG_CMD.pack(NFQNL_CFG_CMD_UNBIND, 0))
        with contextlib.suppress(OSError):
            self._sock.send(
                _message(
                    msg_type, NLM_F_REQUEST, self._next_seq(), socket.AF_UNSPEC, self.queue, attr
                )
            )
        self._sock.close()


# --- the queueing rule (nf_tables with the xtables NFQUEUE target) ---------------------------


def set_queue_rule(
    sock: socket.socket, table: str, chain: str, queue: int | None, *, bypass: bool = True
) -> None:
    """Flush ``chain`` of the IPv4 nftables ``table`` and, unless ``queue`` is None, append
    one rule sending every packet to that queue, in one atomic nf_tables transaction.

    ``sock`` is a ``NETLINK_NETFILTER`` socket opened in the namespace to change. Uses the
    xtables ``NFQUEUE`` target (revision 3) through nft_compat, because the native
    ``queue`` expression may be missing; ``nft list ruleset`` shows it as
    ``xt target "NFQUEUE"``."""
    seq = int(time.monotonic() * 1000) & 0x7FFFFFFF
    names = _attr(NFTA_RULE_TABLE, table.encode() + b"\0") + _attr(
        NFTA_RULE_CHAIN, chain.encode() + b"\0"
    )
    nft = NFNL_SUBSYS_NFTABLES << 8
    ack = NLM_F_REQUEST | NLM_F_ACK
    parts = [
        _message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, socket.AF_UNSPEC, NFNL_SUBSYS_NFTABLES)
    ]
    parts.append(_message(nft | NFT_MSG_DELRULE, ack, seq + 1, NFPROTO_IPV4, 0, names))
    acked = {seq + 1}
    if queue is not None:
        info = _NFQ_INFO_V3.pack(queue, 1, NFQ_FLAG_BYPASS if bypass else 0)
        target = _nested(
            NFTA_EXPR_DATA,
            _attr(NFTA_TARGET_NAME, b"NFQUEUE\0"),
            _attr(NFTA_TARGET_REV, struct.pack(">I", 3)),
            _attr(NFTA_TARGET_INFO, info),
        )
        expression = _nested(NFTA_LIST_ELEM, _attr(NFTA_EXPR_NAME, b"target\0"), target)
        body = names + _nested(NFTA_RULE_EXPRESSIONS, expression)
        flags = ack | NLM_F_CREATE | NLM_F_APPEND
        parts.append(_message(nft | NFT_MSG_NEWRULE, flags, seq + 2, NFPROTO_IPV4, 0, body))
        acked.add(seq + 2)
    parts.append(
        _message(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            seq + len(parts),
            socket.AF_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
        )
    )
    sock.send(b"".join(parts))
    _await_acks(sock, acked, timeout=5.0)


# --- the process ---------------------------------------------------------------------------


def _send_release(
    queue: QueueSocket, raw: socket.socket, release: Release, core: ShaperCore
) -> None:
    try:
        queue.verdict(release.packet_id, release.accept, release.payload)
    except OSError:
        core.note_verdict_error()
        return
    if release.copy is not None and len(release.copy) >= 20:
        destination = socket.inet_ntoa(release.copy[16:20])
        try:
            raw.sendto(release.copy, (destination, 0))
        except OSError:
            core.note_verdict_error()


def run(
    queue_number: int,
    spec: ShapeSpec,
    *,
    seed: int,
    max_held: int = 4096,
    mark: int = DEFAULT_MARK,
) -> ShaperStats:
    """Shape the packets of ``queue_number`` until SIGTERM or SIGINT; returns the counts.

    Prints ``ready`` (one line, flushed) once the queue is bound, so the parent installs
    the rule only when someone listens (until then, ``bypass`` lets packets through)."""
    core = ShaperCore(spec, random.Random(seed), max_held=max_held)
    stop_r, stop_w = socket.socketpair()
    stop_r.setblocking(False)
    stop_w.setblocking(False)
    stopping = False

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous_fd = signal.set_wakeup_fd(stop_w.fileno(), warn_on_full_buffer=False)
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    queue: QueueSocket | None = None
    try:
        raw.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
        queue = QueueSocket(queue_number, maxlen=max_held + 4096)
        print("ready", flush=True)
        poller = select.poll()
        poller.register(queue.fileno(), select.POLLIN)
        poller.register(stop_r.fileno(), select.POLLIN)
        while not stopping:
            wake = core.next_release()
            timeout_ms = (
                -1 if wake is None else max(0, int((wake - time.monotonic()) * 1000 + 0.999))
            )
            poller.poll(timeout_ms)
            packets, errors = queue.receive()
            for _ in range(errors):
                core.note_verdict_error()
            for packet in packets:
                release = core.admit(packet, time.monotonic())
                if release is not None:
                    _send_release(queue, raw, release, core)
            for release in core.due(time.monotonic()):
                _send_release(queue, raw, release, core)
        for release in core.drain():
            _send_release(queue, raw, release, core)
    finally:
        if queue is not None:
            queue.close()
        raw.close()
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_r.close()
        stop_w.close()
    return core.stats()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pulsar.tools.netlab.nfqueue --queue N [--delay-ms ...]``: see the module doc."""
    parser = argparse.ArgumentParser(
        prog="python -m pulsar.tools.netlab.nfqueue",
        description="Shape the packets of one NFQUEUE (delay, jitter, reorder, duplicate, "
        "corrupt, loss). Prints 'ready' once bound, and its counts as JSON on exit.",
    )
    parser.add_argument("--queue", type=int, required=True, help="NFQUEUE number to bind")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--reorder-pct", type=float, default=0.0, help="share sent without delay")
    parser.add_argument("--duplicate-pct", type=float, default=0.0)
    parser.add_argument("--corrupt-pct", type=float, default=0.0)
    parser.add_argument("--loss-pct", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-held", type=int, default=4096, help="beyond this, accept at once")
    parser.add_argument("--mark", type=lambda text: int(text, 0), default=DEFAULT_MARK)
    args = parser.parse_args(argv)
    try:
        spec = ShapeSpec(
            delay_ms=args.delay_ms,
            jitter_ms=args.jitter_ms,
            reorder_pct=args.reorder_pct,
            duplicate_pct=args.duplicate_pct,
            corrupt_pct=args.corrupt_pct,
            loss_pct=args.loss_pct,
        )
    except ValueError as error:
        parser.error(str(error))
    if args.max_held < 0:
        parser.error("--max-held must not be negative")
    try:
        stats = run(args.queue, spec, seed=args.seed, max_held=args.max_held, mark=args.mark)
    except OSError as error:
        print(f"nfqueue: {error}", file=sys.stderr)
        return 1
    print(stats.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
