"""Times agents pass in and get back, as pure rules: session days and ``since`` values.

Invariants:
* ``session_day(ms)`` is VantagePeers' ``deriveSessionDay``: day 1 is
  2026-03-06 UTC, days change at UTC midnight, and earlier times are day 1.
* ``parse_since`` tells a cursor from a timestamp by size alone: integers below
  ``TIMESTAMP_FLOOR`` (10^11, which as Unix ms is 1973-03-03) are positions in
  this replica's arrival order; integers from it up, and ISO-8601 strings, are
  Unix-ms times compared with when messages *arrived here*. No cursor ever gets
  that large, and no agent asks for mail from before 1973.
* Anything else is refused: negative numbers, values beyond 2^53 - 1 (the
  largest integer JSON clients carry exactly), times more than
  ``MAX_FUTURE_MS`` ahead of this machine's clock, cursors beyond this
  replica's newest position. Never a silent empty inbox.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from replica.errors import InvalidArgument

DAY_MS = 86_400_000
SESSION_EPOCH_MS = 1_772_755_200_000  # 2026-03-06T00:00:00Z, VantagePeers' day 1
MAX_SAFE_INT = 2**53 - 1
TIMESTAMP_FLOOR = 10**11
MAX_FUTURE_MS = DAY_MS

_DIGITS = re.compile(r"[0-9]{1,16}")


def session_day(ms: int) -> int:
    """VantagePeers' project day number of the Unix-ms time ``ms`` (at least 1)."""
    return max(1, (ms - SESSION_EPOCH_MS) // DAY_MS + 1)


def to_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


@functools.lru_cache(maxsize=8192)
def iso_ms(ms: int) -> str:
    """Unix ms as ISO-8601 UTC with milliseconds (JavaScript's ``toISOString``); remembered, as
    ``ms_of_iso`` is."""
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@functools.lru_cache(maxsize=8192)
def ms_of_iso(text: str) -> int:
    """Unix ms of an ISO-8601 time as the replica shows times (``iso_ms``'s inverse); remembered,
    as the same times are shown again and again (an inbox page re-read until it is marked)."""
    return to_ms(datetime.fromisoformat(text))


@dataclass(frozen=True)
class Since:
    """A ``since`` argument, understood: an arrival position, or an arrival time (Unix ms)."""

    cursor: int | None = None
    arrived_after_ms: int | None = None


def parse_time(value: str, what: str = "since") -> int:
    """An ISO-8601 date-time (``Z`` or an offset; no offset means UTC) as Unix ms."""
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidArgument(
            f"{what} must be a cursor, a Unix-ms timestamp or an ISO-8601 time, got {value[:40]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return to_ms(when)


def parse_since(value: object, *, now_ms: int, newest: int, what: str = "since") -> Since:
    """What a ``since`` argument means (see the module's rules); ``newest`` is the newest position here."""
    if value is None:
        return Since()
    if isinstance(value, str) and not _DIGITS.fullmatch(value.strip()):
        return _arrival(parse_time(value, what), now_ms, what)
    if isinstance(value, str):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{what} must be a cursor, a Unix-ms timestamp or an ISO-8601 time")
    if value < 0 or value > MAX_SAFE_INT:
        raise InvalidArgument(f"{what} must be between 0 and {MAX_SAFE_INT}, got {value}")
    if value >= TIMESTAMP_FLOOR:
        return _arrival(value, now_ms, what)
    if value > newest:
        raise InvalidArgument(
            f"{what} {value} is beyond this replica's newest position {newest}: pass a cursor this replica "
            f"returned, or a Unix-ms timestamp (>= {TIMESTAMP_FLOOR})")
    return Since(cursor=value)


def _arrival(ms: int, now_ms: int, what: str) -> Since:
    if ms < 0:
        raise InvalidArgument(f"{what} must be {iso_ms(0)} or later, got a time before 1970")
    if ms > now_ms + MAX_FUTURE_MS:
        raise InvalidArgument(f"{what} {ms} is a time more than a day ahead of this machine's clock ({iso_ms(now_ms)})")
    return Since(arrived_after_ms=ms)
