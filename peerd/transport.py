"""How nodes reach each other: one small interface, over HTTP or in memory.

A transport carries opaque bodies (already sealed): ``post(addr, body)`` sends
one request and returns the ``Answer``; ``listen(server, host, port)`` hands
every request that arrives, with the caller's address, to a ``Server`` (the
node) and sends back its answer. It knows nothing of sealing or of the
protocol's messages.

* ``HttpTransport``: aiohttp, ``POST /v1`` on the peer port (the daemon, ``peerd doctor``), and
  ``POST /v1/join`` for machines not in the fleet yet (unsealed, ``peerd.protocol.join``; a body
  over ``JOIN_MAX_BODY`` is refused with 413). Both routes get the same bounds: connection caps,
  head and body time limits, ``max_body``.
* ``MemoryNetwork`` / ``MemoryTransport``: nodes in one process calling each
  other's ``Server.answer`` directly, no sockets (tests, like httpcore's mock
  backend or pycrdt's ``Channel``).

Invariants: a request that gets no answer raises ``TransportError`` naming the
peer and the kind of failure; aiohttp exceptions never escape; a reply over
``max_body`` fails the request; a 403 answer is plain text (the one reply that
is not sealed), every other one ``application/octet-stream``.

The HTTP server bounds what any client can hold (``ServeLimits``), whatever path
it asks for: a connection over its source's cap or the port's total cap is
closed as it is accepted (``limits.Gate``); one still without a complete request
head ``head_timeout`` after it opened (or after its last reply) is dropped; a
body not complete within ``body_timeout`` gets 408, one declared (or grown)
over ``max_body`` gets 413 before (or instead of) being read, and the
connection closes after either, once whatever the client still sends in the
next ``LINGER`` seconds has been read and dropped (so that it sees the answer
rather than a reset; nothing of it is kept). Every such refusal, and malformed HTTP, is
reported to the server (``Server.refuse``), which decides what to log; nothing
here logs a traceback for a client's fault.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError

from peerd.errors import DaemonError, TransportError
from peerd.limits import PEER_PER_SOURCE, Gate, open_file_limit, peer_caps
from peerd.linkio import GatedSite, open_ws, plain_address, serve_ws

PATH = "/v1"
JOIN_PATH = "/v1/join"
LINK_PATH = "/v1/link"  # the return path's links (``peerd.protocol.link`` states the same path)
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
        """A request or connection the transport turned away itself (too large, too slow, over the
        connection cap, malformed HTTP), for the server's log and counters."""

    async def link(self, channel: Channel, remote: str) -> None:
        """A link a member opened (``GET /v1/link``): held until this returns."""


class Channel(Protocol):
    """A long-lived two-way link carrying opaque binary frames (a WebSocket over HTTP)."""

    close_code: int | None
    close_reason: str

    async def send(self, data: bytes) -> None:
        """One frame; TransportError when the link is gone."""

    async def receive(self) -> bytes | None:
        """The next frame, or None once the link is closed (``close_code`` then says how)."""

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class Transport(Protocol):
    async def listen(self, server: Server, host: str, port: int) -> int:
        """Serve requests on ``host:port`` (0: any free port); returns the port."""

    async def post(self, addr: str, body: bytes, path: str = PATH) -> Answer:
        """One request to ``addr`` (``host:port``); TransportError when no answer comes."""

    async def open_link(self, addr: str, keepalive: float) -> Channel:
        """A link to ``addr``'s peer port, kept alive every ``keepalive`` seconds; TransportError
        when it cannot be opened."""

    async def close(self) -> None:
        """Stop serving and close every connection."""


# -- over HTTP ---------------------------------------------------------------------------------

HEAD_TIMEOUT = 10.0  # seconds from a connection (or the end of its last reply) to a complete request head
BODY_TIMEOUT = 10.0  # seconds from the head to the whole body
LINGER = 2.0  # seconds a refused body is still read (and dropped) so its sender sees the refusal, not a reset
CLIENT_KEEPALIVE = 5.0  # our client drops idle connections before a server's head timeout could


