"""MCP tools over a replica: in-process server, stdio runner and the streamable HTTP app.

Invariants:
* Imports only ``replica`` of peerd (tests/test_layers.py): the daemon and ``peerd mcp`` host
  it; it never reaches into them.
* One ``TOOLS`` table and one ``build_server`` for every transport, so stdio, HTTP and an
  in-process server answer alike (a server with a ``PushHub`` adds ``replay_unread``).
* The names below load on first use: importing a light submodule (``mcp_server.localguard``,
  ``mcp_server.wiring``, ``mcp_server.arguments``, ``mcp_server.framing``) never loads the MCP SDK.

Entry points:

* ``build_server(replica, waiter=..., bind=...)`` -> ``MCPServer`` with every tool;
* ``run_stdio(home, role, instance)`` -> serve stdio on the replica in ``home``;
* ``http_app(replica, waiter=...)`` -> ASGI app for ``/mcp``, which peerd's local
  server mounts behind ``localguard.LocalOnly``;
* ``Wiring.over(replica, source)`` (``mcp_server.wiring``) -> the process's change feed
  over a replica, the one ``FeedWaiter`` on it that wakes ``wait`` calls when the feed
  moves, and MCP over HTTP or stdio on both: what every host builds;
* ``mcp_server.channel.PushHub`` -> pushes mail (Claude Code channel events) and
  resource updates to sessions, on the same feed; ``mcp_server.resources`` holds the
  inbox and thread resources, ``mcp_server.framing`` how mail is framed for an agent.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp_server.http import MCP_PATH, http_app
    from mcp_server.localguard import LocalOnly
    from mcp_server.server import build_server
    from mcp_server.stdio import run_stdio
    from mcp_server.tools import TOOLS, SessionBinding
    from mcp_server.wiring import Wiring
    from replica.feed import FeedWaiter, Waiter

_WHERE = {
    "MCP_PATH": "mcp_server.http", "http_app": "mcp_server.http", "LocalOnly": "mcp_server.localguard",
    "build_server": "mcp_server.server", "run_stdio": "mcp_server.stdio", "TOOLS": "mcp_server.tools",
    "SessionBinding": "mcp_server.tools", "FeedWaiter": "replica.feed", "Waiter": "replica.feed",
    "Wiring": "mcp_server.wiring",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'mcp_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "MCP_PATH",
    "TOOLS",
    "FeedWaiter",
    "LocalOnly",
    "SessionBinding",
    "Waiter",
    "Wiring",
    "build_server",
    "http_app",
    "run_stdio",
]
