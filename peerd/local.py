"""The one local server: the JSON API, the dashboard and MCP (at ``/mcp``) on 127.0.0.1.

Invariants:
* One uvicorn embedding serves everything on the local port, inside the
  daemon's event loop; it binds 127.0.0.1 itself (``port=0`` picks a free one)
  and never touches signal handlers.
* ``mcp_server.localguard.LocalOnly`` stands in front of every route: a
  request whose Host is not loopback or whose Origin is not this server's own
  gets 403, one that does not prove it can read the home (``LocalAuth``: the
  home's token, or a browser session) 401, a body that is not JSON 415, before
  anything reads its body. There is no app without a ``LocalAuth``.
* Resources are bounded before the app runs: a request head must arrive
  within ``HEAD_TIMEOUT`` (400 if still incomplete past ``MAX_HEADER_BYTES``), a body within
  ``BODY_TIMEOUT`` and ``MAX_BODY_BYTES`` (a larger ``Content-Length`` is
  refused unread; a chunked body is cut off at the limit), and connections
  beyond ``limits.connection_cap`` (under the open-file limit) are closed on accept.
* MCP is mounted lazily: the first request to ``/mcp`` imports and builds the
  MCP app in a worker thread (once, however many requests arrive together)
  and starts its lifespan; the server's shutdown stops it. Until then the
  daemon has not loaded the MCP SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import ClassVar

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from mcp_server.localauth import LocalAuth
from mcp_server.localguard import LocalOnly, send_error
from peerd.errors import DaemonError
from peerd.lazymount import LazyMount, McpBuilder
from peerd.limits import LOCAL_CONNECTIONS, connection_cap, open_file_limit
from replica.errors import TooLarge
from replica.ops import MAX_JSON_REQUEST_BYTES

log = logging.getLogger("peerd.local")

MCP_PATH = "/mcp"
MAX_BODY_BYTES = MAX_JSON_REQUEST_BYTES  # a largest message fits, even with every byte escaped in JSON
MAX_HEADER_BYTES = 32 * 1024
HEAD_TIMEOUT = 10.0  # seconds from a connection (or a request's first byte) to its complete head
BODY_TIMEOUT = 10.0  # seconds to receive a whole request body
KEEP_ALIVE = 5.0  # seconds an idle keep-alive connection stays open


def _open_file_cap() -> int:
    return connection_cap(open_file_limit(), LOCAL_CONNECTIONS)


@dataclass(frozen=True)
class Limits:
    """What one local client may hold: connections, time to send a head and a body, body size."""

    max_connections: int = field(default_factory=_open_file_cap)
    head_timeout: float = HEAD_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    max_body: int = MAX_BODY_BYTES


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's Content-Length (h11 has checked that it is one well-formed number), if any."""
    for name, value in headers:
        if name.lower() == b"content-length" and value.isdigit():
            return int(value)
    return None


def under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


# -- bounded bodies ---------------------------------------------------------------------------


class BodyTooLarge(TooLarge):
    """A request body past the local side's limit."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None if the client went away; BodyTooLarge past ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out ``body`` first, then whatever the connection says (a disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def again() -> Message:
        return pending.pop() if pending else await receive()

    return again


class BoundedBody:
    """ASGI middleware: read each request body up front, within a size limit and a deadline."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limit = limits.max_body
        self.timeout = limits.body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"request body over {self.limit} bytes"
        declared = declared_length(scope["headers"])
        if declared is not None and declared > self.limit:
            await send_error(send, 413, too_large)  # refused unread; the connection closes
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await read_body(receive, self.limit)
        except TimeoutError:
            await send_error(send, 408, f"request body not received within {self.timeout:g} s")
            return
        except BodyTooLarge:
            await send_error(send, 413, too_large)
            return
        if body is not None:
            await self.app(scope, replay(body, receive), send)


# -- the app ----------------------------------------------------------------------------------


@dataclass
class LocalApp:
    """The local port's ASGI app: guard, body bounds, then MCP or our routes."""

    api: ASGIApp
    mcp: LazyMount | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.mcp is not None and under(scope["path"], MCP_PATH):
            await self.mcp(scope, receive, send)
        else:
            await self.api(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.mcp is not None:
                    try:
                        await self.mcp.close()
                    except Exception:
                        log.exception("stopping MCP failed")
                await send({"type": "lifespan.shutdown.complete"})
                return


def build_app(routes: list[BaseRoute], mcp: McpBuilder | None = None, limits: Limits | None = None, *,
              auth: LocalAuth) -> ASGIApp:
    """The local port's app: ``routes``, and MCP at ``/mcp`` built by ``mcp`` on first use, for
    callers that ``auth`` admits."""
    app = LocalApp(Starlette(routes=routes), LazyMount(mcp) if mcp is not None else None)
    return LocalOnly(BoundedBody(app, limits or Limits()), auth)


def find_local_app(app: ASGIApp) -> LocalApp | None:
    """The ``LocalApp`` inside ``build_app``'s wrappers (tests and benchmarks look at its mount)."""
    while not isinstance(app, LocalApp):
        inner = getattr(app, "app", None)
        if inner is None:
            return None
        app = inner
    return app


# -- the server -------------------------------------------------------------------------------


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for each request head and a hard connection cap.

    uvicorn itself only times out idle keep-alive connections after a response;
    a connection that never completes its head would otherwise stay forever.
    """

    limits: ClassVar[Limits]
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.close()  # over the cap: give the file descriptor back at once
            return
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        """Arm the head deadline while a request head is awaited; disarm once it has arrived."""
        if self.conn.their_state is not h11.IDLE:
            self._stop_head_timer()
        elif self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_overdue)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def protocol_for(limits: Limits) -> type[BoundedH11]:
    return type("LocalH11", (BoundedH11,), {"limits": limits})


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the daemon handles signals itself

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # so asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise DaemonError(
            f"cannot listen on 127.0.0.1:{port} for MCP and the local API: {exc.strerror or exc}"
            " (is another peerd running? pick another port with --local-port, or 0 for any free one)"
        ) from None
    return sock


class LocalServer:
    """uvicorn serving the local app on 127.0.0.1 inside the running event loop."""

    def __init__(self, app: ASGIApp, port: int = 0, *, limits: Limits | None = None) -> None:
        self.app = app
        self.want_port = port
        self.port = 0
        self.limits = limits or Limits()
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return self.url + MCP_PATH

    def config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.app, lifespan="on", log_config=None, log_level="warning", access_log=False, ws="none",
            # Connections over the cap are closed on accept (BoundedH11), so uvicorn's own 503 only
            # answers when more requests than that are still running.
            http=protocol_for(self.limits), limit_concurrency=self.limits.max_connections + 1,
            timeout_keep_alive=int(KEEP_ALIVE), h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            timeout_graceful_shutdown=2,
        )

    async def start(self) -> None:
        sock = _bind(self.want_port)
        self.port = sock.getsockname()[1]
        server = self._server = _Server(self.config())
        task = self._task = asyncio.create_task(server.serve(sockets=[sock]))
        ready = asyncio.create_task(server.ready.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if not server.started:
            await self.stop()
            raise DaemonError("the local server stopped during start-up")

    async def stop(self) -> None:
        server, task = self._server, self._task
        self._server = self._task = None
        if server is not None and task is not None:
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> LocalServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
