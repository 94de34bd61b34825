"""Keeping the search index and the senders table caught up in the background.

Invariants:
* Woken by the change feed, never by a timer: an idle daemon does no index work.
* Debounced: after a change it waits ``INDEX_DELAY`` so that a burst of arrivals
  is indexed in one go, and so runs at most once per ``INDEX_DELAY`` while ops
  keep coming.
* Short steps: each worker-thread call is one short write transaction of at
  most ``INDEX_STEP`` ops, so writers interleave with a long catch-up.
* Held back while a snapshot is being taken (``hold``): the snapshot's pages go first.
* Search stays correct without it: ``search_messages`` and ``recent_senders``
  catch up by themselves before they query; this only keeps their backlog small.
* A failing step (the store busy or full, or a bug) never ends the loop: it is
  logged once per kind of error, and the next change tries again.
* After indexing, what retractions dropped is scrubbed from the files (``Replica.scrub_step``:
  the search index merged whole, the WAL emptied). A checkpoint that a reader keeps from
  completing is tried again after a backoff (``SCRUB_RETRY_MIN`` doubling to ``SCRUB_RETRY_MAX``), not only
  on the next change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica import PeerdError, Replica, scrub
from replica.feed import FeedWaiter

log = logging.getLogger("peerd.indexer")

INDEX_DELAY = 1.0
INDEX_STEP = 5000
SCRUB_RETRY_MIN, SCRUB_RETRY_MAX = 0.5, 30.0  # waits between tries of a checkpoint a reader kept from completing


async def _scrub(rep: Replica, offload: Callable[..., Awaitable[Any]], hold: asyncio.Event | None) -> str:
    """Leave no retracted content on disk (``replica.scrub``), one short step per worker-thread call."""
    state = scrub.MORE
    while state == scrub.MORE:
        if hold is not None:
            await hold.wait()
        state = await offload(rep.scrub_step)
    return str(state)


async def keep_indexed(rep: Replica, waiter: FeedWaiter, *, delay: float = INDEX_DELAY, step: int = INDEX_STEP,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                       offload: Callable[..., Awaitable[Any]] = asyncio.to_thread,
                       hold: asyncio.Event | None = None) -> None:
    """Index what lands, ``step`` ops at a time, ``delay`` seconds after each change; ends on close.
    ``sleep`` and ``offload`` (how the work leaves the loop) are the node's. Each step first waits for
    ``hold`` to be set (a snapshot being taken holds indexing back)."""
    failed: set[str] = set()
    retry = SCRUB_RETRY_MIN
    while not waiter.closed:
        await sleep(delay)
        mark = waiter.mark
        try:
            while True:
                if hold is not None:
                    await hold.wait()
                if not await offload(rep.catch_up_step, step):
                    break
            if await _scrub(rep, offload, hold) == scrub.BLOCKED:  # a reader holds the WAL: try again later
                await sleep(retry)
                retry = min(retry * 2, SCRUB_RETRY_MAX)
                continue
            retry = SCRUB_RETRY_MIN
        except Exception as exc:
            kind = type(exc).__name__
            if kind not in failed:
                failed.add(kind)
                ours = not isinstance(exc, PeerdError)  # a bug gets its traceback, a store failure one line
                log.error("indexing failed (retried on the next change): %s", exc, exc_info=exc if ours else None)
        else:
            failed.clear()
        await waiter.wait_beyond(mark)
