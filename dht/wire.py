"""The ``rpcudp`` datagram format, parsed defensively.

Every datagram is ``type (1 byte) | message id (20 bytes) | msgpack body``; type 0 is a
request whose body is ``[name, [args...]]``, type 1 a response whose body is the handler's
return value. This is byte-for-byte what ``rpcudp`` sends, so stock ``kademlia`` nodes and
ours talk to each other.

``rpcudp`` itself trusts its input: a body that is not msgpack, a request with the wrong
arity or argument types, or a FIND_NODE answer full of garbage raises inside a task or
crashes a handler. Here every request is checked against a table of RPC signatures and every
response against the shape its caller expects before anything else sees it; whatever does not
fit raises :class:`MalformedDatagram`, which the protocol counts, logs (throttled) and drops.

Pure functions only: no sockets, no clocks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import umsgpack

from .keys import KEY_SIZE, MAX_RPC_SIZE

__all__ = [
    "MAX_HOLDS_KEYS",
    "MAX_NODES_IN_RESPONSE",
    "MAX_REQUEST_DATAGRAM",
    "MAX_RESPONSE_DATAGRAM",
    "MSG_ID_SIZE",
    "FoundValue",
    "MalformedDatagram",
    "NodeTriple",
    "Request",
    "Response",
    "decode_datagram",
    "encode_request",
    "encode_response",
    "holds_bitmap",
    "parse_find_node",
    "parse_find_value",
    "parse_holds",
    "parse_ping",
    "parse_store",
    "parse_store_batch",
]

REQUEST: Final = b"\x00"
RESPONSE: Final = b"\x01"
MSG_ID_SIZE: Final = 20

MAX_REQUEST_DATAGRAM: Final = 1 + MSG_ID_SIZE + MAX_RPC_SIZE
"""No honest peer sends a bigger request: ``rpcudp`` refuses to."""
MAX_RESPONSE_DATAGRAM: Final = 16 * 1024
"""Responses are not size-checked by ``rpcudp``; the largest honest ones are a FIND_VALUE
hit (one block, < 8.2 KiB) and a FIND_NODE answer (k contacts, ~1.5 KiB for k=20)."""
MAX_NODES_IN_RESPONSE: Final = 64
"""Contacts we take from one FIND_NODE/FIND_VALUE answer; honest peers send k."""

MAX_HOLDS_KEYS: Final = 256
"""Keys one HOLDS request may name (22 bytes each on the wire: 5.7 KiB, under one RPC)."""

NodeTriple = tuple[bytes, str, int]
"""A contact as it travels on the wire: ``(node id, ip, port)``."""


class MalformedDatagram(ValueError):
    """A datagram, request or response that does not have the shape the protocol expects."""


@dataclass(frozen=True, slots=True)
class Request:
    msg_id: bytes
    name: str
    args: tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Response:
    msg_id: bytes
    data: object


@dataclass(frozen=True, slots=True)
class FoundValue:
    """A FIND_VALUE answer that carries a value (still unverified)."""

    value: bytes


def _node_id(value: object) -> bytes:
    if not isinstance(value, bytes) or len(value) != KEY_SIZE:
        raise MalformedDatagram("expected a 20-byte node id or key")
    return value


def _anything(value: object) -> object:
    return value


def _count(value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_NODES_IN_RESPONSE:
        raise MalformedDatagram(f"expected a count of contacts in 1..{MAX_NODES_IN_RESPONSE}")
    return value


def _batch_items(value: object) -> list[tuple[bytes, object]]:
    if not isinstance(value, list):
        raise MalformedDatagram("store_batch items must be a list")
    items: list[tuple[bytes, object]] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise MalformedDatagram("store_batch item must be [key, value]")
        items.append((_node_id(item[0]), item[1]))
    return items


def _keys(value: object) -> list[bytes]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_HOLDS_KEYS:
        raise MalformedDatagram(f"holds takes a list of 1..{MAX_HOLDS_KEYS} keys")
    return [_node_id(key) for key in value]


# name -> one checker per positional argument (after the sender's address)
_SIGNATURES: Final[dict[str, tuple[Callable[[object], object], ...]]] = {
    "ping": (_node_id,),
    "stun": (),
    "store": (_node_id, _node_id, _anything),  # the handler verifies the value itself
    "find_node": (_node_id, _node_id),
    "find_near": (_node_id, _node_id, _count),
    "find_value": (_node_id, _node_id),
    "find_value_near": (_node_id, _node_id, _count),
    "store_batch": (_node_id, _batch_items),
    # ours: which of these keys do you hold as records? A bitmap back (``holds_bitmap``).
    "holds": (_node_id, _keys),
}


# -- STORE_BATCH fast path --------------------------------------------------------------
#
# STORE_BATCH is the one hot message (several 1-8 KiB values per datagram, thousands per
# second during a pipelined put), and pure-Python ``umsgpack`` spends ~90 us packing and
# ~80 us unpacking one. Its layout is fixed, so we write it directly and read it back with a
# strict parser of exactly that layout. The bytes are what ``umsgpack.packb`` produces for
# ``["store_batch", [node_id, [[key, value], ...]]]`` (a test pins that); any datagram that
# deviates from the layout in any way is handed to ``umsgpack`` as usual.

_BATCH_PREFIX: Final = umsgpack.packb(["store_batch", [b"\0" * KEY_SIZE, []]])[: -KEY_SIZE - 1]
_ITEM_PREFIX: Final = b"\x92\xc4\x14"  # fixarray(2), bin8 of 20 bytes


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + n.to_bytes(2, "big")  # < 65536 items: far beyond one datagram


def _bin_header(n: int) -> bytes:
    if n < 256:
        return b"\xc4" + bytes([n])
    if n < 65536:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _encode_store_batch(node_id: bytes, items: Sequence[Sequence[bytes]]) -> bytes:
    parts = [_BATCH_PREFIX, node_id, _array_header(len(items))]
    for key, value in items:
        parts += (_ITEM_PREFIX, key, _bin_header(len(value)), value)
    return b"".join(parts)


def _decode_store_batch(body: bytes) -> tuple[object, ...] | None:
    """The args of a canonical STORE_BATCH body, or None to fall back to ``umsgpack``."""
    if not body.startswith(_BATCH_PREFIX):
        return None
    pos = len(_BATCH_PREFIX)
    node_id = body[pos : pos + KEY_SIZE]
    pos += KEY_SIZE
    if len(body) <= pos:
        return None
    head = body[pos]
    if 0x90 <= head <= 0x9F:
        count, pos = head & 0x0F, pos + 1
    elif head == 0xDC:
        count, pos = int.from_bytes(body[pos + 1 : pos + 3], "big"), pos + 3
    else:
        return None
    items: list[tuple[bytes, object]] = []
    for _ in range(count):
        if body[pos : pos + 3] != _ITEM_PREFIX:
            return None
        key = body[pos + 3 : pos + 3 + KEY_SIZE]
        pos += 3 + KEY_SIZE
        kind = body[pos : pos + 1]
        if kind == b"\xc4" and pos + 2 <= len(body):
            size, pos = body[pos + 1], pos + 2
        elif kind == b"\xc5" and pos + 3 <= len(body):
            size, pos = int.from_bytes(body[pos + 1 : pos + 3], "big"), pos + 3
        else:
            return None
        value = body[pos : pos + size]
        if len(value) != size or len(key) != KEY_SIZE:
            return None
        pos += size
        items.append((key, value))
    if pos != len(body) or len(node_id) != KEY_SIZE:
        return None
    return node_id, items


def decode_datagram(data: bytes) -> Request | Response:
    """Split and decode one datagram. Requests come back with checked, converted args."""
    if len(data) < 1 + MSG_ID_SIZE + 1:
        raise MalformedDatagram(f"datagram of {len(data)} bytes is too small")
    kind, msg_id = data[:1], data[1 : 1 + MSG_ID_SIZE]
    if kind == REQUEST:
        if len(data) > MAX_REQUEST_DATAGRAM:
            raise MalformedDatagram(f"request of {len(data)} bytes is oversized")
    elif kind == RESPONSE:
        if len(data) > MAX_RESPONSE_DATAGRAM:
            raise MalformedDatagram(f"response of {len(data)} bytes is oversized")
    else:
        raise MalformedDatagram(f"unknown datagram type {kind!r}")
    if kind == REQUEST:
        fast = _decode_store_batch(data[1 + MSG_ID_SIZE :])
        if fast is not None:
            return Request(msg_id, "store_batch", fast)
    else:
        flags = _decode_flags(data[1 + MSG_ID_SIZE :])
        if flags is not None:
            return Response(msg_id, flags)
    try:
        body = umsgpack.unpackb(data[1 + MSG_ID_SIZE :])
    except Exception as exc:  # umsgpack raises many types, RecursionError included
        raise MalformedDatagram(f"body is not msgpack: {type(exc).__name__}") from None
    if kind == RESPONSE:
        return Response(msg_id, body)
    if not isinstance(body, list) or len(body) != 2:
        raise MalformedDatagram("request body must be [name, args]")
    name, args = body
    if not isinstance(name, str):
        raise MalformedDatagram("RPC name must be a string")
    signature = _SIGNATURES.get(name)
    if signature is None:
        raise MalformedDatagram(f"unknown RPC {name[:40]!r}")
    if not isinstance(args, list) or len(args) != len(signature):
        raise MalformedDatagram(f"RPC {name} takes {len(signature)} arguments")
    return Request(msg_id, name, tuple(check(arg) for check, arg in zip(signature, args,
                                                                          strict=True)))


def encode_request(msg_id: bytes, name: str, args: Sequence[object]) -> bytes:
    """The datagram for a request; raises :class:`ValueError` beyond ``rpcudp``'s limit."""
    if name == "store_batch":
        node_id, items = args
        # PulsarProtocol.store_batch is the only caller: (bytes, [[key, value], ...])
        body = _encode_store_batch(node_id, items)  # type: ignore[arg-type]
    else:
        body = umsgpack.packb([name, list(args)])
    if len(body) > MAX_RPC_SIZE:
        raise ValueError(f"RPC {name} is {len(body)} bytes, over the {MAX_RPC_SIZE} limit")
    return REQUEST + msg_id + body


