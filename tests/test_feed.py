"""The change feed in one process: its sources (listener, file watch), its asyncio waiter, its
rules (marks only grow, one watcher per process), on real replica files."""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from peerd import home as homes
from peerd.feedlink import daemon_key, parse_mark
from peerd.indexer import keep_indexed
from replica import Replica, open_home
from replica import feed as feedmod
from replica.feed import ANY_NAME, ChangeFeed, FeedWaiter, FileWatch, parse_events, touched
from tests.daemons import patience, read_only, wait_until

REPO = Path(__file__).resolve().parent.parent
WRITER = """
import sys
from pathlib import Path
from replica import open_home
with open_home(Path(sys.argv[1])) as r:
    for i in range(int(sys.argv[2])):
        r.send_message("writer", "beta", f"from another process {i}")
"""


@pytest.fixture
def replica(home: Path) -> Iterator[Replica]:
    r = open_home(home)
    yield r
    r.close()


def write_elsewhere(home: Path, count: int = 1) -> None:
    """``count`` messages written by a separate Python process on the same replica file."""
    subprocess.run([sys.executable, "-c", WRITER, str(home), str(count)], cwd=REPO, check=True, timeout=60)


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "peerd-feed-watch"]


# -- pure parts ------------------------------------------------------------------------------------


def inotify_event(name: bytes, mask: int = 0x2) -> bytes:
    padded = name + b"\0" * (16 - len(name) % 16) if name else b""
    return struct.pack("iIII", 1, mask, 0, len(padded)) + padded


def test_parse_events_reads_names_and_overflow() -> None:
    """Names come out of a buffer of inotify events; a queue overflow stands for every name."""
    data = inotify_event(b"replica.db-wal") + inotify_event(b"daemon.json", 0x80) + inotify_event(b"replica.db-wal")
    assert parse_events(data) == {"replica.db-wal", "daemon.json"}
    assert parse_events(inotify_event(b"", 0x4000)) == {ANY_NAME}
    assert touched({"x.tmp", "daemon.json"}, ["daemon.json", "replica.db-wal"]) == {"daemon.json"}
    assert touched({ANY_NAME}, ["daemon.json", "replica.db-wal"]) == {"daemon.json", "replica.db-wal"}


def test_stream_lines_and_daemon_identity() -> None:
    """Only ``{"lseq": N}`` with a whole N >= 0 is a mark; a daemon run is told by pid, start and port."""
    assert parse_mark(b'{"lseq": 42}\n') == 42
    for bad in (b"", b"garbage", b'{"lseq": -1}', b'{"lseq": true}', b'{"lseq": "3"}', b"[1]"):
        assert parse_mark(bad) is None
    assert daemon_key({"pid": 7, "started": 1.5, "local_port": 8}) == (7, 1.5, 8)
    assert daemon_key({"pid": 7}) is None and daemon_key(None) is None


# -- the feed ---------------------------------------------------------------------------------------


def test_commits_through_the_replica_move_the_mark_at_once(replica: Replica) -> None:
    """The replica's listener moves the mark to max_lseq before the write returns, and wakes subscribers."""
    feed = ChangeFeed(replica)
    woken: list[int] = []
    unsubscribe = feed.subscribe(lambda: woken.append(feed.mark))
    sent = replica.send_message("alpha", "beta", "hi")
    assert feed.mark == sent.seq == replica.max_lseq() and woken == [sent.seq]
    unsubscribe()
    replica.send_message("alpha", "beta", "again")
    assert woken == [sent.seq] and feed.mark == replica.max_lseq()
    feed.close()
    replica.send_message("alpha", "beta", "after close")
    assert feed.mark < replica.max_lseq()


def test_the_mark_only_grows(replica: Replica) -> None:
    """An older or equal mark (a late source) neither moves the mark back nor wakes anyone."""
    feed = ChangeFeed(replica)
    woken: list[int] = []
    feed.subscribe(lambda: woken.append(feed.mark))
    feed.advance(10)
    feed.advance(3)
    feed.advance(10)
    assert feed.mark == 10 and woken == [10]
    feed.close()


def test_file_watch_notices_another_process_write(home: Path, replica: Replica) -> None:
    """A commit by a separate process reaches the feed through its one watch thread."""
    feed = ChangeFeed.watching(replica)
    woke = threading.Event()
    feed.subscribe(woke.set)
    try:
        assert len(watch_threads()) == 1
        write_elsewhere(home)
        assert woke.wait(10)
        assert feed.mark == replica.max_lseq() == 1
    finally:
        feed.close()
    assert watch_threads() == []


