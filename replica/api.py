"""The Python API over one replica: ``Replica``, one facade composed of its areas.

Each area is a module of its own, built on ``core.ReplicaCore`` (store,
identity, the write path): ``messaging`` (send, inbox, receipts, the log),
``search`` (full text, recent senders), ``profiles`` (profiles and agents),
``threads``, ``pending`` (mail not yet delivered, for pushes and hooks),
``sync`` (vectors, pages of ops, apply, state checks), ``snapshot`` and
``vouching`` (serving and taking snapshots, checking afterwards what they let
through), ``fleet`` (membership: admitting, removing, rotating the fleet key), and ``horizon``
(retention: the fleet's horizon, purging what is past it), ``pinning`` (role pins and who sent
in each role's name), ``leasing`` (leases on paths), ``acks`` (acknowledgements) and ``roles`` (which
roles are known, confirmed or not, and forgetting one seen only reading). The
argument checks they share are pure functions in ``checks``.

Invariants (of every method, whichever area holds it):
* Every change is one signed op written in one transaction together with its
  projections; a call that raises has written nothing.
* Arguments are checked before anything is written; bad calls raise
  ``InvalidArgument`` or ``NotFound``, never a sqlite error.
* Cursors (``seq``, ``since``, ``after_seq``) are positions in this replica's
  local arrival order, so a message that arrives late is never skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from replica import identity as idmod
from replica import routing
from replica.acks import Acks
from replica.checks import DEFAULT_LIMIT, MAX_LIMIT, check_count, check_name
from replica.core import Listener, now_ms
from replica.horizon import Retention
from replica.ids import agent_id_for
from replica.leasing import Leasing
from replica.pending import PendingMail
from replica.pinning import Pinning
from replica.roles import Roles
from replica.search import Search
from replica.store import Store
from replica.threads import Threads
from replica.vouching import Vouching


class Replica(Acks, PendingMail, Search, Threads, Vouching, Retention, Pinning, Leasing, Roles):
    """One replica: a SQLite file (or ``:memory:``) plus this node's identity."""

    @classmethod
    def open(cls, path: str | Path = ":memory:", identity: idmod.Identity | None = None,
             *, wall: Callable[[], int] = now_ms,
             broadcast_history_ms: int = routing.DEFAULT_BROADCAST_HISTORY_MS) -> Replica:
        """Open (creating if needed) the replica at ``path`` as ``identity``; a role's inbox
        holds the broadcasts sent up to ``broadcast_history_ms`` before it was first seen."""
        return cls(Store(path), identity or idmod.generate(), wall=wall, broadcast_history_ms=broadcast_history_ms)


__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Listener", "Replica", "agent_id_for", "check_count", "check_name", "now_ms"]
