"""SQL of retention: the horizon in force, the purge steps, and giving freed pages back to the disk.

The rules are ``replica.retention``'s; this module finds what they apply to and deletes it.

Invariants:
* The horizon is one last-writer-wins register (``lww`` row ``ret``/``""``/``h``), projected by
  ``project.materialize`` with the store's one LWW upsert, so it is part of the state digest.
* A step is one short write transaction that looks at no more than ``limit`` rows: messages by
  creation (``ops_by_hlc``), then the other ops, each step picking up after the last.
* Before a step deletes anything, this node's own row in ``origins`` is raised to its newest op
  (``contig``, ``top`` and ``hlc``), so deleting its own ops never lets a seq or a stamp be reused.
* Only ops at or below their origin's contiguous mark are deleted.
* Local numbers never go back: the op row with the highest ``lseq`` is emptied in place (a
  tombstone: ``oid`` 0, ``seq`` -lseq, no blob) rather than deleted, and a thread keeps its highest
  number as a row with a negated ``lseq``, so no lseq or thread number is ever given twice.
* A message leaves with everything filed under it: its search entry (a contentless FTS5 index is
  deleted from by the indexed values), routes, thread number, receipts (projection and
  registers) and retraction rows. A receipt or retraction op that leaves takes the rows it made
  with it only when their message is no longer held.
* The file shrinks: the search index is merged whole (``merge_search``, bounded steps) once a fifth
  of it is the data of deleted entries, which FTS5 keeps until its segments merge; ``reclaim``
  turns a file made before retention into an incremental-vacuum file with one VACUUM (the first
  time a horizon takes effect here), then gives free pages back ``pages`` at a time; a passive
  checkpoint lets the main file shrink without waiting for readers.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from replica import project, routing
from replica import retention as ret
from replica.codec import pack
from replica.errors import StoreError
from replica.hlc import pack as stamp_of
from replica.hlc import wall_of
from replica.lww import join_key
from replica.names import name_key
from replica.ops import KIND_RETRACT, KIND_SET, Op, parse_message_id, read_stored

INCREMENTAL = 2  # PRAGMA auto_vacuum
WAL_LIMIT_BYTES = 4 * 1024 * 1024  # what the WAL file is cut back to after a checkpoint
_META_LAST, _META_CHECKED, _META_TOTAL = "purge_last", "purge_checked", "purge_total"
_META_SEEN = "purge_seen"  # the lseq up to which a pass has looked for late receipts and retractions
# Search entries deleted since the index was last merged whole (-1: a merge is under way). FTS5 keeps a
# deleted entry's data until the segments holding it merge: once a fifth of the index is deleted data,
# it is merged whole, in bounded steps, so the cost per deleted entry stays constant.
_META_SEARCH_GONE = "purge_search_gone"
SEARCH_MERGE_SHARE = 5
# Only ops that may leave are read back (their blobs name their kind or a receipt table).
_MARKERS = (pack(ret.RECEIPTS), pack(KIND_RETRACT), pack(ret.KIND_RET))
_AFTER = "o.hlc >= ?1 AND (o.hlc > ?1 OR o.lseq > ?2) AND o.hlc < ?3"


def _may_leave(first: int) -> str:
    """An op row that may leave: a live row whose blob names one of ``_MARKERS`` (parameters from ``first`` on)."""
    return f"o.seq > 0 AND ({' OR '.join(f'instr(o.blob, ?{first + i}) > 0' for i in range(len(_MARKERS)))})"


# CROSS JOIN keeps ops (by creation) the outer loop: each row looks up its origin's mark.
_MESSAGES = (
    "SELECT o.lseq, o.hlc, o.seq, g.contig, o.id, o.sender, o.skey, o.channel, o.ckey, o.tkey, o.thread,"
    f" o.retracted, o.content FROM ops o CROSS JOIN origins g ON g.oid = o.oid WHERE {_AFTER}"
    " AND o.id IS NOT NULL ORDER BY o.hlc, o.lseq LIMIT ?4"
)
_OTHERS = (
    "SELECT o.lseq, o.hlc, o.seq, g.contig, o.blob FROM ops o CROSS JOIN origins g ON g.oid = o.oid"
    f" WHERE {_AFTER} AND o.id IS NULL AND {_may_leave(5)} ORDER BY o.hlc, o.lseq LIMIT ?4"
)
_LATE = (
    f"SELECT o.lseq, o.blob FROM ops o WHERE o.lseq > ?1 AND o.id IS NULL AND {_may_leave(3)}"
    " ORDER BY o.lseq LIMIT ?2"
)
_FIRST_MESSAGE = "SELECT hlc FROM ops WHERE hlc >= ? AND id IS NOT NULL ORDER BY hlc LIMIT 1"
_FIRST_OP = (
    "SELECT o.hlc FROM ops o WHERE o.hlc >= ?1 AND o.oid > 0"
    f" AND (o.id IS NOT NULL OR {_may_leave(2)})"
    " ORDER BY o.hlc LIMIT 1"
)
_TOMBSTONE = (
    "UPDATE ops SET oid = 0, seq = -lseq, blob = x'', hlc = NULL, id = NULL, sender = NULL, sender_inst = NULL,"
    " channel = NULL, to_inst = NULL, thread = NULL, content = NULL, skey = NULL, sikey = NULL, ckey = NULL,"
    " tkey = NULL, sday = NULL, tenant = NULL, retracted = NULL WHERE lseq = ?"
)
_OWN_FLOOR = (
    "UPDATE origins SET contig = max(contig, (SELECT coalesce(max(seq), 0) FROM ops WHERE oid = ?1)),"
    " top = max(top, (SELECT coalesce(max(seq), 0) FROM ops WHERE oid = ?1)),"
    " hlc = max(hlc, coalesce((SELECT hlc FROM ops WHERE oid = ?1 ORDER BY seq DESC LIMIT 1), 0)) WHERE oid = ?1"
)


# -- the horizon ----------------------------------------------------------------------------------


def setting(cur: sqlite3.Cursor) -> ret.Setting | None:
    """The ``ret`` op in force here (None: keep everything)."""
    row = cur.execute("SELECT v, hlc, origin FROM lww WHERE tbl = ? AND k = '' AND f = 'h'", (ret.REGISTER,)).fetchone()
    return None if row is None else ret.Setting(int(row[0]), int(row[1]), bytes(row[2]))


def state(cur: sqlite3.Cursor) -> ret.RetentionState:
    s = setting(cur)
    meta = dict(cur.execute("SELECT k, v FROM meta WHERE k IN (?, ?, ?)", (_META_LAST, _META_CHECKED, _META_TOTAL)))
    h = 0 if s is None else s.horizon_ms
    return ret.RetentionState(
        h, ret.format_horizon(h), None if s is None else wall_of(s.hlc), None if s is None else s.origin.hex(),
        json.loads(meta[_META_LAST]) if _META_LAST in meta else None,
        int(meta[_META_CHECKED]) if _META_CHECKED in meta else None,
        json.loads(meta[_META_TOTAL]) if _META_TOTAL in meta else {})


def read_state(path: str) -> ret.RetentionState:
    """``state`` of a replica file opened read-only (a daemon may be writing it): looking never
    writes; ``StoreError`` if it cannot be read as a replica."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            return state(conn.cursor())
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the retention state of {path}: {exc}") from None


