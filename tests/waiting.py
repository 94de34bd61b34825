"""Waiting for a condition in tests, with patience that grows on a busy machine.

Prefer waiting for an event (a process's ready line, a long-poll returning). Where
there is none (a peer table filling, replicas converging through gossip), poll a
condition with ``wait_until`` / ``eventually``. Their timeouts are generous guards,
never the thing a test measures, and are scaled by ``patience``:

* ``PEERD_TEST_PATIENCE`` (a factor, default 1) stretches every timeout, and
* the machine's load per CPU (at least 1) stretches it further while it is busy,

so a loaded 2-core machine waits longer instead of failing. pytest-timeout stays the
overall guard.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def patience(seconds: float) -> float:
    """``seconds`` scaled for this run and this machine's current load."""
    factor = float(os.environ.get("PEERD_TEST_PATIENCE", "1") or 1)
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * max(factor, 0.1) * max(1.0, load)


def wait_until(pred: Callable[[], T | None], timeout: float, what: str = "condition", interval: float = 0.04,
               retry_on: tuple[type[BaseException], ...] = (OSError,)) -> T:
    """Poll ``pred`` until it returns something truthy; return it, or fail after ``patience(timeout)``.

    Exceptions of ``retry_on`` count as "not yet"; the last value or error is named in the failure.
    """
    limit = patience(timeout)
    deadline = time.monotonic() + limit
    last: Any = None
    while True:
        try:
            value = pred()
            if value:
                return value
            last = value
        except retry_on as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


async def eventually(pred: Callable[[], T | Awaitable[T | None] | None], within: float, what: str = "condition",
                     interval: float = 0.01, *, in_thread: bool = False) -> T:
    """``wait_until`` for a test running on an event loop: the loop keeps running while it waits
    (``in_thread``: ``pred`` runs on a worker thread, off the loop; a ``pred`` that returns an
    awaitable, such as an MCP call, is awaited). Fails after ``patience(within)``."""
    limit = patience(within)
    deadline = time.monotonic() + limit
    while True:
        value = await asyncio.to_thread(pred) if in_thread else pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}; last: {value!r}")
        await asyncio.sleep(interval)


def end_group(proc: Any, grace: float = 20.0) -> None:
    """Stop a process started in a group of its own (``start_new_session``) and everything it
    started: SIGTERM to the group, then SIGKILL if it has not exited within ``patience(grace)`` s."""
    import contextlib  # noqa: PLC0415 - only the tests that start process groups need these
    import signal  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=patience(grace))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
