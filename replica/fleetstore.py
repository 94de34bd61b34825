"""SQL of fleet membership: projecting ``admit`` and ``rekey`` ops, and settling removals.

Invariants:
* ``fleet_removed`` always equals ``membership.standing`` of the stored rekey ops; ``settle``
  recomputes it inside the write transaction that stored a rekey op (by apply or a local write).
* A removed node's ops above its cutoff are retracted on every replica but its own: the row keeps
  its lseq (so arrival positions never go back) with the seq negated and every message column and
  the blob cleared, its search entry, routes and thread number are dropped (a thread then shows a
  gap in its numbers there), and the origin's contiguous mark is held to the cutoff. Register writes
  such ops already made stay (docs/security.md names the window).
* This node's own key is kept in ``meta`` (``self_node``), so a projection knows whose ops never to retract.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from replica import membership as mem
from replica import scrub
from replica.codec import unpack
from replica.errors import Undecodable
from replica.ops import Op

SELF_META = "self_node"
_RETRACT = (
    "UPDATE ops SET seq = -seq, blob = x'', id = NULL, sender = NULL, sender_inst = NULL, channel = NULL,"
    " to_inst = NULL, thread = NULL, content = NULL, skey = NULL, sikey = NULL, ckey = NULL, tkey = NULL,"
    " sday = NULL, tenant = NULL WHERE oid = ? AND seq > ?"
)


def remember_self(cur: sqlite3.Cursor, node: bytes) -> None:
    cur.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (SELF_META, node))


def project(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """The projections of a newly stored membership op."""
    b = op.body
    if op.kind == mem.KIND_ADMIT:
        cur.execute(
            "INSERT INTO fleet_admits(node, name, fleet, hlc, origin) VALUES (?, ?, ?, ?, ?) ON CONFLICT(node)"
            " DO UPDATE SET name = excluded.name, fleet = excluded.fleet, hlc = excluded.hlc, origin = excluded.origin"
            " WHERE excluded.hlc > fleet_admits.hlc"
            " OR (excluded.hlc = fleet_admits.hlc AND excluded.origin > fleet_admits.origin)",
            (b["k"], b["nm"], b["f"], op.hlc, op.origin),
        )
    else:
        cur.execute("INSERT OR IGNORE INTO fleet_rekeys(origin, seq, lseq) VALUES (?, ?, ?)", (op.origin, op.seq, lseq))
        settle(cur)


def _body(raw: bytes) -> Any:
    try:
        header = unpack(unpack(raw)[0])
    except (Undecodable, TypeError, IndexError, KeyError):
        return None
    return header[5] if isinstance(header, list) and len(header) == 6 else None


def rekeys(cur: sqlite3.Cursor) -> list[mem.Rekey]:
    """Every stored rekey op (retracted ones are void by the rules anyway, and are left out)."""
    out = []
    for origin, seq, blob, hlc in cur.execute(
        "SELECT r.origin, r.seq, o.blob, o.hlc FROM fleet_rekeys r JOIN ops o ON o.lseq = r.lseq"
    ).fetchall():
        body = _body(bytes(blob)) if blob else None
        if isinstance(body, dict):
            out.append(mem.Rekey.from_body(bytes(origin), int(seq), int(hlc), body))
    return out


def self_node(cur: sqlite3.Cursor) -> bytes | None:
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (SELF_META,)).fetchone()
    return bytes(row[0]) if row else None


def removed(cur: sqlite3.Cursor) -> dict[bytes, int]:
    return {bytes(r[0]): int(r[1]) for r in cur.execute("SELECT node, upto FROM fleet_removed")}


def settle(cur: sqlite3.Cursor) -> None:
    """Make ``fleet_removed`` the standing of the stored rekeys, and retract what it bars."""
    me = self_node(cur)
    now = mem.standing(rekeys(cur)).removed
    cur.execute("DELETE FROM fleet_removed")
    cur.executemany("INSERT INTO fleet_removed(node, upto) VALUES (?, ?)", list(now.items()))
    for node, upto in now.items():
        if node != me:
            retract_above(cur, node, upto)


def retract_above(cur: sqlite3.Cursor, node: bytes, upto: int) -> int:
    """Retract every op of ``node`` above seq ``upto`` held here; how many were."""
    row = cur.execute("SELECT oid FROM origins WHERE node = ?", (node,)).fetchone()
    if row is None:
        return 0
    oid = int(row[0])
    rows = cur.execute(
        "SELECT lseq, id, content, sender, coalesce(channel, thread), seq, retracted FROM ops"
        " WHERE oid = ? AND seq > ?", (oid, upto),
    ).fetchall()
    if rows:
        indexed = int(cur.execute("SELECT coalesce((SELECT v FROM meta WHERE k = 'fts_upto'), 0)").fetchone()[0])
        searched = False
        for lseq, mid, content, sender, channel, _seq, retracted in rows:
            if mid is not None and content is not None and retracted is None and lseq <= indexed:
                searched = True
                cur.execute("INSERT INTO message_fts(message_fts, rowid, content, sender, channel)"
                            " VALUES ('delete', ?, ?, ?, ?)", (lseq, content, sender, channel))
        scrub.mark(cur, search=searched)  # what the rows held leaves the files too
        cur.executemany("DELETE FROM routes WHERE lseq = ?", [(r[0],) for r in rows])
        cur.executemany("DELETE FROM thread_seqs WHERE lseq = ?", [(r[0],) for r in rows])
        # a tombstone of an earlier retraction of the same seq (the removal was undone, then redone)
        cur.executemany("DELETE FROM ops WHERE oid = ? AND seq = ?", [(oid, -r[5]) for r in rows])
        cur.execute(_RETRACT, (oid, upto))
    cur.execute("UPDATE origins SET contig = min(contig, ?), top = min(top, ?) WHERE oid = ?", (upto, upto, oid))
    return len(rows)
