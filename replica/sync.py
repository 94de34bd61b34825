"""The sync surface: version vectors, the ops a peer lacks, applying a peer's
ops, local arrival order, and whole-state checks.

Invariants:
* ``vector()`` only counts seqs held contiguously from 1, or known to be gone
  (purged by retention: ``vector.contiguous``, ``vector.covered_to``), so
  ``ops_missing`` only offers ops the receiver can place with no hole, and a
  page's stated range tells the receiver which seqs are gone.
* ``apply`` is all-or-nothing per call: every op not held yet is verified
  before any is stored; ops already held are skipped by (origin, seq) before
  their signature is checked. An op of a newer release (``Op.understood``
  False) is stored and counted like any other.
* A peer of the first release (wire 2) refuses a whole batch for one op it does
  not know, so the modes ``V1_RUN`` and ``V1_ALL`` of ``ops_missing`` never
  offer it one (``Op.v1``).
* Applying moves this node's clock past what it saw, capped by the allowed
  drift, so a peer's clock far ahead cannot drag ours with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from replica import fleetstore, membership, pinstore, project, vector
from replica import hlc as hlcmod
from replica import ops as opsmod
from replica.checks import check_count
from replica.codec import pack, unpack
from replica.core import LAST_OWN, ReplicaCore
from replica.errors import InvalidOp
from replica.landing import GONE, REFUSED, STORE, Landing
from replica.models import ApplyResult, Page
from replica.ops import Op

# An origin's contiguous mark; this node's own row is always contiguous up to its newest op.
_CONTIG = (
    "CASE WHEN oid = ?1 THEN max(contig, (SELECT coalesce(max(seq), 0) FROM ops WHERE ops.oid = ?1)) ELSE contig END"
)
_NEWEST = "SELECT coalesce(max(lseq), 0) FROM ops"

# What a receiver takes (``ops_missing``): every op (a peer of this release or newer, wire >= 3), or
# only what a peer of the first release takes (wire 2: it refuses any op it does not know).
ALL, V1_RUN, V1_ALL = "all", "v1-run", "v1-all"
MODES = (ALL, V1_RUN, V1_ALL)


OWN_AHEAD_META = "own_history_ahead"  # the first op of ours a peer brought that we never held (peerd.forks)


def _note_own_ahead(cur: Any, seq: int, self_oid: int) -> None:
    """Remember (once, in the replica) that a peer held an op of ours we did not: our own newest seq
    before it, and its seq. Only a copy of a home put back (or one node key in two homes) does that."""
    if cur.execute("SELECT 1 FROM meta WHERE k = ?", (OWN_AHEAD_META,)).fetchone():
        return
    ours = cur.execute("SELECT coalesce(max(seq), 0) FROM ops WHERE oid = ? AND seq < ?", (self_oid, seq)).fetchone()[0]
    cur.execute("INSERT INTO meta(k, v) VALUES (?, ?)", (OWN_AHEAD_META, pack([seq, int(ours)])))


class Sync(ReplicaCore):
    fleet_changes = 0  # membership ops (admit, rekey) applied or written by this object: a cheap "look again"
    own_arrivals = 0  # ops of our own origin a peer brought that we never held (``own_history_ahead``)

    def vector(self) -> dict[bytes, int]:
        """Origin key -> highest seq held contiguously."""
        with self._store.read() as cur:
            rows = cur.execute(f"SELECT node, {_CONTIG} AS c FROM origins WHERE c > 0", (self._self_oid,))
            return {bytes(r[0]): int(r[1]) for r in rows}

    def ops_missing(self, theirs: Mapping[bytes, int], byte_budget: int, mode: str = ALL) -> Page:
        """The ops ``theirs`` lacks, in origin-seq order, paged by ``byte_budget``.

        ``mode`` says what the receiver takes (module docstring): ``ALL`` every op; ``V1_RUN`` (a
        first-release peer asking) only ops it takes, from its seq on up to the first it would refuse
        or that is gone; ``V1_ALL`` (our push to such a peer) every op it takes, past such gaps. A
        range whose scan ended covers it whole, holes of purged ops included; one the budget cut
        ends at the last op sent, and the page says ``more``."""
        check_count(byte_budget, "byte_budget", low=1)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        ops: list[bytes] = []
        ranges: dict[bytes, tuple[int, int]] = {}
        with self._store.read() as cur:
            rows = cur.execute(
                f"SELECT oid, node, {_CONTIG} AS c FROM origins WHERE c > 0 ORDER BY node", (self._self_oid,)
            ).fetchall()
            wanted = vector.missing_ranges({bytes(r[1]): int(r[2]) for r in rows}, theirs)
            oids = {bytes(r[1]): int(r[0]) for r in rows}
            for origin, (lo, hi) in wanted.items():
                scan = _Scan(lo, mode, byte_budget, ops)
                scan.run(cur, oids[origin], hi)
                if scan.end >= lo:
                    ranges[origin] = (lo, scan.end)
                if scan.cut:
                    return Page(ops, ranges, True)
        return Page(ops, ranges, False)

    def apply(self, raws: Sequence[bytes], covered: Mapping[bytes, tuple[int, int]] | None = None) -> ApplyResult:
        """Verify every op not held yet, then store them; all-or-nothing per call.

        An op already held (same origin and seq) is skipped before its signature is
        checked: an op's identity is (origin, seq), and signature checks are most of the
        cost when two peers send the same backlog at once. An op of a removed node above
        its cutoff is refused quietly (counted in ``refused``, never stored): see
        ``replica.membership``. ``covered``: origin -> (lo, hi) that the sender's page covers
        (every op it holds in the range is in ``raws``; the rest was purged): an origin held
        up to at least lo - 1 is then held (or purged) up to hi. An op that arrives already
        purgeable (``retention.purgeable_on_arrival``) is counted, not stored (unless it lands above a
        hole in its origin's seqs: then it is stored, and purged once the hole fills); one at or below its
        origin's mark that is not held was purged here, and is skipped like a duplicate (sync never
        brings back what was purged)."""
        decoded, positions = self._decode_new(raws)
        if not decoded and not covered:
            return ApplyResult(0, len(raws))
        new_oids: dict[bytes, int] = {}
        with self._store.write() as cur:
            new, new_index, refused, fleet_ops = self._store_all(cur, decoded, positions, new_oids)
            if covered:
                _cover(cur, covered, self.node_key)
            if decoded:
                self._observe(cur, max(op.hlc for op in decoded))
        self._oids.update(new_oids)
        if fleet_ops:
            self.fleet_changes += 1
        if new:
            self._notify()
        return ApplyResult(len(new), len(raws) - len(new) - refused, new, new_index, refused)

    def _decode_new(self, raws: Sequence[bytes]) -> tuple[list[Op], list[int]]:
        """The ops of ``raws`` not held yet, verified, with their positions in ``raws``."""
        held = self._held(raws)
        decoded: list[Op] = []
        positions: list[int] = []
        now = self._wall()
        for i, raw in enumerate(raws):
            if i in held:
                continue
            try:
                decoded.append(self._checked(opsmod.decode(raw), now))
            except InvalidOp as exc:
                raise InvalidOp(exc.reason, index=i) from None
            positions.append(i)
        return decoded, positions

    def _checked(self, op: Op, now: int) -> Op:
        """``op``, unless it is a peer's op stamped beyond the allowed drift (``hlc.too_far_ahead``):
        then InvalidOp, and nothing of its batch is stored (our own clock is the reference)."""
        why = None if op.origin == self.node_key else hlcmod.too_far_ahead(op.hlc, now, self._max_drift_ms)
        if why is not None:
            raise InvalidOp(why)
        return op

    def _store_all(self, cur: Any, decoded: Sequence[Op], positions: Sequence[int],
                   new_oids: dict[bytes, int]) -> tuple[list[int], list[int], int, bool]:
        """Store verified ops in one transaction: (new lseqs, their input positions, refused, any
        membership op among them); origins new to this replica go to ``new_oids``. Membership ops
        land first (they are kept whatever their fate), so what the batch's other ops may do is judged
        on the standing the whole batch makes, not on the order of its ops."""
        new: list[int] = []
        new_index: list[int] = []
        refused = 0
        touched: dict[int, list[int]] = {}
        gone_ops: dict[int, list[tuple[Op, int]]] = {}
        order = sorted(range(len(decoded)), key=lambda i: decoded[i].kind not in membership.KINDS)
        fleet_ops = bool(order) and decoded[order[0]].kind in membership.KINDS
        landing = Landing(self, cur, new_oids)
        arrived = landing.arrived

        def store(op: Op, oid: int, position: int) -> None:
            lseq = project.store_op(cur, oid, op, arrived)
            if lseq is not None:
                new.append(lseq)
                new_index.append(position)
                touched.setdefault(oid, [])
                if oid == self._self_oid:  # an op of ours we never held: this replica is an older copy
                    _note_own_ahead(cur, op.seq, self._self_oid)
                    self.own_arrivals += 1

        for i in order:
            op, position = decoded[i], positions[i]
            if landing.fleet_ops and op.kind not in membership.KINDS:
                landing.settle()  # the membership ops stored so far may change who counts
            fate, oid = landing.fate(op)
            if fate == REFUSED:
                refused += 1
            elif fate == GONE:
                touched.setdefault(oid, []).append(op.seq)
                gone_ops.setdefault(oid, []).append((op, position))
            elif fate == STORE:
                store(op, oid, position)
        for oid, waiting in gone_ops.items():
            # Gone above a hole: stored instead (``vector.stranded``); the first pass after the
            # hole fills purges it, as on a replica that held it before it expired.
            late = _stranded(cur, oid, touched[oid])
            for op, position in waiting:
                if op.seq in late:
                    touched[oid].remove(op.seq)
                    store(op, oid, position)
        for oid, gone in touched.items():
            _advance(cur, oid, gone)
        if landing.fleet_ops:
            landing.settle()
        return new, new_index, refused, fleet_ops

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
            rows = cur.execute("SELECT lseq, blob FROM ops WHERE lseq > ? AND length(blob) > 0 ORDER BY lseq LIMIT ?",
                               (lseq, limit))
            return [(int(r[0]), bytes(r[1])) for r in rows]

    def local_ops_after(self, lseq: int, limit: int = 1000) -> list[tuple[int, bytes]]:
        """This node's own ops (written by any process on this replica) after ``lseq``."""
        with self._store.read() as cur:
            rows = cur.execute(
                "SELECT lseq, blob FROM ops WHERE lseq > ? AND oid = ? AND length(blob) > 0 ORDER BY lseq LIMIT ?",
                (lseq, self._self_oid, limit),
            )
            return [(int(r[0]), bytes(r[1])) for r in rows]

    # -- whole-state checks ---------------------------------------------------------------

    def clock(self) -> int:
        """The persisted HLC high-water mark."""
        with self._store.read() as cur:
            return int(cur.execute(LAST_OWN, (self._self_oid,)).fetchone()[1] or 0)

    def state_digest(self) -> str:
        """A hash of the replicated state (messages, retractions, LWW registers, first-seen times, role
        pins), not local order. A retracted message counts by its retraction alone: its op is gone, so a
        replica that never held it holds the same state."""
        h = hashlib.blake2b(digest_size=16)
        with self._store.read() as cur:
            for row in cur.execute(
                "SELECT id, sender, sender_inst, channel, to_inst, thread, content, hlc, retracted FROM messages"
                " WHERE retracted IS NULL ORDER BY id"
            ):
                h.update(pack(list(row)))
            for row in cur.execute("SELECT msg_id, by_key, hlc FROM retractions ORDER BY msg_id, by_key, hlc"):
                h.update(pack(list(row)))
            for row in cur.execute("SELECT tbl, k, f, v, hlc, origin FROM lww ORDER BY tbl, k, f"):
                h.update(pack(list(row)))
            # each known role's time, as every release hashes it (a forget shows in it; whether a role is
            # confirmed follows from its messages and profiles, hashed above)
            for row in cur.execute("SELECT role, at FROM first_seen WHERE at IS NOT NULL ORDER BY role"):
                h.update(pack(["first_seen", *row]))
            for row in cur.execute("SELECT rkey, hlc, origin, role, nodes FROM role_pins ORDER BY rkey, hlc, origin"):
                h.update(pack(["pin", *row]))
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
                "newer_ops": one("SELECT count(*) FROM ops WHERE newer IS NOT NULL"),
                "pin_refused": pinstore.refused(cur),
            }

    def own_history_ahead(self) -> tuple[int, int] | None:
        """(their seq, our newest seq before it) of the first op of ours a peer brought that this
        replica never held, or None: the sign of a home that is an older copy of itself."""
        with self._store.read() as cur:
            row = cur.execute("SELECT v FROM meta WHERE k = ?", (OWN_AHEAD_META,)).fetchone()
        if row is None:
            return None
        theirs, ours = unpack(bytes(row[0]))
        return int(theirs), int(ours)

    def newer_ops(self) -> dict[str, int]:
        """Ops held that this release does not fully understand (written by a newer release), by
        kind: stored, counted and relayed; an upgrade applies what they hold."""
        out: dict[str, int] = {}
        with self._store.read() as cur:
            for (blob,) in cur.execute("SELECT blob FROM ops WHERE newer IS NOT NULL AND length(blob) > 0"):
                kind = opsmod.read_stored(bytes(blob)).kind
                out[kind] = out.get(kind, 0) + 1
        return out

    def integrity_check(self) -> str:
        with self._store.read() as cur:
            return str(cur.execute("PRAGMA integrity_check").fetchone()[0])