@dataclass(frozen=True)
class ServeLimits:
    """What one peer connection may hold: time for a head and a body, and how many
    connections one source address and all of them together may keep open."""

    max_connections: int
    per_source: int
    head_timeout: float = HEAD_TIMEOUT
    body_timeout: float = BODY_TIMEOUT

    @classmethod
    def for_open_files(cls, soft_nofile: int | None = None, per_source: int = PEER_PER_SOURCE) -> ServeLimits:
        total, per_source = peer_caps(open_file_limit() if soft_nofile is None else soft_nofile, per_source)
        return cls(total, per_source)


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger: a client's malformed HTTP (logged by aiohttp with a traceback, or at
    debug level for a first line that is not HTTP at all) is a refusal, reported through
    ``Server.refuse`` in one line; anything else is ours and keeps its traceback."""

    def __init__(self, report: Callable[[str, str], None]) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.report = report

    def _refusal(self, args: tuple[object, ...], exc_info: Any) -> bool:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if not isinstance(exc, HttpProcessingError):
            return False
        first = (exc.message or type(exc).__name__).strip().splitlines()[0]
        self.report(str(args[0]) if args else "", f"malformed HTTP ({first})")
        return True

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if not self._refusal(args, exc_info):
            super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        if exc_info is None or not self._refusal(args, exc_info):
            super().debug(msg, *args, exc_info=exc_info, **kwargs)


class HttpTransport:
    """aiohttp on both sides: a server on the peer port and a keep-alive client."""

    def __init__(self, *, max_body: int, total: float, connect: float | None = None,
                 read: float | None = None, limits: ServeLimits | None = None,
                 per_source: int = PEER_PER_SOURCE) -> None:
        """``limits`` of the peer port, or (None) sized from the open-file limit when it starts
        listening, with at most ``per_source`` connections per address."""
        self.max_body = max_body
        self.limits = limits
        self.per_source = per_source
        self._timeout = aiohttp.ClientTimeout(total=total, connect=connect, sock_read=read)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.gate: Gate | None = None

    async def listen(self, server: Server, host: str, port: int) -> int:
        limits = self.limits = self.limits or ServeLimits.for_open_files(per_source=self.per_source)
        app = web.Application(client_max_size=self.max_body,
                              middlewares=[bounded_body(server.refuse, self.max_body, limits.body_timeout)])
        app.router.add_post(PATH, self._handler(server))
        app.router.add_post(JOIN_PATH, self._join_handler(server))
        app.router.add_get(LINK_PATH, self._link_handler(server))
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, logger=_ServerLog(server.refuse),
            keepalive_timeout=limits.head_timeout,  # aiohttp drops a connection still awaiting a head then
            lingering_time=LINGER,  # after a 408 or 413, drain (never buffer) the rest briefly, then close
            auto_decompress=False,  # bodies are sealed: nothing to decompress, no decompression bomb
        )
        await self._runner.setup()
        gate = self.gate = Gate(limits.max_connections, limits.per_source)
        site = GatedSite(self._runner, host, port, gate,
                          lambda source: server.refuse(source, "too many connections from this address"
                                                       if gate.held(source) >= gate.per_source
                                                       else "the peer port is full"))
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise DaemonError(
                f"cannot listen for peers on {f'[{host}]' if ':' in host else host}:{port}: {exc.strerror or exc}"
                " (is another peerd running? pick another port with --port, or 0 for any free one)"
            ) from None
        return int(self._runner.addresses[0][1])

    @staticmethod
    def _handler(server: Server) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            answer = await server.answer(await request.read(), plain_address(request.remote or ""))  # read: cached
            if answer.status == 403:
                return web.Response(status=403, text=answer.body.decode(errors="replace"))
            return web.Response(status=answer.status, body=answer.body, content_type="application/octet-stream")

        return handle

    @staticmethod
    def _join_handler(server: Server) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()  # read already (``bounded_body``), within max_body and its time
            if len(body) > JOIN_MAX_BODY:
                server.refuse(request.remote or "", f"join request over the {JOIN_MAX_BODY}-byte limit")
                return web.Response(status=413, text="join request too large")
            answer = await server.join(body, plain_address(request.remote or ""))
            return web.Response(status=answer.status, body=answer.body, content_type="application/octet-stream")

        return handle

    def _link_handler(self, server: Server) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            ws, channel = await serve_ws(request, self.max_body)
            await server.link(channel, channel.peer)
            await channel.close()
            return ws

        return handle

    async def open_link(self, addr: str, keepalive: float) -> Channel:
        return await open_ws(addr, LINK_PATH, keepalive=keepalive, max_body=self.max_body,
                             connect=self._timeout.connect or 3.0)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=128, force_close=False, keepalive_timeout=CLIENT_KEEPALIVE),
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
        except (aiohttp.ClientError, OSError, ValueError) as exc:  # ValueError: a host no URL can hold
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


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bounded_body(refuse: Callable[[str, str], None], max_body: int, timeout: float) -> Middleware:
    """aiohttp middleware: every request's body is read before its handler runs (which then gets
    it from the request's cache), within ``max_body`` bytes and ``timeout`` seconds; refusals
    (413 on the declared length, unread; 413 past the limit; 408; 400 when cut off) go to
    ``refuse`` and close the connection. On every route, whoever adds one."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        remote = request.remote or ""
        declared = request.content_length
        if declared is not None and declared > max_body:  # refused unread
            return _closing(refuse, remote, 413, f"body of {declared} bytes is over the {max_body}-byte limit")
        try:
            async with asyncio.timeout(timeout):
                await request.read()
        except TimeoutError:
            return _closing(refuse, remote, 408, f"body not received within {timeout:g} s")
        except web.HTTPRequestEntityTooLarge:
            return _closing(refuse, remote, 413, f"body over the {max_body}-byte limit")
        except (ConnectionError, RequestPayloadError) as exc:  # gone mid-body, or a broken chunked body
            return _closing(refuse, remote, 400, f"body incomplete ({exc or type(exc).__name__})")
        return await handler(request)

    return middleware


def _closing(refuse: Callable[[str, str], None], remote: str, status: int, why: str) -> web.Response:
    """A refusal the transport makes itself: reported, and the connection closes."""
    refuse(remote, why)
    resp = web.Response(status=status, text=why)
    resp.force_close()
    return resp


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
    cuts: set[frozenset[str]] = field(default_factory=set)  # pairs of addresses that cannot reach each other
    _ports: itertools.count[int] = field(default_factory=lambda: itertools.count(20_000))

    def cut(self, *groups: Iterable[str]) -> None:
        """Split the network: no address of one group reaches one of another, either way."""
        sides = [set(g) for g in groups]
        for i, side in enumerate(sides):
            for other in sides[i + 1:]:
                self.cuts.update(frozenset((a, b)) for a in side for b in other)

    def heal(self) -> None:
        self.cuts.clear()

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
        if frozenset((self.addr, addr)) in self.network.cuts:
            raise TransportError("cannot reach: the network is cut", peer=addr, kind="unreachable",
                                 detail="no route to host")
        self.network.posts.append(Post(self.addr, addr, bytes(body), path))
        if path == JOIN_PATH:
            return await server.join(bytes(body), self.host)
        return await server.answer(bytes(body), self.host)

    async def open_link(self, addr: str, keepalive: float) -> Channel:
        raise TransportError("links are not carried in memory", peer=addr, kind="not-peerd")

    async def close(self) -> None:
        self.network.servers.pop(self.addr, None)
