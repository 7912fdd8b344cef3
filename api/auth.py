"""Bearer-token authentication for every request that changes state.

Reads (GET, HEAD) are open to whoever can reach the socket, which is loopback unless the
operator says otherwise; anything else needs ``Authorization: Bearer <token>``. The token is
generated into the data directory on first start (file mode 0600) or given in the config.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from .problems import Handler, Problem

__all__ = ["MIN_TOKEN_CHARS", "TOKEN_FILE", "auth_middleware", "check_token",
           "load_or_create_token"]

TOKEN_FILE = "api-token"
# A fixed prefix so a generated token never starts with "-" (which a command line would read
# as an option: ``--token -x…``) and so secret scanners can recognise one in a leaked log.
TOKEN_PREFIX = "pct_"
_OPEN_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MIN_TOKEN_CHARS = 16
_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what an HTTP header carries intact


def check_token(token: object) -> str:
    """``token`` if it is a usable API token: at least :data:`MIN_TOKEN_CHARS` visible
    ASCII characters (no spaces); else :class:`ValueError` saying why."""
    if not isinstance(token, str):
        raise ValueError("the API token must be a string")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the API token must be at least {MIN_TOKEN_CHARS} characters "
                         f"(got {len(token)})")
    if not _TOKEN.fullmatch(token):
        raise ValueError("the API token may hold only visible ASCII characters, no spaces")
    return token


def load_or_create_token(data_dir: Path) -> str:
    """The token kept in ``data_dir``; a new random one (256 bits) if there is none."""
    path = Path(data_dir) / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        return token
    try:
        return check_token(token)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def auth_middleware(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in _OPEN_METHODS:
            # aiohttp decodes header bytes that are not UTF-8 as lone surrogates
            # (surrogateescape); this turns them back into the bytes that were sent.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                raise Problem(401, "unauthorized", "this call changes state: send the node's "
                              "API token as 'Authorization: Bearer <token>'")
        return await handler(request)

    return check