_FLAG = {True: b"\xc3", False: b"\xc2"}


def encode_response(msg_id: bytes, data: object) -> bytes:
    if type(data) is list and len(data) < 16 and all(type(f) is bool for f in data):
        # a STORE_BATCH answer, the other hot message: a fixarray of booleans
        return RESPONSE + msg_id + bytes([0x90 | len(data)]) + b"".join(_FLAG[f] for f in data)
    body: bytes = umsgpack.packb(data)
    return RESPONSE + msg_id + body


def _decode_flags(body: bytes) -> list[bool] | None:
    """A fixarray of booleans (a STORE_BATCH answer), or None for anything else."""
    if not body or not 0x91 <= body[0] <= 0x9F or len(body) != 1 + (body[0] & 0x0F):
        return None
    flags = body[1:]
    if flags.strip(b"\xc2\xc3"):
        return None
    return [f == 0xC3 for f in flags]


def _node_triple(item: object) -> NodeTriple | None:
    if not isinstance(item, list) or len(item) != 3:
        return None
    node_id, host, port = item
    if not isinstance(node_id, bytes) or len(node_id) != KEY_SIZE:
        return None
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        return None
    if not 0 < port < 65536:
        return None
    try:
        # Only literal IPs: a hostname would make sendto() resolve it, blocking the loop.
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return node_id, host, port


