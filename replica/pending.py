"""Mail for pushes and hooks: what a reader has not read, and recording that it was delivered.

Invariants:
* ``mail`` reads ``mailbox.mail`` in one snapshot; it never writes, so a resource
  read or a peek does not change receipts.
* ``record_delivered`` writes *delivered* (never *read*) for receipts that still
  have none, in as few ops as the size cap allows; a receipt delivered meanwhile
  (another session, a peer) is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replica import mailbox
from replica.checks import MAX_LIMIT, check_count, check_limit, check_name, required_name
from replica.core import ReplicaCore
from replica.mailbox import Mail


class PendingMail(ReplicaCore):
    def mail(self, role: str, instance: str | None = None, *, after: int = 0, limit: int = 50,
             pending_only: bool = True, threads: bool = True) -> list[Mail]:
        """The first ``limit`` messages of (role, instance)'s mail after arrival position ``after``
        (see ``replica.mailbox``); ``pending_only``: only what was never delivered. Reads only."""
        r = required_name(role, "role")
        inst = check_name(instance, "instance", optional=True)
        after = check_count(after, "after")
        limit = check_limit(limit)
        first, _ = self._first_seen(r, self._wall())
        with self._store.read() as cur:
            return mailbox.mail(cur, r, inst, floor=self._broadcast_floor(first), after=after, limit=limit,
                                pending_only=pending_only, threads=threads)

    def record_delivered(self, items: Sequence[Mail]) -> int:
        """Record *delivered* now for each of ``items`` not delivered yet; returns how many."""
        keys = mailbox.undelivered_keys(items)[:MAX_LIMIT]
        if not keys:
            return 0
        with self._store.read() as cur:
            delivered = mailbox.delivered_among(cur, keys)
        now = self._wall()
        writes: list[list[Any]] = [["rcpt", list(k), "d", now] for k in keys if k not in delivered]
        if writes:
            self._set(writes)
        return len(writes)
