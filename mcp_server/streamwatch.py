"""Seeing an HTTP session's push stream open and close: ASGI middleware in front of the MCP app.

Invariants:
- The hub hears ``stream_opened`` only once the SDK answered a session's GET (server-to-client)
  stream with 200, so a push is never recorded for a stream that is not there; it hears
  ``stream_closed`` when that request ends, however it ends.
- A DELETE ends the session in the hub after the SDK has answered it; the app's shutdown stops
  the hub (its followers) before the app goes.
- Every other request passes through untouched, only marking its session as seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from mcp_server.channel import PushHub


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1")).strip() or None
    return None


class StreamWatch:
    """ASGI middleware in front of the MCP app: tells the hub when a session's GET (server-to-client)
    stream is open, when it closes, and when a session ends (DELETE); stops the hub at shutdown."""

    def __init__(self, app: ASGIApp, hub: PushHub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        key = _header(scope, b"mcp-session-id") if scope["type"] == "http" else None
        if key is None:
            await self.app(scope, receive, send)
            return
        self.hub.touch(key)
        if scope["method"] == "GET" and "text/event-stream" in (_header(scope, b"accept") or ""):
            await self._stream(key, scope, receive, send)
        elif scope["method"] == "DELETE":
            try:
                await self.app(scope, receive, send)
            finally:
                self.hub.session_closed(key)
        else:
            await self.app(scope, receive, send)

    async def _stream(self, key: str, scope: Scope, receive: Receive, send: Send) -> None:
        opened = False

        async def watch(message: Message) -> None:
            nonlocal opened
            await send(message)
            if message["type"] == "http.response.start" and message.get("status") == 200 and not opened:
                opened = True  # the SDK registers the stream in the same step; pushes start after it
                self.hub.stream_opened(key)

        try:
            await self.app(scope, receive, watch)
        finally:
            if opened:
                self.hub.stream_closed(key)

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.hub.aclose()
            return message

        return wrapped
