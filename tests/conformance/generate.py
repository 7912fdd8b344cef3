"""Writes the wire conformance vectors of docs/protocol.md section 10.

    python -m tests.conformance.generate            rewrite messages.json, noise.json, dht.json
    python -m tests.conformance.generate --check    exit 1 if a file differs from what the
                                                    code produces now

Everything is deterministic: Ed25519 identities from fixed seeds, X25519 static and
ephemeral keys from fixed bytes, fixed timestamps, fixed DHT message ids (the node's own
random ones are pinned while a vector is recorded). Ed25519 signatures are deterministic,
so the same code always writes the same bytes.

Readable forms. Pub-sub messages and handshake payloads are DAG-CBOR; their decoded fields
are written in the DAG-JSON style: a link is ``{"/": "<CID, base32>"}``, a byte string is
``{"/": {"bytes": "<base64, no padding>"}}``, everything else is plain JSON. DHT datagrams
are msgpack; there a byte string is ``{"bin": "<hex>"}`` and a map ``{"map": {...}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from unittest import mock

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from kademlia.node import Node

from dag import CID, EventDescriptor, Identity, PublishRule, TopicDescriptor, cid_of_raw
from dag.chunks import split
from dag.records import HeadsRecord
from dag.store import BlockStore
from dht import DhtConfig, DhtStats, PeerBook, dht_key
from dht.protocol import PulsarProtocol
from dht.storage import RecordStorage
from dht.wire import Request, decode_datagram, encode_request, encode_response
from pulsar.net.framing import encode_data
from pulsar.net.handshake import PROLOGUE, Handshake, StaticKey
from pulsar.net.noise import PROTOCOL_NAME
from pulsar.net.secure import seal
from pulsar.proto.batch.messages import Batch
from pulsar.proto.codec import Frame, encode_message
from pulsar.proto.flood.messages import Subs
from pulsar.proto.fragments.messages import Fragment, FWant, IDontWant
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.groups.messages import GroupBeat
from pulsar.proto.membership.messages import (
    Disconnect,
    ForwardJoin,
    HvJoin,
    Interests,
    Neighbor,
    NeighborReply,
    ViewShuffle,
    ViewShuffleReply,
)
from pulsar.proto.reconcile.items import INFINITY, fingerprint_of
from pulsar.proto.reconcile.messages import Fingerprint, IdList, RBlocks, Recon, RWant
from pulsar.proto.repair.messages import Blocks, Heads, HeadsDigest, Joined, Want, heads_digest
from pulsar.proto.tree.messages import Event, Join, Leave, Ping, Pong, RequestToPublish

__all__ = [
    "FILES",
    "HERE",
    "build_all",
    "dht_vectors",
    "dump",
    "from_msgpack_readable",
    "main",
    "message_vectors",
    "msgpack_readable",
    "noise_vector",
    "readable",
    "replay_dht",
    "world",
]

HERE: Final = Path(__file__).resolve().parent
FILES: Final = ("messages.json", "noise.json", "dht.json")

T0: Final = 1767225600.0
"""2026-01-01T00:00:00.000Z: every timestamp is T0 plus a few seconds."""


# --------------------------------------------------------------------------- readable forms


def readable(value: Any) -> Any:
    """A decoded DAG-CBOR value in DAG-JSON style (links and bytes tagged, see above)."""
    if isinstance(value, CID):
        return {"/": str(value)}
    if isinstance(value, bytes):
        return {"/": {"bytes": base64.b64encode(value).decode().rstrip("=")}}
    if isinstance(value, dict):
        return {key: readable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [readable(item) for item in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    raise TypeError(f"no readable form for {type(value).__name__}")


def msgpack_readable(value: Any) -> Any:
    """A decoded msgpack value: bytes as ``{"bin": hex}``, maps as ``{"map": {...}}``."""
    if isinstance(value, bytes):
        return {"bin": value.hex()}
    if isinstance(value, dict):
        return {"map": {str(key): msgpack_readable(item) for key, item in value.items()}}
    if isinstance(value, list | tuple):
        return [msgpack_readable(item) for item in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    raise TypeError(f"no readable form for {type(value).__name__}")


def from_msgpack_readable(value: Any) -> Any:
    """The inverse of :func:`msgpack_readable` (maps come back as dicts, arrays as lists)."""
    if isinstance(value, dict):
        if set(value) == {"bin"}:
            return bytes.fromhex(value["bin"])
        if set(value) == {"map"}:
            return {key: from_msgpack_readable(item) for key, item in value["map"].items()}
        raise ValueError(f"not a readable msgpack value: {value!r}")
    if isinstance(value, list):
        return [from_msgpack_readable(item) for item in value]
    return value


def _identity_entry(identity: Identity, seed: bytes) -> dict[str, str]:
    return {
        "seed": seed.hex(),
        "peer_id": str(identity.peer_id),
        "peer_id_hex": identity.peer_id.raw.hex(),
        "kademlia_id": identity.peer_id.kademlia_id().hex(),
    }


def _block_entry(cid: CID, block: bytes) -> dict[str, str]:
    return {"cid": str(cid), "hex": block.hex()}


# --------------------------------------------------------------------------- the world


def _seed(n: int) -> bytes:
    return bytes([n]) * 32


@dataclass(frozen=True)
class World:
    """The identities, descriptors and blocks every vector is made of."""

    seeds: dict[str, bytes]
    ids: dict[str, Identity]
    meta: TopicDescriptor
    topic: TopicDescriptor
    e1: EventDescriptor
    e2: EventDescriptor
    big: EventDescriptor
    big_payload_size: int
    big_blocks: tuple[tuple[CID, bytes], ...]
    """The large event's chunk tree, root last (as ``dag.chunks.split`` returns it)."""
    record: HeadsRecord
    """The author's heads record of the topic."""


