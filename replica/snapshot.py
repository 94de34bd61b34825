"""Snapshots, the replica's side: a member serves what it holds up to a fixed vector; a member far
behind takes it in, page by page, without checking every op's signature.

A snapshot's **point** is, per origin (by full key), the seqs from the taker's seq + 1 (``starts``)
up to the server's seq when the snapshot opened (``tops``). Ops never change, so a page read at any
later time holds the same ops (less the ones purged since, which its ranges cover as gone). Pages
follow the point's order: origin by origin, seq by seq; a **cursor** ``(i, seq)`` is the next seq
of origin ``i`` (``Point.norm`` moves it past origins with nothing left; None: the end).

Invariants:
* Serving reads each page in one read transaction (``snapshot_page``); a range whose scan ran to its
  end covers it whole (holes are purged ops), one the budget cut ends at the last op sent.
* Taking is all-or-nothing per page, in one write transaction that also moves the vector over the
  page's ranges and saves the cursor (``meta``), so a kill -9 loses or repeats nothing: a restart
  asks from the saved cursor, or opens a new snapshot from the vector it left.
* Only ``msg`` and ``set`` ops skip their signature check (``VOUCHED``: nearly every op of a fleet);
  every other kind (membership, retractions, kinds of newer releases) is verified on arrival as
  always. The page is vouched for by its signer, who must be an admitted, not removed member here
  (``signer_standing``) when each page is stored. Ops are stored byte for byte, so every peer that
  gets them from us verifies them as usual, and the lseqs they took are kept (``unverified``) for
  the background check (``replica.vouching``).
* Stored ops are exactly what ``Sync.apply`` would have stored (``replica.bulk``, and the one rule of
  how ops land, ``landing.Landing``): held ops are skipped, ops of removed nodes above their cutoff
  refused, ops purged here never brought back, ops past the retention horizon counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from replica import bulk, fleetstore
from replica import membership as mem
from replica import ops as opsmod
from replica.errors import InvalidOp
from replica.landing import GONE, REFUSED, STORE, Landing
from replica.models import ApplyResult
from replica.ops import KIND_MSG, KIND_SET, Op
from replica.sync import Sync, _advance, _cover, _stranded

VOUCHED = frozenset({KIND_MSG, KIND_SET})  # kinds a snapshot page stores on its signer's word
TAKING, CURSOR, UNVERIFIED = "snapshot_taking", "snapshot_cursor", "snapshot_unverified"

Cursor = tuple[int, int]


@dataclass(frozen=True)
class Point:
    """What a snapshot covers: for origin ``origins[i]`` (full keys, sorted), seqs ``starts[i]`` to
    ``tops[i]`` (nothing when start > top)."""

    origins: tuple[bytes, ...]
    starts: tuple[int, ...]
    tops: tuple[int, ...]

    @classmethod
    def between(cls, tops: Mapping[bytes, int], base: Mapping[bytes, int]) -> Point:
        """From ``base`` (held, full keys) up to ``tops``."""
        keys = tuple(sorted(tops))
        return cls(keys, tuple(base.get(k, 0) + 1 for k in keys), tuple(tops[k] for k in keys))

    def norm(self, cursor: Cursor) -> Cursor | None:
        """The cursor moved past every origin with nothing left from it on; None at the end."""
        i, seq = cursor
        while i < len(self.origins):
            if seq <= self.tops[i]:
                return i, max(seq, self.starts[i])
            i += 1
            seq = self.starts[i] if i < len(self.origins) else 0
        return None

    def first(self) -> Cursor | None:
        return self.norm((0, self.starts[0])) if self.origins else None

    @property
    def total(self) -> int:
        """Seqs the snapshot covers (held or purged)."""
        return sum(max(0, t - s + 1) for s, t in zip(self.starts, self.tops, strict=True))

    def to_json(self) -> dict[str, Any]:
        return {"origins": [k.hex() for k in self.origins], "starts": list(self.starts), "tops": list(self.tops)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Point:
        return cls(tuple(bytes.fromhex(k) for k in d["origins"]), tuple(d["starts"]), tuple(d["tops"]))


@dataclass(frozen=True)
class SnapPage:
    """One page: its ops, the range per origin it covers, and the next cursor (None: the last)."""

    ops: list[bytes]
    ranges: dict[bytes, tuple[int, int]]
    next: Cursor | None


@dataclass(frozen=True)
class Prepared:
    """A page's ops, decoded and checked against its ranges (``Snapshots.prepare_page``)."""

    ops: list[Op]
    covered: dict[bytes, tuple[int, int]]


