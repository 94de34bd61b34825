"""A client of Codex's app server (``codex app-server``), the JSON-RPC service behind Codex's own
terminal UI and IDE extensions: what peerd needs of it to hand a waiting Codex session new input.

Invariants:
* Transport: the WebSocket that a local Codex app server serves on a Unix socket: its control
  socket (``$CODEX_HOME/app-server-control/app-server-control.sock``, where Codex's terminal UI
  finds, or starts, the shared background server it runs its sessions in), or any
  ``codex app-server --listen unix://PATH``. One JSON-RPC message per text frame, without the
  ``"jsonrpc"`` member, as Codex writes them. The socket path is resolved first (Codex makes the
  control socket a link to a short path: a Unix socket's address is at most 107 bytes).
* A connection is usable once ``initialize`` (declaring ``experimentalApi``: the thread queue is
  experimental) and ``initialized`` are through. Responses are matched to requests by id;
  notifications go to ``on_note`` in arrival order and must return at once; a request from Codex
  (an approval, an elicitation) is answered at once with an error: peerd approves nothing on the
  user's behalf.
* Every failure is a ``CodexError``: ``unavailable`` (no socket, refused, the connection closed:
  every call then waiting fails with it), ``refused`` (a JSON-RPC error reply; its code and
  message kept) or ``timeout``. No aiohttp exception leaves this module.
* Bounded: each call waits at most its timeout, each frame is at most ``MAX_FRAME`` bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from peerd.errors import DaemonError
from replica.errors import RemoteError

CONTROL_SOCKET = Path("app-server-control") / "app-server-control.sock"  # in CODEX_HOME
CALL_TIMEOUT = 60.0  # a thread's MCP servers may take this long to start (mcpServerStatus/list waits)
CONNECT_TIMEOUT = 10.0
MAX_FRAME = 64 * 1024 * 1024  # a thread's tool list, or a turn's items, can run to megabytes
METHOD_NOT_FOUND = -32601

Note = Callable[[str, Mapping[str, Any]], None]


class CodexError(DaemonError, RemoteError):
    """Codex's app server could not be reached, closed the connection, did not answer in time
    (``kind`` ``unavailable`` or ``timeout``), or refused a request (``refused``, with its JSON-RPC
    ``code``)."""

    def __init__(self, message: str, *, kind: str, code: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code


def control_socket(codex_home: str | None = None) -> Path:
    """Where the Codex terminal UI's shared app server listens: under ``codex_home``, else
    ``$CODEX_HOME``, else ``~/.codex``."""
    home = codex_home or os.environ.get("CODEX_HOME") or str(Path.home() / ".codex")
    return Path(home).expanduser() / CONTROL_SOCKET


class CodexApp:
    """One initialized connection to a Codex app server."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse, on_note: Note) -> None:
        self._session = session
        self._ws = ws
        self._on_note = on_note
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._closed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.server: Mapping[str, Any] = {}  # initialize's result: userAgent (with Codex's version), codexHome

    @classmethod
    async def connect(cls, socket: Path, on_note: Note, *, client: str = "peerd", version: str = "") -> CodexApp:
        """Connect to the app server listening on ``socket`` and initialize the connection."""
        path = await asyncio.to_thread(os.path.realpath, socket)
        if not await asyncio.to_thread(os.path.exists, path):
            raise CodexError(f"no Codex app server listens at {socket}", kind="unavailable")
        session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path))
        try:
            ws = await session.ws_connect("ws://localhost/", max_msg_size=MAX_FRAME, autoping=True,
                                          timeout=aiohttp.ClientWSTimeout(ws_close=CONNECT_TIMEOUT))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            await session.close()
            raise CodexError(f"cannot connect to Codex's app server at {socket}: {exc}", kind="unavailable") from None
        app = cls(session, ws, on_note)
        app._reader = asyncio.create_task(app._read())
        try:
            app.server = await app.call("initialize", {
                "clientInfo": {"name": client, "title": "peerd", "version": version or "0"},
                "capabilities": {"experimentalApi": True}}, timeout=CONNECT_TIMEOUT)
            await app.notify("initialized")
        except BaseException:
            await app.close()
            raise
        return app

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *,
                   timeout: float = CALL_TIMEOUT) -> Any:  # noqa: ASYNC109 - each call has its own bound
        """Send a request and return its result; a JSON-RPC error reply is a ``refused`` error."""
        if self.closed:
            raise CodexError("the connection to Codex's app server is closed", kind="unavailable")
        ident = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[ident] = fut
        try:
            await self._send({"id": ident, "method": method, **({} if params is None else {"params": params})})
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise CodexError(f"Codex did not answer {method} within {timeout:.0f} s", kind="timeout") from None
        finally:
            self._calls.pop(ident, None)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        await self._send({"method": method, **({} if params is None else {"params": params})})

    async def close(self) -> None:
        self._fail_all("the connection to Codex's app server was closed")
        with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError):
            await self._ws.close()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._session.close()

    async def _send(self, message: Mapping[str, Any]) -> None:
        try:
            await self._ws.send_str(json.dumps(message))
        except (aiohttp.ClientError, OSError, RuntimeError) as exc:  # RuntimeError: aiohttp's "closing"
            self._fail_all(f"the connection to Codex's app server broke: {exc}")
            raise CodexError(f"the connection to Codex's app server broke: {exc}", kind="unavailable") from None

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    message = json.loads(frame.data)
                except ValueError:
                    continue
                if isinstance(message, dict):
                    await self._dispatch(message)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        finally:
            self._fail_all("Codex's app server closed the connection")

    async def _dispatch(self, message: dict[str, Any]) -> None:
        method, ident = message.get("method"), message.get("id")
        if isinstance(method, str) and ident is not None:  # a request to us: we grant nothing
            with contextlib.suppress(CodexError):
                await self._send({"id": ident, "error": {"code": METHOD_NOT_FOUND,
                                                         "message": "peerd answers no requests"}})
        elif isinstance(method, str):
            params = message.get("params")
            self._on_note(method, params if isinstance(params, dict) else {})
        elif isinstance(ident, int) and (fut := self._calls.get(ident)) is not None and not fut.done():
            error = message.get("error")
            if isinstance(error, dict):
                fut.set_exception(CodexError(f"Codex refused: {error.get('message', error)}", kind="refused",
                                             code=error.get("code") if isinstance(error.get("code"), int) else None))
            else:
                fut.set_result(message.get("result"))

    def _fail_all(self, why: str) -> None:
        self._closed.set()
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(CodexError(why, kind="unavailable"))
