"""One change feed per process: how every waiter learns that new ops landed.

Invariants:
* A feed's ``mark`` is the replica's ``max_lseq`` as this process last learned
  it. It only grows, and never runs ahead of what a new read of the replica
  sees (every source reports a commit only once it is visible).
* Subscribers are called, from the thread that learned of the change, each
  time the mark grows; they must return at once (hand off to a loop or an
  event) and read ``mark`` for the newest value (calls from two threads may
  interleave).
* Sources: commits through this process's ``Replica`` reach the feed at once
  (its listener); commits by other connections (other processes, other
  ``Replica`` objects) reach it through one outside ``Source`` at a time: a
  ``FileWatch`` on the replica file, or whatever the host plugs in (the
  daemon's change stream). A process builds one feed per replica file, so one
  watcher serves every waiter.
* ``FileWatch`` sleeps in the kernel: inotify on the replica's folder where
  the platform has it, so an idle process costs nothing; elsewhere it reads
  SQLite's ``data_version`` every ``POLL_INTERVAL`` on its own connection.
  After a file event it lets the writer's burst finish (``GATHER_S``) before it
  looks, so one commit costs one wake-up and one look, not one per WAL frame.
* ``FeedWaiter`` turns the feed into awaitable waits. A waiting call costs one
  future; a change costs one callback on the loop, however many calls wait;
  ``wait_beyond(mark)`` returns once the mark exceeds ``mark``, so a caller
  that takes the mark *before* it looks for data never misses a change that
  lands between the look and the wait; once closed, every wait returns at once.
* No asyncio here (``replica`` stays loop-free, tests/test_layers.py): the
  waiter is loop-neutral. It takes its event loop from its host, through a
  callable that returns the running loop (``Loop``: the two loop methods it
  uses), because the daemon, the CLI and the MCP server all wait on the same
  feed and each builds its waiter with asyncio's loop
  (``mcp_server.wiring``, the one place that does).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import selectors
import sqlite3
import struct
import sys
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from replica.api import Replica
from replica.errors import StoreError

log = logging.getLogger("replica.feed")

Subscriber = Callable[[], None]
POLL_INTERVAL = 0.025  # only where there is no inotify
# A file event comes when a writer writes its WAL frames, a moment before the commit becomes
# visible to readers (SQLite then updates the shared-memory index, which raises no event):
# look at once, then again after these pauses until the commit shows (a writer descheduled in
# between on a busy machine is covered for most of a second). A new event cuts a pause short;
# an event whose commit never shows (a spilled cache rolled back) costs a few looks, no more.
SETTLE_PAUSES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
# A commit writes its WAL frames one write() each, and each raises an event: after the first
# event, let the burst finish before the first look. The kernel folds the repeats meanwhile, so a
# commit costs one wake-up and one look instead of one of each per frame (this process's own
# commits among them: they reach the feed through the replica's listener, but raise events too).
GATHER_S = 0.001

_IN_MODIFY = 0x002
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_Q_OVERFLOW = 0x4000
_WATCH_MASK = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE  # a commit writes the WAL; a file replaced is moved in
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
ANY_NAME = "*"  # stands for every name when the kernel's event queue overflowed


class Source(Protocol):
    """Something that tells a feed about commits it cannot see through the replica's listener."""

    def start(self, feed: ChangeFeed) -> None: ...

    def stop(self) -> None: ...


class ChangeFeed:
    """The mark of one replica in this process, and who to wake when it grows."""

    def __init__(self, replica: Replica, source: Source | None = None) -> None:
        self._replica = replica
        self._lock = threading.Lock()
        self._subs: list[Subscriber] = []
        self._mark = replica.max_lseq()
        self._source = source
        replica.add_mark_listener(self.refresh)
        if source is not None:
            source.start(self)

    @classmethod
    def watching(cls, replica: Replica) -> ChangeFeed:
        """A feed that also notices other processes' commits (a ``FileWatch``), unless in memory."""
        return cls(replica, None if replica.path == ":memory:" else FileWatch(replica.path))

    @property
    def mark(self) -> int:
        return self._mark

    def refresh(self, mark: int | None = None) -> None:
        """The replica's listener, called after each commit through it: advance to ``mark``, the
        newest position when the writer knows it, else read the mark from the replica."""
        self.advance(self._replica.max_lseq() if mark is None else mark)

    def advance(self, mark: int) -> None:
        """Move the mark to ``mark`` if that is ahead, and wake every subscriber."""
        with self._lock:
            if mark <= self._mark:
                return
            self._mark = mark
            subs = list(self._subs)
        for fn in subs:
            fn()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn()`` whenever the mark grows; returns the function that unsubscribes."""
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._subs.remove(fn)

        return unsubscribe

    def close(self) -> None:
        """Stop the outside source and stop listening to the replica (which stays open)."""
        self._replica.remove_listener(self.refresh)
        if self._source is not None:
            self._source.stop()
            self._source = None


# -- waiting for the mark to move ----------------------------------------------------------------


class Waiter(Protocol):
    """What a waiting call needs from its host to block until the replica changes."""

    async def wait_beyond(self, lseq: int) -> None:
        """Return once the replica's ``max_lseq()`` exceeds ``lseq`` (cancel to give up)."""
        ...


