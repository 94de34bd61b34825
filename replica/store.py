"""The SQLite shell: connection set-up, transactions, and applying ops to tables.

Invariants:
* The database runs in WAL mode with a busy timeout, so several processes can
  share one replica file; every write runs in ``BEGIN IMMEDIATE`` and
  allocates seqs and lseqs inside that transaction.
* ``store_op`` is idempotent: an op already held (same origin and seq) is
  ignored, and the projections are touched only for a newly stored op.
* A thread message's number in its thread (``thread_seqs.tseq``) is the next
  one of its thread, taken as it lands (inside the write transaction): 1, 2,
  3, ... per thread, no gaps, in this replica's arrival order.
* LWW projections change only when the register write wins: ``_LWW_UPSERT`` is
  ``lww.wins`` in SQL, and ``tests/test_crdt_properties.py`` checks the two agree.
* ``first_seen`` is a min-register per role (``replica.firstseen``): every op's
  sightings are projected with ``firstseen.record`` (the earliest time stays).
* sqlite3 errors are translated to ``StoreError`` here and go no further.
* ``check_file`` opens a file read-only (``mode=ro``): looking never writes.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from replica import firstseen, fleetstore, membership, routing, schema
from replica.errors import StoreError
from replica.hlc import wall_of
from replica.lww import join_key
from replica.models import FileCheck
from replica.ops import KIND_MSG, Op, message_id

BUSY_TIMEOUT_MS = 30_000


def receipt_id(msg_id: str, role: str, inst: str) -> str:
    """A receipt's id: a pure function of (message, role, instance)."""
    h = hashlib.blake2b(f"{msg_id}\x1f{role}\x1f{inst}".encode(), digest_size=12, person=b"peerd-rcpt")
    return h.hexdigest()


