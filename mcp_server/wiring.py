"""One builder for what waits on a replica in a process: its change feed, the waiter on it, and
MCP served on them. The daemon (``peerd.daemon``, for ``peerd.node``), ``peerd mcp`` and
``python -m mcp_server`` each build theirs here, so the wiring is written once.

Invariants:
* One ``ChangeFeed`` per replica per process: a ``Wiring`` makes it (with at most one outside
  ``Source``), and every waiting call, pusher and change stream of the process waits through
  its one ``FeedWaiter``.
* The waiter takes asyncio's running loop at each wait: this is where the loop-neutral waiter
  of ``replica.feed`` (which may not import asyncio) meets asyncio.
* ``close`` releases every waiting call first, so a server stops without waiting out its
  calls, then stops the feed (its watch thread ends); closing twice is harmless.
* Importing this module loads no MCP SDK: ``mcp_http`` returns a builder that imports it when
  called (the daemon calls it in a worker thread on the first ``/mcp`` request), and
  ``stdio_server`` imports it when a stdio server is built.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from replica import Replica
from replica.feed import ChangeFeed, FeedWaiter, Source

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from starlette.types import ASGIApp

    from mcp_server.channel import PushHub
    from mcp_server.tools import SessionBinding

FleetId = Callable[[], str | None]


class Wiring:
    """A replica's change feed in this process, the one waiter on it, and MCP on both."""

    def __init__(self, replica: Replica, feed: ChangeFeed) -> None:
        self.replica = replica
        self.feed = feed
        self.waiter = FeedWaiter(feed, asyncio.get_running_loop)

    @classmethod
    def over(cls, replica: Replica, source: Source | None = None) -> Wiring:
        """A new feed over ``replica``, told of other connections' commits by ``source`` (None:
        only commits through ``replica`` itself). It reads the replica: call it off the loop."""
        return cls(replica, ChangeFeed(replica, source))

    @classmethod
    def watching(cls, replica: Replica) -> Wiring:
        """A new feed that also watches the replica file for other processes' commits (the
        daemon's; none for a replica in memory). Off the loop, as ``over``."""
        return cls(replica, ChangeFeed.watching(replica))

    def mcp_http(self, fleet_id: FleetId | None = None, tools: str = "all") -> Callable[[], ASGIApp]:
        """What builds MCP streamable HTTP on this wiring; it imports the MCP SDK when called
        (peerd's local server calls it on the first ``/mcp`` request, in a worker thread)."""

        def build() -> ASGIApp:
            from mcp_server.http import http_app  # noqa: PLC0415 - the MCP SDK, only once MCP is asked for

            return http_app(self.replica, waiter=self.waiter, fleet_id=fleet_id, tools=tools)

        return build

    def stdio_server(self, binding: SessionBinding, *, push: bool = True, senders: frozenset[str] = frozenset(),
                     fleet_id: FleetId | None = None, tools: str = "all") -> tuple[MCPServer, PushHub]:
        """The MCP server of one stdio session bound by ``binding``, and the hub that pushes its
        mail (``push`` off: none; ``senders``: only from these). The caller closes the hub."""
        from mcp_server.channel import PushConfig, PushHub  # noqa: PLC0415 - the MCP SDK
        from mcp_server.server import build_server  # noqa: PLC0415

        config = PushConfig(binding, enabled=push, senders=senders)
        hub = PushHub(lambda: self.replica, self.waiter, lambda _request: config)
        return build_server(self.replica, waiter=self.waiter, bind=binding, push=hub, fleet_id=fleet_id,
                            tools=tools), hub

    def close(self) -> None:
        """Release every waiting call, then stop the feed (the replica stays open)."""
        self.waiter.close()
        self.feed.close()

    async def aclose(self) -> None:
        """``close`` from the loop: the waiting calls at once, the feed's watch thread off the loop."""
        self.waiter.close()
        await asyncio.to_thread(self.feed.close)


@asynccontextmanager
async def wired(replica: Replica, source: Source | None = None) -> AsyncIterator[Wiring]:
    """``Wiring.over(replica, source)`` for the length of a block, built and closed off the loop."""
    wiring = await asyncio.to_thread(Wiring.over, replica, source)
    try:
        yield wiring
    finally:
        await wiring.aclose()
