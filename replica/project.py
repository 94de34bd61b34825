"""Applying an op to the tables: storing it with its projections (a message's columns, its
routes and thread number, a retraction, the membership tables, the registers, first-seen times,
role pins and the leases).

Invariants:
* ``store_op`` is idempotent: an op already held (same origin and seq) is
  ignored, and the projections are touched only for a newly stored op. An op of a kind this
  release does not know is stored and counted, and projects nothing (``replica.ops``).
* A thread message's number in its thread (``thread_seqs.tseq``) is the next
  one of its thread, taken as it lands (inside the write transaction): 1, 2,
  3, ... per thread, no gaps, in this replica's arrival order.
* Names are matched by key (``names.name_key``): a message row carries the
  keys of its sender, sender instance, channel and target instance.
* A retraction takes effect when its role is the message's sender (by key),
  whichever of the two ops arrives first: the content column is emptied, the
  search entry removed, and ``retracted`` holds the lowest such stamp.
* ``first_seen`` and ``seen_reads`` hold what the ops show of each role key (``replica.firstseen``):
  every op's sightings are projected with ``firstseen.record``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from replica import firstseen, fleetstore, leases, leasestore, membership, pins, pinstore, retention, routing, scrub
from replica.hlc import wall_of
from replica.names import name_key
from replica.ops import (
    KIND_MSG,
    KIND_RETRACT,
    KNOWN_KINDS,
    Op,
    known_writes,
    level_of,
    message_id,
    parse_message_id,
    read_stored,
)
from replica.registers import LWW_UPSERT, put_register
from replica.stamps import session_day


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


# A thread message takes the next number of its thread as it lands: inside the write
# transaction, so numbers are unique per thread and follow this replica's arrival order.
_NUMBER_IN_THREAD = (
    "INSERT OR IGNORE INTO thread_seqs(lseq, thread, tseq) VALUES (?1, ?2,"
    " coalesce((SELECT tseq FROM thread_seqs WHERE thread = ?2 ORDER BY tseq DESC LIMIT 1), 0) + 1)"
)


def materialize(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """Project a newly stored op (its message columns are already in its row)."""
    if op.kind == KIND_MSG:
        _file_message(cur, lseq, op)
        firstseen.record_all(cur, firstseen.sightings(op))  # what a message shows counts, held back or not
        hold_if_refused(cur, lseq, op)
        return
    if op.kind == KIND_RETRACT:
        if not hold_if_refused(cur, lseq, op):
            _apply_retraction(cur, op)
    elif op.kind in membership.KINDS:
        fleetstore.project(cur, lseq, op)
        return
    elif op.kind in leases.KINDS:  # the leases and who holds them (``replica.leasestore``)
        leasestore.project(cur, lseq, op)
        return
    elif op.kind == retention.KIND_RET:  # the fleet's horizon: one register (``replica.purge`` reads it)
        cur.execute(LWW_UPSERT, (retention.REGISTER, "", "h", op.body["h"], op.hlc, op.origin))
        return
    elif op.kind == pins.KIND_PIN:  # a role pinned to nodes (``replica.pinstore``)
        rejudge_role(cur, pinstore.project(cur, op))
        return
    else:
        for write in known_writes(op):
            if write[0] != firstseen.TABLE:  # a min-register, not last-writer-wins
                put_register(cur, write, op.hlc, op.origin)
    firstseen.record_all(cur, firstseen.sightings(op))


def _file_message(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """A message's routes and thread number, and its retraction if that came first."""
    if op.body["t"] is not None:
        cur.execute(_NUMBER_IN_THREAD, (lseq, op.body["t"]))
    _file_routes(cur, lseq, op.body["c"], op.body["t"])
    mid = message_id(op.origin, op.seq)
    if cur.execute("SELECT 1 FROM retractions WHERE msg_id = ? LIMIT 1", (mid,)).fetchone():
        settle_retraction(cur, mid)  # its retraction came first


def _apply_retraction(cur: sqlite3.Cursor, op: Op) -> None:
    cur.execute("INSERT OR IGNORE INTO retractions(msg_id, by_key, hlc) VALUES (?, ?, ?)",
                (op.body["m"], name_key(op.body["f"]), op.hlc))
    settle_retraction(cur, op.body["m"])


# -- ops a role pin holds back (``replica.pins``: the rule; ``replica.pinstore``: the rows) -----------

_HIDE = ("UPDATE ops SET id = NULL, sender = NULL, sender_inst = NULL, channel = NULL, to_inst = NULL,"
         " thread = NULL, content = NULL, skey = NULL, sikey = NULL, ckey = NULL, tkey = NULL, sday = NULL,"
         " tenant = NULL, retracted = NULL WHERE lseq = ?")


