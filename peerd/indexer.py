"""Keeping the search index and the senders table caught up in the background.

Invariants:
* Woken by the change feed, never by a timer: an idle daemon does no index work.
* Debounced: after a change it waits ``INDEX_DELAY`` so that a burst of arrivals
  is indexed in one go, and so runs at most once per ``INDEX_DELAY`` while ops
  keep coming.
* Short steps: each worker-thread call is one short write transaction of at
  most ``INDEX_STEP`` ops, so writers interleave with a long catch-up.
* Search stays correct without it: ``search_messages`` and ``recent_senders``
  catch up by themselves before they query; this only keeps their backlog small.
"""

from __future__ import annotations

import asyncio

from mcp_server.waiter import FeedWaiter
from replica import Replica

INDEX_DELAY = 1.0
INDEX_STEP = 5000


async def keep_indexed(rep: Replica, waiter: FeedWaiter, *, delay: float = INDEX_DELAY,
                       step: int = INDEX_STEP) -> None:
    """Index what lands, ``step`` ops at a time, ``delay`` seconds after each change; ends on close."""
    while not waiter.closed:
        await asyncio.sleep(delay)
        mark = waiter.mark
        while await asyncio.to_thread(rep.catch_up_step, step):
            pass
        await waiter.wait_beyond(mark)
