"""The REST API of a pulsarcast node (aiohttp), its OpenAPI document and a Python client.

``api.client`` needs only aiohttp: ``ApiServer`` and ``create_app`` (which need the node)
are loaded on first use (PEP 562), so ``import api.client`` stays light."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import ApiServer, create_app

__all__ = ["ApiServer", "create_app"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'api' has no attribute {name!r}")
    value = getattr(import_module(".server", __name__), name)
    globals()[name] = value
    return value
