"""MCP over streamable HTTP: the ASGI app that peerd's local server mounts at ``/mcp``.

Invariants:
* The app is served only behind ``mcp_server.localguard.LocalOnly`` (peerd's
  one local server puts it in front of everything), so the SDK's own
  DNS-rebinding check is off: one guard, one answer (403) for a foreign
  Host or Origin.
* A session is bound by headers (``X-Peerd-Role``, ``X-Peerd-Instance``) or by
  query parameters (``/mcp?role=&instance=``), read on every request.
* Request bodies are capped at ``ops.MAX_JSON_REQUEST_BYTES``, the same limit
  as the local server's, so a largest message (900,000 bytes) always fits.
* The app's ASGI lifespan runs the MCP session manager: its host runs the
  lifespan once, from before the first request until shutdown.
* Importing this module loads the MCP SDK (slow); the daemon does so in a
  worker thread on the first request to ``/mcp``, never at start.
"""

from __future__ import annotations

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from mcp_server.server import ReplicaSource, build_server
from mcp_server.tools import FleetIdProvider
from mcp_server.waiter import Waiter
from replica.ops import MAX_JSON_REQUEST_BYTES

MCP_PATH = "/mcp"


def http_app(replica: ReplicaSource, *, waiter: Waiter, fleet_id: FleetIdProvider | None = None,
             path: str = MCP_PATH) -> ASGIApp:
    """The ASGI app serving MCP streamable HTTP at ``path`` (host it behind ``LocalOnly``)."""
    server = build_server(replica, waiter=waiter, bind=None, fleet_id=fleet_id)
    return server.streamable_http_app(
        streamable_http_path=path,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=MAX_JSON_REQUEST_BYTES,
    )


__all__ = ["MCP_PATH", "http_app"]
