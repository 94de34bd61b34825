"""SQL of role pins and of which node sent what: projecting ``pin`` ops, judging an op against
them, the ops they hold back, counting refusals, and the senders of each role.

Invariants:
* ``role_pins`` holds one row per pin op held (``pins.Pin``, with its cuts; NULL for a pin op
  written without them), keyed by the role's name key; the rules over them are ``replica.pins``
  (pure). A pin op projects exactly its row: storing it twice, or in any order, leaves the same rows.
* ``admits`` is the one judge of an op in a role's name (local writes and ops from peers alike).
* ``pin_held`` lists the stored ops (by lseq) the pins held here refuse: their rows carry no message
  columns and they are applied nowhere, so every replica holding the same ops shows the same.
  ``project.rejudge_role`` keeps it equal to the verdict of the role's pins.
* Refusals are counted in ``meta`` (``pin_refused``: each time an op is held back, with the last
  one), in the transaction that refused it, so every process on the file and
  every restart sees them.
* The sending node of a message is its op's origin (``ops.oid`` -> ``origins.node``), named by the
  membership (``fleet_admits``); ``mailbox.NODE_COLUMNS`` is that lookup, written once, for every view.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from replica import pins
from replica.codec import pack, unpack
from replica.names import name_key
from replica.ops import Op

REFUSED_META = "pin_refused"
LAST_REFUSED_META = "pin_refused_last"


def project(cur: sqlite3.Cursor, op: Op) -> str:
    """The row of a newly stored pin op (its cuts filled in, should a release before cuts have
    projected it without them); returns the role's name key."""
    b = op.body
    cuts = pins.cuts_of(b)
    rkey = name_key(b["r"])
    cur.execute("INSERT INTO role_pins(rkey, hlc, origin, role, nodes, cuts) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(rkey, hlc, origin) DO UPDATE SET cuts = excluded.cuts",
                (rkey, op.hlc, op.origin, b["r"], pack(sorted(b["n"])),
                 None if cuts is None else pack(sorted([k, s] for k, s in cuts.items()))))
    return rkey


_COLUMNS = "role, hlc, origin, nodes, cuts"


def _pin(row: Any) -> pins.Pin:
    cuts = None if row[4] is None else {bytes(k): int(s) for k, s in unpack(bytes(row[4]))}
    return pins.Pin(str(row[0]), frozenset(bytes(n) for n in unpack(bytes(row[3]))), int(row[1]), bytes(row[2]),
                    cuts)


def pins_by_key(cur: sqlite3.Cursor, rkey: str) -> list[pins.Pin]:
    """Every pin op held for the role of name key ``rkey``."""
    return [_pin(r) for r in cur.execute(f"SELECT {_COLUMNS} FROM role_pins WHERE rkey = ?", (rkey,))]


def pins_of(cur: sqlite3.Cursor, role: str) -> list[pins.Pin]:
    """Every pin op held for ``role`` (by its name key)."""
    return pins_by_key(cur, name_key(role))


def in_force(cur: sqlite3.Cursor) -> list[pins.Pin]:
    """The pin in force for each role that has one (unpins included), by role key."""
    by_role: dict[str, list[pins.Pin]] = {}
    for r in cur.execute(f"SELECT rkey, {_COLUMNS} FROM role_pins"):
        by_role.setdefault(str(r[0]), []).append(_pin(r[1:]))
    return [w for key in sorted(by_role) if (w := pins.winner(by_role[key])) is not None]


def any_pins(cur: sqlite3.Cursor) -> bool:
    return cur.execute("SELECT 1 FROM role_pins LIMIT 1").fetchone() is not None


def admits(cur: sqlite3.Cursor, kind: str, body: dict[str, Any], origin: bytes, *, seq: int,
           hlc: int) -> pins.Pin | None:
    """None when the pins held here let ``origin`` write this op (its ``seq``, stamped ``hlc``); else
    the pin that bars it."""
    role = pins.binds(kind, body)
    if role is None:
        return None
    held = pins_of(cur, role)
    if not held or pins.allows(held, origin, seq, hlc):
        return None
    return pins.binding(held, origin, seq, hlc)


