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
* Names are matched by key (``names.name_key``): a message row carries the
  keys of its sender, sender instance, channel and target instance, and a
  register write is filed under the keys of the names in its key
  (``register_key``), so ``Tau`` and ``tau`` write one receipt or profile.
  The signed op keeps the name as written; a profile shows the spelling of
  its first write (lowest stamp), the same on every replica.
* A retraction takes effect when its role is the message's sender (by key),
  whichever of the two ops arrives first: the content column is emptied, the
  search entry removed, and ``retracted`` holds the lowest such stamp.
* ``arrived`` (Unix ms) never decreases along lseq, so "arrived after T" is
  "lseq after the last op that arrived at or before T".
* ``first_seen`` is a min-register per role key (``replica.firstseen``): every op's
  sightings are projected with ``firstseen.record`` (the earliest time stays).
* sqlite3 errors are translated to ``StoreError`` here and go no further.
* ``check_file`` opens a file read-only (``mode=ro``): looking never writes.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from replica import firstseen, fleetstore, membership, retention, routing, schema
from replica.errors import StoreError
from replica.hlc import wall_of
from replica.ids import receipt_id
from replica.lww import join_key
from replica.models import FileCheck
from replica.names import name_key
from replica.ops import (
    KIND_MSG,
    KIND_RETRACT,
    KIND_SET,
    KNOWN_KINDS,
    OP_LEVEL,
    TEXT_KEYS,
    Op,
    known_writes,
    level_of,
    message_id,
    parse_message_id,
    read_stored,
)
from replica.stamps import session_day

BUSY_TIMEOUT_MS = 30_000


CACHE_KIB = 2048  # page cache per connection (2 MiB): hot index pages fit; the OS page cache holds the rest


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
        c.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes on a new file, or at a VACUUM (``replica.purge``)
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
                rebuild_keys(cur)
            upgrade_held(cur)
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
            columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(ops)")}
            newer = int(conn.execute("SELECT count(*) FROM ops WHERE newer IS NOT NULL").fetchone()[0]) \
                if "newer" in columns else 0
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None
    return FileCheck(result, messages, ops, newer)


def origin_id(cur: sqlite3.Cursor, node: bytes) -> int:
    row = cur.execute("SELECT oid FROM origins WHERE node = ?", (node,)).fetchone()
    if row:
        return int(row[0])
    cur.execute("INSERT INTO origins(node) VALUES (?)", (node,))
    return int(cur.lastrowid or 0)


def message_columns(body: dict[str, Any], hlc: int) -> tuple[Any, ...]:
    """A message's matching keys, session day and tenant, as stored beside it (pure)."""
    channel, thread, target = body["c"], body["t"], body["ti"]
    return (
        name_key(body["f"]), routing.instance_key(body["fi"]),
        routing.channel_key(channel) if channel is not None and thread is None else None,
        name_key(target) if target is not None else None,
        body.get("sd") or session_day(wall_of(hlc)),
        name_key(body["tn"]) if body.get("tn") is not None else None,
    )


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


