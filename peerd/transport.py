"""How nodes reach each other: one small interface, over HTTP or in memory.

A transport carries opaque bodies (already sealed): ``post(addr, body)`` sends
one request and returns the ``Answer``; ``listen(server, host, port)`` hands
every request that arrives, with the caller's address, to a ``Server`` (the
node) and sends back its answer. It knows nothing of sealing or of the
protocol's messages.

* ``HttpTransport``: aiohttp, ``POST /v1`` on the peer port (the daemon, ``peerd doctor``), and
  ``POST /v1/join`` for machines not in the fleet yet (unsealed, ``peerd.protocol.join``; its body
  is refused past ``JOIN_MAX_BODY`` before it is read whole).
* ``MemoryNetwork`` / ``MemoryTransport``: nodes in one process calling each
  other's ``Server.answer`` directly, no sockets (tests, like httpcore's mock
  backend or pycrdt's ``Channel``).

Invariants: a request that gets no answer raises ``TransportError`` naming the
peer and the kind of failure; aiohttp exceptions never escape; a reply over
``max_body`` fails the request, and a request over it is refused with 413 and
reported to the server (``Server.refuse``); a 403 answer is plain text (the
one reply that is not sealed), every other one ``application/octet-stream``.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import aiohttp
from aiohttp import web

from peerd.errors import DaemonError, TransportError

PATH = "/v1"
JOIN_PATH = "/v1/join"
JOIN_MAX_BODY = 2048
READ_CHUNK = 65536


class Answer(NamedTuple):
    status: int
    body: bytes
    date: str | None = None  # the HTTP Date header, when there is one (a clock hint for ``peerd doctor``)


class Server(Protocol):
    """What a transport delivers requests to."""

    async def answer(self, body: bytes, remote: str) -> Answer: ...

    async def join(self, body: bytes, remote: str) -> Answer:
        """One unsealed join request (``POST /v1/join``) from a machine not in the fleet yet."""

    def refuse(self, remote: str, why: str) -> None:
        """A request the transport turned away itself (too large), for the server's log and counters."""


class Transport(Protocol):
    async def listen(self, server: Server, host: str, port: int) -> int:
        """Serve requests on ``host:port`` (0: any free port); returns the port."""

    async def post(self, addr: str, body: bytes, path: str = PATH) -> Answer:
        """One request to ``addr`` (``host:port``); TransportError when no answer comes."""

    async def close(self) -> None:
        """Stop serving and close every connection."""


# -- over HTTP ---------------------------------------------------------------------------------


