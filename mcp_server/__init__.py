"""MCP tools over a replica: in-process server, stdio runner and local streamable HTTP.

Imports only ``replica`` of peerd. Entry points:

* ``build_server(replica, waiter=..., bind=...)`` -> ``MCPServer`` with every tool;
* ``run_stdio(home, role, instance)`` -> serve stdio on the replica in ``home``;
* ``http_app(replica, waiter=...)`` -> ASGI app for ``/mcp`` (local callers only),
  hosted in a running loop by ``LocalHttpServer(app, port=0)``;
* ``ReplicaWatcher(replica)`` -> a ``Waiter`` that wakes ``wait`` calls on change.
"""

from mcp_server.local_http import MCP_PATH, LocalHttpServer, LocalOnly, http_app
from mcp_server.server import build_server
from mcp_server.stdio import run_stdio
from mcp_server.tools import TOOLS, SessionBinding
from mcp_server.waiter import ReplicaWatcher, Waiter

__all__ = [
    "MCP_PATH", "TOOLS", "LocalHttpServer", "LocalOnly", "ReplicaWatcher", "SessionBinding",
    "Waiter", "build_server", "http_app", "run_stdio",
]