class _Scan:
    """One origin's part of a page (``Sync.ops_missing``): the ops from ``lo`` on that fit the budget
    and that the receiver takes; ``end`` the last seq covered, ``cut`` whether the budget stopped it."""

    def __init__(self, lo: int, mode: str, budget: int, ops: list[bytes]) -> None:
        self.lo, self.mode, self.budget, self.ops = lo, mode, budget, ops
        self.used = sum(len(o) for o in ops)
        self.end = lo - 1
        self.cut = False

    def run(self, cur: Any, oid: int, hi: int) -> None:
        only_v1 = " AND v1 = 1" if self.mode == V1_ALL else ""
        last = self.lo - 1
        for seq, blob, v1 in cur.execute(
            f"SELECT seq, blob, v1 FROM ops WHERE oid = ? AND seq BETWEEN ? AND ? AND length(blob) > 0{only_v1}"
            " ORDER BY seq",  # a retracted message's op is gone, as a purged one (``project.settle_retraction``)
            (oid, self.lo, hi),
        ):
            if self.mode == V1_RUN and (seq != last + 1 or not v1):
                break  # the run ends at a gap: a first-release receiver cannot place what follows
            if self.ops and self.used + len(blob) > self.budget:
                self.cut = True
                break
            self.ops.append(bytes(blob))
            self.used += len(blob)
            last = seq
        # A scan that ran to hi covers the range whole (seqs missing here were purged); a run, or a
        # scan the budget cut, covers up to the last op sent.
        self.end = last if self.cut or self.mode == V1_RUN else hi