def store_op(cur: sqlite3.Cursor, oid: int, op: Op, arrived: int) -> int | None:
    """Store ``op`` with its projections; its lseq if new, None if held. ``arrived`` comes from
    ``arrival_time`` in the same transaction. An op of a kind this release does not know is stored
    and counted, and projects nothing (``ops`` module docstring)."""
    if op.kind == KIND_MSG:
        b = op.body
        cur.execute(
            "INSERT OR IGNORE INTO ops(oid, seq, blob, id, sender, sender_inst, channel, to_inst, thread, content,"
            " hlc, skey, sikey, ckey, tkey, sday, tenant, arrived, v1, newer)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (oid, op.seq, op.raw, message_id(op.origin, op.seq), b["f"], b["fi"], b["c"], b["ti"], b["t"], b["x"],
             op.hlc, *message_columns(b, op.hlc), arrived, op.v1, level_of(op)),
        )
    else:
        cur.execute("INSERT OR IGNORE INTO ops(oid, seq, blob, hlc, arrived, v1, newer) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (oid, op.seq, op.raw, op.hlc, arrived, op.v1, level_of(op)))
    if cur.rowcount != 1:
        return None
    lseq = int(cur.lastrowid or 0)
    if op.kind in KNOWN_KINDS:
        materialize(cur, lseq, op)
    return lseq


def upgrade_held(cur: sqlite3.Cursor) -> int:
    """The migration step for ops a release before this one stored without understanding them all:
    apply, in arrival order, what this release knows of each (projections are idempotent, so what
    was applied then is not applied twice), and clear the mark of those it now understands in full.
    Returns how many were applied."""
    rows = cur.execute("SELECT lseq, blob, id FROM ops WHERE newer IS NOT NULL AND newer < ? ORDER BY lseq",
                       (OP_LEVEL,)).fetchall()
    applied = 0
    for lseq, blob, mid in rows:
        op = read_stored(bytes(blob))
        if op.kind in KNOWN_KINDS:
            if op.kind == KIND_MSG and mid is None:  # stored as a kind unknown then: its columns are new
                b = op.body
                cur.execute("UPDATE ops SET id = ?, sender = ?, sender_inst = ?, channel = ?, to_inst = ?,"
                            " thread = ?, content = ?, skey = ?, sikey = ?, ckey = ?, tkey = ?, sday = ?, tenant = ?"
                            " WHERE lseq = ?", (message_id(op.origin, op.seq), b["f"], b["fi"], b["c"], b["ti"],
                                                b["t"], b["x"], *message_columns(b, op.hlc), lseq))
            materialize(cur, lseq, op)
            applied += 1
        cur.execute("UPDATE ops SET newer = ?, v1 = ? WHERE lseq = ?", (level_of(op), op.v1, lseq))
    return applied


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
        _file_routes(cur, lseq, op.body["c"], op.body["t"])
        mid = message_id(op.origin, op.seq)
        if cur.execute("SELECT 1 FROM retractions WHERE msg_id = ? LIMIT 1", (mid,)).fetchone():
            settle_retraction(cur, mid)  # its retraction came first
    elif op.kind == KIND_RETRACT:
        cur.execute("INSERT OR IGNORE INTO retractions(msg_id, by_key, hlc) VALUES (?, ?, ?)",
                    (op.body["m"], name_key(op.body["f"]), op.hlc))
        settle_retraction(cur, op.body["m"])
    elif op.kind in membership.KINDS:
        fleetstore.project(cur, lseq, op)
        return
    elif op.kind == retention.KIND_RET:  # the fleet's horizon: one register (``replica.purge`` reads it)
        cur.execute(_LWW_UPSERT, (retention.REGISTER, "", "h", op.body["h"], op.hlc, op.origin))
        return
    else:
        for write in known_writes(op):
            if write[0] != firstseen.TABLE:  # a min-register, not last-writer-wins
                put_register(cur, write, op.hlc, op.origin)
    for role, at in firstseen.sightings(op):
        firstseen.record(cur, role, at)


def _file_routes(cur: sqlite3.Cursor, lseq: int, channel: str | None, thread: str | None) -> None:
    keys = routing.route_keys(channel, thread)
    if len(keys) > 1:  # one role or broadcast: found through the channel key column
        cur.executemany("INSERT OR IGNORE INTO routes(role, lseq) VALUES (?, ?)", [(k, lseq) for k in keys])


def find_message(cur: sqlite3.Cursor, mid: str, columns: str) -> Any:
    """The ``columns`` of message ``mid``'s row, found through its origin and seq, or None.
    ``CROSS JOIN`` keeps origins (a few rows) the outer loop, so each is one ``ops_by_origin``
    lookup; left to itself the planner may scan every op instead."""
    parsed = parse_message_id(mid)
    if parsed is None:
        return None
    prefix, seq = parsed
    return cur.execute(
        f"SELECT {columns} FROM origins o CROSS JOIN ops m ON m.oid = o.oid AND m.seq = ?"
        " WHERE substr(o.node, 1, ?) = ? AND m.id = ?",
        (seq, len(prefix), prefix, mid),
    ).fetchone()


def settle_retraction(cur: sqlite3.Cursor, mid: str) -> None:
    """Apply the retractions of ``mid`` by its sender role, if the message is here: drop its
    content and search entry, and mark it with the lowest such stamp."""
    row = find_message(cur, mid, "m.lseq, m.skey, m.retracted, m.content, m.sender, m.channel")
    if row is None or row[1] is None:
        return
    lseq, skey, retracted, content, sender, channel = row
    first = cur.execute("SELECT min(hlc) FROM retractions WHERE msg_id = ? AND by_key = ?", (mid, skey)).fetchone()[0]
    if first is None or (retracted is not None and retracted <= first) or channel is None:
        return
    if content is not None and lseq <= _fts_upto(cur):  # contentless FTS5 deletes by the indexed values
        cur.execute("INSERT INTO message_fts(message_fts, rowid, content, sender, channel)"
                    " VALUES ('delete', ?, ?, ?, ?)", (lseq, content, sender, channel))
    cur.execute("UPDATE ops SET content = NULL, retracted = ? WHERE lseq = ?", (first, lseq))


def _fts_upto(cur: sqlite3.Cursor) -> int:
    row = cur.execute("SELECT v FROM meta WHERE k = 'fts_upto'").fetchone()
    return int(row[0]) if row else 0


_LWW_UPSERT = (
    "INSERT INTO lww(tbl, k, f, v, hlc, origin) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(tbl, k, f) DO UPDATE SET v = excluded.v, hlc = excluded.hlc, origin = excluded.origin "
    "WHERE excluded.hlc > lww.hlc OR (excluded.hlc = lww.hlc AND excluded.origin > lww.origin)"
)


def register_key(table: str, key: list[str]) -> list[str]:
    """The register a write's key denotes: names in it by their keys (pure).

    A receipt is (message, role, instance or ""); a profile is (role) or (role, instance),
    an empty instance meaning the role's own profile."""
    if table == "rcpt":
        return [key[0], name_key(key[1]), routing.instance_key(key[2])]
    if table == "prof":
        inst = routing.instance_key(key[1]) if len(key) > 1 else ""
        return [name_key(key[0]), inst] if inst else [name_key(key[0])]
    return key


def register_field(table: str, field: str, value: Any) -> tuple[str, Any]:
    """A profile's whole-text ``static``/``dynamic`` (older nodes) is one key of the object,
    ``ops.TEXT_KEYS`` (pure)."""
    if table == "prof" and field in TEXT_KEYS:
        return f"{field}.{TEXT_KEYS[field]}", None if value is None else json.dumps(value, ensure_ascii=False)
    return field, value


def put_register(cur: sqlite3.Cursor, write: list[Any], hlc: int, origin: bytes) -> bool:
    """Apply one LWW write [table, key, field, value]; project it if it wins."""
    table, raw_key, raw_field, value = write
    key = register_key(table, raw_key)
    field, value = register_field(table, raw_field, value)
    stored = int(value) if isinstance(value, bool) else value
    if table == "prof":
        _touch_profile(cur, key, raw_key, hlc, origin)
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


def _touch_profile(cur: sqlite3.Cursor, key: list[str], raw_key: list[str], hlc: int, origin: bytes) -> None:
    """Every write to a profile (winning or not) counts for its spelling (the first write's) and
    its update time (the newest write's): both depend only on the set of writes."""
    role = raw_key[0].strip()
    inst = raw_key[1].strip() if len(key) > 1 else None
    cur.execute(
        "INSERT INTO profiles(id, rkey, ikey, role, inst, first_hlc, first_origin, updated)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET"
        " role = CASE WHEN (excluded.first_hlc, excluded.first_origin) < (first_hlc, first_origin)"
        "   THEN excluded.role ELSE role END,"
        " inst = CASE WHEN (excluded.first_hlc, excluded.first_origin) < (first_hlc, first_origin)"
        "   THEN excluded.inst ELSE inst END,"
        " first_origin = CASE WHEN (excluded.first_hlc, excluded.first_origin) < (first_hlc, first_origin)"
        "   THEN excluded.first_origin ELSE first_origin END,"
        " first_hlc = min(first_hlc, excluded.first_hlc),"
        " updated = max(updated, excluded.updated)",
        (join_key(key), key[0], key[1] if len(key) > 1 else "", role, inst, hlc, origin, wall_of(hlc)),
    )


def _project_nothing(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    """Profile fields are read from the registers themselves (``lww``)."""


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
    "prof": _project_nothing,
    "agent": _project_agent,
    "member": _project_member,
    "thread": _project_thread,
}


# -- schema v5: recompute what older files lack, from the ops ---------------------------------------


def rebuild_keys(cur: sqlite3.Cursor) -> None:
    """Name keys, session days, routes, arrival times, every register (receipts, profiles,
    agents, threads, members), the first-seen times and the senders of a file written before v5,
    recomputed from the ops (their signed bodies are left as they are)."""
    rows = cur.execute("SELECT lseq, blob FROM ops WHERE id IS NOT NULL").fetchall()
    cur.execute("DELETE FROM routes")
    for lseq, blob in rows:
        op = read_stored(bytes(blob))
        cur.execute("UPDATE ops SET skey = ?, sikey = ?, ckey = ?, tkey = ?, sday = ?, tenant = ? WHERE lseq = ?",
                    (*message_columns(op.body, op.hlc), lseq))
        _file_routes(cur, lseq, op.body["c"], op.body["t"])
    arrived = 0
    for lseq, hlc in cur.execute("SELECT lseq, hlc FROM ops ORDER BY lseq").fetchall():
        arrived = max(arrived, wall_of(int(hlc or 0)))
        cur.execute("UPDATE ops SET arrived = ? WHERE lseq = ?", (arrived, lseq))
    _rebuild_registers(cur)
    cur.execute(
        "INSERT INTO senders(rkey, ikey, role, inst, hlc)"
        " SELECT skey, sikey, sender, sender_inst, max(hlc) FROM ops"
        " WHERE id IS NOT NULL AND thread IS NULL AND lseq <= ? GROUP BY skey, sikey", (_fts_upto(cur),))


def _rebuild_registers(cur: sqlite3.Cursor) -> None:
    """Replay every register write and every first-seen sighting (LWW and min: the order does not
    matter) into fresh projections."""
    for table in ("lww", "receipts", "profiles", "agents", "members", "threads", "first_seen"):
        cur.execute(f"DELETE FROM {table}")
    for (blob,) in cur.execute("SELECT blob FROM ops WHERE length(blob) > 0").fetchall():  # not retracted rows
        op = read_stored(bytes(blob))
        if op.kind == KIND_SET:
            for write in known_writes(op):
                if write[0] != firstseen.TABLE:
                    put_register(cur, write, op.hlc, op.origin)
        for role, at in firstseen.sightings(op):
            firstseen.record(cur, role, at)
