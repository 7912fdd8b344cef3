"""The REST API of a pulsarcast node (aiohttp), its OpenAPI document and a Python client."""

from .server import ApiServer, create_app

__all__ = ["ApiServer", "create_app"]
