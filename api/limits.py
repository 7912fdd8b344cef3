"""Every limit the REST API enforces, in one place.

The handlers check these, the OpenAPI document is built from them, and a test compares the
limits table of ``docs/api.md`` with :data:`LIMITS`, so the three cannot drift apart. Where a
limit comes from the data model (descriptor fields), it is derived from :mod:`dag`'s own
constant rather than repeated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Final

from dag.descriptors import MAX_DESCRIPTOR_SIZE, MAX_NAME_BYTES, MAX_PEERS, MAX_SUBTOPICS
from pulsar.runtime import consumer_config

__all__ = ["LIMITS", "ServerLimits"]

META_SUFFIX: Final = "/meta"
"""The node names a topic's meta topic ``<name>/meta`` (``pulsar.Node.create_topic``), and
that name must fit the descriptor's limit too."""

TOPIC_NAME_BYTES: Final = MAX_NAME_BYTES - len(META_SUFFIX.encode())
SUBTOPIC_NAME_BYTES: Final = MAX_NAME_BYTES
SUBTOPICS: Final = MAX_SUBTOPICS - 1  # the node adds the ``meta`` link itself
PEERS: Final = MAX_PEERS
DESCRIPTOR_BYTES: Final = MAX_DESCRIPTOR_SIZE
BODY_BYTES: Final = 2 * 1024 * 1024
"""Largest request body (a 1 MiB payload as base64 fits with room to spare)."""
PAYLOAD_BYTES: Final = 1024 * 1024
"""Largest event payload accepted over HTTP (bigger ones go into chunk trees in the DHT)."""
RAW_PAYLOAD_BYTES: Final = 16 * 1024 * 1024
"""Largest payload of a raw (``application/octet-stream``) publish: the node's own limit on
an event (``core.fragments.max_event_size``), 16 MiB by default; the body streams in and is
refused as soon as it passes the limit."""
BATCH_EVENTS: Final = 1000
"""Most events (lines) in one NDJSON publish batch."""
BATCH_BYTES: Final = 8 * 1024 * 1024
"""Most bytes in one publish batch's body (each line's payload is bounded as a single
publish's)."""
JSON_DEPTH: Final = 64
"""Deepest nesting of arrays and objects in a request body (the body itself is depth 1)."""
PAGE_EVENTS: Final = 1000
"""Largest ``limit`` of one JSON history page (NDJSON streams have no such bound)."""
PAGE_BYTES: Final = 2 * 1024 * 1024
"""A JSON history page stops adding events once its events' JSON reaches this size (it has
at least one event, and ``next_cursor`` says where to go on)."""
SEQ_DIGITS: Final = 18
SEQ_MAX: Final = 10**SEQ_DIGITS - 1
"""Largest delivery-log position a cursor may name: any 1..18 ASCII digits (so a pattern in
the OpenAPI document states it exactly)."""
ROUTING_K: Final = 1000
CONSUMERS_PER_TOPIC: Final = consumer_config.MAX_CONSUMERS_PER_TOPIC
CONSUMER_NAME: Final = consumer_config.MAX_NAME
FETCH_BATCH: Final = consumer_config.MAX_BATCH
FETCH_EXPIRES: Final = int(consumer_config.MAX_EXPIRES)
ACK_PENDING: Final = consumer_config.MAX_ACK_PENDING
ACK_IDS: Final = consumer_config.MAX_ACK_IDS
"""The durable consumers' bounds, the runtime's own (:mod:`pulsar.runtime.consumer_config`)."""

LIMITS: Final[dict[str, int]] = {
    "topic name (UTF-8 bytes)": TOPIC_NAME_BYTES,
    "sub-topics per topic (besides meta)": SUBTOPICS,
    "sub-topic name (UTF-8 bytes)": SUBTOPIC_NAME_BYTES,
    "peer ids per publishing rule": PEERS,
    "encoded topic descriptor (bytes)": DESCRIPTOR_BYTES,
    "request body (bytes)": BODY_BYTES,
    "event payload (bytes)": PAYLOAD_BYTES,
    "raw event payload (bytes)": RAW_PAYLOAD_BYTES,
    "events per publish batch": BATCH_EVENTS,
    "publish batch body (bytes)": BATCH_BYTES,
    "JSON nesting depth of a body": JSON_DEPTH,
    "events per JSON history page": PAGE_EVENTS,
    "event JSON per history page (bytes)": PAGE_BYTES,
    "cursor / position": SEQ_MAX,
    "routing contacts (k)": ROUTING_K,
    "consumers per topic": CONSUMERS_PER_TOPIC,
    "consumer name (characters)": CONSUMER_NAME,
    "messages per fetch (batch)": FETCH_BATCH,
    "fetch wait (expires, seconds)": FETCH_EXPIRES,
    "unacknowledged messages per consumer (max_ack_pending)": ACK_PENDING,
    "delivery ids per acknowledgement": ACK_IDS,
}
"""What docs/api.md's limits table lists (a test keeps the two equal)."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Per-connection protection of the HTTP server (see docs/operations.md).

    ``header_timeout``: a connection that has not sent a complete request head within this
    many seconds of connecting (or of its previous response) is closed — this is aiohttp's
    keep-alive timer, which 3.14 also arms for a new connection. ``body_timeout``: reading a
    request body must finish within this many seconds (``408``). ``max_connections`` and
    ``max_connections_per_client`` (per remote IP address): a connection over either cap
    gets a ``503 unavailable`` problem document and is closed. ``write_buffer``: the
    high-water mark of each connection's send buffer; a response waits for the client to
    read before it produces more.
    """

    header_timeout: float = 15.0
    body_timeout: float = 30.0
    max_connections: int = 1024
    max_connections_per_client: int = 256
    write_buffer: int = 256 * 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"{f.name} must be positive")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ServerLimits:
        """Defaults, overridden by ``PULSARCAST_API_HEADER_TIMEOUT``, ``..._BODY_TIMEOUT``,
        ``..._MAX_CONNECTIONS``, ``..._MAX_CONNECTIONS_PER_CLIENT``, ``..._WRITE_BUFFER``."""
        env = os.environ if environ is None else environ
        given: dict[str, float | int] = {}
        for f in fields(cls):
            raw = env.get("PULSARCAST_API_" + f.name.upper())
            if raw is None or raw == "":
                continue
            kind = float if f.type in ("float", float) else int
            try:
                given[f.name] = kind(raw)
            except ValueError:
                raise ValueError(f"PULSARCAST_API_{f.name.upper()} must be a number, not "
                                 f"{raw!r}") from None
        # Each value was parsed with its own field's type (float or int) just above.
        return cls(**given)  # type: ignore[arg-type]  # see above