def older_than(cur: sqlite3.Cursor, wall_ms: int) -> int:
    """How many messages held here were created before ``wall_ms``."""
    return int(cur.execute("SELECT count(*) FROM ops WHERE hlc < ? AND id IS NOT NULL",
                           (stamp_of(wall_ms),)).fetchone()[0])


def first_young(cur: sqlite3.Cursor, horizon_ms: int, now_ms: int) -> tuple[int | None, int | None]:
    """(creation of the first message not yet older than the horizon, creation of the first op that
    may leave and is not yet older than twice it), wall ms: what ``retention.next_expiry`` takes."""
    soft, hard = ret.cutoffs(horizon_ms, now_ms)
    msg = cur.execute(_FIRST_MESSAGE, (stamp_of(max(soft, 0)),)).fetchone()
    op = cur.execute(_FIRST_OP, (stamp_of(max(hard, 0)), *_MARKERS)).fetchone()
    return (None if msg is None else wall_of(int(msg[0]))), (None if op is None else wall_of(int(op[0])))


# -- a step -----------------------------------------------------------------------------------------


def begin_step(cur: sqlite3.Cursor, self_oid: int) -> int:
    """What every step does first: raise this node's floor, clear tombstones no longer on top; the top lseq."""
    cur.execute(_OWN_FLOOR, (self_oid,))
    top = int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])
    cur.execute("DELETE FROM ops WHERE oid = 0 AND lseq < ?", (top,))
    return top


