"""What every message module shares: the wire's limits, the error a malformed message
raises, and the validators of its fields.

Decoding uses the fast codec (links arrive as raw CID bytes), so each message class
re-validates every field in ``from_wire`` with these; a malformed message raises
:class:`MessageError` and its receiver drops it with a log line.
"""

from __future__ import annotations

from typing import Any, Final

from dag import CID
from dag.errors import DagError

__all__ = [
    "MAX_HOPS",
    "MAX_MESSAGE_SIZE",
    "MessageError",
    "bytes_field",
    "link_field",
    "uint_field",
]

MAX_MESSAGE_SIZE: Final = 1 << 20
MAX_HOPS: Final = 1024


class MessageError(DagError):
    """A frame that is not a well-formed pulsarcast message: the sender's fault."""


def link_field(value: Any, what: str) -> CID:
    if isinstance(value, CID):
        return value
    if not isinstance(value, bytes):
        raise MessageError(f"{what} must be a link")
    try:
        return CID(value)
    except ValueError as exc:
        raise MessageError(f"{what}: {exc}") from None


def bytes_field(value: Any, what: str, limit: int) -> bytes:
    if not isinstance(value, bytes) or len(value) > limit:
        raise MessageError(f"{what} must be bytes of at most {limit}")
    return value


def uint_field(value: Any, what: str, limit: int) -> int:
    if type(value) is not int or not 0 <= value <= limit:
        raise MessageError(f"{what} must be an integer in 0..{limit}")
    return value
