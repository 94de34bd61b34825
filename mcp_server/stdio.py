"""MCP over stdio straight on the replica file: no daemon needed (offline use).

Invariants:
* stdout carries only MCP messages; diagnostics go to stderr.
* The session is bound by the command line (``--role``, ``--instance``).
* ``wait`` sees writes of other processes (the daemon applying peers' ops,
  other agents' stdio servers) through ``ReplicaWatcher``'s ~20 ms check of the
  replica's change counter, only while a call waits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mcp_server.server import build_server
from mcp_server.tools import SessionBinding
from mcp_server.waiter import ReplicaWatcher
from replica import open_home


async def run_stdio(home: Path, role: str | None = None, instance: str | None = None, *,
                    fleet_id: str | None = None) -> None:
    """Serve every peerd tool over stdin/stdout on the replica in ``home`` until stdin closes."""
    replica = await asyncio.to_thread(open_home, home)
    watcher = ReplicaWatcher(replica)
    try:
        server = build_server(replica, waiter=watcher, bind=SessionBinding(role, instance),
                              fleet_id=(lambda: fleet_id) if fleet_id is not None else None)
        await server.run_stdio_async()
    finally:
        watcher.close()
        await asyncio.to_thread(replica.close)