class Pending(Protocol):
    """A future a ``Loop`` makes: awaited by one waiting call, resolved on the loop's thread."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def __await__(self) -> Generator[Any, None, Any]: ...


class Loop(Protocol):
    """What a ``FeedWaiter`` needs of an event loop (an asyncio loop has both)."""

    def create_future(self) -> Pending: ...

    def call_soon_threadsafe(self, callback: Callable[[], object], /) -> object: ...


class FeedWaiter:
    """A ``Waiter`` over a ``ChangeFeed``, on the loop ``running_loop()`` returns at each wait."""

    def __init__(self, feed: ChangeFeed, running_loop: Callable[[], Loop]) -> None:
        self._feed = feed
        self._running_loop = running_loop
        self._waiters: dict[Pending, int] = {}
        self._loop: Loop | None = None
        self._pending = False
        self.closed = False
        self._unsubscribe = feed.subscribe(self._on_change)

    @property
    def mark(self) -> int:
        """The newest mark the feed knows (take it before looking for data)."""
        return self._feed.mark

    @property
    def waiting(self) -> int:
        """How many calls wait right now (what a test waits on before it writes)."""
        return len(self._waiters)

    async def wait_beyond(self, lseq: int) -> None:
        if self.closed or self._feed.mark > lseq:
            return
        loop = self._loop = self._running_loop()
        fut = loop.create_future()
        self._waiters[fut] = lseq
        try:
            if self._feed.mark <= lseq:  # look again: a change may have landed while we registered
                await fut
        finally:
            self._waiters.pop(fut, None)

    def close(self) -> None:
        """Stop following the feed and release every waiter (on the loop's thread)."""
        self.closed = True
        self._unsubscribe()
        self._release()

    def _on_change(self) -> None:
        """Called by the feed from whichever thread learned of the change."""
        loop = self._loop
        if loop is None or self._pending:
            return  # nobody has waited yet (the mark is looked at again on entry), or a release is due
        self._pending = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        self._pending = False
        mark = self._feed.mark
        for fut, lseq in list(self._waiters.items()):
            if (self.closed or mark > lseq) and not fut.done():
                fut.set_result(None)


# -- noticing other connections' commits --------------------------------------------------------


def parse_events(data: bytes) -> set[str]:
    """The file names in a buffer of inotify events (``ANY_NAME`` if the queue overflowed)."""
    names: set[str] = set()
    pos = 0
    while pos + _EVENT.size <= len(data):
        _wd, mask, _cookie, size = _EVENT.unpack_from(data, pos)
        raw = data[pos + _EVENT.size : pos + _EVENT.size + size]
        pos += _EVENT.size + size
        if mask & _IN_Q_OVERFLOW:
            names.add(ANY_NAME)
        name = raw.split(b"\0", 1)[0]
        if name:
            names.add(os.fsdecode(name))
    return names


def touched(names: Iterable[str], wanted: Iterable[str]) -> set[str]:
    """Which of ``wanted`` an event batch names (all of them after an overflow)."""
    names = set(names)
    return set(wanted) if ANY_NAME in names else names & set(wanted)


def _inotify(folder: Path) -> int | None:
    """An inotify descriptor watching ``folder``, or None where the platform has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, AttributeError):
        return None
    if fd < 0:  # e.g. the per-user limit of inotify instances is reached
        return None
    if libc.inotify_add_watch(fd, os.fsencode(folder), _WATCH_MASK) < 0:
        os.close(fd)
        return None
    return fd


def _stat_sig(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class _Wakeups:
    """Blocks the watch thread until files in a folder change or ``stop()``: inotify, or a timer."""

    def __init__(self, folder: Path, db_names: Iterable[str], also: Iterable[str]) -> None:
        self.folder = folder
        self._db_names = set(db_names)
        self._also = tuple(also)
        self._fd = _inotify(folder)
        if self._fd is None:
            log.info("no file notifications for %s here: reading the replica's data_version every %.0f ms",
                     folder, POLL_INTERVAL * 1000)
        self._stop_r, self._stop_w = os.pipe()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._stop_r, selectors.EVENT_READ)
        if self._fd is not None:
            self._sel.register(self._fd, selectors.EVENT_READ)
        self._sigs = {name: _stat_sig(folder / name) for name in self._also}

    @property
    def evented(self) -> bool:
        return self._fd is not None

    def wait(self, timeout: float | None) -> set[str] | None:
        """Names changed since the last call, or none after ``timeout`` s; None once stopped.
        Without inotify: every ``POLL_INTERVAL``, the database (always) and what changed."""
        ready = self._sel.select(timeout if self._fd is not None else POLL_INTERVAL)
        if any(key.fd == self._stop_r for key, _ in ready):
            return None
        if self._fd is None:
            return self._db_names | self._changed_also()
        return self._drain() if ready else set()

    def gather(self, delay: float) -> set[str] | None:
        """The names changed in the next ``delay`` s, read once at its end (so repeats of one
        event are folded by the kernel); None once stopped."""
        if self._stop_r in select.select([self._stop_r], [], [], delay)[0]:
            return None
        return self._drain()

    def _drain(self) -> set[str]:
        """The names in every inotify event queued now (none without inotify)."""
        names: set[str] = set()
        if self._fd is not None:
            with contextlib.suppress(BlockingIOError):
                while True:
                    names |= parse_events(os.read(self._fd, 65536))
        return names

    def _changed_also(self) -> set[str]:
        out = set()
        for name in self._also:
            sig = _stat_sig(self.folder / name)
            if sig != self._sigs[name]:
                self._sigs[name] = sig
                if sig is not None:
                    out.add(name)
        return out

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")

    def close(self) -> None:
        self._sel.close()
        for fd in (self._fd, self._stop_r, self._stop_w):
            if fd is not None:
                os.close(fd)


class _Reader:
    """The watch thread's own read-only connection: SQLite's data_version and the mark."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=rw", uri=True, timeout=30,
                                    isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA query_only = 1")
        self.version = self.data_version()

    def data_version(self) -> int:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def mark(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])

    def committed(self) -> bool:
        """True if another connection committed since the last call."""
        now = self.data_version()
        moved, self.version = now != self.version, now
        return moved


