"""MCP tools over a replica: in-process server, stdio runner and local streamable HTTP.

Imports only ``replica`` of peerd. Entry points:

* ``build_server(replica, waiter=..., bind=...)`` -> ``MCPServer`` with every tool;
* ``run_stdio(home, role, instance)`` -> serve stdio on the replica in ``home``;
* ``http_app(replica, waiter=...)`` -> ASGI app for ``/mcp`` (local callers only),
  hosted in a running loop by ``LocalHttpServer(app, port=0)``;
* ``FeedWaiter(feed)`` -> a ``Waiter`` that wakes ``wait`` calls when the process's
  ``replica.feed.ChangeFeed`` moves.

The names are loaded on first use, so ``mcp_server.waiter`` (which the daemon's
local API uses too) can be imported without loading the MCP SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp_server.local_http import MCP_PATH, LocalHttpServer, LocalOnly, http_app
    from mcp_server.server import build_server
    from mcp_server.stdio import run_stdio
    from mcp_server.tools import TOOLS, SessionBinding
    from mcp_server.waiter import FeedWaiter, Waiter

_HOMES = {
    "MCP_PATH": "local_http", "LocalHttpServer": "local_http", "LocalOnly": "local_http", "http_app": "local_http",
    "build_server": "server", "run_stdio": "stdio", "TOOLS": "tools", "SessionBinding": "tools",
    "FeedWaiter": "waiter", "Waiter": "waiter",
}


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'mcp_server' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mcp_server.{module}"), name)


__all__ = [
    "MCP_PATH", "TOOLS", "FeedWaiter", "LocalHttpServer", "LocalOnly", "SessionBinding",
    "Waiter", "build_server", "http_app", "run_stdio",
]