@dataclass(frozen=True)
class Taking:
    """A snapshot this replica is taking: from whom, which one, what it covers, since when."""

    peer: str
    id: bytes
    signer: bytes
    point: Point
    started: float

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "id": self.id.hex(), "signer": self.signer.hex(),
                           "point": self.point.to_json()})

    @classmethod
    def from_json(cls, text: str) -> Taking:
        d = json.loads(text)
        return cls(str(d["peer"]), bytes.fromhex(d["id"]), bytes.fromhex(d["signer"]), Point.from_json(d["point"]),
                   float(d["started"]))


def _meta(cur: Any, key: str) -> Any:
    row = cur.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
    return None if row is None else row[0]


def _put_meta(cur: Any, key: str, value: Any) -> None:
    cur.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (key, value))


def unverified_ranges(cur: Any) -> list[list[Any]]:
    """``[signer hex, first lseq, last lseq]`` of ops stored on a signer's word, not checked yet."""
    raw = _meta(cur, UNVERIFIED)
    return [] if raw is None else list(json.loads(raw))


def put_unverified(cur: Any, ranges: Sequence[Sequence[Any]]) -> None:
    if ranges:
        _put_meta(cur, UNVERIFIED, json.dumps([list(r) for r in ranges]))
    else:
        cur.execute("DELETE FROM meta WHERE k = ?", (UNVERIFIED,))


def _vouched_for(cur: Any, signer: bytes, lo: int, hi: int) -> None:
    """Remember that lseqs lo..hi were stored on ``signer``'s word (one range per signer)."""
    ranges = unverified_ranges(cur)
    for r in ranges:
        if r[0] == signer.hex():
            r[1], r[2] = min(r[1], lo), max(r[2], hi)
            break
    else:
        ranges.append([signer.hex(), lo, hi])
    put_unverified(cur, ranges)


