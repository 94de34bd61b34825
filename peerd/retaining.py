"""Purging what is past the fleet's retention horizon, in the background of the daemon.

Invariants:
* No polling loop: the task sleeps until the next time something can expire
  (``Replica.next_expiry``) or until the change feed says ops landed, whichever comes first. An
  idle daemon with no horizon (keep everything) only looks at the horizon when ops land.
* A horizon that changes is acted on at once; other changes (a receipt that makes a message
  read, say) are gathered for ``retention.granule(h)`` first, so a busy fleet is swept at most
  once per granule, not once per op.
* Purge work runs off the event loop, one short write transaction per worker-thread call
  (``purge_step``, ``reclaim_step``), so agents' writes interleave with a long purge and a
  shutdown never waits for more than one step. The horizon, read at every change, is read on the
  loop in the replica's ``no_wait`` mode (on a worker thread only if that would wait): a send
  costs this task no thread hop.
* A failing pass (the store busy or full, or a bug) never ends the task: it is logged once per
  kind of error, and the next wake-up tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from replica import PeerdError, Replica
from replica import retention as ret
from replica.errors import WouldWait
from replica.feed import FeedWaiter

Offload = Callable[..., Awaitable[Any]]  # how replica work leaves the loop: asyncio.to_thread in the daemon

log = logging.getLogger("peerd.retention")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def purge_pass(rep: Replica, offload: Offload = asyncio.to_thread) -> ret.PurgeReport:
    """One pass against the horizon in force, step by step on worker threads."""
    started, before = _now_ms(), await offload(rep.database_bytes)
    sweep = await offload(rep.start_purge)
    while not sweep.done:
        sweep = await offload(rep.purge_step, sweep)
    while sweep.removed.ops and await offload(rep.reclaim_step):
        pass
    report: ret.PurgeReport = await offload(rep.finish_purge, sweep, started, before)
    return report


async def _horizon(rep: Replica, offload: Offload) -> int:
    """``rep.horizon_ms()``, on the loop unless that would wait for a lock."""
    try:
        with rep.no_wait():
            return rep.horizon_ms()
    except WouldWait:
        return int(await offload(rep.horizon_ms))


def _said(report: ret.PurgeReport) -> str:
    r = report.removed
    return (f"purged {r.messages} message(s), {r.receipts} receipt(s), {r.ops} op(s) in {report.took_ms} ms; "
            f"database {report.bytes_before:,} -> {report.bytes_after:,} bytes")


async def keep_retention(rep: Replica, waiter: FeedWaiter, *, offload: Offload = asyncio.to_thread) -> None:
    """Purge whenever the rules can remove something; ends when the waiter closes. ``offload``
    takes the replica work off the loop (the node's)."""
    failed: set[str] = set()
    while not waiter.closed:
        mark, started, h = waiter.mark, _now_ms(), 0
        try:
            h = await _horizon(rep, offload)
            due = None
            if h:
                report = await purge_pass(rep, offload)
                if report.removed.ops:
                    log.info(_said(report))
                due = await offload(rep.next_expiry)
        except Exception as exc:
            _report(failed, exc)
            due = started  # again after a granule, or on the next change
        else:
            failed.clear()
        earliest = started + ret.granule(h)  # at most one pass per granule
        if await _wait(waiter, mark, None if due is None else max(due, earliest)) and h:
            await _settle(rep, waiter, h, earliest, offload)


async def _wait(waiter: FeedWaiter, mark: int, until_ms: int | None) -> bool:
    """Until wall time ``until_ms`` (None: no end) or a change beyond ``mark``; whether it was a change."""
    timeout = None if until_ms is None else max(0.0, (until_ms - _now_ms()) / 1000)
    try:
        async with asyncio.timeout(timeout):
            await waiter.wait_beyond(mark)
    except TimeoutError:
        return False
    return not waiter.closed


async def _settle(rep: Replica, waiter: FeedWaiter, h: int, until_ms: int, offload: Offload) -> None:
    """Ops landed: let more land until ``until_ms``, but stop as soon as the horizon changes."""
    while True:
        mark = waiter.mark
        if waiter.closed or await _horizon(rep, offload) != h:
            return
        if not await _wait(waiter, mark, until_ms):
            return


def _report(failed: set[str], exc: Exception) -> None:
    kind = type(exc).__name__
    if kind in failed:
        return
    failed.add(kind)
    ours = not isinstance(exc, PeerdError)  # a bug gets its traceback, a store failure one line
    log.error("retention purge failed (retried later): %s", exc, exc_info=exc if ours else None)
