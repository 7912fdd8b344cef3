"""Topic and event descriptors: the signed, content-addressed blocks of a topic's Merkle DAG.

The fields follow the Pulsarcast paper's listings 1 and 2; ``docs/protocol.md`` gives the exact
wire form. Both descriptor types are immutable values whose identity *is* their CID: two
descriptors are equal when their blocks are equal, and ``hash()`` is the CID's.

Why validation is this strict: descriptors arrive from untrusted peers and are forwarded on
every hop. :meth:`TopicDescriptor.from_block` / :meth:`EventDescriptor.from_block` accept a
block only if (1) it hashes to the CID it was announced under, (2) it is canonical DAG-CBOR
with exactly the schema's fields and types, within size limits, and (3) its signatures
verify. Step (2) re-encodes the parsed value and compares bytes, so a block has exactly one
valid encoding and nobody can mint a second CID for someone else's signed event.

Signatures (Ed25519, 64 bytes):

* topic: ``authorSignature`` over the *unsigned encoding* (the block's map without its
  signature fields);
* event, publisher == author: ``authorSignature`` over the unsigned encoding;
* event, publisher != author (request to publish): ``authorSignature`` over the encoding of
  the author's content ``{topic, author, payload, metadata}`` — what the author sent in its
  request — and ``publisherSignature`` over the block's map without ``publisherSignature``,
  which covers the parent link the publisher chose and the author's signature.

Where the code is: :mod:`dag.descriptor_wire` holds the limits and the checks both kinds
share (field validators, block loading, the canonical-encoding check);
:mod:`dag.topic_descriptor` and :mod:`dag.event_descriptor` hold the two classes. This
module re-exports their public names, so ``from dag.descriptors import ...`` is the one
place to import them from, and holds :func:`check_rights`, the one rule that needs both.
"""

from __future__ import annotations

from .descriptor_wire import (
    CONTENT_TYPE_PATTERN,
    MAX_CONTENT_TYPE,
    MAX_DESCRIPTOR_SIZE,
    MAX_EVENT_KEY,
    MAX_INLINE_PAYLOAD,
    MAX_MERGES,
    PROTOCOL_VERSION,
    check_content_type,
    check_event_key,
    iso_timestamp,
    parse_timestamp,
)
from .descriptor_wire import MAX_NAME_BYTES as MAX_NAME_BYTES
from .descriptor_wire import MAX_PEERS as MAX_PEERS
from .descriptor_wire import MAX_SUBTOPICS as MAX_SUBTOPICS
from .descriptor_wire import MAX_VERSION_CHARS as MAX_VERSION_CHARS
from .descriptor_wire import MAX_VERSION_HEADS as MAX_VERSION_HEADS
from .descriptor_wire import SIGNATURE_SIZE as SIGNATURE_SIZE
from .errors import InvalidDescriptor
from .event_descriptor import EventDescriptor
from .topic_descriptor import MAX_RETENTION, EventLinking, PublishRule, Retention, TopicDescriptor

__all__ = [
    "MAX_DESCRIPTOR_SIZE",
    "CONTENT_TYPE_PATTERN",
    "MAX_CONTENT_TYPE",
    "MAX_EVENT_KEY",
    "MAX_INLINE_PAYLOAD",
    "MAX_MERGES",
    "PROTOCOL_VERSION",
    "MAX_RETENTION",
    "EventDescriptor",
    "EventLinking",
    "PublishRule",
    "Retention",
    "TopicDescriptor",
    "check_content_type",
    "check_event_key",
    "check_rights",
    "iso_timestamp",
    "parse_timestamp",
]


def check_rights(event: EventDescriptor, topic: TopicDescriptor) -> None:
    """Raise :class:`InvalidDescriptor` unless the event's publisher (and, for a request to
    publish, its author) had the right to it under ``topic``'s rules."""
    if not topic.may_publish(event.publisher):
        raise InvalidDescriptor(f"event {event.cid}: {event.publisher} may not publish")
    if event.author != event.publisher and not topic.may_request(event.author):
        raise InvalidDescriptor(f"event {event.cid}: {event.author} may not request to publish")