class Snapshots(Sync):
    # -- serving ------------------------------------------------------------------------------

    def snapshot_point(self, base: Mapping[bytes, int]) -> tuple[Point, list[bytes]]:
        """A point from ``base`` (the taker's vector, full keys) up to our vector now, and the
        membership ops a taker checks us against: every one held."""
        ours = self.vector()
        with self._store.read() as cur:
            fleet = fleetstore.blobs(cur)
        return Point.between(ours, base), fleet

    def snapshot_page(self, point: Point, cursor: Cursor, budget: int) -> SnapPage:
        """The page of ``point`` from ``cursor`` on: ops up to ``budget`` bytes (at least one)."""
        ops: list[bytes] = []
        ranges: dict[bytes, tuple[int, int]] = {}
        at: Cursor | None = point.norm(cursor)
        used = 0
        with self._store.read() as cur:
            while at is not None:
                i, lo = at
                origin, top = point.origins[i], point.tops[i]
                row = cur.execute("SELECT oid FROM origins WHERE node = ?", (origin,)).fetchone()
                end, cut = top, False
                if row is not None:
                    for seq, blob in cur.execute("SELECT seq, blob FROM ops WHERE oid = ? AND seq BETWEEN ? AND ?"
                                                 " AND length(blob) > 0 ORDER BY seq", (row[0], lo, top)):
                        if ops and used + len(blob) > budget:
                            end, cut = seq - 1, True
                            break
                        ops.append(bytes(blob))
                        used += len(blob)
                if end >= lo:
                    ranges[origin] = (lo, end)
                at = point.norm((i, end + 1))
                if cut:
                    break
        return SnapPage(ops, ranges, at)

    # -- taking -----------------------------------------------------------------------------

    def snapshot_taking(self) -> tuple[Taking, Cursor | None] | None:
        """The snapshot being taken (kept across restarts) and its next cursor, or None."""
        with self._store.read() as cur:
            raw, at = _meta(cur, TAKING), _meta(cur, CURSOR)
        if raw is None:
            return None
        cursor = json.loads(at) if at else None
        return Taking.from_json(str(raw)), None if cursor is None else (int(cursor[0]), int(cursor[1]))

    def signer_standing(self, signer: bytes, fleet_ops: Sequence[bytes] = ()) -> str | None:
        """None when ``signer`` is an admitted, not removed member, by what we hold and the membership
        ops ``fleet_ops`` (verified here, stored by nobody); else why not. InvalidOp for a bad op."""
        rekeys: list[mem.Rekey] = []
        admits: list[mem.Admit] = []
        for i, raw in enumerate(fleet_ops):
            try:
                op = opsmod.decode(raw)
            except InvalidOp as exc:
                raise InvalidOp(exc.reason, index=i) from None
            if op.kind == mem.KIND_ADMIT:
                admits.append(mem.Admit.from_body(op.origin, op.seq, op.hlc, op.body))
            elif op.kind == mem.KIND_REKEY:
                rekeys.append(mem.Rekey.from_body(op.origin, op.seq, op.hlc, op.body))
        with self._store.read() as cur:
            held_rekeys, held_admits = fleetstore.read_ops(cur)
            roots = fleetstore.roots(cur)
        st = mem.standing([*rekeys, *held_rekeys], [*admits, *held_admits], roots, self.node_key)
        return _refusal(st, signer, {a.node for a in (*admits, *held_admits)})

    def begin_snapshot(self, taking: Taking, cursor: Cursor | None, fleet_ops: Sequence[bytes]) -> None:
        """Start taking ``taking``: its membership ops are applied (verified op by op) and the
        snapshot is written down, replacing any other one being taken."""
        if fleet_ops:
            self.apply(fleet_ops)
        with self._store.write() as cur:
            _put_meta(cur, TAKING, taking.to_json())
            _put_meta(cur, CURSOR, json.dumps(cursor))

    def end_snapshot(self) -> None:
        """Stop taking the snapshot (done, or given up: ordinary rounds go on from the vector)."""
        with self._store.write() as cur:
            cur.execute("DELETE FROM meta WHERE k IN (?, ?)", (TAKING, CURSOR))

    def take_page(self, taking: Taking, raws: Sequence[bytes], covered: Mapping[bytes, tuple[int, int]],
                  cursor: Cursor | None) -> ApplyResult:
        """Store one page of ``taking`` and move to ``cursor`` (None: the snapshot is complete), all in
        one transaction: ``store_page(taking, prepare_page(raws, covered), cursor)``."""
        return self.store_page(taking, self.prepare_page(raws, covered), cursor)

    def prepare_page(self, raws: Sequence[bytes], covered: Mapping[bytes, tuple[int, int]]) -> Prepared:
        """A page's ops decoded and checked against its ranges (full keys, in the page's order), with no
        look at the replica (so it can run while the page before is stored). InvalidOp when an op is
        malformed, or lies outside those ranges or out of their order."""
        decoded = [_decode(raw, i, self.node_key) for i, raw in enumerate(raws)]
        now = self._wall()
        for i, op in enumerate(decoded):  # as ``Sync.apply``: a stamp past the drift refuses the page
            try:
                self._checked(op, now)
            except InvalidOp as exc:
                raise InvalidOp(exc.reason, index=i) from None
        _inside(decoded, covered)
        return Prepared(decoded, dict(covered))

    def store_page(self, taking: Taking, page: Prepared, cursor: Cursor | None) -> ApplyResult:
        """Store a prepared page of ``taking`` and move to ``cursor`` (None: the snapshot is complete),
        all in one transaction. InvalidOp, with nothing stored, when the signer is no longer a member
        here."""
        decoded, covered = page.ops, page.covered
        new_oids: dict[bytes, int] = {}
        with self._store.write() as cur:
            why = _standing(cur, taking.signer)
            if why is not None:
                raise InvalidOp(f"the snapshot's signer is not a member here: {why}")
            result, fleet_ops, vouched = self._store_page(cur, decoded, new_oids)
            if fleet_ops:
                fleetstore.settle(cur)
            _cover(cur, covered, self.node_key)
            if vouched:
                _vouched_for(cur, taking.signer, min(vouched), max(vouched))
            if decoded:
                self._observe(cur, max(op.hlc for op in decoded))
            if cursor is None:
                cur.execute("DELETE FROM meta WHERE k IN (?, ?)", (TAKING, CURSOR))
            else:
                _put_meta(cur, CURSOR, json.dumps(cursor))
        self._oids.update(new_oids)
        if fleet_ops:
            self.fleet_changes += 1
        if result.new:
            self._notify()
        return result

    def _store_page(self, cur: Any, decoded: Sequence[Op], new_oids: dict[bytes, int]
                    ) -> tuple[ApplyResult, bool, list[int]]:
        """Store the ops of a page not held yet: (the result, any membership op, lseqs stored on the
        signer's word)."""
        held = _held(cur, decoded)
        landing = Landing(self, cur, new_oids)
        batch: list[tuple[int, Op]] = []
        positions: list[int] = []
        gone: dict[int, list[int]] = {}
        expired: list[tuple[int, Op, int]] = []
        refused = 0
        for position, op in enumerate(decoded):
            if (op.origin, op.seq) in held:
                continue
            fate, oid = landing.fate(op)
            if fate == REFUSED:
                refused += 1
            elif fate == GONE:
                gone.setdefault(oid, []).append(op.seq)
                expired.append((oid, op, position))
            elif fate == STORE:
                held.add((op.origin, op.seq))  # a page naming an op twice stores it once
                batch.append((oid, op))
                positions.append(position)
        arrived = landing.arrived
        lseqs = bulk.store_batch(cur, batch, arrived)
        late: list[tuple[int, Op]] = []  # gone above a hole: stored, as ``Sync`` does (purged once it fills)
        stranded = {oid: _stranded(cur, oid, gone[oid]) for oid in {oid for oid, _op, _p in expired}}
        for oid, op, position in expired:
            if op.seq in stranded[oid] and (op.origin, op.seq) not in held:
                held.add((op.origin, op.seq))
                gone[oid].remove(op.seq)
                late.append((oid, op))
                positions.append(position)
        lseqs += bulk.store_batch(cur, late, arrived)
        batch += late
        for oid in {oid for oid, _op in batch} | set(gone):
            _advance(cur, oid, gone.get(oid, ()))
        vouched = [lseq for lseq, (_oid, op) in zip(lseqs, batch, strict=True) if op.kind in VOUCHED]
        fleet_ops = any(op.kind in mem.KINDS for _oid, op in batch)
        result = ApplyResult(len(lseqs), len(decoded) - len(lseqs) - refused, lseqs, positions, refused)
        return result, fleet_ops, vouched