class Store:
    """One connection to a replica file, guarded by a lock for thread use."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.lock = threading.RLock()
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
        if self.path != ":memory:":
            self._enable_wal()
        c.execute("PRAGMA synchronous = NORMAL")
        c.execute("PRAGMA foreign_keys = OFF")
        c.execute("PRAGMA cache_size = -65536")

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
                raise StoreError(f"replica schema v{version} is newer than this peerd (v{schema.LATEST})")
            if version == 0:
                _require_empty(cur, self.path)
            for script in schema.MIGRATIONS[version:]:
                for stmt in script.split(";"):
                    if stmt.strip():
                        cur.execute(stmt)
            cur.execute(
                "INSERT INTO meta(k, v) VALUES ('schema_version', ?) "
                "ON CONFLICT(k) DO UPDATE SET v = excluded.v", (schema.LATEST,),
            )

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Cursor]:
        """A write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on error)."""
        with self.lock:
            try:
                cur = self.conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot start a write on {self.path}: {exc}") from None
            try:
                yield cur
                cur.execute("COMMIT")
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
                    cur.execute("BEGIN")
                yield cur
            except sqlite3.Error as exc:
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
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None
    return FileCheck(result, messages, ops)


def origin_id(cur: sqlite3.Cursor, node: bytes) -> int:
    row = cur.execute("SELECT oid FROM origins WHERE node = ?", (node,)).fetchone()
    if row:
        return int(row[0])
    cur.execute("INSERT INTO origins(node) VALUES (?)", (node,))
    return int(cur.lastrowid or 0)


def store_op(cur: sqlite3.Cursor, oid: int, op: Op) -> int | None:
    """Store ``op`` with its projections; its lseq if new, None if already held."""
    if op.kind == KIND_MSG:
        b = op.body
        cur.execute(
            "INSERT OR IGNORE INTO ops(oid, seq, blob, id, sender, sender_inst, channel, to_inst, thread, content, hlc)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (oid, op.seq, op.raw, message_id(op.origin, op.seq), b["f"], b["fi"], b["c"], b["ti"], b["t"], b["x"],
             op.hlc),
        )
    else:
        cur.execute("INSERT OR IGNORE INTO ops(oid, seq, blob, hlc) VALUES (?, ?, ?, ?)", (oid, op.seq, op.raw, op.hlc))
    if cur.rowcount != 1:
        return None
    lseq = int(cur.lastrowid or 0)
    materialize(cur, lseq, op)
    return lseq


# A thread message takes the next number of its thread as it lands: inside the write
# transaction, so numbers are unique per thread and follow this replica's arrival order.
_NUMBER_IN_THREAD = (
    "INSERT OR IGNORE INTO thread_seqs(lseq, thread, tseq) VALUES (?1, ?2,"
    " coalesce((SELECT tseq FROM thread_seqs WHERE thread = ?2 ORDER BY tseq DESC LIMIT 1), 0) + 1)"
)


def materialize(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """Project a newly stored op (its message columns are already in its row)."""
    if op.kind == KIND_MSG:
        if op.body["t"] is not None:
            cur.execute(_NUMBER_IN_THREAD, (lseq, op.body["t"]))
        keys = routing.route_keys(op.body["c"], op.body["t"])
        if len(keys) > 1:  # one role or broadcast: found through the channel column
            cur.executemany("INSERT OR IGNORE INTO routes(role, lseq) VALUES (?, ?)", [(k, lseq) for k in keys])
    elif op.kind in membership.KINDS:
        fleetstore.project(cur, lseq, op)
        return
    else:
        for write in op.body["w"]:
            if write[0] != firstseen.TABLE:  # a min-register, not last-writer-wins
                put_register(cur, write, op.hlc, op.origin)
    for role, at in firstseen.sightings(op):
        firstseen.record(cur, role, at)


_LWW_UPSERT = (
    "INSERT INTO lww(tbl, k, f, v, hlc, origin) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(tbl, k, f) DO UPDATE SET v = excluded.v, hlc = excluded.hlc, origin = excluded.origin "
    "WHERE excluded.hlc > lww.hlc OR (excluded.hlc = lww.hlc AND excluded.origin > lww.origin)"
)


def put_register(cur: sqlite3.Cursor, write: list[Any], hlc: int, origin: bytes) -> bool:
    """Apply one LWW write [table, key, field, value]; project it if it wins."""
    table, key, field, value = write
    stored = int(value) if isinstance(value, bool) else value
    cur.execute(_LWW_UPSERT, (table, join_key(key), field, stored, hlc, origin))
    if cur.rowcount != 1:
        return False
    _PROJECT[table](cur, key, field, stored, hlc)
    return True


def _project_receipt(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    col = "delivered" if field == "d" else "read"
    msg_id, role, inst = key
    cur.execute(
        f"INSERT INTO receipts(msg_id, role, inst, rid, {col}) VALUES (?, ?, ?, ?, ?) "
        f"ON CONFLICT(msg_id, role, inst) DO UPDATE SET {col} = excluded.{col}",
        (msg_id, role, inst, receipt_id(msg_id, role, inst), value),
    )


def _project_profile(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    cur.execute(
        f"INSERT INTO profiles(id, {field}, updated) VALUES (?, ?, ?) "
        f"ON CONFLICT(id) DO UPDATE SET {field} = excluded.{field}, "
        "updated = max(coalesce(updated, 0), excluded.updated)",
        (key[0], value, wall_of(hlc)),
    )


def _project_agent(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    cur.execute(
        f"INSERT INTO agents(id, {field}) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET {field} = excluded.{field}",
        (key[0], value),
    )


def _project_member(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    cur.execute(
        "INSERT INTO members(thread, agent, present) VALUES (?, ?, ?) "
        "ON CONFLICT(thread, agent) DO UPDATE SET present = excluded.present",
        (key[0], key[1], value),
    )


def _project_thread(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    cur.execute(
        "INSERT INTO threads(id, created) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET created = excluded.created",
        (key[0], value),
    )


_PROJECT = {
    "rcpt": _project_receipt,
    "prof": _project_profile,
    "agent": _project_agent,
    "member": _project_member,
    "thread": _project_thread,
}
