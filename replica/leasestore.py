"""SQL of leases: projecting ``lease.*`` ops and reading leases back (the rules are ``replica.leases``).

Invariants:
* ``leases`` holds one row per take op held, ``lease_changes`` one per renew, release or force op
  held (whether or not its lease is here yet); ``until`` and the ``ended_*`` columns are always
  ``leases.span`` of the row's take and its changes, and ``lost_to`` always ``leases.decide`` over
  the project's leases: ``project`` recomputes them inside the write transaction that stored the op.
* The recomputation starts at the op's lease (its stamp, the pivot): a lease stamped earlier keeps
  its outcome (a later op cannot change it), and only leases live at or after the pivot's start can
  beat one stamped after it, so the work is the leases in play, not the project's history.
* ``lease_losses`` names each lease lost here and the lseq of the op that made it so: the order in
  which sessions are told. A lease that holds again (an earlier release arrived late) leaves it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from replica import leases as rules
from replica.names import name_key
from replica.ops import Op

_COLUMNS = ("id, pkey, project, pattern, rkey, role, inst, exclusive, reason, hlc, origin, seq, ttl, start, until,"
            " ended_kind, ended_by, ended_why, lost_to")


def project(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """The projections of a newly stored lease op."""
    b = op.body
    if op.kind == rules.KIND_TAKE:
        lid = rules.lease_id(op.origin, op.seq)
        cur.execute(f"INSERT OR IGNORE INTO leases({_COLUMNS}, prefix) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                    " ?, ?, NULL, NULL, NULL, NULL, ?)",
                    (lid, name_key(b["p"]), b["p"], b["g"], name_key(b["r"]), b["r"], b["i"], b["x"], b["why"],
                     op.hlc, op.origin, op.seq, b["ttl"], op.hlc >> 16, (op.hlc >> 16) + b["ttl"],
                     rules.literal_prefix(b["g"])))
    else:
        lid = b["l"]
        cur.execute("INSERT OR IGNORE INTO lease_changes(lease, kind, rkey, role, hlc, origin, seq, ttl, why)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (lid, op.kind, name_key(b["r"]), b["r"], op.hlc, op.origin, op.seq, b.get("ttl", 0), b.get("why")))
    row = cur.execute("SELECT pkey, hlc, origin, seq FROM leases WHERE id = ?", (lid,)).fetchone()
    if row is not None:
        _respan(cur, lid)
        pivot = (int(row[1]), bytes(row[2]), int(row[3]))
        if not (op.kind == rules.KIND_TAKE and _newest(cur, row[0], pivot) and _settle_newest(cur, lseq, lid)):
            _settle(cur, lseq, row[0], pivot)


def _take(row: Sequence[Any]) -> rules.Take:
    return rules.Take(id=row[0], project=row[1], pattern=row[3], role=row[4], exclusive=bool(row[7]),
                      stamp=(int(row[9]), bytes(row[10]), int(row[11])), ttl_ms=int(row[12]))


def _changes(cur: sqlite3.Cursor, lid: str) -> list[rules.Change]:
    return [rules.Change(lease=lid, kind=k, role=r, stamp=(int(h), bytes(o), int(s)), ttl_ms=int(t))
            for k, r, h, o, s, t in cur.execute("SELECT kind, rkey, hlc, origin, seq, ttl FROM lease_changes"
                                                 " WHERE lease = ?", (lid,)).fetchall()]


def _respan(cur: sqlite3.Cursor, lid: str) -> None:
    take = _take(cur.execute(f"SELECT {_COLUMNS} FROM leases WHERE id = ?", (lid,)).fetchone())
    s = rules.span(take, _changes(cur, lid))
    ended, by, why = s.ended, None, None
    if ended is not None:
        by, why = cur.execute("SELECT role, why FROM lease_changes WHERE lease = ? AND hlc = ? AND origin = ?"
                              " AND seq = ?", (lid, *ended.stamp)).fetchone()
    cur.execute("UPDATE leases SET until = ?, ended_kind = ?, ended_by = ?, ended_why = ? WHERE id = ?",
                (s.end, None if ended is None else ended.kind, by, why, lid))


def _span_of(row: Sequence[Any]) -> rules.Span:
    ended = None if row[15] is None else rules.Change(row[0], row[15], name_key(row[16] or ""), (0, b"", 0))
    return rules.Span(_take(row), int(row[13]), int(row[14]), ended)


def _newest(cur: sqlite3.Cursor, pkey: str, pivot: rules.Stamp) -> bool:
    """Whether no lease of the project is stamped after ``pivot`` (then nothing but its own outcome moves)."""
    later = cur.execute("SELECT hlc, origin, seq FROM leases WHERE pkey = ? AND hlc >= ?", (pkey, pivot[0])).fetchall()
    return all((int(h), bytes(o), int(s)) <= pivot for h, o, s in later)


# The leases that may beat a new one stamped after all others: live at its start, not lost, of
# another role, exclusive if it is not, and a pattern that may overlap: its literal prefix is a
# prefix of the new pattern, or it starts with the new one's (``leases.literal_prefix``); both are
# index lookups, so the work does not grow with the project's leases.
_MAY_BEAT = (
    f"SELECT {_COLUMNS} FROM leases WHERE id IN ("
    " SELECT id FROM leases INDEXED BY leases_by_prefix WHERE pkey = ?1 AND prefix IN ({prefixes})"
    " UNION SELECT id FROM leases INDEXED BY leases_by_pattern"
    " WHERE pkey = ?1 AND pattern >= ?6 AND pattern < ?6 || char(1114111))"
    " AND until > ?2 AND start <= ?2 AND lost_to IS NULL AND rkey != ?3 AND (exclusive = 1 OR ?4 = 1) AND id != ?5"
    " ORDER BY hlc, origin, seq"
)


def _settle_newest(cur: sqlite3.Cursor, lseq: int, lid: str) -> bool:
    """Decide a new lease stamped after every other of its project: lost to the earliest lease that
    holds, is live at its start and clashes (``leases.decide`` for that case). True once done."""
    row = cur.execute(f"SELECT {_COLUMNS} FROM leases WHERE id = ?", (lid,)).fetchone()
    me = _span_of(row)
    heads = rules.prefixes(row[3])
    sql = _MAY_BEAT.replace("{prefixes}", ", ".join(f"?{7 + i}" for i in range(len(heads))))
    for r in cur.execute(sql, (row[1], me.start, row[4], row[7], lid, rules.literal_prefix(row[3]),
                               *heads)).fetchall():
        if rules.clash(_take(r), me.take):
            cur.execute("UPDATE leases SET lost_to = ? WHERE id = ?", (r[0], lid))
            cur.execute("INSERT INTO lease_losses(lease, winner, lseq) VALUES (?, ?, ?) ON CONFLICT(lease)"
                        " DO UPDATE SET winner = excluded.winner, lseq = excluded.lseq", (lid, r[0], lseq))
            break
    return True


def _settle(cur: sqlite3.Cursor, lseq: int, pkey: str, pivot: rules.Stamp) -> None:
    """Recompute who holds in project ``pkey`` from the lease stamped ``pivot`` on (module docstring)."""
    start = pivot[0] >> 16
    rows = cur.execute(f"SELECT {_COLUMNS} FROM leases WHERE pkey = ? AND (hlc >= ? OR until > ?)",
                       (pkey, pivot[0], start)).fetchall()
    spans = [_span_of(r) for r in rows]
    settled = {s.take.id: r[18] for s, r in zip(spans, rows, strict=True) if s.take.stamp < pivot}
    outcome = rules.decide(spans, settled)
    for s, r in zip(spans, rows, strict=True):
        lid, was, now = s.take.id, r[18], outcome[s.take.id]
        if lid in settled or was == now:
            continue
        cur.execute("UPDATE leases SET lost_to = ? WHERE id = ?", (now, lid))
        if now is None:
            cur.execute("DELETE FROM lease_losses WHERE lease = ?", (lid,))
        else:
            cur.execute("INSERT INTO lease_losses(lease, winner, lseq) VALUES (?, ?, ?) ON CONFLICT(lease)"
                        " DO UPDATE SET winner = excluded.winner, lseq = excluded.lseq", (lid, now, lseq))


# -- reading ------------------------------------------------------------------------------------------


def row_dict(row: Sequence[Any]) -> dict[str, Any]:
    """A lease row as the API's fields (names as written)."""
    return {"id": row[0], "project": row[2], "pattern": row[3], "role": row[5], "instance": row[6],
            "exclusive": bool(row[7]), "reason": row[8], "hlc": int(row[9]), "origin": bytes(row[10]),
            "start": int(row[13]), "until": int(row[14]), "ended_kind": row[15], "ended_by": row[16],
            "ended_why": row[17], "lost_to": row[18], "rkey": row[4]}


