"""MCP over streamable HTTP on the local port: the ASGI app and a small uvicorn host.

Invariants:
* Only local callers get through: the Host header must name 127.0.0.1 or
  localhost (any port) and an Origin header, when present, must be an http(s)
  origin on one of those hosts; anything else gets 403 before the MCP layer.
* A session is bound by headers (``X-Peerd-Role``, ``X-Peerd-Instance``) or by
  query parameters (``/mcp?role=&instance=``), read on every request.
* ``LocalHttpServer`` binds 127.0.0.1 itself, so its port (``port=0`` picks a
  free one) is known before it serves, and it never touches signal handlers:
  it can run as a task inside the daemon's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from types import TracebackType
from urllib.parse import urlsplit

import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_server.server import ReplicaSource, build_server
from mcp_server.tools import FleetIdProvider
from mcp_server.waiter import Waiter

MCP_PATH = "/mcp"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})


def _hostname(authority: str) -> str:
    if authority.startswith("["):
        return authority.split("]", 1)[0] + "]"
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def host_allowed(host: str | None) -> bool:
    return host is not None and _hostname(host.strip().lower()) in LOCAL_HOSTS


def origin_allowed(origin: str | None) -> bool:
    if origin is None:
        return True  # not a browser page: non-browser clients send no Origin
    try:
        parts = urlsplit(origin.strip().lower())
        return parts.scheme in ("http", "https") and parts.hostname in LOCAL_HOSTS
    except ValueError:
        return False


class LocalOnly:
    """ASGI middleware: 403 for any HTTP request whose Host or Origin is not local."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if not host_allowed(headers.get("host")) or not origin_allowed(headers.get("origin")):
                await _forbidden(send)
                return
        await self.app(scope, receive, send)


async def _forbidden(send: Send) -> None:
    body = b"forbidden: only local pages and clients (127.0.0.1, localhost) may use this endpoint\n"
    await send({
        "type": "http.response.start",
        "status": 403,
        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})


def http_app(replica: ReplicaSource, *, waiter: Waiter, fleet_id: FleetIdProvider | None = None,
             path: str = MCP_PATH) -> ASGIApp:
    """The ASGI app serving MCP streamable HTTP at ``path``, local callers only.

    Its ASGI lifespan runs the MCP session manager: the host must run lifespan
    (``LocalHttpServer`` and uvicorn do), once.
    """
    server = build_server(replica, waiter=waiter, bind=None, fleet_id=fleet_id)
    # The SDK's own check answers a bad Host with 421; LocalOnly answers both with 403.
    inner = server.streamable_http_app(
        streamable_http_path=path,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return LocalOnly(inner)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its SIGINT/SIGTERM handlers: the host process owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class LocalHttpServer:
    """Serve an ASGI app on 127.0.0.1 from inside a running event loop."""

    def __init__(self, app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._server: _EmbeddedUvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """The MCP endpoint: ``http://127.0.0.1:<port>/mcp``."""
        return f"http://{self._host}:{self._port}{MCP_PATH}"

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # so asyncio sets TCP_NODELAY
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._port))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, lifespan="on", log_config=None, log_level="warning",
                                access_log=False)
        self._server = _EmbeddedUvicorn(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the MCP HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._server = self._task = None

    async def __aenter__(self) -> LocalHttpServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


__all__ = ["MCP_PATH", "LocalHttpServer", "LocalOnly", "host_allowed", "http_app", "origin_allowed"]
