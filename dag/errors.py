"""The exception tree of the ``dag`` layer.

Every error a block from the network can provoke is a ``DagError`` and also a ``ValueError``,
so callers that only care "was the input bad?" can catch the builtin::

    ValueError
     └── DagError
          ├── InvalidCID              a CID string or binary form that does not parse
          ├── CodecError              bytes that are not strict DAG-CBOR, or a value that can't be
          │                           encoded
          ├── InvalidDescriptor       a topic/event block that fails validation
          │    ├── SchemaError        wrong/missing/extra field, wrong type, too large
          │    ├── CIDMismatch        the block does not hash to the CID it was asked for
          │    └── SignatureError     a signature is missing, malformed or does not verify
          ├── InvalidKeyFile          a key file that is corrupt, of the wrong type or unsafe
          └── ChunkError              a chunk tree that is malformed or fails verification
"""

from __future__ import annotations

__all__ = [
    "CIDMismatch",
    "ChunkError",
    "CodecError",
    "DagError",
    "InvalidCID",
    "InvalidDescriptor",
    "InvalidKeyFile",
    "SchemaError",
    "SignatureError",
]


class DagError(ValueError):
    """Base of every error raised by the ``dag`` package for bad input."""


class InvalidCID(DagError):
    """A CID that does not parse, or uses a version/codec/hash pulsarcast cannot check."""


class CodecError(DagError):
    """Bytes that are not strict DAG-CBOR, or a Python value with no DAG-CBOR encoding."""


class InvalidDescriptor(DagError):
    """A topic or event descriptor block that must not be trusted."""


class SchemaError(InvalidDescriptor):
    """A descriptor with a missing, extra, mistyped or oversized field."""


class CIDMismatch(InvalidDescriptor):
    """A block whose hash does not match the CID it was fetched or announced under."""


class SignatureError(InvalidDescriptor):
    """A descriptor whose author or publisher signature is missing or does not verify."""


class InvalidKeyFile(DagError):
    """A key file that is unreadable, corrupt, of the wrong key type, or has unsafe permissions."""


class ChunkError(DagError):
    """A chunk tree whose blocks are malformed, missing or do not match their links."""
