"""When each role was first seen in the fleet, and whether it was confirmed: replicated per role
as a few join-semilattices (pure rule: ``merge``; the same rule in SQL: ``record``).

What the ops show of a role (matched by name key, ``names.name_key``) are *sightings*:

* **confirming** ones: each message it sent (at its op's wall time) and each write of its profile
  (at its op's wall time): the role exists, it spoke;
* **read** ones: a ``["seen", [role], "at", ms]`` write, which a node adds the first time a role
  reads its inbox (or sets its profile) there while the node has no time for it yet;
* **forgets**: ``["seen", [role], "forgot", ms]`` (``peerd roles forget``): every read sighting at or
  before ``ms`` no longer counts, unless the role is confirmed.

A retracted message's op leaves every replica, so its sighting would stay only where it had
landed before: the retraction is written with ``["seen", [role], "sent", ms]``, the same confirming
sighting, which every replica holds.

Invariants:
* Per role the state is (earliest confirming time, the set of read times, the latest forget): a
  min, a union and a max, so ``merge`` is commutative, associative and idempotent, and replicas
  holding the same ops agree whatever order the ops came in (``tests/test_crdt_properties.py``
  checks ``record`` against ``merge``).
* A role is **confirmed** once any confirming sighting is held, for good; it is **unconfirmed**
  while it has only read sightings after the latest forget; else it is not known.
* Its first-seen time (``Seen.first``) is the earliest of its confirming sightings and its read
  sightings (for an unconfirmed role, only those after the latest forget). For a confirmed role it
  only ever moves earlier, so it never loses a broadcast it could already see
  (``routing.in_broadcast_history``); a forget moves an unconfirmed role's time later or away.
* A node that reads for a role it has no time for writes a read sighting after the role's latest
  forget (``new_sighting``), so what it writes counts wherever the forget is held.
"""

from __future__ import annotations

import difflib
import functools
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from replica import mailbox
from replica.hlc import wall_of
from replica.names import name_key
from replica.ops import KIND_MSG, KIND_SET, Op, known_writes

TABLE = "seen"  # the op table of the register writes (``ops.LWW_SCHEMA``)
FIELD = "at"  # a read sighting
FORGOT = "forgot"  # a forget: read sightings up to its time no longer count
SENT_FIELD = "sent"  # a message's sighting, written again when it is retracted (its op is then gone)
HINT_ROLES = 50  # known roles named in a hint, at most
BROADCAST = "broadcast"
BROADCAST_WORDS = frozenset({"all", "everyone", "everybody", "*"})  # what a sender may write for ``broadcast``

SENT, PROFILE, READ, FORGET = "sent", "profile", "read", "forget"  # the kinds of a sighting
CONFIRMING = frozenset({SENT, PROFILE})
CONFIRMED, UNCONFIRMED = "confirmed", "unconfirmed"  # a known role's status


class Sighting(NamedTuple):
    role: str  # a name key
    at: int  # wall ms
    kind: str  # SENT, PROFILE, READ or FORGET


@dataclass(frozen=True)
class Seen:
    """What the ops show of one role: its earliest confirming time, its read times, its latest forget."""

    confirmed: int | None = None
    reads: frozenset[int] = field(default_factory=frozenset)
    forgot: int | None = None

    def add(self, s: Sighting) -> Seen:
        if s.kind in CONFIRMING:
            return Seen(_least(self.confirmed, s.at), self.reads, self.forgot)
        if s.kind == READ:
            return Seen(self.confirmed, self.reads | {s.at}, self.forgot)
        return Seen(self.confirmed, self.reads, _greatest(self.forgot, s.at))

    def join(self, other: Seen) -> Seen:
        return Seen(_least(self.confirmed, other.confirmed), self.reads | other.reads,
                    _greatest(self.forgot, other.forgot))

    @property
    def counted(self) -> frozenset[int]:
        """The read times that count: all of them for a confirmed role, else those after the forget."""
        if self.confirmed is not None or self.forgot is None:
            return self.reads
        return frozenset(r for r in self.reads if r > self.forgot)

    @property
    def first(self) -> int | None:
        """The role's first-seen time (wall ms), or None while it is not known."""
        times = [*self.counted, *([] if self.confirmed is None else [self.confirmed])]
        return min(times) if times else None

    @property
    def status(self) -> str | None:
        if self.confirmed is not None:
            return CONFIRMED
        return UNCONFIRMED if self.counted else None


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _greatest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def merge(state: Mapping[str, Seen], sightings: Iterable[Sighting]) -> dict[str, Seen]:
    """The state after ``sightings``."""
    out = dict(state)
    for s in sightings:
        out[s.role] = out.get(s.role, Seen()).add(s)
    return out


def join(a: Mapping[str, Seen], b: Mapping[str, Seen]) -> dict[str, Seen]:
    """Two states as one (what a replica holding both sets of ops holds)."""
    return {k: a.get(k, Seen()).join(b.get(k, Seen())) for k in {*a, *b}}


