"""Blocking until the replica changes, without busy polling.

Invariants:
* The replica's change counter is ``max_lseq()``: every op that lands, local or
  from a peer, from this process or another, raises it.
* ``wait_beyond(mark)`` returns as soon as ``max_lseq() > mark``; callers bound
  it with ``asyncio.timeout`` and take ``mark`` *before* they look for data, so
  a change that lands between the look and the wait is never missed.
* ``ReplicaWatcher`` wakes waiters at once on commits made through the same
  ``Replica`` object (its listener) and notices commits of other processes by
  reading ``max_lseq()`` every ``interval`` seconds, only while someone waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from replica import Replica

POLL_INTERVAL = 0.02


class Waiter(Protocol):
    """What the tools need from their host to block until the replica changes."""

    async def wait_beyond(self, lseq: int) -> None:
        """Return once the replica's ``max_lseq()`` exceeds ``lseq`` (cancel to give up)."""
        ...


class ReplicaWatcher:
    """A ``Waiter`` over one replica: listener for in-process commits, cheap polling otherwise."""

    def __init__(self, replica: Replica, *, interval: float = POLL_INTERVAL) -> None:
        self._replica = replica
        self._interval = interval
        self._waiters: dict[asyncio.Future[None], int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        replica.add_listener(self._on_commit)

    def close(self) -> None:
        """Stop listening and wake every waiter (they return as if the replica changed)."""
        self._replica.remove_listener(self._on_commit)
        if self._task is not None:
            self._task.cancel()
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_beyond(self, lseq: int) -> None:
        loop = asyncio.get_running_loop()
        kick = self._bind(loop)
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters[fut] = lseq
        kick.set()  # read max_lseq now: the change may already be there
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._watch(kick))
        try:
            await fut
        finally:
            self._waiters.pop(fut, None)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        if self._loop is not loop or self._kick is None:
            self._loop, self._kick = loop, asyncio.Event()
        return self._kick

    def _on_commit(self) -> None:
        """Called by the replica from the writing thread after each commit."""
        loop, kick = self._loop, self._kick
        if loop is None or kick is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(kick.set)

    async def _watch(self, kick: asyncio.Event) -> None:
        while self._waiters:
            kick.clear()
            latest = await asyncio.to_thread(self._replica.max_lseq)
            for fut, mark in list(self._waiters.items()):
                if latest > mark and not fut.done():
                    fut.set_result(None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(kick.wait(), self._interval)