def world() -> World:
    seeds = {"author": _seed(1), "subscriber": _seed(2), "requester": _seed(3),
             "peer4": _seed(4), "peer5": _seed(5), "dht_node": _seed(13)}
    ids = {name: Identity.from_seed(seed) for name, seed in seeds.items()}
    author = ids["author"]
    meta = TopicDescriptor.create(author, "conformance/meta",
                                  allowed_publishers=PublishRule(True, ()), now=T0)
    topic = TopicDescriptor.create(author, "conformance", meta=meta.cid,
                                   request_to_publish=True, now=T0)
    e1 = EventDescriptor.create(author, topic.cid, b"hello", now=T0 + 1)
    e2 = EventDescriptor.create(author, topic.cid, b'{"n": 2}', parent=e1.cid,
                                content_type="application/json", now=T0 + 2)
    payload = b"pulsarcast conformance vector " * 500  # 15,000 bytes: three leaves
    root, blocks = split(payload)
    big = EventDescriptor.create(author, topic.cid, root, parent=e2.cid, now=T0 + 3)
    record = HeadsRecord.create(author, topic.cid, 1, topic.cid, (big.cid,), now=T0 + 10)
    return World(seeds, ids, meta, topic, e1, e2, big, len(payload), tuple(blocks), record)


# --------------------------------------------------------------------------- messages