def late_mark(cur: sqlite3.Cursor) -> int:
    """Where the last pass stopped looking at ops that landed (``Sweep`` phase ``LATE``)."""
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (_META_SEEN,)).fetchone()
    return int(row[0]) if row else 0


def step(cur: sqlite3.Cursor, sweep: ret.Sweep, top: int, limit: int) -> ret.Sweep:
    """One step of ``sweep``: look at up to ``limit`` rows of its phase, delete what leaves."""
    soft, hard = ret.cutoffs(sweep.horizon_ms, sweep.now_ms)
    h0, l0 = sweep.after
    if sweep.phase == ret.LATE:
        rows = cur.execute(_LATE, (l0, limit, *_MARKERS)).fetchall()
        removed = ret.Removed(receipts=sum(_forget_late(cur, read_stored(bytes(blob))) for _, blob in rows))
        _set_meta(cur, [(_META_SEEN, top if len(rows) < limit else int(rows[-1][0]))])
        rows = [(lseq, -1) for lseq, _ in rows]  # (lseq, hlc), for the cursor below
    elif sweep.phase == ret.MESSAGES:
        rows = cur.execute(_MESSAGES, (h0, l0, stamp_of(max(soft, 0)), limit)).fetchall()
        removed = _messages(cur, rows, sweep, top)
    else:
        rows = cur.execute(_OTHERS, (h0, l0, stamp_of(max(hard, 0)), limit, *_MARKERS)).fetchall()
        removed = _others(cur, rows, sweep, top)
    total = sweep.removed + removed
    if len(rows) < limit:
        return ret.Sweep(sweep.now_ms, sweep.horizon_ms, sweep.in_force, sweep.phase + 1, (-1, 0), total)
    return ret.Sweep(sweep.now_ms, sweep.horizon_ms, sweep.in_force, sweep.phase,
                     (int(rows[-1][1]), int(rows[-1][0])), total)


def _forget_late(cur: sqlite3.Cursor, op: Op) -> int:
    """The rows a receipt or retraction made for a message already purged here; how many receipts."""
    if op.kind == KIND_RETRACT:
        if _purged(cur, op.body["m"]):
            cur.execute("DELETE FROM retractions WHERE msg_id = ? AND by_key = ? AND hlc = ?",
                        (op.body["m"], name_key(op.body["f"]), op.hlc))
        return 0
    if op.kind != KIND_SET:
        return 0
    keys = {_receipt_key(w[1]) for w in op.body["w"] if w[0] == ret.RECEIPTS}
    return sum(_forget_receipts(cur, *key) for key in keys if _purged(cur, key[0]))


def _messages(cur: sqlite3.Cursor, rows: list[Any], sweep: ret.Sweep, top: int) -> ret.Removed:
    indexed = _fts_upto(cur)
    hard = ret.cutoffs(sweep.horizon_ms, sweep.now_ms)[1]
    gone = receipts = unindexed = 0
    for row in rows:
        lseq, hlc, seq, contig, mid, _sender, skey, _channel, ckey, tkey, thread, retracted, _content = row
        if not ret.within_mark(seq, contig):
            continue
        mail = ret.Mail(wall_of(hlc), ckey, thread, skey or "", tkey, retracted is not None)
        read = mail.created_ms < hard or _read(cur, mid, mail)
        if ret.message_leaves(mail, read, sweep.horizon_ms, sweep.now_ms):
            receipts += _forget_message(cur, row)
            unindexed += _unindex(cur, row, indexed)
            _drop_op(cur, lseq, top)
            gone += 1
    if unindexed:
        cur.execute("INSERT INTO meta(k, v) VALUES (?1, ?2) ON CONFLICT(k) DO UPDATE SET"
                    " v = CASE WHEN v < 0 THEN v ELSE v + ?2 END", (_META_SEARCH_GONE, unindexed))
    return ret.Removed(gone, receipts, gone)


def _read(cur: sqlite3.Cursor, mid: str, mail: ret.Mail) -> bool:
    receipts = [ret.Receipt(r[0], r[1], bool(r[2]))
                for r in cur.execute("SELECT role, inst, read IS NOT NULL FROM receipts WHERE msg_id = ?", (mid,))]
    members: list[str] = []
    if mail.thread is not None:
        members = [r[0] for r in cur.execute("SELECT agent FROM members WHERE thread = ? AND present = 1",
                                             (mail.thread,))]
    return ret.is_read(mail, receipts, members)


