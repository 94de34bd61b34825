"""A clock that moves only when a test says so, for ``Node(clock=...)`` (``peerd.clock.Clock``).

Usage::

    clock = ManualClock()
    await clock.advance(30, settle)   # every timer due in the next 30 s fires, in order of its time,
                                      # and ``settle()`` runs after each (the nodes finish what it started)

Invariants: time never goes back; timers fire in order of their due time (ties: the order they
were set); a cancelled timer never fires; ``advance`` returns with the clock exactly ``seconds``
later and nothing due left behind.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable

WALL_AT_START = 1_796_083_200.0  # 2026-12-01T00:00:00Z: the wall clock reads this at the start


class Timer:
    def __init__(self, at: float, callback: Callable[[], None]) -> None:
        self.at = at
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self._now = start
        self._start = start
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return WALL_AT_START + self._now - self._start

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self._now + max(0.0, delay), callback)
        heapq.heappush(self._heap, (timer.at, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        done = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, lambda: done.done() or done.set_result(None))
        try:
            await done
        finally:
            timer.cancel()

    async def wait(self, event: asyncio.Event, within: float | None) -> bool:
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        if within is None:
            await waiter
            return True
        timed_out = asyncio.get_running_loop().create_future()
        timer = self.call_later(within, lambda: timed_out.done() or timed_out.set_result(None))
        try:
            await asyncio.wait({waiter, timed_out}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            waiter.cancel()
        return event.is_set()

    def next_due(self) -> float | None:
        """When the next live timer fires (None: no timer is set)."""
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    async def advance(self, seconds: float, settle: Callable[[], Awaitable[None]]) -> None:
        """Move ``seconds`` forward: fire every timer due by then in order, settling after each."""
        end = self._now + seconds
        await settle()
        while (due := self.next_due()) is not None and due <= end:
            _at, _order, timer = heapq.heappop(self._heap)
            self._now = max(self._now, due)
            timer.callback()
            await settle()
        self._now = end
        await settle()