def first_times(state: Mapping[str, Seen]) -> dict[str, int]:
    """Each known role's first-seen time."""
    return {k: t for k, s in state.items() if (t := s.first) is not None}


def sightings(op: Op) -> list[Sighting]:
    """What an op shows: a role's message (not a thread message, whose sender is an agent) at its
    op's time; a profile write, once per role, at its op's time; each read sighting and forget."""
    if op.kind == KIND_MSG:
        return [Sighting(name_key(op.body["f"]), wall_of(op.hlc), SENT)] if op.body["t"] is None else []
    if op.kind != KIND_SET:
        return []
    out: dict[Sighting, None] = {}
    for w in known_writes(op):
        if w[0] == TABLE:
            out[Sighting(name_key(w[1][0]), w[3], _KINDS[w[2]])] = None
        elif w[0] == "prof":
            out[Sighting(name_key(w[1][0]), wall_of(op.hlc), PROFILE)] = None
    return list(out)


_KINDS = {FIELD: READ, FORGOT: FORGET, SENT_FIELD: SENT}


def write(role: str, at_ms: int) -> list[object]:
    """The read sighting a node writes when it first sees ``role`` at ``at_ms`` (``new_sighting``)."""
    return [TABLE, [role], FIELD, at_ms]


def forget_write(role: str, upto_ms: int) -> list[object]:
    """The write that forgets the read sightings of ``role`` up to ``upto_ms``."""
    return [TABLE, [role], FORGOT, upto_ms]


def sent_write(role: str, at_ms: int) -> list[object]:
    """The sighting of a message ``role`` sent at ``at_ms``, written as its message is retracted: every
    replica then holds it, also one that never held the message (whose op leaves with its content)."""
    return [TABLE, [role], SENT_FIELD, at_ms]


# -- the same rule in SQL ------------------------------------------------------------------------
#
# ``first_seen(role, at, confirmed, forgot)``: ``at`` is ``Seen.first`` (NULL while not known),
# ``confirmed`` 1 once a confirming sighting is held, ``forgot`` the latest forget; ``seen_reads``
# holds every read time. A row, once there, stays (its ``at`` may become NULL).

_CONFIRM = (
    "INSERT INTO first_seen(role, at, confirmed) VALUES (?1, ?2, 1) ON CONFLICT(role) DO UPDATE SET"
    " at = CASE WHEN confirmed THEN min(at, excluded.at) ELSE"
    " min(excluded.at, coalesce((SELECT min(r.at) FROM seen_reads r WHERE r.role = ?1), excluded.at)) END,"
    " confirmed = 1 WHERE NOT confirmed OR excluded.at < at"
)
_READ = (
    "INSERT INTO first_seen(role, at, confirmed) VALUES (?1, ?2, 0) ON CONFLICT(role) DO UPDATE SET at = excluded.at"
    " WHERE (at IS NULL OR excluded.at < at) AND (confirmed OR forgot IS NULL OR excluded.at > forgot)"
)
_FORGET = (
    "INSERT INTO first_seen(role, at, confirmed, forgot) VALUES (?1, NULL, 0, ?2) ON CONFLICT(role) DO UPDATE"
    " SET forgot = excluded.forgot WHERE forgot IS NULL OR excluded.forgot > forgot"
)
_RECOUNT = (
    "UPDATE first_seen SET at = (SELECT min(r.at) FROM seen_reads r WHERE r.role = ?1 AND r.at > first_seen.forgot)"
    " WHERE role = ?1 AND NOT confirmed"
)


def record(cur: sqlite3.Cursor, s: Sighting) -> None:
    """Project one sighting (``merge`` in SQL)."""
    if s.kind in CONFIRMING:
        cur.execute(_CONFIRM, (s.role, s.at))
    elif s.kind == READ:
        cur.execute("INSERT OR IGNORE INTO seen_reads(role, at) VALUES (?, ?)", (s.role, s.at))
        cur.execute(_READ, (s.role, s.at))
    else:
        cur.execute(_FORGET, (s.role, s.at))
        if cur.rowcount:
            cur.execute(_RECOUNT, (s.role,))


def record_all(cur: sqlite3.Cursor, seen: Iterable[Sighting]) -> None:
    for s in seen:
        record(cur, s)


def lookup(cur: sqlite3.Cursor, role: str) -> int | None:
    """The role's first-seen time, or None (read where the light read path can reach it too)."""
    return mailbox.first_seen_at(cur, role)


def new_sighting(cur: sqlite3.Cursor, role: str, now_ms: int) -> int:
    """The time of a read sighting written now: after the role's latest forget, so that it counts."""
    row = cur.execute("SELECT forgot FROM first_seen WHERE role = ?", (name_key(role),)).fetchone()
    return now_ms if row is None or row[0] is None else max(now_ms, int(row[0]) + 1)


