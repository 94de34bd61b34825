"""Rate limits for log lines an outsider can cause: at most a few per source and minute.

A refused request (a body that does not open, a malformed message, a slow body,
a connection over the cap, bad HTTP) is worth one log line, but a flood of them
must not flood the log. ``RateLog`` decides, per source, which events are
written; the rest are counted and told in one summary line when the source's
window ends.

Invariants: pure (the caller passes the time and does the logging); per source
and window of ``window`` seconds, the first ``burst`` events are written and
the others only counted; a window with suppressed events yields exactly one
summary, from ``due``, once it has ended; at most ``max_sources`` sources are
tracked (the oldest window is folded into the summaries first), so memory is
bounded whatever the number of sources.
"""

from __future__ import annotations

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


def summary(source: str, suppressed: int, window: float = WINDOW) -> str:
    return f"suppressed {suppressed} more refused requests from {source} in {window:g} s"