class HttpTransport:
    """aiohttp on both sides: a server on the peer port and a keep-alive client."""

    def __init__(self, *, max_body: int, total: float, connect: float | None = None,
                 read: float | None = None) -> None:
        self.max_body = max_body
        self._timeout = aiohttp.ClientTimeout(total=total, connect=connect, sock_read=read)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def listen(self, server: Server, host: str, port: int) -> int:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post(PATH, self._handler(server))
        app.router.add_post(JOIN_PATH, self._join_handler(server))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, port, reuse_address=True).start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise DaemonError(
                f"cannot listen for peers on {host}:{port}: {exc.strerror or exc}"
                " (is another peerd running? pick another port with --port, or 0 for any free one)"
            ) from None
        return int(self._runner.addresses[0][1])

    def _handler(self, server: Server) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            remote = request.remote or ""
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                server.refuse(remote, f"body over the {self.max_body}-byte limit")
                raise
            answer = await server.answer(body, remote)
            if answer.status == 403:
                return web.Response(status=403, text=answer.body.decode(errors="replace"))
            return web.Response(status=answer.status, body=answer.body, content_type="application/octet-stream")

        return handle

    def _join_handler(self, server: Server) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            remote = request.remote or ""
            if request.content_length is not None and request.content_length > JOIN_MAX_BODY:
                server.refuse(remote, f"join request over the {JOIN_MAX_BODY}-byte limit")
                return web.Response(status=413, text="join request too large")
            body = await request.content.read(JOIN_MAX_BODY + 1)
            if len(body) > JOIN_MAX_BODY:
                server.refuse(remote, f"join request over the {JOIN_MAX_BODY}-byte limit")
                return web.Response(status=413, text="join request too large")
            answer = await server.join(body, remote)
            return web.Response(status=answer.status, body=answer.body, content_type="application/octet-stream")

        return handle

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=128, force_close=False),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            )
        return self._session

    async def post(self, addr: str, body: bytes, path: str = PATH) -> Answer:
        try:
            async with self._client().post(f"http://{addr}{path}", data=body) as resp:
                data = await self._read_capped(resp, addr)
                return Answer(resp.status, data, resp.headers.get("Date"))
        except TimeoutError:
            raise TransportError("no answer in time (timed out)", peer=addr, kind="timeout") from None
        except (aiohttp.ClientError, OSError) as exc:
            kind, detail = classify(exc)
            raise TransportError(f"cannot reach: {str(exc) or type(exc).__name__}", peer=addr, kind=kind,
                                 detail=detail) from None

    async def _read_capped(self, resp: aiohttp.ClientResponse, addr: str) -> bytes:
        """A reply body, refusing one larger than ``max_body``."""
        limit = self.max_body
        if resp.content_length is not None and resp.content_length > limit:
            raise TransportError(f"reply of {resp.content_length} bytes is over the {limit}-byte limit",
                                 peer=addr, kind="too-large")
        data = bytearray()
        async for chunk in resp.content.iter_chunked(READ_CHUNK):
            data += chunk
            if len(data) > limit:
                raise TransportError(f"reply is over the {limit}-byte limit", peer=addr, kind="too-large")
        return bytes(data)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def classify(exc: BaseException) -> tuple[str, str]:
    """(kind, reason) of a failed HTTP request: nothing listens, no way there, or not a peer port."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) or str(exc)
        return ("refused" if isinstance(exc.os_error, ConnectionRefusedError) else "unreachable"), reason
    if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError
                  | ConnectionError):
        return "not-peerd", type(exc).__name__
    if isinstance(exc, OSError):
        return "unreachable", exc.strerror or str(exc) or type(exc).__name__
    return "unreachable", str(exc) or type(exc).__name__


# -- in memory ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Post:
    """One request as a memory network carried it."""

    src: str  # the caller's own address, once it listens ("" before)
    dst: str
    body: bytes
    path: str = PATH


@dataclass
class MemoryNetwork:
    """Nodes in one process reaching each other's servers by ``host:port``, with no sockets."""

    servers: dict[str, Server] = field(default_factory=dict)
    posts: list[Post] = field(default_factory=list)  # every request carried, in order
    _ports: itertools.count[int] = field(default_factory=lambda: itertools.count(20_000))

    def transport(self, host: str = "127.0.0.1") -> MemoryTransport:
        return MemoryTransport(self, host)

    def next_port(self) -> int:
        return next(self._ports)


class MemoryTransport:
    """A node's place on a ``MemoryNetwork``: its server's address and its client."""

    def __init__(self, network: MemoryNetwork, host: str) -> None:
        self.network = network
        self.host = host
        self.addr = ""

    async def listen(self, server: Server, host: str, port: int) -> int:
        port = port or self.network.next_port()
        addr = f"{self.host}:{port}"
        if addr in self.network.servers:
            raise DaemonError(f"cannot listen for peers on {addr}: address already in use")
        self.network.servers[addr] = server
        self.addr = addr
        return port

    async def post(self, addr: str, body: bytes, path: str = PATH) -> Answer:
        server = self.network.servers.get(addr)
        if server is None:
            raise TransportError("cannot reach: nothing listens there", peer=addr, kind="refused",
                                 detail="connection refused")
        self.network.posts.append(Post(self.addr, addr, bytes(body), path))
        if path == JOIN_PATH:
            return await server.join(bytes(body), self.host)
        return await server.answer(bytes(body), self.host)

    async def close(self) -> None:
        self.network.servers.pop(self.addr, None)
