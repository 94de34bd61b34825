"""Time for the node's shell: now, sleeping, and waiting for an event with a timeout.

The node's decisions take the time as a value (``peerd.core``); the shell (``peerd.node``) gets
it, and waits, through a ``Clock``. The daemon runs on ``SystemClock`` (the monotonic clock and
asyncio's timers); a test passes a clock it moves by hand (``tests/fakeclock.py``), so rounds,
backoffs and expiries happen when the test says so, and no test sleeps to wait for them.

Invariants: ``now`` never goes back; ``wait`` returns True as soon as the event is set and False
once ``within`` seconds of this clock have passed (None: no limit); a cancelled ``sleep`` or
``wait`` raises ``CancelledError`` and leaves nothing behind (for ``SystemClock``:
``asyncio.timeout``, not ``wait_for``, which on Python 3.11 can swallow a cancellation that
meets the event being set).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wall(self) -> float:
        """Unix seconds (for people, and for a peer's clock-skew check)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, within: float | None) -> bool: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, within: float | None) -> bool:
        if within is None:
            await event.wait()
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await event.wait()
            return True
        return False

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay, callback)
