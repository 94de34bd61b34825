"""Hybrid logical clock as pure functions.

An HLC value is one int: ``wall_ms << 16 | logical``. Invariants:

* ``tick`` and ``observe`` always return a value strictly greater than ``last``
  (monotonic, even when the wall clock goes backwards).
* ``observe`` lets a remote clock move ours forward by at most ``max_drift_ms``
  beyond our wall clock, so one peer with a clock far in the future cannot drag
  every replica's clock along with it (bounded acceptance).
* ``too_far_ahead`` is the one rule for a peer's op stamped beyond that drift: it is
  refused, not stored, so the same op is taken once our clock has caught up with it.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

LOGICAL_BITS = 16
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
DEFAULT_MAX_DRIFT_MS = 60_000


def pack(wall_ms: int, logical: int = 0) -> int:
    return (wall_ms << LOGICAL_BITS) | logical


def wall_of(hlc: int) -> int:
    return hlc >> LOGICAL_BITS


def tick(last: int, wall_ms: int) -> int:
    """The stamp for a local event at wall time ``wall_ms`` after ``last``."""
    candidate = pack(wall_ms)
    return candidate if candidate > last else last + 1


def observe(last: int, remote: int, wall_ms: int, max_drift_ms: int = DEFAULT_MAX_DRIFT_MS) -> int:
    """Our clock after seeing ``remote``; a remote far ahead is capped."""
    ceiling = pack(wall_ms + max_drift_ms)
    bounded = min(remote, ceiling)
    return max(last, bounded, pack(wall_ms))


def too_far_ahead(stamp: int, wall_ms: int, max_drift_ms: int = DEFAULT_MAX_DRIFT_MS) -> str | None:
    """Why a peer's op stamped ``stamp`` is refused at wall time ``wall_ms``: its wall clock part is
    more than ``max_drift_ms`` ahead of ours; None when it is within the drift."""
    ahead = wall_of(stamp) - wall_ms
    if ahead <= max_drift_ms:
        return None
    return (f"stamped {ahead // 1000} s ahead of this replica's clock; at most {max_drift_ms // 1000} s is "
            "allowed (it is taken once the clocks agree: check the clock of the machine that wrote it)")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_MS = 253402300799999  # 9999-12-31T23:59:59.999Z


@functools.lru_cache(maxsize=2048)  # pure; profiles and pages show the same stamps again
@functools.lru_cache(maxsize=8192)
def to_iso(hlc: int) -> str:
    """The wall-clock part of a stamp as ISO-8601 UTC with milliseconds; a stamp outside
    the years 1970-9999 shows as the nearest end (it never raises). Remembered: the same stamps
    are shown again and again (an inbox page re-read until it is marked)."""
    dt = _EPOCH + timedelta(milliseconds=min(max(wall_of(hlc), 0), _LAST_MS))
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