def _decode(raw: object, index: int, me: bytes) -> Op:
    """An op of a page: its signature checked unless its kind is one a page vouches for (and it is
    not one of our own, which only we write)."""
    if not isinstance(raw, bytes):
        raise InvalidOp("op is not bytes", index=index)
    try:
        op = opsmod.decode(raw, verify=False)
        return op if op.kind in VOUCHED and op.origin != me else opsmod.decode(raw)
    except InvalidOp as exc:
        raise InvalidOp(exc.reason, index=index) from None


def _inside(decoded: Sequence[Op], covered: Mapping[bytes, tuple[int, int]]) -> None:
    """Every op lies inside its origin's range of the page, in the ranges' order, seqs increasing."""
    order = {origin: n for n, origin in enumerate(covered)}
    last = (-1, 0)
    for k, op in enumerate(decoded):
        n = order.get(op.origin)
        if n is None or not covered[op.origin][0] <= op.seq <= covered[op.origin][1]:
            raise InvalidOp("it lies outside the ranges its page claims", index=k)
        if (n, op.seq) <= last:
            raise InvalidOp("it is out of order in its page", index=k)
        last = (n, op.seq)


def _held(cur: Any, decoded: Sequence[Op]) -> set[tuple[bytes, int]]:
    """The (origin, seq) of ``decoded`` this replica holds: one range look per origin."""
    seqs: dict[bytes, list[int]] = {}
    for op in decoded:
        seqs.setdefault(op.origin, []).append(op.seq)
    have: set[tuple[bytes, int]] = set()
    for origin, wanted in seqs.items():
        row = cur.execute("SELECT oid FROM origins WHERE node = ?", (origin,)).fetchone()
        if row is not None:
            have.update((origin, int(r[0])) for r in cur.execute(
                "SELECT seq FROM ops WHERE oid = ? AND seq BETWEEN ? AND ?", (row[0], min(wanted), max(wanted))))
    return have


def _refusal(st: mem.Standing, signer: bytes, named: set[bytes]) -> str | None:
    """Why ``signer`` may not vouch for a page (removed, never admitted), or None."""
    if signer in st.removed:
        return f"node {signer.hex()[:16]} was removed from the fleet"
    if not st.counts(signer) or (not st.closed and signer not in named):
        return f"node {signer.hex()[:16]} was never admitted to the fleet"
    return None


def _standing(cur: Any, signer: bytes) -> str | None:
    """Why ``signer`` may not vouch for a page here (removed, never admitted), or None."""
    if cur.execute("SELECT 1 FROM fleet_removed WHERE node = ?", (signer,)).fetchone():
        return f"node {signer.hex()[:16]} was removed from the fleet"
    let_in = (fleetstore.admitted(cur, signer) if fleetstore.closed(cur)
              else cur.execute("SELECT 1 FROM fleet_admits WHERE node = ?", (signer,)).fetchone() is not None)
    if not let_in:
        return f"node {signer.hex()[:16]} was never admitted to the fleet"
    return None


