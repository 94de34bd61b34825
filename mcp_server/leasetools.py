"""The file reservation tools under mcp_agent_mail's names, arguments and result shapes
(``file_reservation_paths``, ``renew_file_reservations``, ``release_file_reservations``,
``force_release_file_reservation``), and peerd's ``list_file_reservations``.

Invariants: ``project_key`` names a project of the fleet (a path counts by its last folder) and
``agent_name`` a role (the session's bound role when omitted); a handler checks its arguments and
makes one call into the replica (``replica.leasing``), which leaves the replica unchanged on a bad
call; ``registration_token`` and ``format`` are accepted for mcp_agent_mail's clients and unused
(the fleet key and the node's signature stand for the token).
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.types import ToolAnnotations
from pydantic import BeforeValidator, Field

from mcp_server.calls import Call, ToolSpec, role_of
from mcp_server.results import Snake
from mcp_server.schemas import Args, _json_list
from replica import Replica
from replica.leases import MAX_TTL_MS
from replica.leasing import DEFAULT_TTL_S, MAX_PATHS, LeaseInfo, Renewal, Reservation

_MAX_S = MAX_TTL_MS // 1000
_PROJECT = "The project: a name shared by the fleet (a path counts by its last folder, e.g. /src/backend is backend)."
_AGENT = "Your role. Required unless this session is bound to a role."
_UNUSED = "Accepted for mcp_agent_mail clients; unused (the fleet key and node signatures stand for it)."
Paths = Annotated[list[str], BeforeValidator(_json_list)]


class ReserveArgs(Args):
    project_key: str = Field(description=_PROJECT)
    agent_name: str | None = Field(None, description=_AGENT)
    paths: Paths = Field(min_length=1, max_length=MAX_PATHS,
                         description="Paths or globs relative to the project's top folder (e.g. app/api/*.py).")
    ttl_seconds: int = Field(DEFAULT_TTL_S, ge=1, le=_MAX_S, description="How long the leases last, 1 s to a year.")
    exclusive: bool = Field(True, description="Exclusive (nobody else edits) or shared (others may share it).")
    reason: str = Field("", max_length=2048, description="Why: shown to whoever meets the lease.")
    registration_token: str | None = Field(None, description=_UNUSED)
    format: str | None = Field(None, description=_UNUSED)


class RenewArgs(Args):
    project_key: str = Field(description=_PROJECT)
    agent_name: str | None = Field(None, description=_AGENT)
    extend_seconds: int = Field(1800, ge=1, le=_MAX_S,
                                description="Seconds to add to the later of now and each lease's expiry.")
    paths: Paths | None = Field(None, description="Only the leases on these patterns (default: all of yours).")
    file_reservation_ids: Paths | None = Field(None, description="Only these lease ids (default: all of yours).")
    registration_token: str | None = Field(None, description=_UNUSED)
    format: str | None = Field(None, description=_UNUSED)


class ReleaseArgs(Args):
    project_key: str = Field(description=_PROJECT)
    agent_name: str | None = Field(None, description=_AGENT)
    paths: Paths | None = Field(None, description="Only the leases on these patterns (default: all of yours).")
    file_reservation_ids: Paths | None = Field(None, description="Only these lease ids (default: all of yours).")
    registration_token: str | None = Field(None, description=_UNUSED)
    format: str | None = Field(None, description=_UNUSED)


class ForceReleaseArgs(Args):
    project_key: str = Field(description=_PROJECT)
    agent_name: str | None = Field(None, description=_AGENT)
    file_reservation_id: str = Field(description="The lease id (fr_...), as file_reservation_paths gave it.")
    notify_previous: bool = Field(True, description="Send the previous holder a message saying so.")
    note: str = Field("", max_length=2048, description="Added to the lease's record and to the message.")
    registration_token: str | None = Field(None, description=_UNUSED)
    format: str | None = Field(None, description=_UNUSED)


class ListReservationsArgs(Args):
    project_key: str | None = Field(None, description="Only this project (default: every project).")
    agent_name: str | None = Field(None, description="Only this role's leases (default: every role's).")
    include_released: bool = Field(False, description="Also released, forced and expired leases.")
    limit: int = Field(200, ge=1, le=1000)


class ReservationOut(Snake):
    granted: list[dict[str, Any]] = Field(description="Leases taken: {id, path_pattern, exclusive, reason, "
                                                       "expires_ts}.")
    conflicts: list[dict[str, Any]] = Field(description="Paths not granted: {path, holders: [{agent, path_pattern, "
                                                         "exclusive, reason, expires_ts}]}.")


class RenewOut(Snake):
    renewed: int
    file_reservations: list[dict[str, Any]] = Field(description="{id, path_pattern, old_expires_ts, new_expires_ts}.")


class ReleaseOut(Snake):
    released: int
    released_at: str


class ForceReleaseOut(Snake):
    released: int
    released_at: str | None
    reservation: dict[str, Any]
    notified: bool
    already_released: bool = False


class ListReservationsOut(Snake):
    file_reservations: list[dict[str, Any]] = Field(
        description="Newest first: {id, project, path_pattern, agent, instance, exclusive, reason, created_ts, "
                    "expires_ts, status (held, lost, released, forced, expired), released_ts, released_by, "
                    "lost_to, lost_to_agent}.")
    conflicts: list[dict[str, Any]] = Field(
        description="Leases lost to an earlier one (taken apart, e.g. across a partition): {lost, winner}.")


def lease_out(x: LeaseInfo) -> dict[str, Any]:
    return {"id": x.id, "project": x.project, "path_pattern": x.path_pattern, "agent": x.agent,
            "instance": x.instance, "exclusive": x.exclusive, "reason": x.reason, "created_ts": x.created_ts,
            "expires_ts": x.expires_ts, "status": x.status, "released_ts": x.released_ts,
            "released_by": x.released_by, "lost_to": x.lost_to, "lost_to_agent": x.lost_to_agent}


def _holder(x: LeaseInfo) -> dict[str, Any]:
    return {"id": x.id, "agent": x.agent, "path_pattern": x.path_pattern, "exclusive": x.exclusive,
            "reason": x.reason, "expires_ts": x.expires_ts}


def reservation_out(res: Reservation) -> ReservationOut:
    return ReservationOut(
        granted=[{"id": g.id, "path_pattern": g.path_pattern, "exclusive": g.exclusive, "reason": g.reason,
                  "expires_ts": g.expires_ts} for g in res.granted],
        conflicts=[{"path": c.path, "holders": [_holder(h) for h in c.holders]} for c in res.conflicts])


async def file_reservation_paths(call: Call, a: ReserveArgs) -> ReservationOut:
    role = role_of(a.agent_name, call.bind, "agent_name")
    inst = call.bind.instance if call.bind.role and call.bind.role.lower() == role.lower() else None

    def reserve(r: Replica) -> Reservation:
        return r.reserve(a.project_key, role, a.paths, ttl_seconds=a.ttl_seconds, exclusive=a.exclusive,
                         reason=a.reason, instance=inst)

    return reservation_out(await call.run(reserve))


async def renew_file_reservations(call: Call, a: RenewArgs) -> RenewOut:
    role = role_of(a.agent_name, call.bind, "agent_name")

    def renew(r: Replica) -> list[Renewal]:
        return r.renew_leases(a.project_key, role, extend_seconds=a.extend_seconds, paths=a.paths,
                              ids=a.file_reservation_ids)

    done = await call.run(renew)
    return RenewOut(renewed=len(done), file_reservations=[
        {"id": d.id, "path_pattern": d.path_pattern, "old_expires_ts": d.old_expires_ts,
         "new_expires_ts": d.new_expires_ts} for d in done])


async def release_file_reservations(call: Call, a: ReleaseArgs) -> ReleaseOut:
    role = role_of(a.agent_name, call.bind, "agent_name")

    def release(r: Replica) -> tuple[int, str]:
        return r.release_leases(a.project_key, role, paths=a.paths, ids=a.file_reservation_ids)

    n, at = await call.run(release)
    return ReleaseOut(released=n, released_at=at)


def _force(r: Replica, a: ForceReleaseArgs, role: str) -> ForceReleaseOut:
    before = r.lease(a.file_reservation_id)
    after = r.force_release(a.project_key, role, a.file_reservation_id, note=a.note)
    if before.status != "held":
        return ForceReleaseOut(released=0, released_at=before.released_ts, reservation=lease_out(after),
                               notified=False, already_released=True)
    notified = False
    if a.notify_previous and after.agent.lower() != role.lower():
        note = f"\n\nNote from {role}: {a.note}" if a.note else ""
        r.send_message(role, after.agent, f"[file-reservations] {role} released your lease on {after.path_pattern!r} "
                       f"in {after.project} (id {after.id}).{note}\n\nIf you still need it, take it again with "
                       "file_reservation_paths.")
        notified = True
    return ForceReleaseOut(released=1, released_at=after.released_ts, reservation=lease_out(after), notified=notified)


async def force_release_file_reservation(call: Call, a: ForceReleaseArgs) -> ForceReleaseOut:
    return await call.run(_force, a, role_of(a.agent_name, call.bind, "agent_name"))


def _list(r: Replica, a: ListReservationsArgs) -> ListReservationsOut:
    found = r.leases(a.project_key, a.agent_name, include_ended=a.include_released, limit=a.limit)
    lost = [x for x in found if x.status == "lost"]
    winners = {x.lost_to: r.lease(x.lost_to) for x in lost if x.lost_to is not None}
    return ListReservationsOut(file_reservations=[lease_out(x) for x in found], conflicts=[
        {"lost": lease_out(x), "winner": lease_out(winners[x.lost_to]) if x.lost_to in winners else None}
        for x in lost])


async def list_file_reservations(call: Call, a: ListReservationsArgs) -> ListReservationsOut:
    return await call.run(_list, a)


_ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False)
_SET = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
_DROP = ToolAnnotations(read_only_hint=False, destructive_hint=True)
_READ = ToolAnnotations(read_only_hint=True)

LEASE_TOOLS: tuple[ToolSpec[Any, Any], ...] = (
    ToolSpec("file_reservation_paths", "Reserve paths or globs of a project before editing them (advisory leases, "
             "fleet-wide); paths another role holds come back as conflicts with their holders.", ReserveArgs,
             ReservationOut, file_reservation_paths, _ADD),
    ToolSpec("renew_file_reservations", "Extend your live file reservations (all, or by paths or ids).",
             RenewArgs, RenewOut, renew_file_reservations, _SET),
    ToolSpec("release_file_reservations", "Release your file reservations (all, or by paths or ids).",
             ReleaseArgs, ReleaseOut, release_file_reservations, _DROP),
    ToolSpec("force_release_file_reservation", "Release another role's stale file reservation by id, and tell "
             "it by a message.", ForceReleaseArgs, ForceReleaseOut, force_release_file_reservation, _DROP),
    ToolSpec("list_file_reservations", "List file reservations (held and lost; optionally ended ones) and the "
             "conflicts settled between them.", ListReservationsArgs, ListReservationsOut,
             list_file_reservations, _READ),
)


class GuardArgs(Args):
    project_key: str = Field(description=_PROJECT)
    code_repo_path: str = Field(description="The git repository (its top folder) whose commits to guard.")
    format: str | None = Field(None, description=_UNUSED)


class GuardOut(Snake):
    hook: str = Field(description="The pre-commit hook written.")


def _install(r: Replica, a: GuardArgs) -> GuardOut:
    from pathlib import Path  # noqa: PLC0415

    from replica import InvalidArgument, guard  # noqa: PLC0415
    from replica.leasing import project_name  # noqa: PLC0415

    db = Path(r.path)
    if db.name != "replica.db":
        raise InvalidArgument("this server's replica is no home's (a file or memory): run peerd guard install")
    try:
        return GuardOut(hook=str(guard.install(Path(a.code_repo_path).expanduser(), project_name(a.project_key),
                                               str(db.parent))))
    except guard.GuardError as exc:
        raise InvalidArgument(str(exc)) from None


async def install_precommit_guard(call: Call, a: GuardArgs) -> GuardOut:
    return await call.run(_install, a)


LEASE_TOOLS = (*LEASE_TOOLS, ToolSpec(
    "install_precommit_guard", "Install a git pre-commit hook that refuses commits touching paths another role "
    "holds exclusively (set PEERD_ROLE to your role).", GuardArgs, GuardOut, install_precommit_guard, _SET))
