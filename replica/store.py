"""The SQLite shell: connection set-up, transactions and migrations, and the row helpers every
writer shares (origins, arrival times). What an op does to the tables is ``replica.project``
(messages, retractions, routes) and ``replica.registers`` (last-writer-wins registers); the steps
that recompute projections on an upgrade are ``replica.migrate``.

Invariants:
* The database runs in WAL mode with a busy timeout, so several processes can
  share one replica file; every write runs in ``BEGIN IMMEDIATE`` and
  allocates seqs and lseqs inside that transaction.
* Migrations only move forward; a file of a newer schema is refused untouched, and a file that
  is not a peerd replica (other tables) is never taken over.
* ``arrived`` (Unix ms) never decreases along lseq, so "arrived after T" is
  "lseq after the last op that arrived at or before T".
* sqlite3 errors are translated to ``StoreError`` here and go no further.
* In a ``no_wait`` block (the event loop trying a short call before it hands it to a worker
  thread) a lock held elsewhere raises ``WouldWait`` instead of waiting, as long as nothing has
  been committed in the block; after a commit the block's work may not be redone, so the rest
  of it waits as usual. The block holds the connection's lock from start to end.
* ``check_file`` opens a file read-only (``mode=ro``): looking never writes.
* A replica file this creates is owner-only (0600) before SQLite opens it, so its ``-wal`` and
  ``-shm`` files, which SQLite makes with the database's own mode, are owner-only too.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from replica import fleetstore, migrate, schema
from replica.errors import StoreError, WouldWait
from replica.models import FileCheck

BUSY_TIMEOUT_MS = 30_000
_BUSY = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED: the primary result codes of a lock held elsewhere


CACHE_KIB = 2048  # page cache per connection (2 MiB): hot index pages fit; the OS page cache holds the rest


FILE_MODE = 0o600


def create_private(path: str | Path) -> bool:
    """Create ``path`` empty and owner-only unless it exists (an empty file is a new SQLite
    database); whether this call made it. Anything but "it exists" is left for SQLite to report."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except OSError:
        return False
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, FILE_MODE)  # os.open's mode is masked by the umask: only ever narrower
    finally:
        os.close(fd)
    return True


class Store:
    """One connection to a replica file, guarded by a lock for thread use."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.lock = threading.RLock()
        self._no_wait = False  # a no_wait block holds the lock, so only its thread reads this
        self._timeout_ms = BUSY_TIMEOUT_MS  # the connection's busy timeout now (``_match_timeout``)
        self.commits = 0  # commits through this connection; with data_version, see ``version``
        if self.path != ":memory:":
            create_private(self.path)
        try:
            self.conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            self._configure()
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open replica {self.path}: {exc}") from None

    def _configure(self) -> None:
        c = self.conn
        c.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        c.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes on a new file, or at a VACUUM (``replica.purge``)
        c.execute("PRAGMA secure_delete = ON")  # deleted text is overwritten, never left in a page (``replica.scrub``)
        if self.path != ":memory:":
            self._enable_wal()
        c.execute("PRAGMA synchronous = NORMAL")
        c.execute("PRAGMA foreign_keys = OFF")
        c.execute(f"PRAGMA cache_size = -{CACHE_KIB}")

    def _enable_wal(self) -> None:
        """Switch to WAL once per file. Another process opening the same new file at the same
        moment can make the switch report busy at once (no busy handler applies), so retry."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                if str(self.conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                    return
                self.conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _migrate(self) -> None:
        with self.write() as cur:
            has_meta = cur.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
            ).fetchone()
            version = 0
            if has_meta:
                row = cur.execute("SELECT v FROM meta WHERE k='schema_version'").fetchone()
                version = int(row[0]) if row else 0
            if version > schema.LATEST:
                raise StoreError(f"{self.path} was written by a newer peerd (replica schema v{version}; this peerd "
                                 f"reads up to v{schema.LATEST}): upgrade peerd to open it; nothing was changed")
            if version == 0:
                _require_empty(cur, self.path)
            for script in schema.MIGRATIONS[version:]:
                for stmt in script.split(";"):
                    if stmt.strip():
                        cur.execute(stmt)
            if version < schema.KEYED:
                migrate.rebuild_keys(cur)  # the first-seen times among the rest
            elif version < schema.ROLES_SEEN:
                migrate.backfill_reads(cur)
            if version < schema.MEMBERS:
                fleetstore.backfill(cur)
            migrate.upgrade_held(cur)
            cur.execute(
                "INSERT INTO meta(k, v) VALUES ('schema_version', ?) "
                "ON CONFLICT(k) DO UPDATE SET v = excluded.v", (schema.LATEST,),
            )

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    @contextmanager
    def no_wait(self) -> Iterator[None]:
        """Run the block without waiting for a lock (see the module's invariants): ``WouldWait``
        at once if another thread uses the connection, or if a read or a write of the block meets
        a lock another connection holds before the block has committed anything."""
        if not self.lock.acquire(blocking=False):
            raise WouldWait(f"{self.path} is in use by another thread")
        try:
            if self._no_wait:  # nested: the outer block decides
                yield
                return
            self._no_wait = True
            try:
                yield
            finally:
                self._no_wait = False
        finally:
            self.lock.release()

    def _match_timeout(self) -> None:
        """Give the connection the busy timeout of the mode it is in (none in a ``no_wait`` block)
        before a transaction starts. Set only when it changes: a run of no_wait calls, as an event
        loop makes them, pays for no PRAGMA."""
        want = 0 if self._no_wait else BUSY_TIMEOUT_MS
        if self._timeout_ms != want:
            self.conn.execute(f"PRAGMA busy_timeout = {want}")
            self._timeout_ms = want

    @contextmanager
    def raw(self) -> Iterator[sqlite3.Connection]:
        """The connection itself, under its lock and with the waiting busy timeout, for the
        statements a transaction cannot hold (a checkpoint, an incremental vacuum)."""
        with self.lock:
            self._match_timeout()
            yield self.conn

    def truncate_wal(self) -> bool:
        """Copy the whole WAL into the main file and cut it to 0 bytes, without waiting for anyone:
        False when a reader still needs part of it, or a writer holds the file (try again later)."""
        with self.lock:
            try:
                self.conn.execute("PRAGMA busy_timeout = 0")
                busy, _log, _done = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.OperationalError:
                return False
            except sqlite3.Error as exc:
                raise StoreError(f"checkpoint failed on {self.path}: {exc}") from None
            finally:
                self.conn.execute(f"PRAGMA busy_timeout = {self._timeout_ms}")
            return int(busy) == 0

    def _would_wait(self, exc: sqlite3.Error) -> bool:
        return self._no_wait and getattr(exc, "sqlite_errorcode", 0) & 0xFF in _BUSY

    def version(self) -> tuple[int, int]:
        """A value that changes whenever anything is committed to the file, by this connection
        (``commits``) or any other (SQLite's ``data_version``): what a cache of a read checks."""
        with self.lock:
            return int(self.conn.execute("PRAGMA data_version").fetchone()[0]), self.commits

    @contextmanager
    def write(self) -> Iterator[sqlite3.Cursor]:
        """A write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on error)."""
        with self.lock:
            try:
                self._match_timeout()
                cur = self.conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if self._would_wait(exc):
                    raise WouldWait(f"{self.path} is being written by another connection") from None
                raise StoreError(f"cannot start a write on {self.path}: {exc}") from None
            try:
                yield cur
                cur.execute("COMMIT")
                self.commits += 1
                self._no_wait = False  # committed: the rest of a no_wait block waits as usual
            except BaseException as exc:
                with suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"write failed on {self.path}: {exc}") from None
                raise

    @contextmanager
    def read(self) -> Iterator[sqlite3.Cursor]:
        """A consistent read snapshot (nested reads share the outer one)."""
        with self.lock:
            cur = self.conn.cursor()
            outer = not self.conn.in_transaction
            try:
                if outer:
                    self._match_timeout()
                    cur.execute("BEGIN")
                yield cur
            except sqlite3.Error as exc:
                if self._would_wait(exc):
                    raise WouldWait(f"{self.path} is locked by another connection") from None
                raise StoreError(f"read failed on {self.path}: {exc}") from None
            finally:
                if outer:
                    with suppress(sqlite3.Error):
                        self.conn.execute("COMMIT")


