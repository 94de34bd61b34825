"""The git pre-commit guard: which staged paths another role holds exclusively, read from the replica
file alone, and the hook that asks it.

Invariants:
* ``blocking`` reads the replica file with nothing but sqlite3 (read-only, never created): no
  daemon, no network, no signing keys; a file of a schema before leases blocks nothing.
* A path is blocked by a lease that holds now (not lost, not ended, not expired on this machine's
  clock), is exclusive, covers the path (``leases.covers``), and is held by another role than the
  committer's; with no committer role, by any role.
* The hook is a small POSIX shell script marked as peerd's (``HOOK_MARK``): install never
  overwrites a hook that is not peerd's (unless forced), and the script honours the bypass
  variable (``BYPASS_ENV``) before it runs anything; ``git commit --no-verify`` skips it as git does.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from replica import leases as rules
from replica.errors import LocalError
from replica.hlc import pack, to_iso
from replica.mailbox import connect, schema_version
from replica.names import name_key

ROLE_ENV = "PEERD_ROLE"
BYPASS_ENV = "PEERD_GUARD_BYPASS"
HOOK_MARK = "# peerd guard: pre-commit hook"
LEASES_SCHEMA = 9


class GuardError(LocalError):
    """The guard cannot be installed or run as asked (no git repository, a foreign hook...)."""


@dataclass(frozen=True)
class Block:
    path: str
    lease_id: str
    holder: str
    pattern: str
    reason: str
    expires: str


def blocking(db: Path, project: str, paths: list[str], role: str | None, now_ms: int) -> list[Block]:
    """The staged ``paths`` (relative to the repository's top) that leases block (module docstring)."""
    if not db.exists():
        return []
    conn = connect(db)
    try:
        cur = conn.cursor()
        if schema_version(cur) < LEASES_SCHEMA:
            return []
        me = None if role is None else name_key(role)
        out = []
        for path in paths:
            heads = rules.prefixes(path)  # a lease covers a path only if the path starts with its prefix
            marks = ", ".join("?" * len(heads))
            rows = cur.execute("SELECT id, rkey, role, pattern, reason, until FROM leases INDEXED BY leases_by_prefix"
                               " WHERE pkey = ?"
                               f" AND prefix IN ({marks}) AND until > ? AND lost_to IS NULL AND exclusive = 1"
                               " ORDER BY hlc, origin, seq", (name_key(project), *heads, now_ms)).fetchall()
            hit = next((r for r in rows if r[1] != me and rules.covers(r[3], path)), None)
            if hit is not None:
                out.append(Block(path, hit[0], hit[2], hit[3], hit[4], to_iso(pack(int(hit[5])))))
    except sqlite3.Error as exc:
        raise GuardError(f"cannot read the replica {db}: {exc}") from None
    finally:
        conn.close()
    return out


def explain(blocks: list[Block], role: str | None, project: str) -> str:
    """What the hook prints when it refuses a commit."""
    lines = [f"peerd guard: commit refused: {len(blocks)} staged path(s) of project {project!r} are reserved "
             "exclusively by " + ("another role" if role else "a role") + ":"]
    for b in blocks:
        why = f", reason: {b.reason}" if b.reason else ""
        lines.append(f"  {b.path}  held by {b.holder} ({b.pattern!r}, until {b.expires}{why}; id {b.lease_id})")
    if role is None:
        lines.append(f"No role is set, so every exclusive reservation blocks: set {ROLE_ENV}=<your role> "
                     "(your own reservations then let your commits through).")
    lines.append(f"Coordinate with the holder, wait for the expiry, or bypass: {BYPASS_ENV}=1 git commit ... "
                 "(or git commit --no-verify).")
    return "\n".join(lines)


def staged(repo: Path) -> list[str]:
    """The paths a commit in ``repo`` would touch (added, changed, deleted; both sides of a rename)."""
    out = _git(repo, "diff", "--cached", "--name-only", "--no-renames", "-z")
    return [p for p in out.split("\0") if p]


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise GuardError(f"cannot run git: {exc}") from None
    if done.returncode != 0:
        raise GuardError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout


def hooks_dir(repo: Path) -> Path:
    """Where git runs this repository's hooks from (``core.hooksPath`` and worktrees respected)."""
    path = Path(_git(repo, "rev-parse", "--git-path", "hooks").strip())
    return path if path.is_absolute() else (repo / path).resolve()


def hook_script(project: str, home: str | None, command: list[str]) -> str:
    """The pre-commit hook's text: the bypass, then ``peerd guard check`` on this project."""
    argv = [*command, "guard", "check", "--project", project, *(["--home", home] if home else [])]
    return "\n".join([
        "#!/bin/sh", HOOK_MARK,
        f"# Refuses a commit touching paths another role holds exclusively in project {project!r}.",
        f"# Your role: {ROLE_ENV}. Bypass: {BYPASS_ENV}=1 git commit ..., or git commit --no-verify.",
        f'case "${{{BYPASS_ENV}:-}}" in 1|true|yes) echo "peerd guard: bypassed ({BYPASS_ENV})" >&2; exit 0;; esac',
        "exec " + " ".join(shlex.quote(a) for a in argv) + "", ""])


def peerd_command() -> list[str]:
    """How the hook runs peerd: this interpreter and its peerd (whatever PATH the commit has)."""
    return [sys.executable, "-c", "import sys; from peerd.cli import main; sys.exit(main())"]


def install(repo: Path, project: str, home: str | None, *, force: bool = False) -> Path:
    """Write the pre-commit hook of ``repo``; the hook's path."""
    hook = hooks_dir(repo) / "pre-commit"
    if hook.exists() and HOOK_MARK not in hook.read_text(errors="replace") and not force:
        raise GuardError(f"{hook} is another pre-commit hook: not replaced (move it away, or force)")
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(hook_script(project, home, peerd_command()))
    os.chmod(hook, 0o755)
    return hook