def _messages(w: World) -> list[tuple[str, Frame]]:
    t = w.topic.cid
    a, b, c = (w.ids[n].peer_id for n in ("author", "subscriber", "requester"))
    e1, e2, big = w.e1.cid, w.e2.cid, w.big.cid
    root_cid, root_block = w.big_blocks[-1]
    leaves = tuple(cid for cid, _ in w.big_blocks[:-1])
    created, sig = EventDescriptor.sign_content(w.ids["requester"], t, b"please publish",
                                                now=T0 + 4)
    created2, sig2 = EventDescriptor.sign_content(
        w.ids["requester"], t, root_cid, content_type="application/octet-stream", now=T0 + 5)
    created3, sig3 = EventDescriptor.sign_content(w.ids["requester"], t, b"v2", key="user/42",
                                                  now=T0 + 6)
    return [
        ("join", Join(t, w.topic.block)),
        ("leave", Leave(t)),
        ("event", Event(t, w.e1.block, 1)),
        ("event, large (frags and also)", Event(t, w.big.block, 2, True, (c,))),
        ("rtp, inline payload", RequestToPublish(t, t, c, b"please publish", created, sig)),
        ("rtp, chunk-tree payload, media type, CUSTOM parent",
         RequestToPublish(t, t, c, root_cid, created2, sig2, e2, "application/octet-stream")),
        ("rtp, with the event's key", RequestToPublish(t, t, c, b"v2", created3, sig3, None, None,
                                                       "user/42")),
        ("ping", Ping(7)),
        ("pong", Pong(7)),
        ("ihave", IHave(t, ((e1, 1), (e2, 2)))),
        ("graft", Graft(t, e1)),
        ("graft, no event", Graft(t, None)),
        ("prune", Prune(t)),
        ("shuffle", Shuffle(t, (b, c), False)),
        ("hvjoin", HvJoin()),
        ("fwdjoin", ForwardJoin(c, 6)),
        ("neighbor", Neighbor(True)),
        ("neighbor_reply", NeighborReply(True)),
        ("disconnect", Disconnect(True)),
        ("vshuffle", ViewShuffle(a, 3, (b, c))),
        ("vshuffle_reply", ViewShuffleReply((b,))),
        ("interests", Interests((t, w.meta.cid))),
        ("want", Want(t, e2, 512, (e1,), "2025-12-31T23:59:00.000Z")),
        ("blocks", Blocks(t, e2, (w.e2.block,))),
        ("heads", Heads(t, (big,))),
        ("digest", HeadsDigest(t, heads_digest([big]))),
        ("joined", Joined(t, (big,), (c,))),
        ("joined, from a relay naming its parent", Joined(t, (big,), (), a)),
        ("subs", Subs((t,), True)),
        ("frag", Fragment(t, big, root_cid, root_block)),
        ("idontwant", IDontWant(t, (big,))),
        ("fwant", FWant(t, big, leaves)),
        ("batch", Batch((Heads(t, (big,)), IHave(t, ((big, 2),))))),
        ("gbeat, acknowledgements to a member", GroupBeat.signed(
            w.ids["subscriber"], topic=t, group="billing", name="worker-1",
            inc=int(T0 * 1000), seq=3, since=int(T0 * 1000) + 2000, leaving=False,
            acked=(e1, e2), hops=0)),
        ("gbeat, leaving, flooded", GroupBeat.signed(
            w.ids["subscriber"], topic=t, group="billing", name="worker-1",
            inc=int(T0 * 1000), seq=4, since=int(T0 * 1000) + 2000, leaving=True,
            acked=(), hops=6)),
        ("recon, opening: fingerprints of two ranges", Recon(t, 77, 0, (
            Fingerprint((0, b""), (int(T0 * 1000), e1.raw), 12, fingerprint_of(12345, 12)),
            Fingerprint((int(T0 * 1000), e1.raw), INFINITY, 3, fingerprint_of(678, 3))), ())),
        ("recon, lists: one final, one asking for a reply", Recon(t, 77, 1, (), (
            IdList((0, b""), (int(T0 * 1000), e1.raw), False, ((e1, 41), (e2, 42))),
            IdList((int(T0 * 1000), e1.raw), INFINITY, True, ())))),
        ("rwant", RWant(t, 77, (e1, e2))),
        ("rblocks, one of two asked for", RBlocks(t, 77, 2, (w.e2.block,))),
    ]


