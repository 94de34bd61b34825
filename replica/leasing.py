"""Leases, the replica's side: reserve paths, renew, release, force a release, list, and what a
session is to be told (the rules are ``replica.leases``, the SQL ``replica.leasestore``).

Invariants:
* Every change is signed ops of this node (one per lease touched); arguments are checked before
  anything is written, and a call that raises has written nothing.
* ``reserve`` grants a path only when no live lease of another role clashes with it on this
  replica (the clash is returned with its holders instead); a path the role already holds alike is
  renewed, not taken twice. Two takes made apart (other processes, a partition) are settled by the
  rule on every replica, not here: the later one is then listed as lost.
* Releases and renewals name the caller's own leases: a lease id of another role's lease is an
  error; a force release takes any lease and may tell its holder by a message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from replica import leases as rules
from replica import leasestore
from replica.checks import check_count, required_name
from replica.core import ReplicaCore, const_body, iso
from replica.errors import InvalidArgument, NotFound
from replica.names import name_key

DEFAULT_TTL_S = 3600
MAX_PATHS = 100


@dataclass(frozen=True)
class LeaseInfo:
    """One lease as every door shows it (mcp_agent_mail's field names where it has them)."""

    id: str
    project: str
    path_pattern: str
    agent: str
    instance: str | None
    exclusive: bool
    reason: str
    created_ts: str
    expires_ts: str
    status: str  # held, lost, released, forced, expired
    released_ts: str | None = None
    released_by: str | None = None
    lost_to: str | None = None
    lost_to_agent: str | None = None


@dataclass(frozen=True)
class LeaseConflict:
    path: str
    holders: list[LeaseInfo]


@dataclass(frozen=True)
class Reservation:
    granted: list[LeaseInfo] = field(default_factory=list)
    conflicts: list[LeaseConflict] = field(default_factory=list)


@dataclass(frozen=True)
class Renewal:
    id: str
    path_pattern: str
    old_expires_ts: str
    new_expires_ts: str


@dataclass(frozen=True)
class LeaseLoss:
    """A lease found lost on this replica (``lseq``: when, in local arrival order) and its winner."""

    lseq: int
    lost: LeaseInfo
    winner: LeaseInfo | None


def project_name(key: object) -> str:
    """The project a ``project_key`` names: a name, or a path whose last folder is the name (the
    same repository sits at other paths on other machines)."""
    text = required_name(key, "project_key")
    parts = [p for p in text.replace("\\", "/").split("/") if p]
    if not parts:
        raise InvalidArgument("project_key names no project")
    return parts[-1]


def _ttl_ms(seconds: object, what: str) -> int:
    s = check_count(seconds, what, low=1, high=rules.MAX_TTL_MS // 1000)
    return s * 1000


def _pattern(path: object) -> str:
    try:
        return rules.normal_pattern(path)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def info(row: dict[str, Any], now_ms: int, winner: dict[str, Any] | None = None) -> LeaseInfo:
    """A lease row as a ``LeaseInfo`` judged at ``now_ms``."""
    if row["lost_to"] is not None:
        status = "lost"
    elif row["ended_kind"] == rules.KIND_RELEASE:
        status = "released"
    elif row["ended_kind"] == rules.KIND_FORCE:
        status = "forced"
    else:
        status = "held" if row["until"] > now_ms else "expired"
    ended = row["ended_kind"] is not None
    return LeaseInfo(id=row["id"], project=row["project"], path_pattern=row["pattern"], agent=row["role"],
                     instance=row["instance"], exclusive=row["exclusive"], reason=row["reason"],
                     created_ts=iso(row["start"]) or "", expires_ts=iso(row["until"]) or "", status=status,
                     released_ts=iso(row["until"]) if ended else None, released_by=row["ended_by"],
                     lost_to=row["lost_to"], lost_to_agent=None if winner is None else winner["role"])


class Leasing(ReplicaCore):
    def reserve(self, project_key: str, role: str, paths: Sequence[str], *, ttl_seconds: int = DEFAULT_TTL_S,
                exclusive: bool = True, reason: str = "", instance: str | None = None) -> Reservation:
        """Take leases on ``paths`` (mcp_agent_mail's ``file_reservation_paths``; module docstring)."""
        project, who = project_name(project_key), required_name(role, "agent_name")
        inst = None if instance is None else required_name(instance, "instance")
        ttl = _ttl_ms(ttl_seconds, "ttl_seconds")
        if not isinstance(exclusive, bool):
            raise InvalidArgument("exclusive must be true or false")
        if not isinstance(reason, str) or len(reason) > rules.MAX_REASON_CHARS:
            raise InvalidArgument(f"reason must be a string of at most {rules.MAX_REASON_CHARS} characters")
        if isinstance(paths, str) or not isinstance(paths, Sequence) or not 1 <= len(paths) <= MAX_PATHS:
            raise InvalidArgument(f"paths must be a list of 1 to {MAX_PATHS} paths or globs")
        patterns = list(dict.fromkeys(_pattern(p) for p in paths))
        now = self._wall()
        with self._store.read() as cur:
            held = leasestore.live_in(cur, name_key(project), now)
        me = name_key(who)
        mine = [t for t in held if t["rkey"] == me]
        granted: list[LeaseInfo] = []
        conflicts: list[LeaseConflict] = []
        for pattern in patterns:
            probe = rules.Take("", name_key(project), pattern, me, exclusive, (0, b"", 0), ttl)
            holders = [t for t in held if rules.clash(_take_of(t), probe)]
            if holders:
                conflicts.append(LeaseConflict(pattern, [info(t, now) for t in holders]))
                continue
            same = next((t for t in mine if t["pattern"] == pattern and t["exclusive"] == exclusive), None)
            if same is not None:
                lid = same["id"]
                self._write(rules.KIND_RENEW, const_body({"l": lid, "r": who, "ttl": max(ttl, same["until"] - now)}))
            else:
                _lseq, op = self._write(rules.KIND_TAKE, const_body(
                    {"p": project, "g": pattern, "r": who, "i": inst, "x": exclusive, "ttl": ttl, "why": reason}))
                lid = rules.lease_id(op.origin, op.seq)
            granted.append(self.lease(lid))
        return Reservation(granted, conflicts)

    def lease(self, lease_id: str) -> LeaseInfo:
        """One lease by id; ``NotFound`` when this replica holds none of that id."""
        if not isinstance(lease_id, str):
            raise InvalidArgument("a file_reservation_id must be a string (fr_ and 20 hex digits)")
        with self._store.read() as cur:
            row = leasestore.by_id(cur, lease_id)
            if row is None:
                raise NotFound(f"no file reservation {lease_id!r} here")
            winner = None if row["lost_to"] is None else leasestore.by_id(cur, row["lost_to"])
        return info(row, self._wall(), winner)

    def leases(self, project_key: str | None = None, role: str | None = None, *, include_ended: bool = False,
               limit: int = 200) -> list[LeaseInfo]:
        """Leases newest first: those held and those lost (with ``include_ended`` also released,
        forced and expired ones) of a project and a role, or of all."""
        pkey = None if project_key is None else name_key(project_name(project_key))
        rkey = None if role is None else name_key(required_name(role, "agent_name"))
        n = check_count(limit, "limit", low=1, high=1000)
        now = self._wall()
        with self._store.read() as cur:
            rows = leasestore.listed(cur, pkey, rkey, now, ended=include_ended, limit=n)
            winners = {r["lost_to"]: leasestore.by_id(cur, r["lost_to"]) for r in rows if r["lost_to"]}
        return [info(r, now, winners.get(r["lost_to"])) for r in rows]

    def _own_live(self, project_key: str, role: str, paths: Sequence[str] | None,
                  ids: Sequence[str] | None) -> tuple[str, list[dict[str, Any]], int]:
        """The caller's live leases picked by ``paths`` and ``ids`` (all when both are None)."""
        project, who = project_name(project_key), required_name(role, "agent_name")
        if paths is not None and (isinstance(paths, str) or not paths):
            raise InvalidArgument("paths must be omitted or a non-empty list")
        if ids is not None and (isinstance(ids, str) or not ids):
            raise InvalidArgument("file_reservation_ids must be omitted or a non-empty list")
        pats = None if paths is None else {_pattern(p) for p in paths}
        now, me = self._wall(), name_key(who)
        with self._store.read() as cur:
            for lid in ids or ():
                row = leasestore.by_id(cur, str(lid))
                if row is None or row["rkey"] != me:
                    holder = "nobody here" if row is None else f"{row['role']}, not {who}"
                    raise InvalidArgument(f"file reservation {lid!r} is held by {holder}: release your own "
                                          "(or force_release_file_reservation for a stale holder)")
            rows = [r for r in leasestore.live_in(cur, name_key(project), now) if r["rkey"] == me
                    and (pats is None or r["pattern"] in pats) and (ids is None or r["id"] in ids)]
        return who, rows, now

    def renew_leases(self, project_key: str, role: str, *, extend_seconds: int = 1800,
                     paths: Sequence[str] | None = None, ids: Sequence[str] | None = None) -> list[Renewal]:
        """Extend the caller's live leases to the later of now or their expiry, plus ``extend_seconds``."""
        extend = _ttl_ms(extend_seconds, "extend_seconds")
        who, rows, now = self._own_live(project_key, role, paths, ids)
        out = []
        for r in rows:
            new = max(now, r["until"]) + extend
            self._write(rules.KIND_RENEW, const_body({"l": r["id"], "r": who, "ttl": min(new - now, rules.MAX_TTL_MS)}))
            out.append(Renewal(r["id"], r["pattern"], iso(r["until"]) or "", self.lease(r["id"]).expires_ts))
        return out

    def release_leases(self, project_key: str, role: str, *, paths: Sequence[str] | None = None,
                       ids: Sequence[str] | None = None) -> tuple[int, str]:
        """Release the caller's live leases (all, or those picked); (how many, when)."""
        who, rows, now = self._own_live(project_key, role, paths, ids)
        for r in rows:
            self._write(rules.KIND_RELEASE, const_body({"l": r["id"], "r": who}))
        return len(rows), iso(now) or ""

    def force_release(self, project_key: str, role: str, lease_id: str, *, note: str = "") -> LeaseInfo:
        """End another role's lease (a stale holder); the lease as it stands after."""
        project, who = project_name(project_key), required_name(role, "agent_name")
        if not isinstance(note, str) or len(note) > rules.MAX_REASON_CHARS:
            raise InvalidArgument(f"note must be a string of at most {rules.MAX_REASON_CHARS} characters")
        before = self.lease(lease_id)
        if name_key(before.project) != name_key(project):
            raise NotFound(f"file reservation {lease_id!r} is in project {before.project!r}, not {project!r}")
        if before.status == "held":
            self._write(rules.KIND_FORCE, const_body({"l": lease_id, "r": who, "why": note}))
        return self.lease(lease_id)

    def lease_losses(self, after_lseq: int = 0, limit: int = 100) -> list[LeaseLoss]:
        """Leases found lost here after ``after_lseq``, in the order they were found (pushes)."""
        now = self._wall()
        with self._store.read() as cur:
            found = leasestore.losses_after(cur, check_count(after_lseq, "after_lseq"), limit)
        return [LeaseLoss(lseq, info(lost, now, winner), None if winner is None else info(winner, now))
                for lseq, lost, winner in found]

    def lease_mark(self) -> int:
        """Where ``lease_losses`` would start now (a session's cursor)."""
        with self._store.read() as cur:
            return leasestore.last_loss(cur)


def _take_of(row: dict[str, Any]) -> rules.Take:
    return rules.Take(row["id"], name_key(row["project"]), row["pattern"], row["rkey"], row["exclusive"],
                      (row["hlc"], row["origin"], 0), 0)
