"""MCP over streamable HTTP: the ASGI app that peerd's local server mounts at ``/mcp``.

Invariants:
* The app is served only behind ``mcp_server.localguard.LocalOnly`` (peerd's
  one local server puts it in front of everything), so the SDK's own
  DNS-rebinding check is off: one guard, one answer (403) for a foreign
  Host or Origin.
* A session is bound by headers (``X-Peerd-Role``, ``X-Peerd-Instance``) or by
  query parameters (``/mcp?role=&instance=``), read on every request. A bound
  session gets its mail pushed on its GET stream (``mcp_server.channel``;
  ``mcp_server.streamwatch`` sees the stream open and close); sessions stay stateful,
  since a stateless one has no stream to push on.
* Each POST is answered with one JSON body, never an SSE stream: a result carrying a
  largest message (900,000 bytes, up to 6x that once escaped) must reach clients that
  cap one server-sent event (the MCP SDK's HTTP client: 1 MiB). Pushes travel on the
  session's GET stream, so a JSON answer loses nothing peerd sends. The one exception is the
  SDK's: a 2026-07-28 ``subscriptions/listen`` is answered with its SSE stream, which carries
  only small events (``mcp_server.listen`` has them announced).
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

from mcp_server.channel import PushHub
from mcp_server.channelwire import http_config
from mcp_server.server import ReplicaSource, build_server, replica_source, request_binding
from mcp_server.streamwatch import StreamWatch
from mcp_server.tools import FleetIdProvider, SessionBinding
from replica.feed import Waiter
from replica.ops import MAX_JSON_REQUEST_BYTES

MCP_PATH = "/mcp"


def http_app(replica: ReplicaSource, *, waiter: Waiter, fleet_id: FleetIdProvider | None = None,
             path: str = MCP_PATH, tools: str = "all") -> ASGIApp:
    """The ASGI app serving MCP streamable HTTP at ``path`` (host it behind ``LocalOnly``)."""
    hub = PushHub(replica_source(replica), waiter, lambda r: http_config(r, request_binding(r, SessionBinding())))
    server = build_server(replica, waiter=waiter, bind=None, fleet_id=fleet_id, push=hub, tools=tools)
    app = server.streamable_http_app(
        streamable_http_path=path,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=MAX_JSON_REQUEST_BYTES,
        json_response=True,
    )
    return StreamWatch(app, hub)


__all__ = ["MCP_PATH", "http_app"]