def message_vectors(w: World) -> dict[str, Any]:
    vectors = []
    for name, message in _messages(w):
        payload = encode_message(message)
        body = encode_data(payload)[4:]  # the frame body: kind byte DATA, then the message
        vectors.append({
            "name": name,
            "t": type(message).T,
            "body": body.hex(),
            "fields": readable(message.to_wire()),
        })
    small = b"The quick brown fox jumps over the lazy dog"
    root, blocks = split(small, chunk_size=8, fanout=2)
    return {
        "about": "One DATA frame body per pub-sub message kind (docs/protocol.md sections 2.5 "
                 "and 3-6): the kind byte 00 then the DAG-CBOR message. 'fields' is the "
                 "message in DAG-JSON style. Generated by tests/conformance/generate.py.",
        "identities": {name: _identity_entry(w.ids[name], w.seeds[name])
                       for name in ("author", "subscriber", "requester")},
        "blocks": {
            "meta_topic": _block_entry(w.meta.cid, w.meta.block),
            "topic": _block_entry(w.topic.cid, w.topic.block),
            "event_1": _block_entry(w.e1.cid, w.e1.block),
            "event_2": _block_entry(w.e2.cid, w.e2.block),
            "event_large": _block_entry(w.big.cid, w.big.block),
            "event_large_root": _block_entry(*w.big_blocks[-1]),
        },
        "event_large_payload": {"size": w.big_payload_size,
                                "leaves": [str(cid) for cid, _ in w.big_blocks[:-1]]},
        "vectors": vectors,
        "chunk_tree": {
            "about": "A payload cut into a chunk tree with 8-byte leaves and 2 links per "
                     "node (this implementation cuts 6144-byte leaves and 128 links; readers "
                     "accept other shapes within its limits): the payload is the leaves "
                     "concatenated depth-first in link order (docs/protocol.md section "
                     "1.6). Blocks are listed as written, the root last.",
            "payload": small.hex(),
            "root": str(root),
            "blocks": [_block_entry(cid, block) for cid, block in blocks],
        },
    }


# --------------------------------------------------------------------------- Noise


