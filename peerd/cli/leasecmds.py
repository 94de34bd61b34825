"""``peerd guard`` (install the git pre-commit guard, or run its check), ``peerd leases`` (file
reservations held and lost) and ``peerd acks`` (acknowledgements overdue).

Invariants:
* ``guard check`` reads the replica file alone (``replica.guard``): no daemon, no network, no node
  key; it loads nothing heavier than sqlite3, as it runs on every commit. It exits 0 when nothing
  blocks, 1 naming each blocked path's holder, reason and expiry.
* The committing role is ``--role``, else ``PEERD_ROLE``; with neither, every exclusive lease
  blocks and the refusal says how to set the role.
* ``leases`` and ``acks`` read the home's replica directly, with or without a daemon.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from peerd import home as homes
from peerd.cli.errors import EXIT_USAGE, CliError
from peerd.cli.replicafile import emit, open_replica

# -- peerd guard --------------------------------------------------------------------------------


def cmd_guard_check(args: argparse.Namespace) -> int:
    from replica import guard  # noqa: PLC0415

    role = args.role or os.environ.get(guard.ROLE_ENV) or None
    try:
        paths = list(args.paths) or guard.staged(Path.cwd())
        blocks = guard.blocking(homes.replica_path(homes.resolve_home(args.home)), args.project, paths, role,
                                time.time_ns() // 1_000_000)
    except guard.GuardError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        emit(args, {"project": args.project, "role": role, "blocked": [b.__dict__ for b in blocks]}, "")
    elif blocks:
        print(guard.explain(blocks, role, args.project), file=sys.stderr, flush=True)
    return 1 if blocks else 0


def cmd_guard_install(args: argparse.Namespace) -> int:
    from replica import guard  # noqa: PLC0415
    from replica.leasing import project_name  # noqa: PLC0415

    repo = Path(args.repo).resolve()
    try:
        project = project_name(args.project or repo.name)
        hook = guard.install(repo, project, args.home, force=args.force)
    except guard.GuardError as exc:
        raise CliError(str(exc)) from None
    emit(args, {"hook": str(hook), "project": project},
          f"installed the peerd guard for project {project!r} at {hook}\n"
          f"commits touching paths another role holds exclusively are refused; set {guard.ROLE_ENV} to your role; "
          f"bypass with {guard.BYPASS_ENV}=1 or git commit --no-verify")
    return 0


# -- peerd leases, peerd acks -------------------------------------------------------------------


def cmd_leases(args: argparse.Namespace) -> int:
    with open_replica(args) as rep:
        found = [x.__dict__ for x in rep.leases(args.project, args.role, include_ended=args.all)]
    rows = [f"{x['status']:<8} {x['agent']:<16} {x['project']}:{x['path_pattern']}  until {x['expires_ts']}"
            + (f"  lost to {x['lost_to_agent']} ({x['lost_to']})" if x["lost_to"] else "")
            + (f"  ({x['reason']})" if x["reason"] else "") for x in found]
    emit(args, found, "\n".join(rows) if rows else "no file reservations")
    return 0


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str) -> int:
    """Seconds from ``90``, ``45s``, ``30m``, ``2h``, ``1d`` (0 allowed); CliError saying why not."""
    found = re.fullmatch(r"\s*(\d{1,9})\s*([smhd]?)\s*", text.lower())
    if found is None:
        raise CliError(f"not a duration: {text!r} (say 45s, 30m, 2h or 1d)", EXIT_USAGE)
    return int(found[1]) * _UNITS[found[2]]


def cmd_acks(args: argparse.Namespace) -> int:
    wait_s = seconds(args.older_than)
    with open_replica(args) as rep:
        found = rep.overdue_acks(wait_s, sender=args.sender)
    data = [{**o.__dict__, "waiting_for": [w.to_dict() for w in o.waiting_for]} for o in found]
    rows = [f"{o.message_id}  from {o.sender} to {o.channel}, {o.age_seconds} s ago: waiting for "
            + ", ".join(w.role + (f"/{w.instance}" if w.instance else "") for w in o.waiting_for) for o in found]
    emit(args, data, "\n".join(rows) if rows else f"no acknowledgement overdue (older than {args.older_than})")
    return 0


def guard_arguments(s: argparse.ArgumentParser) -> None:
    from peerd.cli.parser import Parser, global_options  # noqa: PLC0415 - the parser loads this module

    common = Parser(add_help=False)
    global_options(common, argparse.SUPPRESS)
    s.set_defaults(fn=cmd_guard_check)  # each verb sets its own; a verb is required
    verbs = s.add_subparsers(dest="verb", required=True, metavar="VERB")
    v = verbs.add_parser("install", parents=[common], help="write the git pre-commit hook of a repository")
    v.add_argument("--repo", default=".", help="the repository (default: the current folder)")
    v.add_argument("--project", help="the project its paths belong to (default: the repository's folder name)")
    v.add_argument("--force", action="store_true", help="replace a pre-commit hook that is not peerd's")
    v.set_defaults(fn=cmd_guard_install)
    v = verbs.add_parser("check", parents=[common], help="exit 1 if a staged path is reserved by another role")
    v.add_argument("--project", required=True, help="the project the repository's paths belong to")
    v.add_argument("--role", help="the committing role (default: $PEERD_ROLE)")
    v.add_argument("paths", nargs="*", help="paths to check (default: what is staged in the current repository)")
    v.set_defaults(fn=cmd_guard_check)


def leases_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--project", help="only this project")
    s.add_argument("--role", help="only this role's leases")
    s.add_argument("--all", action="store_true", help="also released, forced and expired leases")
    s.set_defaults(fn=cmd_leases)


def acks_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--older-than", default="1h", help="how long an acknowledgement may take (default 1h)")
    s.add_argument("--sender", help="only messages this role sent")
    s.set_defaults(fn=cmd_acks)