def _unindex(cur: sqlite3.Cursor, row: Any, indexed: int) -> int:
    """Delete a message's search entry, if it has one (by the values it was indexed with); 1 if it had."""
    lseq, _hlc, _seq, _contig, _mid, sender, _skey, channel, _ckey, _tkey, thread, retracted, content = row
    if retracted is not None or content is None or lseq > indexed:
        return 0
    cur.execute("INSERT INTO message_fts(message_fts, rowid, content, sender, channel)"
                " VALUES ('delete', ?, ?, ?, ?)", (lseq, content, sender, thread if channel is None else channel))
    return 1


def _forget_message(cur: sqlite3.Cursor, row: Any) -> int:
    """Delete what is filed under a message but its op row and search entry; how many receipt registers went."""
    lseq, _hlc, _seq, _contig, mid, _sender, _skey, channel, _ckey, _tkey, thread, _retracted, _content = row
    keys = routing.route_keys(channel, thread)
    if len(keys) > 1:
        cur.executemany("DELETE FROM routes WHERE role = ? AND lseq = ?", [(k, lseq) for k in keys])
    if thread is not None:
        _unnumber(cur, lseq, thread)
    cur.execute("DELETE FROM retractions WHERE msg_id = ?", (mid,))
    return _forget_receipts(cur, mid)


def _unnumber(cur: sqlite3.Cursor, lseq: int, thread: str) -> None:
    """Drop a thread message's number, but keep the thread's highest as a floor (lseq negated)."""
    row = cur.execute("SELECT tseq FROM thread_seqs WHERE lseq = ?", (lseq,)).fetchone()
    if row is None:
        return
    highest = cur.execute("SELECT max(tseq) FROM thread_seqs WHERE thread = ?", (thread,)).fetchone()[0]
    if row[0] == highest:
        cur.execute("DELETE FROM thread_seqs WHERE thread = ? AND lseq < 0", (thread,))
        cur.execute("UPDATE thread_seqs SET lseq = -lseq WHERE lseq = ?", (lseq,))
    else:
        cur.execute("DELETE FROM thread_seqs WHERE lseq = ?", (lseq,))


def _forget_receipts(cur: sqlite3.Cursor, mid: str, role: str | None = None, inst: str | None = None) -> int:
    """Every receipt of ``mid`` (or only (role, inst)'s): the projection and the registers."""
    if role is None:
        cur.execute("DELETE FROM lww WHERE tbl = ? AND k >= ? AND k < ?", (ret.RECEIPTS, mid + "\x1f", mid + "\x20"))
        return cur.execute("DELETE FROM receipts WHERE msg_id = ?", (mid,)).rowcount
    cur.execute("DELETE FROM lww WHERE tbl = ? AND k = ?", (ret.RECEIPTS, join_key([mid, role, inst or ""])))
    return cur.execute("DELETE FROM receipts WHERE msg_id = ? AND role = ? AND inst = ?", (mid, role, inst)).rowcount


def _others(cur: sqlite3.Cursor, rows: list[Any], sweep: ret.Sweep, top: int) -> ret.Removed:
    gone = receipts = 0
    for lseq, _hlc, seq, contig, blob in rows:
        if not ret.within_mark(seq, contig):
            continue
        op = read_stored(bytes(blob))
        if ret.op_leaves(op, sweep.horizon_ms, sweep.now_ms, in_force=(op.hlc, op.origin) == sweep.in_force):
            receipts += _forget_rows_of(cur, op)
            _drop_op(cur, lseq, top)
            gone += 1
    return ret.Removed(0, receipts, gone)


def _forget_rows_of(cur: sqlite3.Cursor, op: Op) -> int:
    """The rows a leaving receipt or retraction op made, for messages no longer held here."""
    if op.kind == KIND_RETRACT:
        if not _held(cur, op.body["m"]):
            cur.execute("DELETE FROM retractions WHERE msg_id = ? AND by_key = ? AND hlc = ?",
                        (op.body["m"], name_key(op.body["f"]), op.hlc))
        return 0
    if op.kind != KIND_SET:
        return 0
    keys = {_receipt_key(w[1]) for w in op.body["w"]}
    return sum(_forget_receipts(cur, *key) for key in keys if not _held(cur, key[0]))


def _receipt_key(key: list[str]) -> tuple[str, str, str]:
    """The register a receipt write's key names (``registers.register_key``)."""
    return key[0], name_key(key[1]), routing.instance_key(key[2])


