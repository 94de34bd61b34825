"""The peer port's sockets: its listening socket (dual-stack), the gate every connection passes,
and its long-lived links (WebSockets).

* ``listening_socket(host, port)``: bound to every interface (``host`` "::" or "", the default),
  one IPv6 socket with ``IPV6_V6ONLY`` off takes IPv4 and IPv6 callers alike; where the machine
  has no IPv6 it falls back to IPv4 alone. "0.0.0.0" is every IPv4 interface; any other host is
  bound as given.
* ``GatedSite``: aiohttp's site on that socket, each connection admitted through a
  ``limits.Gate`` as it is accepted (by its plain source address) or closed at once.
* ``plain_address``: an IPv4 caller on a dual-stack socket shows as ``::ffff:a.b.c.d``; it is
  told as ``a.b.c.d`` everywhere (peer tables, caps, logs), as on an IPv4 socket.
* ``WsChannel``: one link's frames over aiohttp's WebSocket, on either side. Keepalives are
  WebSocket pings sent by the side that opened the link (``heartbeat``), answered by the other;
  a link whose ping goes unanswered closes.

Invariants: aiohttp and socket exceptions never escape a channel (``TransportError`` names the
peer); ``receive`` returns None exactly once the link is closed, with ``close_code`` and
``close_reason`` set.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import socket
from collections.abc import Callable

import aiohttp
from aiohttp import WSMsgType, web

from peerd.errors import TransportError
from peerd.limits import Gate

ALL = ("", "::", "0.0.0.0")  # the hosts that mean every interface
DUAL = ("", "::")  # ... of both families (dual-stack where there is IPv6); 0.0.0.0 is every IPv4 one
NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)  # an IPv6 socket cannot be had here
CLOSING = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)


def plain_address(host: str) -> str:
    """``host`` with an IPv4-mapped IPv6 address told as the IPv4 address it maps."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped) if mapped is not None else host


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket for the peer port; OSError when it cannot be had."""
    if host in DUAL and socket.has_ipv6:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(("::", port))
            except OSError:
                sock.close()
                raise
            return sock
        except OSError as exc:
            if exc.errno not in NO_IPV6:
                raise
        # no IPv6 here: IPv4 alone
    family = socket.AF_INET6 if ":" in host and host not in ALL else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0" if host in ALL else host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Admitted(asyncio.Protocol):
    """One connection, wrapped around aiohttp's protocol: admitted through the gate at once,
    or closed at once (its file descriptor given back) when its source or the port is full."""

    def __init__(self, inner: asyncio.Protocol, gate: Gate, refused: Callable[[str], None]) -> None:
        self.inner = inner
        self.gate = gate
        self.refused = refused
        self.source = ""
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.source = plain_address(str(peer[0])) if isinstance(peer, tuple) and peer else ""
        if not self.gate.admit(self.source):
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
            self.refused(self.source)
            return
        self.admitted = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            self.admitted = False
            self.gate.release(self.source)
            self.inner.connection_lost(exc)


class GatedSite(web.BaseSite):
    """A TCP site whose connections pass a ``Gate`` before aiohttp sees them."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, gate: Gate,
                 refused: Callable[[str], None]) -> None:
        super().__init__(runner, backlog=128)
        self._host, self._port = host, port
        self.gate = gate
        self._refused = refused

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        sock = listening_socket(self._host, self._port)  # every interface: dual-stack where there is IPv6
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Admitted(server(), self.gate, self._refused), sock=sock, backlog=self._backlog)


class WsChannel:
    """One link over a WebSocket (the server's ``WebSocketResponse`` or the client's)."""

    def __init__(self, ws: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, peer: str,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.ws = ws
        self.peer = peer
        self.session = session  # a client link's own session, closed with it
        self.close_code: int | None = None
        self.close_reason = ""

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send_bytes(data)
        except (ConnectionError, aiohttp.ClientError, RuntimeError, OSError) as exc:
            raise TransportError(f"link lost: {exc or type(exc).__name__}", peer=self.peer,
                                 kind="unreachable") from None

    async def receive(self) -> bytes | None:
        try:
            msg = await self.ws.receive()
        except (ConnectionError, aiohttp.ClientError, RuntimeError, OSError, TimeoutError) as exc:
            self._closed(None, f"link lost: {exc or type(exc).__name__}")
            return None
        if msg.type == WSMsgType.BINARY:
            return bytes(msg.data)
        if msg.type in CLOSING:
            reason = msg.extra if msg.type == WSMsgType.CLOSE and isinstance(msg.extra, str) else ""
            if msg.type == WSMsgType.ERROR:
                reason = f"link lost: {msg.data}"
            self._closed(self.ws.close_code, reason)
            return None
        return b""  # a text frame: no frame of ours (the link's reader refuses it)

    def _closed(self, code: int | None, reason: str) -> None:
        self.close_code, self.close_reason = code, reason

    async def close(self, code: int = 1000, reason: str = "") -> None:
        with contextlib.suppress(Exception):  # closing a link that is already gone
            await self.ws.close(code=code, message=reason.encode()[:120])
        if self.session is not None:
            await self.session.close()


async def open_ws(addr: str, path: str, *, keepalive: float, max_body: int, connect: float) -> WsChannel:
    """A client link to ``addr`` (its own session: a link outlives any request timeout)."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect),
                                    skip_auto_headers=("User-Agent",))
    try:
        ws = await session.ws_connect(f"http://{addr}{path}", heartbeat=keepalive, max_msg_size=max_body + 64,
                                      autoclose=True, autoping=True, proxy=None)
    except aiohttp.WSServerHandshakeError as exc:
        await session.close()
        raise TransportError(f"does not take links (HTTP {exc.status})", peer=addr, kind="not-peerd") from None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        await session.close()
        raise TransportError(f"cannot link: {exc or type(exc).__name__}", peer=addr, kind="unreachable") from None
    except BaseException:  # cancelled while connecting (the node stops): the session goes too
        await session.close()
        raise
    return WsChannel(ws, addr, session)


async def serve_ws(request: web.Request, max_body: int) -> tuple[web.WebSocketResponse, WsChannel]:
    """The server's side of a link, once upgraded."""
    ws = web.WebSocketResponse(max_msg_size=max_body + 64, autoping=True)
    await ws.prepare(request)
    return ws, WsChannel(ws, plain_address(request.remote or ""))
