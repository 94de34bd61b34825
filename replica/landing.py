"""What becomes of each op of a batch as it lands: the one rule of ``Sync.apply`` and of snapshot
pages (``replica.snapshot``), inside the write transaction that stores them.

Invariants:
* Membership ops are always stored: the rules decide on all of them (``replica.membership``), so
  no replica may drop one for what it happens to know when it arrives.
* Any other op of a node never let in, or of a removed node above its cutoff, is refused (never
  stored, its origin's vector not moved past it): it comes again with a later round if the set of
  membership ops changes its fate.
* Who counts is read from ``fleet_removed`` and ``fleet_members`` (``replica.fleetstore``) once per
  standing: again after the batch's own membership ops were settled (``settle``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from replica import firstseen, fleetstore, membership, purge, retention, store
from replica.ops import Op


class Lander(Protocol):
    """What a batch lands on: the replica's own key and origin row, the origin rows it knows, its clock."""

    @property
    def node_key(self) -> bytes: ...

    _oids: dict[bytes, int]
    _self_oid: int
    _wall: Callable[[], int]

REFUSED, PURGED_HERE, GONE, STORE = "refused", "purged here", "gone", "store"


class Landing:
    """What becomes of each op of a batch as it lands, in one write transaction (the one rule of
    ``Sync.apply`` and of snapshot pages, ``replica.snapshot``): ``REFUSED`` (a removed node's op above
    its cutoff: never stored), ``PURGED_HERE`` (at or below its origin's mark yet not held: purged
    here, and sync never brings it back), ``GONE`` (purgeable on arrival: counted in its origin's
    vector, its first-seen sightings kept, never stored) or ``STORE`` (an op in the name of a role
    pinned to other nodes too: stored and held back by its projection, ``project.hold_if_refused``, so
    a later pin op can release it). Origins new to the replica get a row, named in ``new_oids``."""

    def __init__(self, rep: Lander, cur: Any, new_oids: dict[bytes, int]) -> None:
        self.rep, self.cur, self.new_oids = rep, cur, new_oids
        self.now = rep._wall()
        self.arrived = store.arrival_time(cur, self.now)
        kept = purge.setting(cur)
        self.horizon = 0 if kept is None else kept.horizon_ms
        self.contig: dict[int, int] = {}
        self.fleet_ops = False  # a membership op was stored since the standing was last read
        self.judge_again()

    def settle(self) -> None:
        """Settle the membership ops stored so far (``fleetstore.settle``) and judge by what it made."""
        fleetstore.settle(self.cur)
        self.fleet_ops = False
        self.judge_again()

    def judge_again(self) -> None:
        """Read who counts (``fleet_removed``, ``fleet_members``)."""
        self.removed = fleetstore.removed(self.cur)
        self.closed = fleetstore.closed(self.cur)
        self.counts: dict[bytes, bool] = {}
        self.contig.clear()  # a settle may have held an origin's mark back

    def barred(self, op: Op) -> bool:
        """An op this replica refuses (``membership.barred``): its origin was never let in, or is
        removed and the op lies above its cutoff. Membership ops are never barred: they are kept."""
        origin = op.origin
        if op.kind in membership.KINDS or origin == self.rep.node_key:
            return False
        if self.closed:
            if origin not in self.counts:
                self.counts[origin] = fleetstore.admitted(self.cur, origin)
            if not self.counts[origin]:
                return True
        return origin in self.removed and op.seq > self.removed[origin]

    def fate(self, op: Op) -> tuple[str, int]:
        """What becomes of ``op``, and its origin's row id (0 when refused)."""
        rep, cur = self.rep, self.cur
        if self.barred(op):
            return REFUSED, 0
        oid = rep._oids.get(op.origin) or self.new_oids.get(op.origin)
        if oid is None:  # remembered once the transaction commits (a rollback forgets the row)
            oid = self.new_oids[op.origin] = store.origin_id(cur, op.origin)
        if oid not in self.contig:
            self.contig[oid] = int(cur.execute("SELECT contig FROM origins WHERE oid = ?", (oid,)).fetchone()[0])
        if op.seq <= self.contig[oid] and oid != rep._self_oid:  # not held, yet counted: purged here
            if op.kind not in membership.KINDS:
                return PURGED_HERE, oid
        elif retention.purgeable_on_arrival(op, self.horizon, self.now):  # every replica purges it: never stored
            firstseen.record_all(cur, firstseen.sightings(op))  # what it showed stays, as on a replica that held it
            return GONE, oid
        if op.kind in membership.KINDS:
            self.fleet_ops = True
        return STORE, oid  # one in a pinned role's name is stored, held back (``project.hold_if_refused``)