def hold(cur: sqlite3.Cursor, lseq: int, rkey: str, op: Op) -> None:
    """File a stored op as held back by the pins of ``rkey``; count it (once) as refused."""
    cur.execute("INSERT OR IGNORE INTO pin_held(lseq, rkey) VALUES (?, ?)", (lseq, rkey))
    if cur.rowcount == 1:
        cur.execute("INSERT INTO meta(k, v) VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET v = v + 1", (REFUSED_META,))
        cur.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                    (LAST_REFUSED_META, pack([str(op.body["f"]), op.origin, op.seq, op.hlc])))


def release(cur: sqlite3.Cursor, lseq: int) -> None:
    cur.execute("DELETE FROM pin_held WHERE lseq = ?", (lseq,))


def held_back(cur: sqlite3.Cursor, rkey: str) -> list[int]:
    """The lseqs of the ops the pins of ``rkey`` hold back here."""
    return [int(r[0]) for r in cur.execute("SELECT lseq FROM pin_held WHERE rkey = ? ORDER BY lseq", (rkey,))]


def is_held(cur: sqlite3.Cursor, lseq: int) -> bool:
    return cur.execute("SELECT 1 FROM pin_held WHERE lseq = ?", (lseq,)).fetchone() is not None


def refused(cur: sqlite3.Cursor) -> int:
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (REFUSED_META,)).fetchone()
    return int(row[0]) if row else 0


def last_refused(cur: sqlite3.Cursor) -> tuple[str, bytes, int, int] | None:
    """(role, origin, seq, hlc) of the last op refused for a pin, or None."""
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (LAST_REFUSED_META,)).fetchone()
    if row is None:
        return None
    role, origin, seq, hlc = unpack(bytes(row[0]))
    return str(role), bytes(origin), int(seq), int(hlc)


def node_names(cur: sqlite3.Cursor) -> dict[bytes, str]:
    """Node key -> the name the membership gives it."""
    return {bytes(r[0]): str(r[1]) for r in cur.execute("SELECT node, name FROM fleet_admits")}


def senders(cur: sqlite3.Cursor) -> list[tuple[str, bytes, int, int]]:
    """(role as first written, node, messages, newest stamp) for every role and node that sent a
    channel message in its name held here, by role key then node."""
    rows = cur.execute(
        "SELECT min(m.sender), o.node, count(*), max(m.hlc) FROM ops m JOIN origins o ON o.oid = m.oid"
        " WHERE m.id IS NOT NULL AND m.thread IS NULL GROUP BY m.skey, m.oid ORDER BY m.skey, o.node"
    )
    return [(str(r[0]), bytes(r[1]), int(r[2]), int(r[3])) for r in rows]


def _full_id(word: str) -> bool:
    return len(word) == 2 * pins.NODE_BYTES and all(c in "0123456789abcdefABCDEF" for c in word)


def resolve(cur: sqlite3.Cursor, words: Iterable[str]) -> tuple[list[bytes], list[str], dict[str, list[bytes]]]:
    """Nodes named by id (a prefix of at least 4 hex digits of a node known here, or a whole id) or by
    membership name: (the nodes found, words that name none, words that name several)."""
    known = {bytes(r[0]) for r in cur.execute("SELECT node FROM origins")} | set(node_names(cur))
    names = node_names(cur)
    found: list[bytes] = []
    unknown: list[str] = []
    ambiguous: dict[str, list[bytes]] = {}
    for word in words:
        w = word.strip()
        hits = sorted({n for n in known if len(w) >= 4 and n.hex().startswith(w.lower())}
                      | {n for n, nm in names.items() if name_key(nm) == name_key(w)})
        if not hits and _full_id(w):  # a node this replica has not heard of yet, named in full
            hits = [bytes.fromhex(w)]
        if not hits:
            unknown.append(word)
        elif len(hits) > 1:
            ambiguous[word] = hits
        else:
            found.append(hits[0])
    return found, unknown, ambiguous
