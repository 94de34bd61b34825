"""SQL of fleet membership: keeping every ``admit`` and ``rekey`` op, and settling who counts.

Invariants:
* Every membership op held is listed in ``fleet_ops`` (origin, seq, its row, its kind), whoever
  wrote it and whatever its fate: the rules decide on the set (``membership.standing``), so no
  replica may drop one because of what it happens to know when it arrives.
* ``fleet_removed`` and ``fleet_members`` always equal ``membership.standing`` of those ops and this
  replica's roots (``meta.fleet_roots``; absent: an open replica, every node counts): every write
  transaction that stores membership ops or changes the roots ends with ``settle``.
* What the standing bars is retracted on every replica but its origin's own: a removed node's ops
  above its cutoff, and every op of a node never let in (membership ops excepted). A retracted row
  keeps its lseq (so arrival positions never go back) with the seq negated and every message column
  and the blob cleared; its search entry, routes and thread number are dropped (a thread then shows
  a gap in its numbers there), and the origin's contiguous mark is held to the cutoff, so the ops
  come again by the next rounds if the standing changes back. Register writes such ops already made
  stay (docs/security.md names the window).
* This node's own key is kept in ``meta`` (``self_node``), so a projection knows whose ops never to
  retract.
"""

from __future__ import annotations

import hashlib
import sqlite3
from typing import Any

from replica import membership as mem
from replica import scrub
from replica.codec import pack, unpack
from replica.errors import Undecodable
from replica.ops import Op

SELF_META = "self_node"
ROOTS_META = "fleet_roots"
_FLEET_OPS = "SELECT lseq FROM fleet_ops"
_RETRACT = (
    "UPDATE ops SET seq = -seq, blob = x'', id = NULL, sender = NULL, sender_inst = NULL, channel = NULL,"
    " to_inst = NULL, thread = NULL, content = NULL, skey = NULL, sikey = NULL, ckey = NULL, tkey = NULL,"
    f" sday = NULL, tenant = NULL WHERE oid = ? AND seq > ? AND lseq NOT IN ({_FLEET_OPS})"
)


def remember_self(cur: sqlite3.Cursor, node: bytes) -> None:
    cur.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (SELF_META, node))


def self_node(cur: sqlite3.Cursor) -> bytes | None:
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (SELF_META,)).fetchone()
    return bytes(row[0]) if row else None


# -- roots ---------------------------------------------------------------------------------------


def roots(cur: sqlite3.Cursor) -> frozenset[bytes] | None:
    """The nodes this replica trusts without an admit; None when it is open (no fleet closed it)."""
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (ROOTS_META,)).fetchone()
    return None if row is None else frozenset(bytes(k) for k in unpack(bytes(row[0])))


def set_roots(cur: sqlite3.Cursor, nodes: frozenset[bytes]) -> None:
    """Close the replica on ``nodes`` (empty: the roots of this node's own admission), and settle."""
    cur.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                (ROOTS_META, pack(sorted(nodes))))
    settle(cur)


# -- the ops ---------------------------------------------------------------------------------------


