"""JSON as the API accepts it: what Python's ``json`` module takes beyond RFC 8259 refused.

Both a client's request body and a payload published as JSON (which may come from any
peer on the network) are parsed here, so the API never echoes NaN, a number beyond a
double, a lone surrogate or a nesting deep enough to exhaust the stack of whoever reads
the answer.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .limits import JSON_DEPTH

__all__ = ["JsonRejected", "strict_loads"]


class JsonRejected(ValueError):
    """Not JSON by RFC 8259, or beyond the API's limits; the message says which."""


def _not_json(constant: str) -> Any:
    raise JsonRejected(f"{constant} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonRejected(f"{text} does not fit a double")
    return value


def _check_tree(value: Any) -> None:
    """Nesting depth at most :data:`JSON_DEPTH`; every string (and key) encodable as UTF-8,
    which JSON's ``\\ud800`` escapes need not be. Iterative, so depth costs no stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                raise JsonRejected("a string holds a lone surrogate (\\ud800-\\udfff), "
                                   "which is not Unicode text") from None
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > JSON_DEPTH:
            raise JsonRejected(f"nests deeper than {JSON_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((key, depth) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        else:
            stack.extend((child, depth + 1) for child in item)


def strict_loads(raw: bytes) -> Any:
    """Parse UTF-8 JSON text; :class:`JsonRejected` for anything the API refuses."""
    try:
        # decode first: json.loads(bytes) would also take UTF-16 and UTF-32
        value = json.loads(raw.decode("utf-8"), parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise JsonRejected(f"nests deeper than {JSON_DEPTH} levels") from None
    except JsonRejected:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonRejected(f"not JSON: {exc}") from None
    _check_tree(value)
    return value
