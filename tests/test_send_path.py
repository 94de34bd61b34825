"""What a send does less of per call, and that it answers the same: the known roles remembered
between sends, the feed told the new position by the writer, and a run of no-wait calls that sets
the busy timeout once; on real replica files, with a second connection writing beside."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replica import Replica, open_home
from replica.feed import ChangeFeed
from replica.store import BUSY_TIMEOUT_MS, Store


@pytest.fixture
def pair(home: Path) -> Iterator[tuple[Replica, Replica]]:
    """Two connections to one replica file, as a daemon and an agent's stdio server have."""
    a, b = open_home(home), open_home(home)
    yield a, b
    a.close()
    b.close()


def test_a_send_names_the_roles_another_connection_added_since_the_last(pair: tuple[Replica, Replica]) -> None:
    """The remembered roles miss once another connection commits: a profile set there is named
    in the next warning, and a role it made known is no longer unknown."""
    a, b = pair
    a.update_profile("coder", "Coder")
    _, first, _ = a.send_checked("lead", "reviewr", "one")
    assert first.unknown_recipients == ("reviewr",) and "reviewer" not in first.known_roles
    b.update_profile("reviewer", "Reviewer")
    _, second, _ = a.send_checked("lead", "reviewr", "two")
    assert second.known_roles[0] == "reviewer"
    b.update_profile("reviewr", "Reviewer, spelt so")
    _, third, _ = a.send_checked("lead", "reviewr", "three")
    assert third.unknown_recipients == () and third.known_roles == ()


def test_the_sender_of_a_send_is_known_to_the_next_one(pair: tuple[Replica, Replica]) -> None:
    """The roles remembered after a send hold its sender: the next send to it is no warning,
    and the next to an unseen role lists it."""
    a, _b = pair
    _, check, _ = a.send_checked("newcomer", "ghost", "hello")
    assert "newcomer" not in check.known_roles
    _, to_sender, _ = a.send_checked("lead", "newcomer", "welcome")
    assert to_sender.unknown_recipients == ()
    _, again, _ = a.send_checked("lead", "ghost", "still there?")
    assert again.unknown_recipients == ("ghost",) and {"lead", "newcomer"} <= set(again.known_roles)


def test_a_write_of_this_connection_other_than_a_send_is_seen_by_the_next_send(pair: tuple[Replica, Replica]) -> None:
    a, _b = pair
    a.send_checked("lead", "ghost", "one")
    a.update_profile("late", "Late")
    a.check_messages("inbox-reader")  # seen only reading: unconfirmed
    _, check, _ = a.send_checked("lead", "ghost, inbox-reader", "two")
    assert "late" in check.known_roles and check.unconfirmed == ("inbox-reader",)


ROLES = st.sampled_from(["lead", "coder", "coder-vps", "reviewer", "reviewr", "ghost", "Ghost", "qa"])
ACTIONS = st.lists(st.tuples(st.sampled_from(["send", "profile", "inbox"]), st.booleans(), ROLES, ROLES),
                   min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS)
def test_every_send_checks_its_recipients_as_a_fresh_connection_would(tmp_path: Path,
                                                                      actions: list[tuple[str, bool, str, str]]) -> None:
    """Whatever mix of sends, profiles and inbox reads two connections make, each send's
    recipient check equals the one a third connection makes just before it."""
    home = tmp_path / f"h{len(list(tmp_path.iterdir()))}"
    with open_home(home) as a, open_home(home) as b, open_home(home) as fresh:
        for what, on_a, role, other in actions:
            rep = a if on_a else b
            if what == "send":
                expected = fresh.recipient_check(f"{other},{role}")
                _, check, _ = rep.send_checked(role, f"{other},{role}", "m")
                assert check == expected
            elif what == "profile":
                rep.update_profile(role, role.title())
            else:
                rep.check_messages(role)


def test_a_local_write_tells_the_feed_its_position(home: Path) -> None:
    """The writer hands the listeners the position it stored at; the feed moves there without
    reading it back."""
    with open_home(home) as rep:
        marks: list[int | None] = []
        plain: list[str] = []
        rep.add_mark_listener(marks.append)
        rep.add_listener(lambda: plain.append("new ops"))
        feed = ChangeFeed(rep)
        sent, _, _ = rep.send_checked("alpha", "beta", "hi")
        assert marks == [sent.seq] and plain == ["new ops"] and feed.mark == sent.seq == rep.max_lseq()
        feed.close()
        rep.remove_listener(marks.append)
        rep.send_checked("alpha", "beta", "again")
        assert marks == [sent.seq] and plain == ["new ops"] * 2


def _timeout(store: Store) -> int:
    return int(store.conn.execute("PRAGMA busy_timeout").fetchone()[0])


def test_no_wait_blocks_wait_for_nothing_and_every_other_call_waits_as_usual(home: Path) -> None:
    """Inside a no_wait block a transaction starts with no busy timeout; a transaction outside
    one, or after the block's commit, starts with the full timeout again."""
    store = Store(home / "replica.db")
    seen: list[tuple[str, int]] = []
    try:
        with store.no_wait():
            with store.read() as cur:
                seen.append(("no_wait read", _timeout(store)))
                cur.execute("SELECT 1")
            with store.write() as cur:
                seen.append(("no_wait write", _timeout(store)))
            with store.read() as cur:
                seen.append(("after its commit", _timeout(store)))
        with store.write() as cur:
            seen.append(("outside", _timeout(store)))
        with store.raw() as conn:
            seen.append(("raw", int(conn.execute("PRAGMA busy_timeout").fetchone()[0])))
    finally:
        store.close()
    assert seen == [("no_wait read", 0), ("no_wait write", 0), ("after its commit", BUSY_TIMEOUT_MS),
                    ("outside", BUSY_TIMEOUT_MS), ("raw", BUSY_TIMEOUT_MS)]


def test_a_run_of_no_wait_sends_sets_the_busy_timeout_once(home: Path) -> None:
    with open_home(home) as rep:
        statements: list[str] = []
        conn: sqlite3.Connection = rep._store.conn
        conn.set_trace_callback(statements.append)
        for i in range(5):
            with rep.no_wait():
                rep.send_checked("alpha", "beta", f"m{i}")
        conn.set_trace_callback(None)
    assert sum("busy_timeout" in s for s in statements) == 1, statements
    assert sum(s == "COMMIT" for s in statements) == 5
