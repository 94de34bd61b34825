"""The steps that recompute what older files lack, from the ops they hold (signed bodies never
change): name keys and every register for files before schema v5, and what a newer release's ops
hold that this release has learnt to read.

Invariants: each step is idempotent and runs inside the opening write transaction; projections
are rebuilt from the ops alone, so an upgraded file has the state digest of a replica that applied
the same ops (``tests/test_migration.py``).
"""

from __future__ import annotations

import sqlite3

from replica import firstseen
from replica.hlc import wall_of
from replica.ops import (
    KIND_MSG,
    KIND_SET,
    KNOWN_KINDS,
    OP_LEVEL,
    known_writes,
    level_of,
    read_stored,
)
from replica.project import _file_routes, _fts_upto, fill_message_columns, materialize, message_columns
from replica.registers import put_register


def upgrade_held(cur: sqlite3.Cursor) -> int:
    """The migration step for ops a release before this one stored without understanding them all:
    apply, in arrival order, what this release knows of each (projections are idempotent, so what
    was applied then is not applied twice), and clear the mark of those it now understands in full.
    Returns how many were applied."""
    rows = cur.execute("SELECT lseq, blob, id FROM ops WHERE newer IS NOT NULL AND newer < ? AND length(blob) > 0"
                       " ORDER BY lseq", (OP_LEVEL,)).fetchall()
    applied = 0
    for lseq, blob, mid in rows:
        op = read_stored(bytes(blob))
        if op.kind in KNOWN_KINDS:
            if op.kind == KIND_MSG and mid is None:  # stored as a kind unknown then: its columns are new
                fill_message_columns(cur, lseq, op)
            materialize(cur, lseq, op)
            applied += 1
        cur.execute("UPDATE ops SET newer = ?, v1 = ? WHERE lseq = ?", (level_of(op), op.v1, lseq))
    return applied


def backfill_reads(cur: sqlite3.Cursor) -> None:
    """The migration step of schema v14: every read sighting of the ops held into ``seen_reads``
    (a read sighting of a confirmed role changes no time: its time was the least of them all)."""
    for (blob,) in cur.execute("SELECT blob FROM ops WHERE id IS NULL AND length(blob) > 0").fetchall():
        op = read_stored(bytes(blob))
        if op.kind == KIND_SET:
            for s in firstseen.sightings(op):
                if s.kind == firstseen.READ:
                    cur.execute("INSERT OR IGNORE INTO seen_reads(role, at) VALUES (?, ?)", (s.role, s.at))


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
    for table in ("lww", "receipts", "profiles", "agents", "members", "threads", "first_seen", "seen_reads"):
        cur.execute(f"DELETE FROM {table}")
    for (blob,) in cur.execute("SELECT blob FROM ops WHERE length(blob) > 0").fetchall():  # not retracted rows
        op = read_stored(bytes(blob))
        if op.kind == KIND_SET:
            for write in known_writes(op):
                if write[0] != firstseen.TABLE:
                    put_register(cur, write, op.hlc, op.origin)
        firstseen.record_all(cur, firstseen.sightings(op))
