"""Storing many ops in one transaction, fast: the store path of snapshot pages.

``store_batch`` leaves a replica exactly as ``project.store_op`` called op by op
(in the order given) would: the same rows, lseqs in the same order, the same
projections. It only does the work in fewer statements: rows are inserted with
``executemany`` at lseqs it allocates itself (the next ones, inside the caller's
write transaction), names are keyed once per batch, and the projections of
messages (routes, thread numbers, first-seen times, retractions that came first)
are made per batch; every other kind goes through ``project.materialize`` op by op.

Invariants:
* The caller holds the write transaction and passes only ops it has checked
  (``ops.decode``) and that this replica does not hold (no (origin, seq) twice, none
  held): an insert that still conflicts fails the transaction, never skips silently.
* Thread numbers are taken in lseq order, as ``store_op`` takes them one by one.
* A role's first-seen time is the minimum of its sightings, so sightings are folded
  per batch before they are recorded (the rule is a min: order does not matter).
* A message whose retraction came first is settled after all rows are in, as
  ``project.materialize`` settles it when it lands.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from replica import firstseen, pinstore, project, registers, routing
from replica.hlc import wall_of
from replica.ids import receipt_id
from replica.lww import join_key
from replica.names import name_key
from replica.ops import KIND_MSG, KIND_SET, KNOWN_KINDS, Op, known_writes, level_of, message_id
from replica.stamps import session_day

_INSERT_MSG = (
    "INSERT INTO ops(lseq, oid, seq, blob, id, sender, sender_inst, channel, to_inst, thread, content,"
    " hlc, skey, sikey, ckey, tkey, sday, tenant, arrived, v1, newer)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_OTHER = "INSERT INTO ops(lseq, oid, seq, blob, hlc, arrived, v1, newer) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_ROUTE = "INSERT OR IGNORE INTO routes(role, lseq) VALUES (?, ?)"
# A receipt write's projection, made only when its register write won (the register holds it now).
_RECEIPT = (
    "INSERT INTO receipts(msg_id, role, inst, rid, {col}) SELECT ?1, ?2, ?3, ?4, ?5"
    " WHERE EXISTS (SELECT 1 FROM lww WHERE tbl = 'rcpt' AND k = ?6 AND f = ?7 AND hlc = ?8 AND origin = ?9)"
    " ON CONFLICT(msg_id, role, inst) DO UPDATE SET {col} = excluded.{col}"
)
_RECEIPT_COLUMNS = {"d": "delivered", "r": "read"}
Write = tuple[list[Any], int, bytes]  # a register write, the stamp and origin of its op


class _Keys:
    """Name keys of one batch, each computed once (``project.message_columns``, memoised), and message
    ids (``ops.message_id``: an origin's prefix, then the seq)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.channels: dict[str, str] = {}
        self.routes: dict[str, tuple[str, ...]] = {}
        self.prefixes: dict[bytes, str] = {}

    def message_id(self, origin: bytes, seq: int) -> str:
        prefix = self.prefixes.get(origin)
        if prefix is None:
            prefix = self.prefixes[origin] = message_id(origin, 0)[:-1]
        return f"{prefix}{seq}"

    def name(self, name: str) -> str:
        key = self.names.get(name)
        if key is None:
            key = self.names[name] = name_key(name)
        return key

    def channel(self, channel: str) -> str:
        key = self.channels.get(channel)
        if key is None:
            key = self.channels[channel] = routing.channel_key(channel)
        return key

    def route(self, channel: str) -> tuple[str, ...]:
        keys = self.routes.get(channel)
        if keys is None:
            keys = self.routes[channel] = routing.route_keys(channel, None)
        return keys

    def columns(self, body: Mapping[str, Any], hlc: int) -> tuple[Any, ...]:
        channel, thread, target, inst = body["c"], body["t"], body["ti"], body["fi"]
        return (
            self.name(body["f"]), self.name(inst) if inst else "",
            self.channel(channel) if channel is not None and thread is None else None,
            self.name(target) if target is not None else None,
            body.get("sd") or session_day(wall_of(hlc)),
            self.name(body["tn"]) if body.get("tn") is not None else None,
        )


def next_lseq(cur: sqlite3.Cursor) -> int:
    return int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0]) + 1


def store_batch(cur: sqlite3.Cursor, batch: Sequence[tuple[int, Op]], arrived: int) -> list[int]:
    """Store ``batch`` ((origin row id, op) each, checked and not held) with its projections, in
    order; the lseqs it took (consecutive, in the order given)."""
    if not batch:
        return []
    first = next_lseq(cur)
    keys = _Keys()
    msgs: list[tuple[Any, ...]] = []
    others: list[tuple[Any, ...]] = []
    for i, (oid, op) in enumerate(batch):
        lseq = first + i
        if op.kind == KIND_MSG:
            b = op.body
            mid = keys.message_id(op.origin, op.seq)
            msgs.append((lseq, oid, op.seq, op.raw, mid, b["f"], b["fi"], b["c"], b["ti"], b["t"], b["x"], op.hlc,
                         *keys.columns(b, op.hlc), arrived, op.v1, level_of(op)))
        else:
            others.append((lseq, oid, op.seq, op.raw, op.hlc, arrived, op.v1, level_of(op)))
    cur.executemany(_INSERT_MSG, msgs)
    cur.executemany(_INSERT_OTHER, others)
    lseqs = list(range(first, first + len(batch)))
    _project(cur, batch, lseqs, keys)
    return lseqs