def project(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """Keep a newly stored membership op. The caller settles (``settle``) once its batch is in,
    inside the same transaction."""
    b = op.body
    cur.execute("INSERT OR IGNORE INTO fleet_ops(origin, seq, lseq, kind) VALUES (?, ?, ?, ?)",
                (op.origin, op.seq, lseq, op.kind))
    if op.kind == mem.KIND_ADMIT:  # the name people see: the newest admit of the node
        cur.execute(
            "INSERT INTO fleet_admits(node, name, fleet, hlc, origin) VALUES (?, ?, ?, ?, ?) ON CONFLICT(node)"
            " DO UPDATE SET name = excluded.name, fleet = excluded.fleet, hlc = excluded.hlc, origin = excluded.origin"
            " WHERE excluded.hlc > fleet_admits.hlc"
            " OR (excluded.hlc = fleet_admits.hlc AND excluded.origin > fleet_admits.origin)",
            (b["k"], b["nm"], b["f"], op.hlc, op.origin),
        )


def _header(raw: bytes) -> list[Any] | None:
    try:
        header = unpack(unpack(raw)[0])
    except (Undecodable, TypeError, IndexError, KeyError):
        return None
    return header if isinstance(header, list) and len(header) == 6 and isinstance(header[5], dict) else None


def read_ops(cur: sqlite3.Cursor) -> tuple[list[mem.Rekey], list[mem.Admit]]:
    """Every membership op held, as the rules see them."""
    rekeys: list[mem.Rekey] = []
    admits: list[mem.Admit] = []
    for origin, seq, blob, hlc, kind in cur.execute(
        "SELECT f.origin, f.seq, o.blob, o.hlc, f.kind FROM fleet_ops f JOIN ops o ON o.lseq = f.lseq"
    ).fetchall():
        header = _header(bytes(blob)) if blob else None
        if header is None:
            continue
        args = (bytes(origin), int(seq), int(hlc), header[5])
        if kind == mem.KIND_REKEY:
            rekeys.append(mem.Rekey.from_body(*args))
        else:
            admits.append(mem.Admit.from_body(*args))
    return rekeys, admits


def rekeys(cur: sqlite3.Cursor) -> list[mem.Rekey]:
    return read_ops(cur)[0]


def blobs(cur: sqlite3.Cursor) -> list[bytes]:
    """Every membership op held, as signed (what a member on another key, or a snapshot, needs)."""
    rows = cur.execute("SELECT o.blob FROM fleet_ops f JOIN ops o ON o.lseq = f.lseq ORDER BY f.lseq")
    return [bytes(r[0]) for r in rows if r[0]]


def digest(cur: sqlite3.Cursor) -> bytes:
    """A digest of the set of membership ops held: two replicas with equal digests decide alike."""
    h = hashlib.blake2b(digest_size=16, person=b"peerd-fleet-ops")
    for origin, seq in cur.execute("SELECT origin, seq FROM fleet_ops ORDER BY origin, seq"):
        h.update(bytes(origin) + int(seq).to_bytes(8, "big"))
    return h.digest()


def standing(cur: sqlite3.Cursor) -> mem.Standing:
    ks, admits = read_ops(cur)
    return mem.standing(ks, admits, roots(cur), self_node(cur) or b"")


# -- settling ------------------------------------------------------------------------------------


def removed(cur: sqlite3.Cursor) -> dict[bytes, int]:
    return {bytes(r[0]): int(r[1]) for r in cur.execute("SELECT node, upto FROM fleet_removed")}


def closed(cur: sqlite3.Cursor) -> bool:
    return cur.execute("SELECT 1 FROM meta WHERE k = ?", (ROOTS_META,)).fetchone() is not None


def admitted(cur: sqlite3.Cursor, node: bytes) -> bool:
    """Whether ``node`` was let in (on a closed replica; see ``closed``)."""
    return cur.execute("SELECT 1 FROM fleet_members WHERE node = ?", (node,)).fetchone() is not None


def settle(cur: sqlite3.Cursor) -> mem.Standing:
    """Make ``fleet_removed`` and ``fleet_members`` the standing of the ops held, and retract what it
    bars (module docstring)."""
    me = self_node(cur)
    now = standing(cur)
    cur.execute("DELETE FROM fleet_removed")
    cur.executemany("INSERT INTO fleet_removed(node, upto) VALUES (?, ?)", list(now.removed.items()))
    cur.execute("DELETE FROM fleet_members")
    if now.admitted is not None:
        cur.executemany("INSERT INTO fleet_members(node) VALUES (?)", [(k,) for k in now.admitted])
        for (node,) in cur.execute("SELECT node FROM origins").fetchall():
            if bytes(node) != me and bytes(node) not in now.admitted:
                retract_above(cur, bytes(node), 0)
    for node, upto in now.removed.items():
        if node != me:
            retract_above(cur, node, upto)
    return now


def retract_above(cur: sqlite3.Cursor, node: bytes, upto: int) -> int:
    """Retract every op of ``node`` above seq ``upto`` held here but its membership ops; how many were."""
    row = cur.execute("SELECT oid FROM origins WHERE node = ?", (node,)).fetchone()
    if row is None:
        return 0
    oid = int(row[0])
    rows = cur.execute(
        "SELECT lseq, id, content, sender, coalesce(channel, thread), seq, retracted FROM ops"
        f" WHERE oid = ? AND seq > ? AND lseq NOT IN ({_FLEET_OPS})", (oid, upto),
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


def backfill(cur: sqlite3.Cursor) -> None:
    """Schema v13: list every membership op a replica held before ``fleet_ops`` (rekeys were listed;
    admits are found among the ops, whose blob names the kind)."""
    cur.execute("INSERT OR IGNORE INTO fleet_ops(origin, seq, lseq, kind)"
                " SELECT origin, seq, lseq, 'rekey' FROM fleet_rekeys")
    needle = pack(mem.KIND_ADMIT)  # the kind as the header encodes it
    for lseq, blob in cur.execute("SELECT lseq, blob FROM ops WHERE id IS NULL AND instr(blob, ?) > 0",
                                  (needle,)).fetchall():
        header = _header(bytes(blob))
        if header is not None and header[4] == mem.KIND_ADMIT:
            cur.execute("INSERT OR IGNORE INTO fleet_ops(origin, seq, lseq, kind) VALUES (?, ?, ?, ?)",
                        (bytes(header[1]), int(header[2]), lseq, mem.KIND_ADMIT))
    cur.execute("DROP TABLE fleet_rekeys")
