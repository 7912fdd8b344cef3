"""``pulsarcast bench codec``: descriptor decode/verify/sign rates and the block store.

Figures (events with 256-byte inline payloads, author == publisher, one core):

* ``decode_validate_per_s`` — :meth:`EventDescriptor.from_block` without the signature check:
  size limit, CID check (sha2-256), fast decode, schema and types, canonical re-encoding.
* ``verify_per_s`` — the same plus the Ed25519 signature check.
* ``build_sign_per_s`` — :meth:`EventDescriptor.create`: encode, sign, and parse back.
* ``reference_decode_per_s`` — the pure-Python ``dag-cbor`` package decoding the same
  blocks plus a CID check through ``multiformats`` (no schema work at all, so the ratio
  against it understates our advantage).
* ``store_put_per_s`` / ``store_get_per_s`` — the SQLite block store, batched puts.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import dag_cbor
import multiformats

from dag import EventDescriptor, Identity, TopicDescriptor

from .store import bench_store
from .timing import rate


def _events(count: int) -> tuple[Identity, list[EventDescriptor]]:
    identity = Identity.generate()
    meta = TopicDescriptor.create(identity, "bench/meta")
    topic = TopicDescriptor.create(identity, "bench", meta=meta.cid)
    events = []
    parent = None
    for _ in range(count):
        event = EventDescriptor.create(identity, topic.cid, os.urandom(256), parent=parent)
        events.append(event)
        parent = event.cid
    return identity, events


def bench_codec(events: int = 2000, seconds: float = 1.0) -> dict[str, Any]:
    identity, sample = _events(events)
    pairs = [(e.block, e.cid) for e in sample]

    decode_validate = rate(
        lambda p: EventDescriptor.from_block(p[0], p[1], verify_signature=False),
        pairs,
        min_seconds=seconds,
    )
    verify = rate(lambda p: EventDescriptor.from_block(p[0], p[1]), pairs, min_seconds=seconds)
    topic = sample[0].topic
    build_sign = rate(
        lambda e: EventDescriptor.create(identity, topic, b"x" * 256, parent=e.cid),
        sample[: min(500, len(sample))],
        min_seconds=seconds,
    )

    def reference(p: tuple[bytes, Any]) -> None:
        dag_cbor.decode(p[0])
        digest = multiformats.multihash.digest(p[0], "sha2-256")
        cid = multiformats.CID("base32", 1, "dag-cbor", digest)
        if bytes(cid) != p[1].raw:
            raise AssertionError("reference CID mismatch")

    reference_rate = rate(reference, pairs[:200], min_seconds=seconds)
    with tempfile.TemporaryDirectory() as tmp:
        store = bench_store(os.path.join(tmp, "bench.sqlite3"))
    return {
        "bench": "codec",
        "events": len(sample),
        "decode_validate_per_s": round(decode_validate),
        "verify_per_s": round(verify),
        "build_sign_per_s": round(build_sign),
        "reference_decode_per_s": round(reference_rate),
        "decode_vs_reference": round(decode_validate / reference_rate, 1),
        "store_put_per_s": round(store["store_put_per_s"]),
        "store_get_per_s": round(store["store_get_per_s"]),
    }