def test_file_watch_without_inotify_reads_data_version(home: Path, replica: Replica,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the platform has no inotify, the watch falls back to SQLite's data_version and still wakes."""
    monkeypatch.setattr(feedmod, "_inotify", lambda _folder: None)
    feed = ChangeFeed.watching(replica)
    woke = threading.Event()
    feed.subscribe(woke.set)
    try:
        write_elsewhere(home, 3)
        assert woke.wait(10)
        while feed.mark < 3:  # the three commits may reach it in one look or several
            woke.clear()
            assert woke.wait(10)
    finally:
        feed.close()


@pytest.mark.parametrize("evented", [True, False], ids=["inotify", "polling"])
def test_file_watch_reports_other_files_of_the_folder(home: Path, replica: Replica, evented: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A file named in ``also`` (daemon.json, written atomically) runs its callback when written."""
    if not evented:
        monkeypatch.setattr(feedmod, "_inotify", lambda _folder: None)
    seen = threading.Event()
    feed = ChangeFeed(replica, FileWatch(replica.path, also={"daemon.json": seen.set}))
    try:
        homes.write_daemon_json(home, {"pid": os.getpid()})
        assert seen.wait(10)
    finally:
        feed.close()


# -- the asyncio side -------------------------------------------------------------------------------


async def test_one_watcher_serves_many_waiters(home: Path, replica: Replica) -> None:
    """Ten waits on one process's feed share its one watch thread, and one write elsewhere wakes them all."""
    feed = await asyncio.to_thread(ChangeFeed.watching, replica)
    waiter = FeedWaiter(feed, asyncio.get_running_loop)
    try:
        mark = waiter.mark
        waits = [asyncio.create_task(waiter.wait_beyond(mark)) for _ in range(10)]
        await asyncio.sleep(0)  # each task runs up to its future
        assert waiter.waiting == 10 and len(watch_threads()) == 1
        await asyncio.to_thread(write_elsewhere, home)
        await asyncio.wait_for(asyncio.gather(*waits), 10)
        assert waiter.mark > mark and waiter.waiting == 0
    finally:
        waiter.close()
        await asyncio.to_thread(feed.close)


class CountingLoop:
    """An asyncio loop as a waiter's ``Loop``, counting the callbacks handed to it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.callbacks = 0

    def create_future(self) -> asyncio.Future[None]:
        return self.loop.create_future()

    def call_soon_threadsafe(self, callback: Callable[[], object], /) -> object:
        self.callbacks += 1
        return self.loop.call_soon_threadsafe(callback)


async def test_a_change_costs_one_callback_however_many_calls_wait(replica: Replica) -> None:
    """The waiter takes its loop from its host: ten waiting calls and a change from another
    thread cost one callback on that loop, and every call returns."""
    feed = ChangeFeed(replica)
    loop = CountingLoop(asyncio.get_running_loop())
    waiter = FeedWaiter(feed, lambda: loop)
    try:
        mark = waiter.mark
        waits = [asyncio.create_task(waiter.wait_beyond(mark)) for _ in range(10)]
        await asyncio.sleep(0)  # each task runs up to its future
        assert waiter.waiting == 10 and loop.callbacks == 0
        await asyncio.to_thread(replica.send_message, "a", "b", "wake")
        await asyncio.wait_for(asyncio.gather(*waits), patience(5))
        assert loop.callbacks == 1 and waiter.waiting == 0
    finally:
        waiter.close()
        feed.close()


async def test_a_closed_waiter_returns_at_once(replica: Replica) -> None:
    """Closing releases a waiting call, and a wait on a closed waiter does not park at all."""
    feed = ChangeFeed(replica)
    waiter = FeedWaiter(feed, asyncio.get_running_loop)
    parked = asyncio.create_task(waiter.wait_beyond(waiter.mark))
    await asyncio.sleep(0)
    assert waiter.waiting == 1
    waiter.close()
    await asyncio.wait_for(parked, patience(5))
    await asyncio.wait_for(waiter.wait_beyond(waiter.mark), patience(1))
    assert waiter.waiting == 0
    feed.close()


async def test_wait_beyond_returns_at_once_when_the_mark_is_past(replica: Replica) -> None:
    """A change that landed before the wait began is not waited for (the mark is taken before looking)."""
    feed = ChangeFeed(replica)
    waiter = FeedWaiter(feed, asyncio.get_running_loop)
    mark = waiter.mark
    await asyncio.to_thread(replica.send_message, "a", "b", "early")
    await asyncio.wait_for(waiter.wait_beyond(mark), patience(1))
    assert waiter.waiting == 0
    waiter.close()
    feed.close()


async def test_indexer_indexes_what_lands_and_ends_on_close(replica: Replica) -> None:
    """The background indexer, woken by the feed, brings the search index up to a new message with
    no search asking for it; closing the waiter ends it."""
    feed = ChangeFeed(replica)
    waiter = FeedWaiter(feed, asyncio.get_running_loop)
    task = asyncio.create_task(keep_indexed(replica, waiter, delay=0))
    sent = await asyncio.to_thread(replica.send_message, "alpha", "beta", "needle in the index")

    def indexed_upto() -> int:
        with read_only(Path(replica.path)) as db:
            return int(db.execute("SELECT v FROM meta WHERE k = 'fts_upto'").fetchone()[0])

    await asyncio.to_thread(wait_until, lambda: indexed_upto() >= sent.seq, 10, "the indexer to reach the message")
    assert not task.done()
    waiter.close()
    await asyncio.wait_for(task, patience(5))
    feed.close()