def _require_empty(cur: sqlite3.Cursor, path: str) -> None:
    """A database without peerd's schema must be empty: another program's tables are never
    taken over (say, a file of another message bus opened by mistake)."""
    tables = [r[0] for r in cur.execute("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' LIMIT 5")]
    if tables:
        raise StoreError(f"{path} is not a peerd replica: it holds other tables ({', '.join(tables)})")


def check_file(path: str | Path, *, timeout: float = 10.0) -> FileCheck:
    """SQLite's quick check and the counts of a replica file, opened read-only (a daemon
    may be writing it; ``timeout`` seconds at most for its locks); ``StoreError`` if it
    cannot be read as a replica."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout)
        try:
            result = str(conn.execute("PRAGMA quick_check").fetchone()[0])
            messages = int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
            ops = int(conn.execute("SELECT count(*) FROM ops").fetchone()[0])
            columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(ops)")}
            newer = int(conn.execute("SELECT count(*) FROM ops WHERE newer IS NOT NULL").fetchone()[0]) \
                if "newer" in columns else 0
            row = conn.execute("SELECT v FROM meta WHERE k = 'pin_refused'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None
    return FileCheck(result, messages, ops, newer, int(row[0]) if row else 0)


def origin_id(cur: sqlite3.Cursor, node: bytes) -> int:
    row = cur.execute("SELECT oid FROM origins WHERE node = ?", (node,)).fetchone()
    if row:
        return int(row[0])
    cur.execute("INSERT INTO origins(node) VALUES (?)", (node,))
    return int(cur.lastrowid or 0)


def arrival_time(cur: sqlite3.Cursor, wall_ms: int) -> int:
    """The arrival time of ops stored now, in this write transaction: the wall clock, but never
    before the last op's (so arrival times never decrease along lseq)."""
    row = cur.execute("SELECT arrived FROM ops ORDER BY lseq DESC LIMIT 1").fetchone()
    return max(wall_ms, int(row[0]) if row else 0)


def position_at(cur: sqlite3.Cursor, arrived_ms: int) -> int:
    """The highest lseq whose op arrived at or before ``arrived_ms`` (0 if none): a binary search,
    as arrival times never decrease along lseq."""
    lo, hi = 0, int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])
    while lo < hi:
        mid = (lo + hi + 1) // 2
        row = cur.execute("SELECT lseq, arrived FROM ops WHERE lseq >= ? ORDER BY lseq LIMIT 1", (mid,)).fetchone()
        if int(row[1]) <= arrived_ms:
            lo = int(row[0])
        else:
            hi = mid - 1
    return lo
