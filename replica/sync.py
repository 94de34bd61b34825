"""The sync surface: version vectors, the ops a peer lacks, applying a peer's
ops, local arrival order, and whole-state checks.

Invariants:
* ``vector()`` only counts seqs held contiguously from 1 (``vector.contiguous``),
  so ``ops_missing`` only offers ops the receiver can place with no hole.
* ``apply`` is all-or-nothing per call: every op not held yet is verified
  before any is stored; ops already held are skipped by (origin, seq) before
  their signature is checked.
* Applying moves this node's clock past what it saw, capped by the allowed
  drift, so a peer's clock far ahead cannot drag ours with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from replica import fleetstore, membership, store, vector
from replica import hlc as hlcmod
from replica import ops as opsmod
from replica.checks import check_count
from replica.codec import pack
from replica.core import LAST_OWN, ReplicaCore
from replica.errors import InvalidOp
from replica.models import ApplyResult, Page
from replica.ops import Op

# An origin's contiguous mark; this node's own row is always contiguous up to its newest op.
_CONTIG = (
    "CASE WHEN oid = ?1 THEN max(contig, (SELECT coalesce(max(seq), 0) FROM ops WHERE ops.oid = ?1)) ELSE contig END"
)
_NEWEST = "SELECT coalesce(max(lseq), 0) FROM ops"


class Sync(ReplicaCore):
    fleet_changes = 0  # membership ops (admit, rekey) applied or written by this object: a cheap "look again"

    def vector(self) -> dict[bytes, int]:
        """Origin key -> highest seq held contiguously."""
        with self._store.read() as cur:
            rows = cur.execute(f"SELECT node, {_CONTIG} AS c FROM origins WHERE c > 0", (self._self_oid,))
            return {bytes(r[0]): int(r[1]) for r in rows}

    def ops_missing(self, theirs: Mapping[bytes, int], byte_budget: int) -> Page:
        """The ops ``theirs`` lacks, in origin-seq order, paged by ``byte_budget``."""
        check_count(byte_budget, "byte_budget", low=1)
        ops: list[bytes] = []
        ranges: dict[bytes, tuple[int, int]] = {}
        used = 0
        more = False
        with self._store.read() as cur:
            rows = cur.execute(
                f"SELECT oid, node, {_CONTIG} AS c FROM origins WHERE c > 0 ORDER BY node", (self._self_oid,)
            ).fetchall()
            wanted = vector.missing_ranges({bytes(r[1]): int(r[2]) for r in rows}, theirs)
            oids = {bytes(r[1]): int(r[0]) for r in rows}
            for origin, (lo, hi) in wanted.items():
                if more:
                    break
                last = lo - 1
                for seq, blob in cur.execute(
                    "SELECT seq, blob FROM ops WHERE oid = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                    (oids[origin], lo, hi),
                ):
                    if ops and used + len(blob) > byte_budget:
                        more = True
                        break
                    ops.append(bytes(blob))
                    used += len(blob)
                    last = seq
                if last >= lo:
                    ranges[origin] = (lo, last)
                if last < hi:
                    more = True
        return Page(ops, ranges, more)

    def apply(self, raws: Sequence[bytes]) -> ApplyResult:
        """Verify every op not held yet, then store them; all-or-nothing per call.

        An op already held (same origin and seq) is skipped before its signature is
        checked: an op's identity is (origin, seq), and signature checks are most of the
        cost when two peers send the same backlog at once. An op of a removed node above
        its cutoff is refused quietly (counted in ``refused``, never stored): see
        ``replica.membership``."""
        held = self._held(raws)
        decoded: list[Op] = []
        positions: list[int] = []
        for i, raw in enumerate(raws):
            if i in held:
                continue
            try:
                decoded.append(opsmod.decode(raw))
            except InvalidOp as exc:
                raise InvalidOp(exc.reason, index=i) from None
            positions.append(i)
        if not decoded:
            return ApplyResult(0, len(raws))
        new: list[int] = []
        new_index: list[int] = []
        new_oids: dict[bytes, int] = {}
        refused = 0
        fleet_ops = False
        with self._store.write() as cur:
            removed = fleetstore.removed(cur)
            touched: set[int] = set()
            arrived = store.arrival_time(cur, self._wall())
            for i, op in enumerate(decoded):
                if removed and membership.barred(removed, op.origin, op.seq, self.node_key):
                    refused += 1
                    continue
                oid = self._oids.get(op.origin) or new_oids.get(op.origin)
                if oid is None:
                    oid = new_oids[op.origin] = store.origin_id(cur, op.origin)
                lseq = store.store_op(cur, oid, op, arrived)
                if lseq is not None:
                    new.append(lseq)
                    new_index.append(positions[i])
                    touched.add(oid)
                    fleet_ops = fleet_ops or op.kind in membership.KINDS
            for oid in touched:
                _advance(cur, oid)
            if fleet_ops:  # ops of a node this batch removed may have come after its removal
                fleetstore.settle(cur)
            self._observe(cur, max(op.hlc for op in decoded))
        self._oids.update(new_oids)
        if fleet_ops:
            self.fleet_changes += 1
        if new:
            self._notify()
        return ApplyResult(len(new), len(raws) - len(new) - refused, new, new_index, refused)

    def _observe(self, cur: Any, seen: int) -> None:
        """Move this node's clock past ``seen`` (within the allowed drift)."""
        last = int(cur.execute("SELECT hlc FROM origins WHERE oid = ?", (self._self_oid,)).fetchone()[0])
        cur.execute("UPDATE origins SET hlc = ? WHERE oid = ?",
                    (hlcmod.observe(last, seen, self._wall(), self._max_drift_ms), self._self_oid))

    def _held(self, raws: Sequence[bytes]) -> set[int]:
        """Positions of ops this replica already holds, judged by (origin, seq) alone."""
        ids = [opsmod.peek(raw) for raw in raws]
        wanted: dict[bytes, list[int]] = {}
        for origin_seq in ids:
            if origin_seq is not None:
                wanted.setdefault(origin_seq[0], []).append(origin_seq[1])
        have: set[tuple[bytes, int]] = set()
        with self._store.read() as cur:
            for origin, seqs in wanted.items():
                row = cur.execute("SELECT oid FROM origins WHERE node = ?", (origin,)).fetchone()
                if row is None:
                    continue
                lo, hi = min(seqs), max(seqs)
                have.update((origin, int(r[0])) for r in cur.execute(
                    "SELECT seq FROM ops WHERE oid = ? AND seq BETWEEN ? AND ?", (row[0], lo, hi)))
        return {i for i, x in enumerate(ids) if x is not None and x in have}

    # -- local arrival order ------------------------------------------------------------

    def max_lseq(self) -> int:
        with self._store.read() as cur:
            return int(cur.execute(_NEWEST).fetchone()[0])

    def ops_after(self, lseq: int, limit: int = 1000) -> list[tuple[int, bytes]]:
        """Ops that landed here after local position ``lseq``, oldest first."""
        with self._store.read() as cur:
            rows = cur.execute("SELECT lseq, blob FROM ops WHERE lseq > ? ORDER BY lseq LIMIT ?", (lseq, limit))
            return [(int(r[0]), bytes(r[1])) for r in rows]

    def local_ops_after(self, lseq: int, limit: int = 1000) -> list[tuple[int, bytes]]:
        """This node's own ops (written by any process on this replica) after ``lseq``."""
        with self._store.read() as cur:
            rows = cur.execute(
                "SELECT lseq, blob FROM ops WHERE lseq > ? AND oid = ? ORDER BY lseq LIMIT ?",
                (lseq, self._self_oid, limit),
            )
            return [(int(r[0]), bytes(r[1])) for r in rows]

    # -- whole-state checks ---------------------------------------------------------------

    def clock(self) -> int:
        """The persisted HLC high-water mark."""
        with self._store.read() as cur:
            return int(cur.execute(LAST_OWN, (self._self_oid,)).fetchone()[1] or 0)

    def state_digest(self) -> str:
        """A hash of the replicated state (messages, retractions, LWW registers, first-seen times), not
        local order. A retracted message counts without its content, as every replica holds it."""
        h = hashlib.blake2b(digest_size=16)
        with self._store.read() as cur:
            for row in cur.execute(
                "SELECT id, sender, sender_inst, channel, to_inst, thread, content, hlc, retracted FROM messages"
                " ORDER BY id"
            ):
                h.update(pack(list(row)))
            for row in cur.execute("SELECT msg_id, by_key, hlc FROM retractions ORDER BY msg_id, by_key, hlc"):
                h.update(pack(list(row)))
            for row in cur.execute("SELECT tbl, k, f, v, hlc, origin FROM lww ORDER BY tbl, k, f"):
                h.update(pack(list(row)))
            for row in cur.execute("SELECT role, at FROM first_seen ORDER BY role"):
                h.update(pack(["first_seen", *row]))
        return h.hexdigest()

    def stats(self) -> dict[str, int]:
        with self._store.read() as cur:

            def one(sql: str) -> int:
                return int(cur.execute(sql).fetchone()[0])

            return {
                "ops": one("SELECT count(*) FROM ops"),
                "messages": one("SELECT count(*) FROM messages"),
                "receipts": one("SELECT count(*) FROM receipts"),
                "profiles": one("SELECT count(*) FROM profiles"),
                "origins": len(self.vector()),
                "max_lseq": one(_NEWEST),
            }

    def integrity_check(self) -> str:
        with self._store.read() as cur:
            return str(cur.execute("PRAGMA integrity_check").fetchone()[0])


def _advance(cur: Any, oid: int) -> None:
    """Move an origin's contiguous mark over every seq now held, and its top."""
    contig = int(cur.execute("SELECT contig FROM origins WHERE oid = ?", (oid,)).fetchone()[0])
    held = [r[0] for r in cur.execute("SELECT seq FROM ops WHERE oid = ? AND seq > ? ORDER BY seq", (oid, contig))]
    top = max(held, default=contig)
    cur.execute(
        "UPDATE origins SET contig = ?, top = max(top, ?) WHERE oid = ?",
        (vector.contiguous(contig, held), top, oid),
    )