def _above_mark(cur: Any, oid: int, gone: Sequence[int]) -> tuple[int, list[int]]:
    """An origin's contiguous mark, and the seqs above it held or ``gone`` (arrived purged)."""
    contig = int(cur.execute("SELECT contig FROM origins WHERE oid = ?", (oid,)).fetchone()[0])
    held = [r[0] for r in cur.execute("SELECT seq FROM ops WHERE oid = ? AND seq > ? ORDER BY seq", (oid, contig))]
    return contig, held + [s for s in gone if s > contig]


def _stranded(cur: Any, oid: int, gone: Sequence[int]) -> set[int]:
    """The seqs of ``gone`` (arrived purgeable) that ``_advance`` would not reach: to be stored
    (``vector.stranded``). Shared by op batches (``Sync``) and snapshot pages."""
    contig, above = _above_mark(cur, oid, ())
    return vector.stranded(contig, above, gone)


def _advance(cur: Any, oid: int, gone: Sequence[int] = ()) -> None:
    """Move an origin's contiguous mark over every seq now held (or ``gone``: arrived purged), and
    its top."""
    contig, held = _above_mark(cur, oid, gone)
    top = max(held, default=contig)
    cur.execute(
        "UPDATE origins SET contig = ?, top = max(top, ?) WHERE oid = ?",
        (vector.contiguous(contig, held), top, oid),
    )


def _cover(cur: Any, covered: Mapping[bytes, tuple[int, int]], me: bytes) -> None:
    """Take a page's covered ranges: an origin held up to lo - 1 or more is held or purged up to hi
    (never past a removed node's cutoff; never for a node nobody let in, whose ops were refused, not
    purged; never our own origin, whose ops only we write)."""
    removed = fleetstore.removed(cur)
    closed = fleetstore.closed(cur)
    for origin, (lo, hi) in covered.items():
        if origin == me or (closed and not fleetstore.admitted(cur, origin)):
            continue
        row = cur.execute("SELECT oid, contig FROM origins WHERE node = ?", (origin,)).fetchone()
        if row is None or int(row[1]) + 1 < lo:
            continue
        top = vector.covered_to(int(row[1]), lo, min(hi, removed.get(origin, hi)))
        if top > int(row[1]):
            cur.execute("UPDATE origins SET contig = ?, top = max(top, ?) WHERE oid = ?", (top, top, row[0]))
            _advance(cur, int(row[0]))