def live_in(cur: sqlite3.Cursor, pkey: str, now_ms: int) -> list[dict[str, Any]]:
    """The leases of a project that hold now (not lost, not ended, not expired), oldest first."""
    return [row_dict(r) for r in cur.execute(
        f"SELECT {_COLUMNS} FROM leases WHERE pkey = ? AND until > ? AND lost_to IS NULL ORDER BY hlc, origin, seq",
        (pkey, now_ms)).fetchall()]


def listed(cur: sqlite3.Cursor, pkey: str | None, rkey: str | None, now_ms: int, *, ended: bool,
           limit: int) -> list[dict[str, Any]]:
    """Leases of a project (or every project) and role (or every role), newest first: the live and
    the lost ones, and with ``ended`` also the released, forced and expired ones."""
    where: list[str] = ["1"]
    args: list[Any] = []
    if pkey is not None:
        where.append("pkey = ?")
        args.append(pkey)
    if rkey is not None:
        where.append("rkey = ?")
        args.append(rkey)
    if not ended:
        where.append("(until > ? OR lost_to IS NOT NULL)")
        args.append(now_ms)
    return [row_dict(r) for r in cur.execute(
        f"SELECT {_COLUMNS} FROM leases WHERE {' AND '.join(where)} ORDER BY hlc DESC, origin, seq LIMIT ?",
        (*args, limit)).fetchall()]


def by_id(cur: sqlite3.Cursor, lid: str) -> dict[str, Any] | None:
    row = cur.execute(f"SELECT {_COLUMNS} FROM leases WHERE id = ?", (lid,)).fetchone()
    return None if row is None else row_dict(row)


def losses_after(cur: sqlite3.Cursor, after_lseq: int, limit: int = 100) -> list[tuple[int, dict[str, Any],
                                                                                      dict[str, Any] | None]]:
    """Leases lost here since ``after_lseq`` (in the order they were lost), each with its winner."""
    out = []
    for lid, winner, lseq in cur.execute("SELECT lease, winner, lseq FROM lease_losses WHERE lseq > ?"
                                         " ORDER BY lseq LIMIT ?", (after_lseq, limit)).fetchall():
        lost = by_id(cur, lid)
        if lost is not None:
            out.append((int(lseq), lost, by_id(cur, winner)))
    return out


def last_loss(cur: sqlite3.Cursor) -> int:
    return int(cur.execute("SELECT coalesce(max(lseq), 0) FROM lease_losses").fetchone()[0])