def parse_find_node(data: object) -> list[NodeTriple]:
    """Contacts from a FIND_NODE answer; malformed entries are skipped, a malformed answer
    raises."""
    if not isinstance(data, list):
        raise MalformedDatagram("FIND_NODE answer must be a list of contacts")
    triples = (_node_triple(item) for item in data[:MAX_NODES_IN_RESPONSE])
    return [t for t in triples if t is not None]


def parse_find_value(data: object) -> FoundValue | list[NodeTriple]:
    """A FIND_VALUE answer: either ``{"value": bytes}`` or a FIND_NODE-style contact list."""
    if isinstance(data, dict):
        value = data.get("value")
        if len(data) != 1 or not isinstance(value, bytes):
            raise MalformedDatagram("FIND_VALUE hit must be {'value': bytes}")
        return FoundValue(value)
    return parse_find_node(data)


def holds_bitmap(flags: Sequence[bool]) -> bytes:
    """A HOLDS answer: bit ``i % 8`` of byte ``i // 8`` (least significant first) says
    whether the ``i``-th key asked is held. 32 bytes for 256 keys."""
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def parse_holds(data: object, count: int) -> list[bool]:
    """The flags of a HOLDS answer about ``count`` keys (see :func:`holds_bitmap`)."""
    if not isinstance(data, bytes) or len(data) != (count + 7) // 8:
        raise MalformedDatagram(f"holds answer must be a bitmap of {count} bits")
    return [bool(data[i >> 3] >> (i & 7) & 1) for i in range(count)]


def parse_ping(data: object) -> bytes:
    return _node_id(data)


def parse_store(data: object) -> bool:
    return data is True


def parse_store_batch(data: object, count: int) -> list[bool]:
    if not isinstance(data, list) or len(data) != count:
        raise MalformedDatagram("store_batch answer must be one flag per item")
    return [flag is True for flag in data]
