"""Checking, afterwards, the signatures a snapshot let through, and dropping what fails.

A snapshot page stores ``msg`` and ``set`` ops on its signer's word (``replica.snapshot``) and
keeps the lseqs they took (``meta.snapshot_unverified``: signer, first and last lseq). This module
checks them later, a step at a time (``check_vouched``), as if they had just arrived.

Invariants:
* A step reads a few ops, checks their signatures outside any transaction, then records how far it
  got in one short write transaction; checking an op twice (a restart, an op that arrived by a
  round inside the range) is harmless.
* An op whose signature fails is **forged** (its signer vouched for it): it is dropped as if it had
  never arrived (its row, search entry, routes and thread number), its origin's vector goes back to
  just before it, and every register and first-seen time is rebuilt from the ops that remain; the
  genuine op then comes with the next rounds, verified. How many each signer vouched for is kept
  (``meta.snapshot_forged``) for ``peerd status`` and ``peerd doctor``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from replica import migrate
from replica import ops as opsmod
from replica.errors import InvalidOp
from replica.snapshot import Snapshots, put_unverified, unverified_ranges

FORGED = "snapshot_forged"
_SENDERS = (
    "INSERT INTO senders(rkey, ikey, role, inst, hlc)"
    " SELECT skey, sikey, sender, sender_inst, max(hlc) FROM ops"
    " WHERE id IS NOT NULL AND thread IS NULL AND lseq <= ? GROUP BY skey, sikey"
)


@dataclass(frozen=True)
class VouchCheck:
    """One step of the check: whose word it was, how many ops were checked and are left (at most:
    ``Vouching.vouched_left``), and the (origin, seq) of those that did not verify (dropped)."""

    signer: bytes
    checked: int
    left: int
    forged: list[tuple[bytes, int]] = field(default_factory=list)


class Vouching(Snapshots):
    def vouched_left(self) -> int:
        """Ops stored on a signer's word and not checked yet, at most (the lseqs left in its ranges:
        ops that arrived otherwise meanwhile, or were dropped, count too)."""
        with self._store.read() as cur:
            return sum(max(0, int(r[2]) - int(r[1]) + 1) for r in unverified_ranges(cur))

    def forged_by(self) -> dict[str, int]:
        """Signer (node id) -> ops it vouched for that did not verify (and were dropped)."""
        with self._store.read() as cur:
            raw = cur.execute("SELECT v FROM meta WHERE k = ?", (FORGED,)).fetchone()
        return {} if raw is None else {str(k): int(v) for k, v in json.loads(raw[0]).items()}

    def check_vouched(self, limit: int = 2000) -> VouchCheck | None:
        """Check the signatures of up to ``limit`` ops stored on a signer's word; None when none wait."""
        with self._store.read() as cur:
            ranges = unverified_ranges(cur)
            if not ranges:
                return None
            signer, lo, hi = bytes.fromhex(ranges[0][0]), int(ranges[0][1]), int(ranges[0][2])
            rows = cur.execute("SELECT lseq, blob FROM ops WHERE lseq BETWEEN ? AND ? ORDER BY lseq LIMIT ?",
                               (lo, hi, limit)).fetchall()
        upto = int(rows[-1][0]) if rows else hi
        bad = [int(lseq) for lseq, blob in rows if blob and not _genuine(bytes(blob))]
        with self._store.write() as cur:
            forged = _drop(cur, bad) if bad else []
            ranges = unverified_ranges(cur)  # again: a page may have widened a range meanwhile
            for r in ranges:
                if r[0] == signer.hex():
                    r[1] = max(int(r[1]), upto + 1)
            put_unverified(cur, [r for r in ranges if int(r[1]) <= int(r[2])])
            if forged:
                _count_forged(cur, signer, len(forged))
            left = sum(max(0, int(r[2]) - int(r[1]) + 1) for r in unverified_ranges(cur))
        if forged:
            self._notify()
        return VouchCheck(signer, len(rows), left, forged)


def _genuine(blob: bytes) -> bool:
    try:
        opsmod.decode(blob)
    except InvalidOp:
        return False
    return True


def _count_forged(cur: Any, signer: bytes, n: int) -> None:
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (FORGED,)).fetchone()
    counts = {} if row is None else json.loads(row[0])
    counts[signer.hex()] = int(counts.get(signer.hex(), 0)) + n
    cur.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                (FORGED, json.dumps(counts)))


def _drop(cur: Any, lseqs: list[int]) -> list[tuple[bytes, int]]:
    """Drop forged ops as if they had never arrived, and rebuild what they may have projected."""
    indexed = int(cur.execute("SELECT coalesce((SELECT v FROM meta WHERE k = 'fts_upto'), 0)").fetchone()[0])
    out: list[tuple[bytes, int]] = []
    for lseq in lseqs:
        row = cur.execute("SELECT o.oid, o.seq, o.id, o.content, o.sender, coalesce(o.channel, o.thread),"
                          " o.retracted, g.node FROM ops o JOIN origins g ON g.oid = o.oid WHERE o.lseq = ?",
                          (lseq,)).fetchone()
        if row is None:
            continue
        oid, seq, mid, content, sender, channel, retracted, node = row
        if mid is not None and content is not None and retracted is None and lseq <= indexed:
            cur.execute("INSERT INTO message_fts(message_fts, rowid, content, sender, channel)"
                        " VALUES ('delete', ?, ?, ?, ?)", (lseq, content, sender, channel))
        for table in ("routes", "thread_seqs", "ops"):
            cur.execute(f"DELETE FROM {table} WHERE lseq = ?", (lseq,))
        cur.execute("UPDATE origins SET contig = min(contig, ?) WHERE oid = ?", (int(seq) - 1, oid))
        out.append((bytes(node), int(seq)))
    migrate._rebuild_registers(cur)  # registers and first-seen times from the ops that remain
    cur.execute("DELETE FROM senders")
    cur.execute(_SENDERS, (indexed,))
    return out
