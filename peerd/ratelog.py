"""Rate limits for log lines an outsider can cause: at most a few per source and minute.

A refused request (a body that does not open, a malformed message, a slow body,
a connection over the cap, bad HTTP) is worth one log line, but a flood of them
must not flood the log. ``RateLog`` decides, per source, which events are
written; the rest are counted and told in one summary line when the source's
window ends.

``RateFilter`` applies the same rule to log records a library writes about
refused requests (uvicorn's "Invalid HTTP request received." on the local
port): per message text, ``burst`` records a window pass, and the next one to
pass after a window that held some back says how many.

Invariants: ``RateLog`` is pure (the caller passes the time and does the logging); per source
and window of ``window`` seconds, the first ``burst`` events are written and
the others only counted; a window with suppressed events yields exactly one
summary, from ``due``, once it has ended; at most ``max_sources`` sources are
tracked (the oldest window is folded into the summaries first), so memory is
bounded whatever the number of sources.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

BURST = 5
WINDOW = 60.0
MAX_SOURCES = 4096


@dataclass
class _Window:
    start: float
    written: int = 0
    suppressed: int = 0


@dataclass(frozen=True)
class Verdict:
    write: bool  # log this event
    flush_at: float | None = None  # the first suppression of a window: call ``due`` at this time


@dataclass
class RateLog:
    burst: int = BURST
    window: float = WINDOW
    max_sources: int = MAX_SOURCES
    _windows: dict[str, _Window] = field(default_factory=dict)
    _evicted: list[tuple[str, int]] = field(default_factory=list)

    def note(self, source: str, now: float) -> Verdict:
        """One event from ``source`` at ``now``: write it, or count it."""
        win = self._windows.get(source)
        if win is None or now - win.start >= self.window:
            self._close(source, self._windows.pop(source, None))
            win = self._windows[source] = _Window(now)  # dicts keep insertion order: oldest window first
            self._bound()
        if win.written < self.burst:
            win.written += 1
            return Verdict(True)
        win.suppressed += 1
        return Verdict(False, win.start + self.window if win.suppressed == 1 else None)

    def due(self, now: float) -> list[tuple[str, int]]:
        """(source, suppressed count) of every window that has ended with events left untold."""
        out, self._evicted = self._evicted, []
        for source, win in list(self._windows.items()):
            if now - win.start >= self.window:
                del self._windows[source]
                if win.suppressed:
                    out.append((source, win.suppressed))
        return out

    def _close(self, source: str, win: _Window | None) -> None:
        if win is not None and win.suppressed:
            self._evicted.append((source, win.suppressed))

    def _bound(self) -> None:
        while len(self._windows) > self.max_sources:
            oldest = next(iter(self._windows))
            self._close(oldest, self._windows.pop(oldest))


def summary(source: str, suppressed: int, window: float = WINDOW, burst: int = BURST) -> str:
    return f"suppressed {suppressed} more refused requests from {source} (at most {burst} are told per {window:g} s)"


class RateFilter(logging.Filter):
    """A logging filter holding each of ``messages`` to ``burst`` records per ``window`` seconds."""

    def __init__(self, messages: Iterable[str], *, burst: int = BURST, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.messages = frozenset(messages)
        self.rate = RateLog(burst=burst, window=window)
        self.clock = clock
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)
        if key not in self.messages:
            return True
        now = self.clock()
        verdict = self.rate.note(key, now)
        for source, count in self.rate.due(now):
            self._held[source] = self._held.get(source, 0) + count
        if not verdict.write:
            return False
        held = self._held.pop(key, 0)
        if held:
            record.msg = f"{key} ({held} more like it were not logged)"
        return True
