"""The request plumbing of the Python client: the aiohttp session, the headers, one JSON
request and its answer, and problem documents turned into :class:`ApiError`.

``_ClientBase`` is what every endpoint method of :class:`api.client.PulsarcastClient`
goes through: it owns the session (made lazily, or shared by the caller), adds the bearer
token, reads answers within :data:`MAX_BODY` and raises :class:`ApiError` for any problem
answer. Kept apart from the streams (:mod:`api.client_streams`) and the endpoint methods
(:mod:`api.client`) so that how a request is made is in one place. Like the rest of the
client it needs only aiohttp and the standard library (``tests/test_imports.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import quote

import aiohttp

__all__ = ["MAX_BODY", "MAX_LINE", "PROBLEM_BASE", "ApiError"]

PROBLEM_BASE: Final = "https://pulsarcast.dev/problems/"
Json = dict[str, Any]

MAX_LINE: Final = 4 * 1024 * 1024
"""Longest NDJSON or SSE line read: an event with a 1 MiB payload is ~1.4 MiB of JSON
(aiohttp's default refuses lines over 512 KiB)."""
MAX_BODY: Final = 16 * 1024 * 1024
"""Largest JSON answer read whole; a node (or something posing as one) sending more is an
error, not a memory exhaustion."""


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, refusing one over :data:`MAX_BODY` (``read(n)`` returns what is
    buffered, so read in chunks until the end)."""
    body = bytearray()
    while chunk := await response.content.read(256 * 1024):
        body += chunk
        if len(body) > MAX_BODY:
            raise ApiError(response.status, "answer-too-large", f"answer over {MAX_BODY} bytes",
                           {})
    return bytes(body)


class ApiError(Exception):
    """The node answered with a problem document (RFC 9457).

    ``kind`` is the stable slug of the problem type (``"topic-not-found"``, ...), the thing
    to branch on; ``detail`` is for humans; ``problem`` is the whole document.
    """

    def __init__(self, status: int, kind: str, detail: str, problem: Mapping[str, Any]) -> None:
        super().__init__(f"{status} {kind}: {detail}")
        self.status = status
        self.kind = kind
        self.detail = detail
        self.problem = dict(problem)

    @classmethod
    async def from_response(cls, response: aiohttp.ClientResponse) -> ApiError:
        text = await response.text(errors="replace")
        try:
            problem = json.loads(text)
        except ValueError:
            problem = None
        if not isinstance(problem, dict):
            # Not from the API itself (a proxy, another server on the port): keep the text.
            problem = {"status": response.status, "detail": text[:500] or response.reason}
        return cls.from_problem(problem, response.status, response.reason or "")

    @classmethod
    def from_problem(cls, problem: Mapping[str, Any], status: int | None = None,
                     reason: str = "") -> ApiError:
        """A problem document: an error answer's body, or one line of a batch's answer."""
        if status is None:
            given = problem.get("status")
            status = given if type(given) is int else 500
        type_ = str(problem.get("type", ""))
        kind = type_[len(PROBLEM_BASE):] if type_.startswith(PROBLEM_BASE) else (
            type_ or f"http-{status}")
        detail = str(problem.get("detail") or problem.get("title") or reason)
        return cls(status, kind, detail, problem)


def _params(**values: Any) -> dict[str, str]:
    return {k: str(v) for k, v in values.items() if v is not None}


class _ClientBase:
    """The session and the request plumbing of :class:`api.client.PulsarcastClient` (whose
    docstring says how to make one)."""

    def __init__(self, base_url: str, token: str | None = None,
                 session: aiohttp.ClientSession | None = None, *,
                 timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session belongs to the loop that is running when it is
        # made, and the blocking facade builds the client before its loop runs anything.
        if self._session is None:
            # aiohttp refuses lines over twice its read buffer.
            self._session = aiohttp.ClientSession(timeout=self._timeout,
                                                  read_bufsize=MAX_LINE // 2)
        return self._session

    # ------------------------------------------------------------------ plumbing

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if extra:
            headers.update(extra)
        return headers

    async def _call(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                    body: Json | None = None, timeout: float | None = None) -> Any:
        """One request; the JSON answer (None for 204); :class:`ApiError` for problems.
        ``timeout`` (seconds) replaces the client's for a call the node may hold open on
        purpose (a consumer fetch waits up to its ``expires``)."""
        options: dict[str, Any] = {}
        if timeout is not None:  # left out, the session's own applies (None would be none)
            options["timeout"] = aiohttp.ClientTimeout(total=timeout)
        async with self.session.request(method, self.base_url + path, params=params,
                                        json=body, headers=self._headers(),
                                        **options) as response:
            if response.status >= 400:
                raise await ApiError.from_response(response)
            if response.status == 204:
                return None
            data = await _read_bounded(response)
            return json.loads(data) if data else None

    async def _call_ndjson(self, path: str, lines: list[Json]) -> list[Json]:
        """POST ``lines`` as NDJSON; the answer's lines (NDJSON too), parsed."""
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        headers = self._headers({"Content-Type": "application/x-ndjson"})
        async with self.session.post(self.base_url + path, data=data,
                                     headers=headers) as response:
            if response.status >= 400:
                raise await ApiError.from_response(response)
            body = await _read_bounded(response)
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    @staticmethod
    def _cid(cid: str) -> str:
        return quote(str(cid), safe="")