def _x25519(label: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(
        hashlib.sha256(b"pulsarcast conformance: " + label.encode()).digest())


def _public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def _private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes_raw()


DIALER_LISTEN: Final = ("", 0)
LISTENER_LISTEN: Final = ("0.0.0.0", 4001)


def handshake_pair(w: World) -> tuple[Handshake, Handshake]:
    """The two sides of the recorded handshake: the subscriber dials the author."""
    dialer_id, listener_id = w.ids["subscriber"], w.ids["author"]
    dialer = Handshake(StaticKey.generate(dialer_id, _x25519("dialer static")),
                       DIALER_LISTEN, initiator=True, expected=listener_id.peer_id,
                       ephemeral=_x25519("dialer ephemeral"))
    listener = Handshake(StaticKey.generate(listener_id, _x25519("listener static")),
                         LISTENER_LISTEN, initiator=False,
                         ephemeral=_x25519("listener ephemeral"))
    return dialer, listener


def _record(body: bytes) -> str:
    return (len(body).to_bytes(2, "big") + body).hex()


def noise_vector(w: World) -> dict[str, Any]:
    dialer, listener = handshake_pair(w)
    m1 = dialer.start()
    assert m1 is not None
    m2 = listener.receive(m1)
    assert m2 is not None
    m3 = dialer.receive(m2)
    assert m3 is not None
    m4 = listener.receive(m3)
    assert m4 is not None and dialer.receive(m4) is None and dialer.done and listener.done
    handshake_hash = dialer._noise.handshake_hash
    dialer_send, _ = dialer.ciphers()
    listener_send, _ = listener.ciphers()
    join = Join(w.topic.cid, w.topic.block)
    joined = Joined(w.topic.cid, (), ())
    first = encode_data(encode_message(join))
    answer = encode_data(encode_message(joined))
    first_record = bytes(seal(dialer_send, first))
    answer_record = bytes(seal(listener_send, answer))

    def side(name: str, identity: Identity, seed: bytes, listen: tuple[str, int]) -> dict[str, Any]:
        static, ephemeral = _x25519(f"{name} static"), _x25519(f"{name} ephemeral")
        key = StaticKey.generate(identity, static)
        payload = {"peer": identity.peer_id.raw, "sig": key.signature, "listen": list(listen)}
        return {
            "identity": _identity_entry(identity, seed),
            "static_private": _private(static).hex(),
            "static_public": _public(static).hex(),
            "ephemeral_private": _private(ephemeral).hex(),
            "ephemeral_public": _public(ephemeral).hex(),
            "payload_fields": readable(payload),
        }

    return {
        "about": "A complete transport handshake (docs/protocol.md section 2.3) and the first "
                 "transport record each way (2.4): the subscriber (dialer, Noise initiator, "
                 "not listening) dials the author (listener). 'record' is the bytes on the "
                 "TCP stream: a 2-byte big-endian length, then the Noise message. Generated "
                 "by tests/conformance/generate.py.",
        "protocol": PROTOCOL_NAME.decode(),
        "prologue": PROLOGUE.hex(),
        "dialer": side("dialer", w.ids["subscriber"], w.seeds["subscriber"], DIALER_LISTEN),
        "listener": side("listener", w.ids["author"], w.seeds["author"], LISTENER_LISTEN),
        "handshake": [
            {"from": "dialer", "message": "1: e", "record": _record(m1), "payload": ""},
            {"from": "listener", "message": "2: e, ee, s, es", "record": _record(m2),
             "payload": listener._payload.hex()},
            {"from": "dialer", "message": "3: s, se", "record": _record(m3),
             "payload": dialer._payload.hex()},
            {"from": "listener", "message": "4: first transport record (nonce 0), empty",
             "record": _record(m4), "payload": ""},
        ],
        "handshake_hash": handshake_hash.hex(),
        "transport": [
            {"from": "dialer", "nonce": 0, "record": first_record.hex(),
             "plaintext": first.hex(), "message": readable(join.to_wire())},
            {"from": "listener", "nonce": 1, "record": answer_record.hex(),
             "plaintext": answer.hex(), "message": readable(joined.to_wire())},
        ],
    }


# --------------------------------------------------------------------------- DHT

Address = tuple[str, int]

NODE_ADDRESS: Final = ("192.0.2.1", 4001)
REQUESTER_ADDRESS: Final = ("192.0.2.2", 4002)
CONTACTS: Final = (("author", ("192.0.2.10", 4010)), ("requester", ("192.0.2.3", 4003)),
                   ("peer4", ("192.0.2.4", 4004)), ("peer5", ("192.0.2.5", 4005)))
"""The node's routing table. The requester (the subscriber's identity) asks from
``REQUESTER_ADDRESS``; ``requester`` here is a third peer."""


def _kid(w: World, name: str) -> bytes:
    return w.ids[name].peer_id.kademlia_id()


def _held(w: World) -> list[tuple[str, bytes, bytes]]:
    """What the node holds for the network: ``(what, key, value)``."""
    return [("the topic's first version (a block)", dht_key(w.topic.cid), w.topic.block),
            ("the author's heads record of the topic", w.record.key, w.record.block)]


class _Capture(asyncio.DatagramTransport):
    """A UDP transport that keeps what the protocol sends."""

    def __init__(self, protocol: PulsarProtocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.sent: list[tuple[bytes, Address]] = []

    def sendto(self, data: Any, addr: Any = None) -> None:
        self.sent.append((bytes(data), (addr[0], addr[1])))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        self.protocol.connection_lost(None)


@contextlib.asynccontextmanager
async def dht_node(w: World, *, proven: bool) -> AsyncIterator[tuple[PulsarProtocol, _Capture]]:
    """A fresh DHT node (in memory) with the routing table and records of the vectors;
    ``proven``: the requester's address is already validated."""
    store = BlockStore(":memory:")
    stats = DhtStats()
    storage = RecordStorage(store, max_records=1000, stats=stats)
    protocol = PulsarProtocol(Node(_kid(w, "dht_node"), *NODE_ADDRESS), storage, DhtConfig(),
                              PeerBook(), stats)
    transport = _Capture(protocol)
    protocol.connection_made(transport)
    try:
        for name, (host, port) in CONTACTS:
            protocol.welcome_if_new(Node(_kid(w, name), host, port))
        for _, key, value in _held(w):
            assert storage.offer(key, value)
        if proven:
            protocol.note_proven(REQUESTER_ADDRESS, _kid(w, "subscriber"))
        yield protocol, transport
    finally:
        await protocol.close()
        store.close()


@contextlib.contextmanager
def pinned_ids(vector: str) -> Iterator[None]:
    """The node's own message ids (random in production) fixed for one vector."""
    fixed = hashlib.sha1(b"node message id: " + vector.encode()).digest()
    with mock.patch.object(os, "urandom", lambda n: fixed[:n]):
        yield


async def _settle() -> None:
    for _ in range(20):  # a STORE is answered after its group commit, a few turns later
        await asyncio.sleep(0)


def _request_id(vector: str, n: int) -> bytes:
    return hashlib.sha1(f"requester message id: {vector} #{n}".encode()).digest()


def _decoded(datagram: bytes) -> dict[str, Any]:
    message = decode_datagram(datagram)
    if isinstance(message, Request):
        return {"type": "request", "msg_id": message.msg_id.hex(), "name": message.name,
                "args": msgpack_readable(list(message.args))}
    return {"type": "response", "msg_id": message.msg_id.hex(),
            "answer": msgpack_readable(message.data)}


Step = tuple[str, Sequence[Any]]
"""``("request", (name, args))``, or ``("answer ping", ())``: the requester answers the
node's last request, a validation PING, with its node id."""


def _dht_specs(w: World) -> list[tuple[str, bool, list[Step]]]:
    me = _kid(w, "subscriber")
    t = w.topic
    own = HeadsRecord.create(w.ids["subscriber"], t.cid, 5, t.cid, (w.e2.cid,), now=T0 + 20)
    leaf1, leaf2 = b"a chunk-tree leaf", b"another leaf"  # raw blocks, to keep this file short
    key1, key2 = dht_key(cid_of_raw(leaf1)), dht_key(cid_of_raw(leaf2))
    return [
        ("ping, from an address not validated yet", False,
         [("request", ("ping", [me])), ("answer ping", ())]),
        ("find_node, from an address not validated yet: held until a ping round trip", False,
         [("request", ("find_node", [me, _kid(w, "author")])), ("answer ping", ())]),
        ("stun", True, [("request", ("stun", []))]),
        ("store, a block", True,
         [("request", ("store", [me, key1, leaf1]))]),
        ("store, a heads record", True, [("request", ("store", [me, own.key, own.block]))]),
        ("store, refused: the value does not hash to the key", True,
         [("request", ("store", [me, key2, leaf1]))]),
        ("store_batch", True,
         [("request", ("store_batch", [me, [[key1, leaf1], [key2, leaf2]]]))]),
        ("find_node", True, [("request", ("find_node", [me, _kid(w, "author")]))]),
        ("find_near, as a peer lookup (locate) sends it", True,
         [("request", ("find_near", [me, _kid(w, "requester"), 3]))]),
        ("find_value, found: the topic's first version", True,
         [("request", ("find_value", [me, dht_key(t.cid)]))]),
        ("find_value, not found", True,
         [("request", ("find_value", [me, key1]))]),
        ("find_value_near, found: the author's heads record", True,
         [("request", ("find_value_near", [me, w.record.key, 8]))]),
        ("find_value_near, not found", True,
         [("request", ("find_value_near", [me, key2, 2]))]),
        ("holds", True,
         [("request", ("holds", [me, [dht_key(t.cid), key1, w.record.key]]))]),
    ]


async def _record_exchange(w: World, name: str, proven: bool, steps: list[Step]
                           ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with dht_node(w, proven=proven) as (protocol, transport):
        for n, (kind, spec) in enumerate(steps):
            if kind == "request":
                rpc, args = spec
                datagram = encode_request(_request_id(name, n), rpc, args)
            else:
                asked = next(d for d in reversed(out)
                             if d["from"] == "node" and d["decoded"]["type"] == "request")
                ping = decode_datagram(bytes.fromhex(asked["hex"]))
                assert isinstance(ping, Request) and ping.name == "ping"
                datagram = encode_response(ping.msg_id, _kid(w, "subscriber"))
            out.append({"from": "requester", "hex": datagram.hex(),
                        "decoded": _decoded(datagram)})
            seen = len(transport.sent)
            with pinned_ids(name):
                protocol.datagram_received(datagram, REQUESTER_ADDRESS)
            await _settle()
            for data, to in transport.sent[seen:]:
                assert to == REQUESTER_ADDRESS, to
                out.append({"from": "node", "hex": data.hex(), "decoded": _decoded(data)})
    return out


async def replay_dht(w: World, vector: dict[str, Any]) -> list[str]:
    """Feed a vector's requester datagrams to a fresh node; return every datagram of the
    exchange, in order, as hex (the requester's as given, the node's as it sent them)."""
    out: list[str] = []
    async with dht_node(w, proven=vector["requester_proven"]) as (protocol, transport):
        for item in vector["datagrams"]:
            if item["from"] != "requester":
                continue
            out.append(item["hex"])
            seen = len(transport.sent)
            with pinned_ids(vector["name"]):
                protocol.datagram_received(bytes.fromhex(item["hex"]), REQUESTER_ADDRESS)
            await _settle()
            out += [data.hex() for data, to in transport.sent[seen:] if to == REQUESTER_ADDRESS]
    return out


async def dht_vectors(w: World) -> dict[str, Any]:
    vectors = []
    for name, proven, steps in _dht_specs(w):
        vectors.append({
            "name": name,
            "requester_proven": proven,
            "datagrams": await _record_exchange(w, name, proven, steps),
        })
    return {
        "about": "DHT datagrams (docs/protocol.md section 9): one request and its answer per "
                 "RPC, as a node of this implementation produces them. Each vector starts "
                 "from a fresh node with the routing table and records below; "
                 "'requester_proven' says whether the requester's address was validated "
                 "beforehand (section 9.3). The node's own message ids are random in "
                 "production; here they are pinned. Generated by "
                 "tests/conformance/generate.py.",
        "node": {
            "identity": _identity_entry(w.ids["dht_node"], w.seeds["dht_node"]),
            "address": list(NODE_ADDRESS),
            "contacts": [{"name": name, "node_id": _kid(w, name).hex(), "address": list(addr)}
                         for name, addr in CONTACTS],
            "holds": [{"what": what, "key": key.hex(), "value": value.hex()}
                      for what, key, value in _held(w)],
        },
        "requester": {
            "identity": _identity_entry(w.ids["subscriber"], w.seeds["subscriber"]),
            "address": list(REQUESTER_ADDRESS),
        },
        "vectors": vectors,
    }


# --------------------------------------------------------------------------- files


def dump(data: dict[str, Any]) -> str:
    """JSON, indented, with every array or object that fits in a line on one line."""
    return _format(data, 0) + "\n"


def _format(value: Any, level: int) -> str:
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, dict | list) or not value or level + len(flat) <= 96:
        return flat
    pad = " " * (level + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(key)}: {_format(item, level + 1)}"
                 for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * level + "}"
    items = [pad + _format(item, level + 1) for item in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * level + "]"


def build_all() -> dict[str, str]:
    """Every vector file's text, by file name."""
    w = world()
    return {
        "messages.json": dump(message_vectors(w)),
        "noise.json": dump(noise_vector(w)),
        "dht.json": dump(asyncio.run(dht_vectors(w))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true",
                        help="compare with the files instead of writing them")
    args = parser.parse_args(argv)
    logging.getLogger("dht").setLevel(logging.ERROR)  # the refused STORE is meant
    stale = []
    for name, text in build_all().items():
        path = HERE / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path} ({len(text.encode())} bytes)")
    if stale:
        print(f"out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
