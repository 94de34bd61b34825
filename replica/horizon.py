"""Retention, the replica's side: set the fleet's horizon, read it, and purge what is past it.

Invariants:
* Setting the horizon writes one signed ``ret`` op (last writer wins across the fleet); a node
  that was removed from the fleet cannot write one (its peers would refuse it anyway).
* A purge is a ``Sweep`` advanced by ``purge_step``: each step is one short write transaction
  (``PURGE_STEP`` rows at most), so agents' writes interleave with a long purge; then
  ``reclaim_step`` merges the search index when due and gives freed pages back, each step about
  ``RECLAIM_PAGES`` pages of work, and ``finish_purge``
  checkpoints and records the pass. ``purge`` runs all of it in one call.
* Every pass judges by one clock reading (the sweep's ``now_ms``) and the horizon read when it began.
* The rules live in ``replica.retention``, the SQL in ``replica.purge``.
"""

from __future__ import annotations

import sqlite3

from replica import purge
from replica import retention as ret
from replica.checks import check_count
from replica.core import const_body
from replica.errors import InvalidArgument, StoreError
from replica.fleet import Fleet

PURGE_STEP = 500  # rows looked at per write transaction
RECLAIM_PAGES = 2048  # pages (8 MiB of 4 KiB pages) given back per transaction


class Retention(Fleet):
    def set_retention(self, horizon_ms: int) -> ret.RetentionState:
        """Set the fleet's horizon (ms; 0 keeps everything) with one signed op."""
        h = check_count(horizon_ms, "horizon_ms", high=ret.MAX_HORIZON_MS)
        if self.node_key in self.removed():
            raise InvalidArgument("this node was removed from the fleet: members refuse its ops, so it cannot "
                                  "set the fleet's retention horizon")
        self._write(ret.KIND_RET, const_body(ret.ret_body(h)))
        return self.retention()

    def retention(self) -> ret.RetentionState:
        with self._store.read() as cur:
            return purge.state(cur)

    def horizon_ms(self) -> int:
        """The horizon in force here, ms (0: keep everything)."""
        with self._store.read() as cur:
            s = purge.setting(cur)
        return 0 if s is None else s.horizon_ms

    def messages_older_than(self, age_ms: int) -> int:
        """How many messages held here are older than ``age_ms`` now (what a horizon would take)."""
        with self._store.read() as cur:
            return purge.older_than(cur, self._wall() - check_count(age_ms, "age_ms"))

    def next_expiry(self, now_ms: int | None = None) -> int | None:
        """The wall time (ms) at which a purge can next remove something, barring new ops."""
        now = self._wall() if now_ms is None else now_ms
        with self._store.read() as cur:
            s = purge.setting(cur)
            if s is None or s.horizon_ms == 0:
                return None
            return ret.next_expiry(s.horizon_ms, *purge.first_young(cur, s.horizon_ms, now))

    # -- purging --------------------------------------------------------------------------------

    def start_purge(self, now_ms: int | None = None) -> ret.Sweep:
        """A pass judged at ``now_ms`` (default: now) against the horizon in force now."""
        with self._store.read() as cur:
            s, seen = purge.setting(cur), purge.late_mark(cur)
        now = self._wall() if now_ms is None else now_ms
        return ret.Sweep(now, 0 if s is None else s.horizon_ms, None if s is None else s.stamp, after=(-1, seen))

    def purge_step(self, sweep: ret.Sweep, limit: int = PURGE_STEP) -> ret.Sweep:
        """One short transaction of ``sweep``; the sweep as it stands after it."""
        if sweep.done:
            return sweep
        with self._store.write() as cur:
            top = purge.begin_step(cur, self._self_oid)
            return purge.step(cur, sweep, top, check_count(limit, "limit", low=1))

    def reclaim_step(self, pages: int = RECLAIM_PAGES) -> bool:
        """One short step of giving space back: merging the search index once much of it is deleted
        data, then up to ``pages`` free pages back to the disk; whether there is more to do."""
        pages = check_count(pages, "pages", low=1)
        with self._store.write() as cur:
            if purge.search_to_merge(cur):
                purge.merge_search(cur, pages)
                return True
        with self._store.raw() as conn:
            try:
                return purge.reclaim(conn, pages) > 0
            except sqlite3.Error as exc:
                raise StoreError(f"cannot reclaim space in {self.path}: {exc}") from None

    def finish_purge(self, sweep: ret.Sweep, started_ms: int, bytes_before: int) -> ret.PurgeReport:
        """Checkpoint, measure and record a finished pass."""
        with self._store.raw() as conn:
            try:
                purge.checkpoint(conn)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot checkpoint {self.path}: {exc}") from None
        report = ret.PurgeReport(sweep.now_ms, max(0, self._wall() - started_ms), sweep.removed, bytes_before,
                                 self.database_bytes())
        with self._store.write() as cur:
            purge.record(cur, report)
        return report

    def purge(self, now_ms: int | None = None) -> ret.PurgeReport:
        """A whole pass in this thread: every step, reclaiming, recording."""
        started, before = self._wall(), self.database_bytes()
        sweep = self.start_purge(now_ms)
        while not sweep.done:
            sweep = self.purge_step(sweep)
        while sweep.removed.ops and self.reclaim_step():
            pass
        return self.finish_purge(sweep, started, before)

    def database_bytes(self) -> int:
        """The size of this replica's database: its file's on disk once the WAL is checkpointed."""
        with self._store.read() as cur:
            return purge.database_bytes(cur)
