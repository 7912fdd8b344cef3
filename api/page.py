"""The node's web page: ``/`` and the few static files it loads, shipped in ``api/static``.

The page is plain hand-written HTML, CSS and JavaScript that reads the same REST endpoints
as any client (no build step, nothing fetched from elsewhere: the machines that run nodes
may have no internet). Everything here is a read, so no token is needed; the page's forms
send the token the user types with each state-changing call, as any client does.

Topic names and payloads come off the network, so the page treats every value as text,
and every answer here carries a Content-Security-Policy that allows only this origin's
scripts and styles (no inline script): a value that slipped into markup still could not
run.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

__all__ = ["ASSETS", "CSP", "routes"]

CSP = ("default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
"""Only this origin (the API the page reads); no framing, no inline script or style."""

ASSETS: dict[str, str] = {
    "app.js": "text/javascript",
    "style.css": "text/css",
}
"""The static files besides ``index.html``, by name, with their content types."""

_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A node may be upgraded in place: the page must not outlive the API it was written for.
    "Cache-Control": "no-cache",
}

routes = web.RouteTableDef()


def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _answer(name: str, content_type: str) -> web.Response:
    # Read on each request (a few KiB): an edited file shows on reload, and nothing is
    # held for a page nobody opens.
    return web.Response(body=_read(name), content_type=content_type, charset="utf-8",
                        headers=_HEADERS)


@routes.get("/")
async def page(request: web.Request) -> web.Response:
    return _answer("index.html", "text/html")


@routes.get("/static/{name}")
async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    content_type = ASSETS.get(name)
    if content_type is None:  # only the listed files: no path ever reaches the disk
        raise web.HTTPNotFound()
    return _answer(name, content_type)
