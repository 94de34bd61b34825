"""The one guard of the local port (MCP at ``/mcp``, the JSON API, the dashboard): where a request
comes from, who sends it, and what its body is.

Invariants, checked in this order before the app sees a request or anything reads its body:
* ``Host`` must be exactly ``hostname[:port]`` with hostname one of ``127.0.0.1``,
  ``localhost``, ``[::1]`` (ASCII, any case) and port all digits, 1-65535: no
  userinfo, no path, no other spelling of an address. Exactly one Host header.
* ``Origin``, when present (at most once), must be this server's own origin: ``http://``, a
  loopback name and the port the request came in on (``scope["server"]``), nothing else; another
  port of this machine, ``https``, ``null`` and anything unparsable are refused. Absent ``Origin``
  passes: command-line clients and agents send none. Failing either: 403.
* The caller proves it can read the home (``mcp_server.localauth``): the home's token as a bearer
  token, or a browser session on the browser's own paths; else 401 with ``WWW-Authenticate:
  Bearer`` and a body saying where the token is. ``/login?code=`` is the one door without
  credentials: a live login code opens a session (an HttpOnly, SameSite=Strict cookie for this
  port) and redirects to the dashboard; any other code gets 401.
* A request with a body (POST, PUT, PATCH, DELETE) must say ``Content-Type: application/json``
  (parameters allowed); a type a web form can send, or a body with none, gets 415.
* The rules are pure functions that never raise; every refusal is one JSON body
  (``{"error": "..."}``) and ``Connection: close``.

It imports nothing of the MCP SDK, so the daemon can guard its port without loading MCP; MCP's
own DNS-rebinding check is switched off behind it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_server.localauth import LOGIN_PATH, LocalAuth, bearer, cookie, cookie_name

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST = r"(?:127\.0\.0\.1|localhost|\[::1\])(?::(?P<port>[0-9]{1,5}))?"
# re.ASCII: with Unicode case folding, "localho\u017ft" (a long s) would match "localhost".
_HOST_RE = re.compile(_HOST, re.ASCII | re.IGNORECASE)
_ORIGIN_RE = re.compile(r"http://" + _HOST, re.ASCII | re.IGNORECASE)
FORBIDDEN_SUFFIX = "; this port only serves pages and clients on this machine"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPE = "application/json"
LANDING = "/dashboard"  # where a login link leads
_WANTED = frozenset({b"host", b"origin", b"authorization", b"cookie", b"content-type", b"content-length",
                     b"transfer-encoding", b"sec-fetch-site"})

Heads = dict[bytes, list[str]]


def gather(headers: Iterable[tuple[bytes, bytes]]) -> Heads:
    """The headers the guard looks at, by lower-case name, each with every value sent."""
    out: Heads = {}
    for name, value in headers:
        key = name.lower()
        if key in _WANTED:
            out.setdefault(key, []).append(value.decode("latin-1"))
    return out


def _port_ok(match: re.Match[str] | None) -> bool:
    if match is None:
        return False
    port = match.group("port")
    return port is None or 1 <= int(port) <= 65535


def host_allowed(host: str | None) -> bool:
    """True for ``127.0.0.1``, ``localhost`` or ``[::1]``, optionally with ``:port``."""
    return host is not None and _port_ok(_HOST_RE.fullmatch(host))


def origin_allowed(origin: str | None, port: int | None) -> bool:
    """True when absent, or exactly this server's own origin: ``http://`` on a loopback name with
    the server's ``port`` (written as browsers write it: no leading zeros; none for port 80)."""
    if origin is None:
        return True
    match = _ORIGIN_RE.fullmatch(origin)
    if match is None or port is None:
        return False
    given = match.group("port")
    return given == str(port) if given is not None else port == 80


def own_port(scope: Scope) -> int | None:
    """The port this request came in on (the ASGI server's own address), if the server says."""
    server = scope.get("server")
    return server[1] if isinstance(server, tuple | list) and len(server) == 2 else None


