"""When each role was first seen in the fleet: a replicated min-register per role.

Invariants:
* A role's first-seen time (wall ms) is the minimum over every op that shows
  the role (matched by name key, ``names.name_key``): each message it sent (its op's wall time) and each ``seen`` write
  naming it. A node writes ``["seen", [role], "at", now]`` the first time the
  role checks its inbox or sets its profile there while the node has no time
  for it yet, so a role is written about at most once per node.
* The minimum is commutative, associative and idempotent: replicas holding the
  same ops agree on every role's time whatever order the ops came in
  (``merge`` is the rule, ``record`` the same rule in SQL, and
  ``tests/test_crdt_properties.py`` checks that they agree).
* The times only ever move earlier, so a role never loses a broadcast it could
  already see (``routing.in_broadcast_history``).
"""

from __future__ import annotations

import difflib
import functools
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from replica import mailbox
from replica.hlc import wall_of
from replica.names import name_key
from replica.ops import KIND_MSG, KIND_SET, Op, known_writes

TABLE = "seen"  # the op table of the register writes (``ops.LWW_SCHEMA``)
FIELD = "at"
HINT_ROLES = 50  # known roles named in a hint, at most

_RECORD = (
    "INSERT INTO first_seen(role, at) VALUES (?, ?) "
    "ON CONFLICT(role) DO UPDATE SET at = excluded.at WHERE excluded.at < first_seen.at"
)


def merge(state: Mapping[str, int], sightings: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The register after ``sightings`` (role, wall ms): the earliest time per role."""
    out = dict(state)
    for role, at in sightings:
        out[role] = min(at, out.get(role, at))
    return out


def sightings(op: Op) -> list[tuple[str, int]]:
    """The (role key, wall ms) an op shows: a role's message (not a thread message, whose sender
    is an agent) at its op's time, and each ``seen`` write. Roles are matched by name key."""
    if op.kind == KIND_MSG:
        return [(name_key(op.body["f"]), wall_of(op.hlc))] if op.body["t"] is None else []
    if op.kind == KIND_SET:
        return [(name_key(w[1][0]), w[3]) for w in known_writes(op) if w[0] == TABLE]
    return []


def write(role: str, at_ms: int) -> list[object]:
    """The register write a node makes when it first sees ``role`` at ``at_ms``."""
    return [TABLE, [role], FIELD, at_ms]


def record(cur: sqlite3.Cursor, role: str, at_ms: int) -> None:
    """Project one sighting (``merge`` in SQL)."""
    cur.execute(_RECORD, (role, at_ms))


def lookup(cur: sqlite3.Cursor, role: str) -> int | None:
    """The role's first-seen time, or None (read where the light read path can reach it too)."""
    return mailbox.first_seen_at(cur, role)


def is_known(cur: sqlite3.Cursor, role: str) -> bool:
    """Whether this replica has seen ``role`` (by name key): a first-seen time, or a profile."""
    row = cur.execute("SELECT EXISTS (SELECT 1 FROM first_seen WHERE role = ?1)"
                      " OR EXISTS (SELECT 1 FROM profiles WHERE rkey = ?1)", (name_key(role),)).fetchone()
    return bool(row[0])


def close(unknown: Sequence[str], known: Sequence[str]) -> list[str]:
    """The known roles spelt close to an unknown one (a likely typo), closest first."""
    return list(_close(tuple(unknown), tuple(known)))


@functools.lru_cache(maxsize=256)
def _close(unknown: tuple[str, ...], known: tuple[str, ...]) -> tuple[str, ...]:
    """``close``, remembered (as ``_hint``): the warning of a send to a role nobody has seen asks it
    again on every send to that role."""
    return tuple(dict.fromkeys(k for u in unknown for k in difflib.get_close_matches(name_key(u), known, n=3,
                                                                                       cutoff=0.6)))


def hint(unknown: Sequence[str], known: Sequence[str], cap: int = HINT_ROLES) -> list[str]:
    """At most ``cap`` known roles to name next to unknown ones: the closest spellings first."""
    return list(_hint(tuple(unknown), tuple(known), cap))


@functools.lru_cache(maxsize=256)
def _hint(unknown: tuple[str, ...], known: tuple[str, ...], cap: int) -> tuple[str, ...]:
    """``hint``, remembered: a sender that keeps writing to a role nobody has seen yet asks the same
    question on every send, and comparing spellings costs about 5 us per known role."""
    return tuple(dict.fromkeys([*_close(unknown, known), *known]))[:cap]


def known_roles(cur: sqlite3.Cursor) -> list[str]:
    """Every role this replica has seen (first-seen times and profiles), by name key, sorted."""
    rows = cur.execute("SELECT role FROM first_seen UNION SELECT rkey FROM profiles ORDER BY 1")
    return [str(r[0]) for r in rows]


def address_keys(part: str) -> list[str]:
    """The role keys a channel entry may stand for: its own, and each role it can be an instance
    address of (``sigma`` for ``sigma-vps``, ``routing.instance_address``). It names a known role
    when any of them is known."""
    key = name_key(part)
    return [key, *(key[:i] for i, c in enumerate(key) if c == "-" and i > 0)]


def addressable_in(part: str, seen: frozenset[str]) -> bool:
    """Whether a channel entry names a role among ``seen`` (role keys), itself or by an instance
    address (``address_keys``)."""
    return any(k in seen for k in address_keys(part))


@dataclass(frozen=True)
class KnownRoles:
    """Every role key this replica has seen (``known_roles``): sorted, and as a set."""

    sorted: tuple[str, ...]
    keys: frozenset[str]

    @classmethod
    def of(cls, keys: Sequence[str]) -> KnownRoles:
        ordered = tuple(sorted(keys))
        return cls(ordered, frozenset(ordered))

    def with_role(self, key: str) -> KnownRoles:
        """These roles with ``key`` among them."""
        return self if key in self.keys else KnownRoles.of((*self.sorted, key))