def _project(cur: sqlite3.Cursor, batch: Sequence[tuple[int, Op]], lseqs: Sequence[int], keys: _Keys) -> None:
    """The projections of the rows just stored: messages per batch first, then every other kind op
    by op, in order (a rekey among them then settles removals over rows already projected)."""
    routes: list[tuple[str, int]] = []
    numbered: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    by_origin: dict[bytes, list[str]] = {}
    rest: list[tuple[int, Op]] = []
    for (_oid, op), lseq in zip(batch, lseqs, strict=True):
        if op.kind != KIND_MSG:
            rest.append((lseq, op))
            continue
        channel, thread = op.body["c"], op.body["t"]
        if thread is not None:
            numbered.append((lseq, thread))
        else:
            if channel is not None and len(route := keys.route(channel)) > 1:
                routes += ((k, lseq) for k in route)
            role, at = keys.name(op.body["f"]), wall_of(op.hlc)
            seen[role] = min(at, seen.get(role, at))
        by_origin.setdefault(op.origin, []).append(keys.message_id(op.origin, op.seq))
    cur.executemany(project._NUMBER_IN_THREAD, numbered)  # the one rule for thread numbers
    cur.executemany(_ROUTE, routes)
    for role, at in seen.items():  # the earliest message of each sender: one confirming sighting
        firstseen.record(cur, firstseen.Sighting(role, at, firstseen.SENT))
    _settle_retracted(cur, by_origin)
    if by_origin and pinstore.any_pins(cur):  # messages in the name of a pinned role: held back, as one by one
        for (_oid, op), lseq in zip(batch, lseqs, strict=True):
            if op.kind == KIND_MSG:
                project.hold_if_refused(cur, lseq, op)
    receipts: list[Write] = []
    for lseq, op in rest:
        if op.kind == KIND_SET:
            _writes(cur, op, keys, receipts)
        elif op.kind in KNOWN_KINDS:
            project.materialize(cur, lseq, op)
    _receipts(cur, receipts, keys)


def _writes(cur: sqlite3.Cursor, op: Op, keys: _Keys, receipts: list[Write]) -> None:
    """A set op's projections (``project.materialize``), its receipt writes kept for ``_receipts``."""
    for write in known_writes(op):
        if write[0] == "rcpt" and write[2] in _RECEIPT_COLUMNS:
            receipts.append((write, op.hlc, op.origin))
        elif write[0] != firstseen.TABLE:  # a min-register, not last-writer-wins
            registers.put_register(cur, write, op.hlc, op.origin)
    firstseen.record_all(cur, firstseen.sightings(op))


def _receipts(cur: sqlite3.Cursor, writes: Sequence[Write], keys: _Keys) -> None:
    """Receipt writes, most of a fleet's register writes, in a few statements: the winner of each
    register among them (last writer wins: the order does not matter), then one upsert per winner
    and its projection where it won (``registers.put_register`` for each, in effect)."""
    best: dict[tuple[str, str], tuple[int, bytes, list[str], Any]] = {}
    for (_table, raw_key, field, value), hlc, origin in writes:
        key = [raw_key[0], keys.name(raw_key[1]), keys.name(raw_key[2]) if raw_key[2] else ""]
        slot = (join_key(key), field)
        held = best.get(slot)
        if held is None or (hlc, origin) > (held[0], held[1]):
            best[slot] = (hlc, origin, key, value)
    cur.executemany(registers.LWW_UPSERT, [("rcpt", k, f, v, hlc, origin)
                                         for (k, f), (hlc, origin, _key, v) in best.items()])
    for field, col in _RECEIPT_COLUMNS.items():
        cur.executemany(_RECEIPT.format(col=col), [
            (key[0], key[1], key[2], receipt_id(*key), v, k, f, hlc, origin)
            for (k, f), (hlc, origin, key, v) in best.items() if f == field])


def _settle_retracted(cur: sqlite3.Cursor, ids: Mapping[bytes, Sequence[str]]) -> None:
    """Settle the messages of ``ids`` whose retraction was stored before them: one look per origin
    (ids of an origin share a prefix, so its retractions are one range of the key)."""
    if cur.execute("SELECT 1 FROM retractions LIMIT 1").fetchone() is None:
        return
    for origin, mids in ids.items():
        prefix = message_id(origin, 1).rpartition("-")[0]
        found = {str(r[0]) for r in cur.execute(
            "SELECT DISTINCT msg_id FROM retractions WHERE msg_id >= ? AND msg_id < ?", (prefix + "-", prefix + "."))}
        for mid in found.intersection(mids):
            project.settle_retraction(cur, mid)

