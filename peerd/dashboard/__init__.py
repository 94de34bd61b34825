"""The dashboard: one page (HTML, CSS and JS shipped in this package) served on
the daemon's local port at ``/dashboard``; ``/`` redirects there.

Invariants: the page loads nothing from outside this daemon (no CDN, no web
fonts; it works offline); it sits behind the same loopback Host/Origin checks
as the API; its responses forbid framing and any script or style that is not
one of these files (Content-Security-Policy), and the script inserts message
text only as text, never as HTML. Everything live comes from the local API
(``/api/status``, ``/api/messages``, ``/api/search``, ``/api/events``).
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def asset(name: str) -> bytes:
    """The bytes of one shipped file (``index.html``, ``app.js``, ``style.css``)."""
    if name not in ASSETS:
        raise KeyError(name)
    return (resources.files(__name__) / "static" / name).read_bytes()


def page_routes() -> list[BaseRoute]:
    """Routes serving the dashboard (files are read once, when the routes are built)."""
    files = {name: asset(name) for name in ASSETS}

    def serve(name: str) -> Response:
        return Response(files[name], media_type=ASSETS[name], headers=SECURITY_HEADERS)

    async def root(_r: Request) -> Response:
        return RedirectResponse("/dashboard", status_code=302)

    async def index(_r: Request) -> Response:
        return serve("index.html")

    async def static(r: Request) -> Response:
        name = r.path_params["name"]
        if name not in files or name == "index.html":
            return Response("not found\n", status_code=404, media_type="text/plain")
        return serve(name)

    return [
        Route("/", root, methods=["GET"]),
        Route("/dashboard", index, methods=["GET"]),
        Route("/dashboard/{name}", static, methods=["GET"]),
    ]
