"""MCP over stdio straight on the replica file: no daemon needed (offline use).

Invariants:
* stdout carries only MCP messages; diagnostics go to stderr.
* Every line read gets an answer: one that is not JSON-RPC gets a JSON-RPC
  error (``stdioguard``), and the server keeps going.
* The session is bound by the command line (``--role``, ``--instance``).
* The process has one change feed, whatever the number of waiting calls: its
  own writes wake waiters at once; writes of other processes (the daemon
  applying peers' ops, other agents' stdio servers, ``peerd send``) reach it
  through the feed's outside source: by default one ``FileWatch`` on the
  replica file; ``peerd mcp`` passes one that follows a running daemon's
  change stream instead.
* With a bound role, the session is a Claude Code channel: new mail for the
  role is pushed as it lands (``mcp_server.channel``), unless ``push`` is off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from mcp_server.stdioguard import run_guarded
from mcp_server.tools import SessionBinding
from mcp_server.wiring import wired
from replica import Replica, open_home
from replica.feed import FileWatch, Source


async def run_stdio(home: Path, role: str | None = None, instance: str | None = None, *,
                    fleet_id: str | None = None, source: Source | None = None, push: bool = True,
                    push_from: Sequence[str] = ()) -> None:
    """Serve every peerd tool over stdin/stdout on the replica in ``home`` until stdin closes.
    ``source`` tells the change feed about other processes' writes (default: a ``FileWatch``);
    ``push`` / ``push_from``: see ``serve_stdio``."""
    replica = await asyncio.to_thread(open_home, home)
    try:
        await serve_stdio(replica, source or FileWatch(replica.path), role, instance, fleet_id=fleet_id,
                          push=push, push_from=push_from)
    finally:
        await asyncio.to_thread(replica.close)


async def serve_stdio(replica: Replica, source: Source | None, role: str | None = None,
                      instance: str | None = None, *, fleet_id: str | None = None, push: bool = True,
                      push_from: Sequence[str] = (), tools: str = "all") -> None:
    """Serve every peerd tool over stdin/stdout on an open ``replica`` until stdin closes.
    ``source``: how the feed learns of other processes' writes (None: nobody else writes,
    as for a replica in memory). ``push`` / ``push_from`` (an allowlist of senders) shape the
    channel pushes of a bound session. The caller closes the replica."""
    async with wired(replica, source) as wiring:
        server, hub = wiring.stdio_server(SessionBinding(role, instance), push=push, senders=frozenset(push_from),
                                          fleet_id=(lambda: fleet_id) if fleet_id is not None else None,
                                          tools=tools)
        try:
            await run_guarded(server)
        finally:
            await hub.aclose()
