"""The one Host/Origin guard of the local port (MCP at ``/mcp``, the JSON API, the dashboard).

Invariants:
* ``Host`` must be exactly ``hostname[:port]`` with hostname one of ``127.0.0.1``,
  ``localhost``, ``[::1]`` (ASCII, any case) and port all digits, 1-65535: no
  userinfo, no path, no other spelling of an address. Exactly one Host header.
* ``Origin``, when present (at most once), must be ``http://`` or ``https://``
  followed by such a host and nothing else; ``null`` and anything unparsable are
  refused. Absent ``Origin`` passes: command-line clients and agents send none.
* The rules are pure functions that never raise; every refusal is a 403 with
  one JSON body (``{"error": "forbidden: ..."}``) and ``Connection: close``,
  sent before the app sees the request or reads its body.

It imports nothing of the MCP SDK, so the daemon can guard its port without
loading MCP; MCP's own DNS-rebinding check is switched off behind it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST = r"(?:127\.0\.0\.1|localhost|\[::1\])(?::(?P<port>[0-9]{1,5}))?"
# re.ASCII: with Unicode case folding, "localho\u017ft" (a long s) would match "localhost".
_HOST_RE = re.compile(_HOST, re.ASCII | re.IGNORECASE)
_ORIGIN_RE = re.compile(r"https?://" + _HOST, re.ASCII | re.IGNORECASE)
FORBIDDEN_SUFFIX = "; this port only serves pages and clients on this machine"


def _port_ok(match: re.Match[str] | None) -> bool:
    if match is None:
        return False
    port = match.group("port")
    return port is None or 1 <= int(port) <= 65535


def host_allowed(host: str | None) -> bool:
    """True for ``127.0.0.1``, ``localhost`` or ``[::1]``, optionally with ``:port``."""
    return host is not None and _port_ok(_HOST_RE.fullmatch(host))


def origin_allowed(origin: str | None) -> bool:
    """True when absent, or an ``http(s)`` origin on a loopback name (optionally with a port)."""
    return origin is None or _port_ok(_ORIGIN_RE.fullmatch(origin))


def refusal(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a request with these (ASGI) headers is refused, or None if it may pass."""
    hosts: list[str] = []
    origins: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key == b"host":
            hosts.append(value.decode("latin-1"))
        elif key == b"origin":
            origins.append(value.decode("latin-1"))
    if len(hosts) != 1 or not host_allowed(hosts[0]):
        return "Host must be 127.0.0.1, localhost or [::1], with an optional port"
    if len(origins) > 1 or not origin_allowed(origins[0] if origins else None):
        return "Origin, when sent, must be http(s):// on 127.0.0.1, localhost or [::1]"
    return None


async def send_error(send: Send, status: int, message: str) -> None:
    """The local port's one error format: ``{"error": message}``, and the connection closes."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")],
    })
    await send({"type": "http.response.body", "body": body})


class LocalOnly:
    """ASGI middleware: 403 for any HTTP request whose Host or Origin is not loopback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (reason := refusal(scope["headers"])) is not None:
            await send_error(send, 403, f"forbidden: {reason}{FORBIDDEN_SUFFIX}")
            return
        await self.app(scope, receive, send)


__all__ = ["LOOPBACK_NAMES", "LocalOnly", "host_allowed", "origin_allowed", "refusal", "send_error"]