class FileWatch:
    """The outside source of a process alone on a replica file: one thread that notices
    commits by other connections. ``also`` maps other file names in the replica's folder
    to callbacks, run on the watch thread when such a file is created, replaced or written
    (how a host notices, say, a daemon starting on the same home)."""

    def __init__(self, path: str | Path, *, also: Mapping[str, Callable[[], None]] | None = None) -> None:
        self.path = Path(path)
        self._db_names = (self.path.name + "-wal",)  # a WAL replica commits by appending to its -wal file
        self._also = dict(also or {})
        self._wakeups: _Wakeups | None = None
        self._thread: threading.Thread | None = None

    def start(self, feed: ChangeFeed) -> None:
        try:
            reader = _Reader(str(self.path))
        except sqlite3.Error as exc:
            raise StoreError(f"cannot watch {self.path}: {exc}") from None
        try:
            self._wakeups = _Wakeups(self.path.parent, self._db_names, self._also)
        except BaseException:
            reader.conn.close()
            raise
        # The thread reads the mark only once the watch is armed, so no commit slips in between.
        self._thread = threading.Thread(target=self._run, args=(feed, self._wakeups, reader),
                                        name="peerd-feed-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._wakeups is None or self._thread is None:
            return
        self._wakeups.stop()
        self._thread.join()
        self._wakeups.close()
        self._wakeups = self._thread = None

    def _run(self, feed: ChangeFeed, wakeups: _Wakeups, reader: _Reader) -> None:
        try:
            feed.advance(reader.mark())
            pauses: list[float] = []  # while a commit is expected: how long to wait before each next look
            while (names := wakeups.wait(pauses.pop(0) if pauses else None)) is not None:
                if wakeups.evented and touched(names, self._db_names):
                    if (more := wakeups.gather(GATHER_S)) is None:
                        break
                    names |= more
                for name in touched(names, self._also):
                    self._also[name]()
                if touched(names, self._db_names):
                    pauses = list(SETTLE_PAUSES) if wakeups.evented else []
                elif not pauses and names:
                    continue  # only other files changed, and no commit is awaited
                if reader.committed():
                    feed.advance(reader.mark())
                    pauses = []
        except sqlite3.Error as exc:  # the file went away under us: in-process commits still wake waiters
            log.warning("stopped watching %s for other processes' writes: %s", self.path, exc)
        finally:
            reader.conn.close()
