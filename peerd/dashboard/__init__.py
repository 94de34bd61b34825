"""The dashboard: one page (HTML, CSS and JS shipped in this package) served on
the daemon's local port at ``/dashboard``; ``/`` redirects there.

Invariants: the page loads nothing from outside this daemon (no CDN, no web
fonts; it works offline); it sits behind the same guard as the API (loopback
Host, this port's own Origin, and credentials); its responses forbid framing
and any script or style that is not one of these files (Content-Security-Policy),
and the script inserts message text only as text, never as HTML. Everything live
comes from the local API (``/api/status``, ``/api/messages``, ``/api/search``,
``/api/events``): those reads and the page's own files are what a browser
session (opened by a one-time login link, ``POST /api/login``) may do
(``browser_path``); anything else needs the home's token.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from mcp_server.localauth import LOGIN_PATH, LocalAuth
from mcp_server.localguard import own_port
from peerd.apiargs import route

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


BROWSER_PATHS = frozenset({"/", "/dashboard", "/api/status", "/api/messages", "/api/search", "/api/events"})


def browser_path(path: str) -> bool:
    """What the page reads (its files, status, messages, search, events): all a browser session may do."""
    return path in BROWSER_PATHS or path.startswith("/dashboard/")


def login_url(base: str, code: str) -> str:
    """The link that opens a browser session on the daemon at ``base`` (``http://127.0.0.1:PORT``)."""
    return f"{base}{LOGIN_PATH}?code={code}"


def login_routes(auth: LocalAuth) -> list[BaseRoute]:
    """``POST /api/login``: a fresh one-time login link (for ``peerd dashboard``)."""

    async def new_login(r: Request) -> Any:
        base = f"http://127.0.0.1:{own_port(r.scope) or r.url.port}"
        return {"url": login_url(base, auth.new_login()), "expires_in": int(auth.login_ttl)}

    return [route("/api/login", new_login, ["POST"])]


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