def _held(cur: sqlite3.Cursor, mid: str) -> bool:
    return project.find_message(cur, mid, "1") is not None


def _purged(cur: sqlite3.Cursor, mid: str) -> bool:
    """A message that was here and was purged: not held, though its origin's mark is past its seq."""
    parsed = parse_message_id(mid)
    if parsed is None:
        return False
    prefix, seq = parsed
    marks = cur.execute("SELECT g.contig, EXISTS(SELECT 1 FROM ops m WHERE m.oid = g.oid AND m.seq = ?2 AND m.id = ?3)"
                        " FROM origins g WHERE substr(g.node, 1, ?4) = ?1", (prefix, seq, mid, len(prefix)))
    return any(contig >= seq and not held for contig, held in marks)


def _drop_op(cur: sqlite3.Cursor, lseq: int, top: int) -> None:
    """Delete an op row; the one on top is emptied instead, so its lseq is never given again."""
    cur.execute(_TOMBSTONE if lseq == top else "DELETE FROM ops WHERE lseq = ?", (lseq,))


def _fts_upto(cur: sqlite3.Cursor) -> int:
    row = cur.execute("SELECT v FROM meta WHERE k = 'fts_upto'").fetchone()
    return int(row[0]) if row else 0


# -- after a pass -------------------------------------------------------------------------------------


def record(cur: sqlite3.Cursor, report: ret.PurgeReport) -> None:
    """Keep the pass in ``meta``: when it ran, and (if it removed anything) what, with the running total."""
    old = dict(cur.execute("SELECT k, v FROM meta WHERE k = ?", (_META_TOTAL,)))
    total = ret.Removed(**json.loads(old[_META_TOTAL])) if old else ret.Removed()
    rows: list[tuple[str, Any]] = [(_META_CHECKED, report.at_ms)]
    if report.removed != ret.Removed():
        rows += [(_META_LAST, json.dumps(report.to_dict())),
                 (_META_TOTAL, json.dumps((total + report.removed).to_dict()))]
    _set_meta(cur, rows)


def _set_meta(cur: sqlite3.Cursor, rows: list[tuple[str, Any]]) -> None:
    cur.executemany("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", rows)


def search_to_merge(cur: sqlite3.Cursor) -> bool:
    """Whether the search index is to be merged whole now (a fifth of it is deleted data, or a merge
    is under way); deciding so marks the merge as under way."""
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (_META_SEARCH_GONE,)).fetchone()
    gone = int(row[0]) if row else 0
    if gone <= 0:
        return gone < 0
    held = int(cur.execute("SELECT count(*) FROM ops WHERE id IS NOT NULL AND lseq <= ?", (_fts_upto(cur),))
               .fetchone()[0])
    if gone * SEARCH_MERGE_SHARE < held + gone:
        return False
    _set_meta(cur, [(_META_SEARCH_GONE, -1)])
    return True


def merge_search(cur: sqlite3.Cursor, pages: int) -> bool:
    """One bounded step of merging the search index whole (about ``pages`` pages written), which drops the
    data of deleted entries; False once there was nothing left to merge (the merge is then over)."""
    before = cur.connection.total_changes
    cur.execute("INSERT INTO message_fts(message_fts, rank) VALUES ('merge', ?)", (-pages,))
    if cur.connection.total_changes - before >= 2:  # FTS5's sign that the step merged something
        return True
    _set_meta(cur, [(_META_SEARCH_GONE, 0)])
    return False


def reclaim(conn: sqlite3.Connection, pages: int) -> int:
    """Give up to ``pages`` free pages back to the file system (the first time, on a file made before
    retention: one VACUUM, which also switches it to incremental vacuum); how many were free."""
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    if not free:
        return 0
    if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) != INCREMENTAL:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("VACUUM")
        return free
    conn.executescript(f"PRAGMA incremental_vacuum({int(pages)});")  # steps the pragma to its end
    return min(free, pages)


def checkpoint(conn: sqlite3.Connection) -> None:
    """Copy the WAL into the main file without waiting for readers (a later one finishes the job),
    which is when the main file shrinks; the WAL itself is cut back to ``WAL_LIMIT_BYTES``."""
    conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}").fetchall()
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def database_bytes(cur: sqlite3.Cursor) -> int:
    """The size of the database in bytes: its main file's, once the WAL is checkpointed into it."""
    pages = int(cur.execute("PRAGMA page_count").fetchone()[0])
    return pages * int(cur.execute("PRAGMA page_size").fetchone()[0])
