"""stdio MCP that answers every line: a line that is not JSON-RPC gets a JSON-RPC error.

The SDK's stdio reader turns a line it cannot parse (not JSON, truncated JSON,
a lone surrogate such as ``"\\ud800"``, JSON that is not a JSON-RPC message)
into an exception on the read stream, and its server loop drops such items
silently: a client that sent a request that way waits forever for its answer.

Invariants:
* ``AnswerBadLines`` wraps the read stream: every exception item is answered
  on the write stream with one JSON-RPC error: ``-32700`` "Parse error" with
  ``id`` null when the line is not JSON; ``-32600`` "Invalid Request" when it is
  a JSON object but not a JSON-RPC message, with the object's ``id`` when that
  is a string or an integer (so the caller's request is answered, not left
  waiting), else null. It is never passed on, and the server keeps reading.
* An error's ``data`` names the problem (the parser's words), never the line
  itself, so nothing a client sent is echoed back (a lone surrogate could not
  be written out as UTF-8).
* ``guarded_stdio`` is the SDK's ``stdio_server`` with that wrapper on its read
  stream. On pipes it reads and writes them on the event loop (``mcp_server.pipes``, which
  also claims fd 0 and 1 as the SDK does); elsewhere the SDK's transport does both. The SDK
  parses every line and writes every message either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, cast

import mcp_types as types
from mcp.server import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from mcp_server.pipes import loop_stdio

DETAIL_MAX = 200


def _request_id(inputs: list[Any]) -> str | int | None:
    """The ``id`` of the JSON object a validation failed on, when it is one a reply can carry."""
    for value in inputs:
        if isinstance(value, dict):
            rid = value.get("id")
            if isinstance(rid, str) and rid.isprintable() and len(rid) <= DETAIL_MAX:
                return rid
            if isinstance(rid, int) and not isinstance(rid, bool) and -(2**63) <= rid < 2**63:
                return rid
    return None


def error_for(exc: Exception) -> types.JSONRPCError:
    """The JSON-RPC error answering a line that failed to parse with ``exc``."""
    code, message, rid = types.PARSE_ERROR, "Parse error", None
    detail = type(exc).__name__
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_context=False)
        if not any(e["type"] == "json_invalid" for e in errors):
            code, message = types.INVALID_REQUEST, "Invalid Request"
            rid = _request_id([e.get("input") for e in errors])
        if errors:
            detail = str(errors[0]["msg"])
    safe = detail.encode("utf-8", "replace").decode("utf-8")[:DETAIL_MAX]
    return types.JSONRPCError(jsonrpc="2.0", id=rid, error=types.ErrorData(code=code, message=message, data=safe))


class AnswerBadLines:
    """A read stream that answers the lines the SDK could not parse instead of dropping them."""

    def __init__(self, inner: ReadStream[SessionMessage | Exception], write: WriteStream[SessionMessage]) -> None:
        self.inner = inner
        self.write = write

    @property
    def last_context(self) -> Any:
        return getattr(self.inner, "last_context", None)

    async def _pass(self, item: SessionMessage | Exception) -> SessionMessage | None:
        if isinstance(item, Exception):
            await self.write.send(SessionMessage(error_for(item)))
            return None
        return item

    async def receive(self) -> SessionMessage:
        while (item := await self._pass(await self.inner.receive())) is None:
            pass
        return item

    def __aiter__(self) -> AnswerBadLines:
        return self

    async def __anext__(self) -> SessionMessage:
        while (item := await self._pass(await self.inner.__anext__())) is None:
            pass
        return item

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> AnswerBadLines:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                        exc_tb: TracebackType | None) -> bool | None:
        await self.aclose()
        return None


@asynccontextmanager
async def guarded_stdio() -> AsyncIterator[tuple[AnswerBadLines, WriteStream[SessionMessage]]]:
    """``stdio_server()`` (on the event loop when stdin and stdout are pipes), answering
    unparseable lines with JSON-RPC errors."""
    async with loop_stdio() as pipes:
        stdin, stdout = pipes if pipes is not None else (None, None)
        async with stdio_server(cast(Any, stdin), cast(Any, stdout)) as (read, write):
            yield AnswerBadLines(read, write), write


async def run_guarded(server: MCPServer[Any]) -> None:
    """``server.run_stdio_async()``, through ``guarded_stdio``."""
    lowlevel = server._lowlevel_server
    async with guarded_stdio() as (read, write):
        await lowlevel.run(read, write, lowlevel.create_initialization_options())