def hold_if_refused(cur: sqlite3.Cursor, lseq: int, op: Op) -> bool:
    """Hold back a newly stored message or retraction the pins held here refuse; whether it was."""
    role = pins.binds(op.kind, op.body)
    if role is None or not pinstore.any_pins(cur):
        return False
    if pinstore.admits(cur, op.kind, op.body, op.origin, seq=op.seq, hlc=op.hlc) is None:
        return False
    _hold(cur, lseq, op, name_key(role))
    return True


def _hold(cur: sqlite3.Cursor, lseq: int, op: Op, rkey: str) -> None:
    """Take a stored message out of every view (its row keeps its seq and signed bytes, so it is
    still counted and relayed), or keep a retraction from taking effect; file it as held back."""
    if op.kind == KIND_MSG:
        row = cur.execute("SELECT content, sender, coalesce(channel, thread) FROM ops WHERE lseq = ?",
                          (lseq,)).fetchone()
        if row is not None and row[0] is not None and lseq <= _fts_upto(cur):
            cur.execute("INSERT INTO message_fts(message_fts, rowid, content, sender, channel)"
                        " VALUES ('delete', ?, ?, ?, ?)", (lseq, *row))
        cur.execute(_HIDE, (lseq,))
        cur.execute("DELETE FROM routes WHERE lseq = ?", (lseq,))
        cur.execute("DELETE FROM thread_seqs WHERE lseq = ?", (lseq,))
    pinstore.hold(cur, lseq, rkey, op)


def _release(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """Apply an op the pins held back and no longer refuse, as if it had just landed."""
    pinstore.release(cur, lseq)
    if op.kind == KIND_MSG:
        fill_message_columns(cur, lseq, op)
        _file_message(cur, lseq, op)
        row = cur.execute("SELECT content, sender, coalesce(channel, thread) FROM ops WHERE lseq = ?",
                          (lseq,)).fetchone()
        if row[0] is not None and lseq <= _fts_upto(cur):  # past the search index's mark: index it now
            cur.execute("INSERT INTO message_fts(rowid, content, sender, channel) VALUES (?, ?, ?, ?)", (lseq, *row))
    else:
        _apply_retraction(cur, op)


def rejudge_role(cur: sqlite3.Cursor, rkey: str) -> None:
    """After a pin op of the role ``rkey`` landed: hold back every stored message and retraction in
    its name that its pins now refuse, and release those they no longer refuse. A retraction that
    took effect stays in effect (the content it dropped is gone)."""
    held = pinstore.pins_by_key(cur, rkey)
    for lseq in pinstore.held_back(cur, rkey):
        op = _stored(cur, lseq)
        if op is not None and pins.allows(held, op.origin, op.seq, op.hlc):
            _release(cur, lseq, op)
    for lseq, node, seq, hlc in cur.execute(
        "SELECT m.lseq, o.node, m.seq, m.hlc FROM ops m JOIN origins o ON o.oid = m.oid"
        " WHERE m.skey = ? AND m.id IS NOT NULL AND m.retracted IS NULL", (rkey,)
    ).fetchall():
        if not pins.allows(held, bytes(node), int(seq), int(hlc)):
            op = _stored(cur, int(lseq))
            if op is not None:
                _hold(cur, int(lseq), op, rkey)


def _stored(cur: sqlite3.Cursor, lseq: int) -> Op | None:
    row = cur.execute("SELECT blob FROM ops WHERE lseq = ? AND length(blob) > 0", (lseq,)).fetchone()
    return None if row is None else read_stored(bytes(row[0]))


def fill_message_columns(cur: sqlite3.Cursor, lseq: int, op: Op) -> None:
    """A message row's columns, from its op (a row stored without them: held back, or of a kind
    unknown to the release that stored it)."""
    b = op.body
    cur.execute("UPDATE ops SET id = ?, sender = ?, sender_inst = ?, channel = ?, to_inst = ?, thread = ?,"
                " content = ?, skey = ?, sikey = ?, ckey = ?, tkey = ?, sday = ?, tenant = ? WHERE lseq = ?",
                (message_id(op.origin, op.seq), b["f"], b["fi"], b["c"], b["ti"], b["t"], b["x"],
                 *message_columns(b, op.hlc), lseq))


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
    searched = content is not None and lseq <= _fts_upto(cur)
    if searched:  # contentless FTS5 deletes by the indexed values
        cur.execute("INSERT INTO message_fts(message_fts, rowid, content, sender, channel)"
                    " VALUES ('delete', ?, ?, ?, ?)", (lseq, content, sender, channel))
    # The signed bytes hold the content too: they go, and the seq counts as held, as a purged op's.
    cur.execute("UPDATE ops SET content = NULL, blob = x'', retracted = ? WHERE lseq = ?", (first, lseq))
    scrub.mark(cur, search=searched)


def _fts_upto(cur: sqlite3.Cursor) -> int:
    row = cur.execute("SELECT v FROM meta WHERE k = 'fts_upto'").fetchone()
    return int(row[0]) if row else 0