def status(cur: sqlite3.Cursor, role: str) -> str | None:
    """``CONFIRMED`` (it sent, or has a profile), ``UNCONFIRMED`` (it only read), or None (not known)."""
    key = name_key(role)
    row = cur.execute("SELECT at, confirmed FROM first_seen WHERE role = ?", (key,)).fetchone()
    if (row is not None and row[1]) or cur.execute("SELECT 1 FROM profiles WHERE rkey = ?", (key,)).fetchone():
        return CONFIRMED
    return UNCONFIRMED if row is not None and row[0] is not None else None


def is_confirmed(cur: sqlite3.Cursor, role: str) -> bool:
    """Whether ``role`` (by name key) sent a message here or has a profile."""
    return status(cur, role) == CONFIRMED


def confirmed_roles(cur: sqlite3.Cursor) -> list[str]:
    """Every confirmed role, by name key, sorted."""
    rows = cur.execute("SELECT role FROM first_seen WHERE confirmed UNION SELECT rkey FROM profiles ORDER BY 1")
    return [str(r[0]) for r in rows]


def unconfirmed_roles(cur: sqlite3.Cursor) -> list[str]:
    """Every role known only by reading (after its latest forget), by name key, sorted."""
    rows = cur.execute("SELECT role FROM first_seen f WHERE NOT confirmed AND at IS NOT NULL"
                       " AND NOT EXISTS (SELECT 1 FROM profiles p WHERE p.rkey = f.role) ORDER BY 1")
    return [str(r[0]) for r in rows]


def known(cur: sqlite3.Cursor) -> list[tuple[str, int, bool]]:
    """Every known role: (name key, first-seen time, confirmed), by key."""
    rows = cur.execute("SELECT f.role, f.at, f.confirmed OR EXISTS (SELECT 1 FROM profiles p WHERE p.rkey = f.role)"
                       " FROM first_seen f WHERE f.at IS NOT NULL ORDER BY 1")
    return [(str(r[0]), int(r[1]), bool(r[2])) for r in rows]


def last_read(cur: sqlite3.Cursor, role: str) -> int | None:
    """The latest read sighting of ``role`` held here (what a forget made now must cover)."""
    row = cur.execute("SELECT max(at) FROM seen_reads WHERE role = ?", (name_key(role),)).fetchone()
    return None if row[0] is None else int(row[0])


def close(unknown: Sequence[str], known: Sequence[str]) -> list[str]:
    """The known roles spelt close to an unknown one (a likely typo), closest first; ``broadcast``
    for a word that means everyone (``all``, ``everyone``) or is spelt close to it."""
    return list(_close(tuple(unknown), tuple(known)))


@functools.lru_cache(maxsize=256)
def _close(unknown: tuple[str, ...], known: tuple[str, ...]) -> tuple[str, ...]:
    """``close``, remembered (as ``_hint``): the warning of a send to a role nobody has seen asks it
    again on every send to that role."""
    out: dict[str, None] = {}
    for u in unknown:
        key = name_key(u)
        if key in BROADCAST_WORDS:
            out[BROADCAST] = None
        out.update(dict.fromkeys(difflib.get_close_matches(key, [*known, BROADCAST], n=3, cutoff=0.6)))
    return tuple(out)


def hint(unknown: Sequence[str], known: Sequence[str], cap: int = HINT_ROLES) -> list[str]:
    """At most ``cap`` known roles to name next to unknown ones: the closest spellings first."""
    return list(_hint(tuple(unknown), tuple(known), cap))


@functools.lru_cache(maxsize=256)
def _hint(unknown: tuple[str, ...], known: tuple[str, ...], cap: int) -> tuple[str, ...]:
    """``hint``, remembered: a sender that keeps writing to a role nobody has seen yet asks the same
    question on every send, and comparing spellings costs about 5 us per known role."""
    near = [k for k in _close(unknown, known) if k != BROADCAST]  # not a role: the warning names it
    return tuple(dict.fromkeys([*near, *known]))[:cap]


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
    """Every confirmed role key of this replica (``confirmed_roles``: sorted, and as a set) and the
    unconfirmed ones (``unconfirmed_roles``)."""

    sorted: tuple[str, ...]
    keys: frozenset[str]
    unconfirmed: frozenset[str] = frozenset()

    @classmethod
    def of(cls, keys: Sequence[str], unconfirmed: Iterable[str] = ()) -> KnownRoles:
        ordered = tuple(sorted(keys))
        return cls(ordered, frozenset(ordered), frozenset(unconfirmed) - frozenset(ordered))

    @classmethod
    def read(cls, cur: sqlite3.Cursor) -> KnownRoles:
        return cls.of(confirmed_roles(cur), unconfirmed_roles(cur))

    def with_role(self, key: str) -> KnownRoles:
        """These roles with ``key`` among the confirmed ones (it just sent)."""
        return self if key in self.keys else KnownRoles.of((*self.sorted, key), self.unconfirmed)
