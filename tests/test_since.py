"""Times agents pass: session days, and ``since`` as a cursor or as an arrival time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import InvalidArgument, Replica
from replica.stamps import (
    MAX_SAFE_INT,
    TIMESTAMP_FLOOR,
    Since,
    iso_ms,
    ms_of_iso,
    parse_since,
    parse_time,
    session_day,
)
from tests.conftest import pull

NOW = 1_800_000_000_000  # 2027-01-15


@pytest.mark.parametrize(("when", "day"), [
    ("2026-03-06T00:00:00.000Z", 1), ("2026-03-06T23:59:59.999Z", 1), ("2026-03-07T00:00:00.000Z", 2),
    ("2026-06-01T00:00:00.000Z", 88), ("2026-06-01T23:59:59.999Z", 88), ("2026-06-02T00:00:00.000Z", 89),
    ("1970-01-01T00:00:00.000Z", 1), ("2025-01-01T00:00:00.000Z", 1),
])
def test_session_day_follows_vantagepeers_examples(when: str, day: int) -> None:
    """Day 1 is 2026-03-06 UTC; days turn at UTC midnight; earlier times are day 1 (VantagePeers' test table)."""
    assert session_day(ms_of_iso(when)) == day


def test_small_integers_are_cursors_and_large_ones_or_iso_are_arrival_times() -> None:
    """Below 10^11 a since is a position; from 10^11, or as ISO-8601 (Z, offset or none = UTC), a time."""
    assert parse_since(None, now_ms=NOW, newest=5) == Since()
    assert parse_since(0, now_ms=NOW, newest=5) == Since(cursor=0)
    assert parse_since(5, now_ms=NOW, newest=5) == Since(cursor=5)
    assert parse_since("5", now_ms=NOW, newest=5) == Since(cursor=5)
    assert parse_since(TIMESTAMP_FLOOR, now_ms=NOW, newest=5) == Since(arrived_after_ms=TIMESTAMP_FLOOR)
    assert parse_since(1711670400000, now_ms=NOW, newest=5) == Since(arrived_after_ms=1711670400000)
    assert parse_since(1711670400000.0, now_ms=NOW, newest=5) == Since(arrived_after_ms=1711670400000)
    for text in ("2024-03-29T00:00:00Z", "2024-03-29T02:00:00+02:00", "2024-03-29T00:00:00"):
        assert parse_since(text, now_ms=NOW, newest=5) == Since(arrived_after_ms=1711670400000)
    assert parse_since("1970-01-01T00:00:01Z", now_ms=NOW, newest=5) == Since(arrived_after_ms=1000)


@pytest.mark.parametrize(("value", "match"), [
    (-1, "between 0 and"), (MAX_SAFE_INT + 1, "between 0 and"), (2**63, "between 0 and"), (2**64, "between 0 and"),
    (NOW + 86_400_001, "more than a day ahead"), ("2999-01-01T00:00:00Z", "more than a day ahead"),
    (6, "beyond this replica's newest position 5"), (1_700_000_000, "beyond this replica's newest position"),
    (True, "must be a cursor"), (1.5, "must be a cursor"), ("yesterday", "ISO-8601"), ("", "ISO-8601"),
    ([1], "must be a cursor"), ("1969-12-31T23:59:59Z", "1970"),
])
def test_values_that_are_neither_are_refused(value: object, match: str) -> None:
    """Negative, beyond 2^53 - 1, far future, a cursor past the newest position (Unix seconds, say): refused."""
    with pytest.raises(InvalidArgument, match=match):
        parse_since(value, now_ms=NOW, newest=5)


@given(st.integers(0, MAX_SAFE_INT))
def test_every_safe_integer_is_a_cursor_or_a_time_never_both(value: int) -> None:
    """Each value in range is read one way only, by its size, or refused with InvalidArgument."""
    try:
        since = parse_since(value, now_ms=NOW, newest=10**6)
    except InvalidArgument:
        assert value > 10**6 and (value < TIMESTAMP_FLOOR or value > NOW + 86_400_000)
        return
    assert (since.cursor is None) != (since.arrived_after_ms is None)
    assert (since.cursor == value) if value < TIMESTAMP_FLOOR else (since.arrived_after_ms == value)


def test_iso_round_trip() -> None:
    """Times shown as ISO-8601 turn back into the same Unix ms."""
    assert iso_ms(1780000009000) == "2026-05-28T20:26:49.000Z"
    assert ms_of_iso(iso_ms(1780000009123)) == 1780000009123
    assert parse_time("2026-05-28T20:26:49.000Z") == 1780000009000


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def test_a_message_written_offline_earlier_is_not_skipped_by_a_timestamp_since() -> None:
    """since = the time of the last check means "arrived here after": a message created before that
    time on a machine that was offline, and synced after it, is still returned."""
    there, here = Clock(NOW - 3_600_000), Clock(NOW)
    offline = Replica.open(wall=there)
    home = Replica.open(wall=here)
    offline.send_message("alpha", "beta", "written an hour ago, offline")
    home.send_message("alpha", "beta", "before the check")
    last_check = here.ms
    assert [m.content for m in home.check_messages("beta").messages] == ["before the check"]
    here.ms += 60_000
    pull(home, offline)  # the offline machine comes back a minute after the check
    later = home.check_messages("beta", arrived_after_ms=last_check)
    assert [m.content for m in later.messages] == ["written an hour ago, offline"]
    assert home.check_messages("beta", arrived_after_ms=here.ms).messages == []


def test_arrival_time_never_decreases_when_the_clock_steps_back() -> None:
    """A wall clock stepping back leaves arrival times where they were, so a timestamp still splits
    the arrival order in two: what came before, and what came after."""
    clock = Clock(NOW)
    r = Replica.open(wall=clock)
    r.send_message("a", "b", "first")
    clock.ms -= 3_600_000
    r.send_message("a", "b", "after the step back")
    assert r.position_at(NOW - 1) == 0
    assert r.position_at(NOW) == r.max_lseq()
    assert [m.content for m in r.check_messages("b", arrived_after_ms=NOW - 1).messages] == [
        "first", "after the step back"]


@given(steps=st.lists(st.integers(-5_000, 5_000), min_size=1, max_size=30), probe=st.integers(NOW - 200_000, NOW + 200_000))
def test_position_at_is_the_last_op_that_had_arrived(steps: list[int], probe: int) -> None:
    """The binary search over arrival times finds the last op that arrived at or before a time,
    whatever the wall clock did (steps back included)."""
    clock = Clock(NOW)
    r = Replica.open(wall=clock)
    for step in steps:
        clock.ms += step
        r.send_message("a", "b", "x")
    with r._store.read() as cur:  # the rule, by a plain scan
        arrivals = cur.execute("SELECT lseq, arrived FROM ops ORDER BY lseq").fetchall()
    assert [a for _, a in arrivals] == sorted(a for _, a in arrivals)
    assert r.position_at(probe) == max((lseq for lseq, a in arrivals if a <= probe), default=0)
