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
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mcp_server.server import build_server
from mcp_server.stdioguard import run_guarded
from mcp_server.tools import SessionBinding
from mcp_server.waiter import FeedWaiter
from replica import Replica, open_home
from replica.feed import ChangeFeed, FileWatch, Source


async def run_stdio(home: Path, role: str | None = None, instance: str | None = None, *,
                    fleet_id: str | None = None, source: Source | None = None) -> None:
    """Serve every peerd tool over stdin/stdout on the replica in ``home`` until stdin closes.
    ``source`` tells the change feed about other processes' writes (default: a ``FileWatch``)."""
    replica = await asyncio.to_thread(open_home, home)
    try:
        await serve_stdio(replica, source or FileWatch(replica.path), role, instance, fleet_id=fleet_id)
    finally:
        await asyncio.to_thread(replica.close)


async def serve_stdio(replica: Replica, source: Source | None, role: str | None = None,
                      instance: str | None = None, *, fleet_id: str | None = None) -> None:
    """Serve every peerd tool over stdin/stdout on an open ``replica`` until stdin closes.
    ``source``: how the feed learns of other processes' writes (None: nobody else writes,
    as for a replica in memory). The caller closes the replica."""
    feed = await asyncio.to_thread(ChangeFeed, replica, source)
    waiter = FeedWaiter(feed)
    try:
        server = build_server(replica, waiter=waiter, bind=SessionBinding(role, instance),
                              fleet_id=(lambda: fleet_id) if fleet_id is not None else None)
        await run_guarded(server)
    finally:
        waiter.close()
        await asyncio.to_thread(feed.close)