def refusal(headers: Iterable[tuple[bytes, bytes]] | Heads, port: int | None = None) -> str | None:
    """Why a request with these headers (ASGI pairs, or ``gather``'s) is refused where it comes
    from, or None if it may pass."""
    h = headers if isinstance(headers, dict) else gather(headers)
    hosts, origins = h.get(b"host", []), h.get(b"origin", [])
    if len(hosts) != 1 or not host_allowed(hosts[0]):
        return "Host must be 127.0.0.1, localhost or [::1], with an optional port"
    if len(origins) > 1 or not origin_allowed(origins[0] if origins else None, port):
        return (f"Origin, when sent, must be this server's own: http://127.0.0.1:{port}, http://localhost:{port} "
                f"or http://[::1]:{port}")
    return None


def has_body(h: Heads) -> bool:
    """Whether the request says a body follows (a non-zero length, or chunks)."""
    lengths = h.get(b"content-length", [])
    return bool(h.get(b"transfer-encoding")) or any(v.strip() not in ("", "0") for v in lengths)


def media_refusal(method: str, h: Heads) -> str | None:
    """Why a request's body is refused for its type (a form can send it, or it has none), or None."""
    if method not in BODY_METHODS:
        return None
    types = h.get(b"content-type", [])
    if not types:
        return None if not has_body(h) else f"a request body needs Content-Type: {JSON_TYPE}"
    if len(types) != 1 or types[0].split(";", 1)[0].strip().lower() != JSON_TYPE:
        return f"request bodies must be {JSON_TYPE} (Content-Type: {JSON_TYPE}), not {', '.join(types)!r}"
    return None


async def send_error(send: Send, status: int, message: str,
                     headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """The local port's one error format: ``{"error": message}``, and the connection closes."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"), *headers],
    })
    await send({"type": "http.response.body", "body": body})


def login_code(query_string: bytes) -> str | None:
    """The ``code`` of a login link's query, if it has one."""
    codes = parse_qs(query_string.decode("latin-1")).get("code")
    return codes[0] if codes else None


def session_cookie(name: str, value: str, max_age: int) -> bytes:
    return f"{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}".encode("latin-1")


class LocalOnly:
    """ASGI middleware: the guard above, in front of every HTTP request of the local port."""

    def __init__(self, app: ASGIApp, auth: LocalAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        h = gather(scope["headers"])
        port = own_port(scope)
        if (reason := refusal(h, port)) is not None:
            await send_error(send, 403, f"forbidden: {reason}{FORBIDDEN_SUFFIX}")
        elif scope["path"] == LOGIN_PATH:
            await self._login(scope, send, port)
        elif (why := self._unauthorized(scope, h, port)) is not None:
            await send_error(send, 401, f"unauthorized: {why}", [(b"www-authenticate", b"Bearer")])
        elif (reason := media_refusal(scope["method"], h)) is not None:
            await send_error(send, 415, reason)
        else:
            await self.app(scope, receive, send)

    def _unauthorized(self, scope: Scope, h: Heads, port: int | None) -> str | None:
        """None when the caller is admitted, else what to tell it."""
        auth = self.auth
        if auth.token_ok(bearer(h.get(b"authorization", []))):
            return None
        if h.get(b"authorization"):
            return f"wrong token; {auth.how}"
        fetch_site = h.get(b"sec-fetch-site", [None])[-1]
        if not auth.browser_ok(scope["method"], scope["path"], fetch_site):
            return auth.how
        value = cookie(h.get(b"cookie", []), cookie_name(port))
        if auth.session_ok(value):
            return None
        return auth.how if value is None else f"this browser session has ended; {auth.relogin}"

    async def _login(self, scope: Scope, send: Send, port: int | None) -> None:
        if scope["method"] != "GET":  # not even HEAD: a prefetch must not use the code up
            await send_error(send, 405, "a login link is opened with GET", [(b"allow", b"GET")])
            return
        session = self.auth.redeem(login_code(scope["query_string"]))
        if session is None:
            await send_error(send, 401, f"unauthorized: this login link is not valid (used already, expired, or "
                             f"mistyped); {self.auth.relogin}", [(b"www-authenticate", b"Bearer")])
            return
        await send({"type": "http.response.start", "status": 303, "headers": [
            (b"location", LANDING.encode()), (b"content-length", b"0"), (b"cache-control", b"no-store"),
            (b"referrer-policy", b"no-referrer"),
            (b"set-cookie", session_cookie(cookie_name(port), session.value, session.max_age))]})
        await send({"type": "http.response.body", "body": b""})


__all__ = ["LOOPBACK_NAMES", "LocalOnly", "gather", "host_allowed", "media_refusal", "origin_allowed", "refusal",
           "send_error"]
