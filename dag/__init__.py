"""The pulsarcast data model: CIDs, strict DAG-CBOR, identities, descriptors, chunk trees,
history walks and the durable block store. Pure: imports no other pulsarcast package."""

from .cid import CID, cid_of, cid_of_raw
from .codec import decode, encode
from .descriptors import (
    MAX_RETENTION,
    EventDescriptor,
    EventLinking,
    PublishRule,
    Retention,
    TopicDescriptor,
    check_content_type,
    check_event_key,
    check_rights,
)
from .errors import (
    ChunkError,
    CIDMismatch,
    CodecError,
    DagError,
    InvalidCID,
    InvalidDescriptor,
    InvalidKeyFile,
    SchemaError,
    SignatureError,
)
from .identity import Identity, PeerId
from .store import BlockStore, StoreError

__all__ = [
    "CID",
    "BlockStore",
    "CIDMismatch",
    "ChunkError",
    "CodecError",
    "DagError",
    "EventDescriptor",
    "EventLinking",
    "Identity",
    "InvalidCID",
    "InvalidDescriptor",
    "InvalidKeyFile",
    "PeerId",
    "MAX_RETENTION",
    "PublishRule",
    "Retention",
    "SchemaError",
    "SignatureError",
    "StoreError",
    "TopicDescriptor",
    "check_content_type",
    "check_event_key",
    "check_rights",
    "cid_of",
    "cid_of_raw",
    "decode",
    "encode",
]
