"""The local server: JSON API (and MCP, mounted by the daemon) on 127.0.0.1 only.

Invariants: it binds 127.0.0.1; every request's Host must name a loopback
host and an Origin header, when present, must be a loopback origin, so a web
page cannot reach the API through DNS rebinding or a cross-site POST; replica
calls run off the event loop; bad arguments get 400 with the replica's
message and change nothing; unknown ids get 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Awaitable, Callable, Generator
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from peerd.errors import DaemonError
from replica import InvalidArgument, NotFound, PeerdError

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
MAX_JSON_BYTES = 1024 * 1024


def host_allowed(host_header: str | None) -> bool:
    if not host_header:
        return False
    host = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    if host_header.startswith("[") and "]:" in host_header:
        host = host_header.split("]:")[0] + "]"
    return host.lower() in LOOPBACK_HOSTS


def origin_allowed(origin: str | None) -> bool:
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and (parts.hostname or "").lower() in LOOPBACK_HOSTS


class LoopbackOnly:
    """ASGI middleware: 403 unless Host and Origin are loopback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            if not host_allowed(headers.get("host")) or not origin_allowed(headers.get("origin")):
                resp = JSONResponse({"error": "forbidden: this port only serves pages and clients on this machine"},
                                    status_code=403)
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_json(request: Request) -> dict[str, Any]:
    body = await request.body()
    if len(body) > MAX_JSON_BYTES:
        raise InvalidArgument(f"request body over {MAX_JSON_BYTES} bytes")
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise InvalidArgument("request body is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidArgument("request body must be a JSON object")
    return data


Endpoint = Callable[[Request], Awaitable[Any]]


def json_endpoint(fn: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler: its result as JSON, replica errors as 400/404 with the message."""

    async def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(await fn(request))
        except NotFound as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except (InvalidArgument, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except PeerdError as exc:
            return JSONResponse({"error": str(exc)}, status_code=500)

    return endpoint


def build_app(routes: list[BaseRoute], mcp: ASGIApp | None = None, mcp_prefix: str = "/mcp") -> ASGIApp:
    """The local app: our routes, with ``mcp`` (which owns the ASGI lifespan) under ``mcp_prefix``."""
    api = Starlette(routes=routes)
    if mcp is None:
        return LoopbackOnly(api)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "lifespan" or path == mcp_prefix or path.startswith(mcp_prefix + "/"):
            assert mcp is not None
            await mcp(scope, receive, send)
        else:
            await api(scope, receive, send)

    return LoopbackOnly(app)


def route(path: str, fn: Endpoint, methods: list[str]) -> Route:
    return Route(path, json_endpoint(fn), methods=methods)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the daemon handles signals itself


class LocalServer:
    """uvicorn serving the local app on 127.0.0.1 inside the daemon's event loop."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        self.app = app
        self.want_port = port
        self.port = 0
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # so asyncio sets TCP_NODELAY
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.want_port))
        except OSError as exc:
            sock.close()
            raise DaemonError(
                f"cannot listen on 127.0.0.1:{self.want_port} for MCP and the local API: {exc.strerror or exc}"
                " (is another peerd running? pick another port with --local-port, or 0 for any free one)"
            ) from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False,
                                timeout_graceful_shutdown=2)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("local server stopped during start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
