"""Blocking until the replica changes: the asyncio side of the process's change feed.

Invariants:
* The replica's change counter is ``max_lseq()``: every op that lands, local or
  from a peer, from this process or another, raises it; the process's one
  ``replica.feed.ChangeFeed`` learns of it (see there for how) and wakes us.
* ``wait_beyond(mark)`` returns as soon as the feed's mark exceeds ``mark``;
  callers bound it with ``asyncio.timeout`` and take ``mark`` *before* they look
  for data, so a change that lands between the look and the wait is never missed.
* No timers and no polling: a waiter costs one future; a change costs one
  callback on the loop, however many calls wait.
* Once closed (the host is going away), every wait returns at once, and a
  caller that finds nothing new stops waiting.
* Imports no MCP SDK: the daemon uses it for its local API as well.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from replica.feed import ChangeFeed


class Waiter(Protocol):
    """What the tools need from their host to block until the replica changes."""

    async def wait_beyond(self, lseq: int) -> None:
        """Return once the replica's ``max_lseq()`` exceeds ``lseq`` (cancel to give up)."""
        ...


class FeedWaiter:
    """A ``Waiter`` on one event loop over a ``ChangeFeed``."""

    def __init__(self, feed: ChangeFeed) -> None:
        self._feed = feed
        self._waiters: dict[asyncio.Future[None], int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = False
        self.closed = False
        self._unsubscribe = feed.subscribe(self._on_change)

    @property
    def mark(self) -> int:
        """The newest mark the feed knows (take it before looking for data)."""
        return self._feed.mark

    @property
    def waiting(self) -> int:
        """How many calls wait right now."""
        return len(self._waiters)

    async def wait_beyond(self, lseq: int) -> None:
        if self.closed or self._feed.mark > lseq:
            return
        loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters[fut] = lseq
        try:
            if self._feed.mark <= lseq:  # look again: a change may have landed while we registered
                await fut
        finally:
            self._waiters.pop(fut, None)

    def close(self) -> None:
        """Stop following the feed and release every waiter (on the loop's thread)."""
        self.closed = True
        self._unsubscribe()
        self._release()

    def _on_change(self) -> None:
        """Called by the feed from whichever thread learned of the change."""
        loop = self._loop
        if loop is None or self._pending:
            return  # nobody has waited yet (the mark is looked at again on entry), or a release is due
        self._pending = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        self._pending = False
        mark = self._feed.mark
        for fut, lseq in list(self._waiters.items()):
            if (self.closed or mark > lseq) and not fut.done():
                fut.set_result(None)
