"""The baseline release (0.1.0, commit ``45fb640``) built from this repository's history, and
what the tests do on a daemon of it.

Usage::

    def test_x(fleet: Fleet, baseline_peerd: Path) -> None:
        old = fleet.add("old", executable=baseline_peerd)   # a 0.1.0 daemon
        new = fleet.add("new")                               # the current code
        ...
        BaselineApi(old).send("alice", "bob", "hi")          # 0.1.0's local API and MCP tools
        CurrentApi(new).inbox("bob")                         # the same calls, on the current code

Building (``build_baseline``, behind the session fixture ``baseline_peerd``):
``git archive COMMIT | tar -x`` into ``.baseline/<full commit id>/`` at the top of the
checkout (ignored by git), then ``uv sync --frozen --no-dev --no-editable`` there (its own
``.venv``, no Python downloads). The folder outlives the test run, so a developer builds
once; a fresh clone has none and builds it. ``--no-editable`` installs 0.1.0 as its wheel
would be, so the daemon never reads the extracted sources.

Invariants:
- One build per commit, whatever the number of test processes (pytest-xdist workers): the
  build runs under an exclusive ``fcntl.flock`` on ``.baseline/<commit>.lock``; the file
  ``.baseline/<commit>/complete`` is written last, and a folder without it (an interrupted
  build) is removed and built again. A build whose interpreter has gone is built again too.
- A baseline that cannot be had (the commit missing from a shallow clone, no git, a failed
  ``uv sync``, an executable that would import other code than its own) fails the test with
  a message saying why and what to do; it is never skipped.
- Every call the tests make in 0.1.0's vocabulary (local API paths and JSON fields, MCP tool
  names and arguments) is in ``BaselineApi``; ``CurrentApi`` makes the same calls on the
  current code (the harness's ``Daemon`` methods, which follow the current local API), so a
  later change of the current API changes ``CurrentApi`` only. Both return the same plain
  values (``Mail``, ``Receipt``, dicts), which tests compare across versions.
- Test modules load the fixture with ``pytest_plugins = ["tests.baseline"]`` after importing
  this module, so pytest is told not to rewrite it: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from replica import open_home
from replica.core import iso as iso_ms
from tests.daemons import Daemon, read_only
from tests.localclient import mcp_client

BASELINE_COMMIT = "45fb640"
BASELINE_VERSION = "0.1.0"
BASELINE_SCHEMA = 6  # the replica schema version 0.1.0 writes and the newest it opens
ROOT = Path(__file__).resolve().parents[1]
BUILDS = ROOT / ".baseline"
COMPLETE = "complete"


class BaselineUnavailable(Exception):
    """The baseline release cannot be built here; the message says why and what to do."""


# -- building -------------------------------------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def resolve_commit(commit: str = BASELINE_COMMIT) -> str:
    """The full id of ``commit`` in this checkout's history; ``BaselineUnavailable`` if it is not there."""
    try:
        found = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except FileNotFoundError:
        raise BaselineUnavailable("git is not installed: the baseline is built from the repository's history") from None
    if found.returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true"
        what = ("this clone is shallow: fetch the full history (git fetch --unshallow)" if shallow else
                "it is not in this checkout's history: fetch it from the repository (git fetch origin)")
        raise BaselineUnavailable(f"the baseline release {BASELINE_VERSION} (commit {commit}) cannot be built, "
                                  f"since {what}, and run the tests again")
    return found.stdout.decode().strip()


def _run(argv: list[str], what: str, **kwargs: Any) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, check=False, **kwargs)
    except FileNotFoundError:
        raise BaselineUnavailable(f"building the baseline {BASELINE_VERSION}: {argv[0]} is not installed") from None
    if done.returncode != 0:
        out = (done.stdout + done.stderr).decode(errors="replace").strip()[-3000:]
        raise BaselineUnavailable(f"building the baseline {BASELINE_VERSION}: {what} failed "
                                  f"(exit code {done.returncode}):\n{out}")


def _uv_env() -> dict[str, str]:
    """Our environment for the baseline's ``uv sync``: its own venv, never ours, no downloads of Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def _extract(commit: str, into: Path) -> None:
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert archive.stdout is not None
    with archive.stdout:
        untar = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, capture_output=True, check=False)
    assert archive.stderr is not None
    with archive.stderr:
        archive_err = archive.stderr.read()
    if archive.wait() != 0 or untar.returncode != 0:
        out = (archive_err + untar.stderr).decode(errors="replace").strip()
        raise BaselineUnavailable(f"building the baseline {BASELINE_VERSION}: git archive {commit} | tar -x failed:\n{out}")


def _check_own_code(folder: Path) -> None:
    """The built executable imports the baseline's code, not ours (a PYTHONPATH would put ours first)."""
    python = folder / ".venv" / "bin" / "python"
    done = subprocess.run([str(python), "-c", "import replica; print(replica.__file__)"], capture_output=True,
                          check=False, cwd=folder.parent)
    where = done.stdout.decode().strip()
    if done.returncode != 0 or not Path(where).is_relative_to(folder):
        raise BaselineUnavailable(f"the baseline's Python imports {where or done.stderr.decode()!r}, not its own "
                                  f"code under {folder}: unset PYTHONPATH and run the tests again")


def _built(folder: Path) -> bool:
    venv = folder / ".venv" / "bin"
    return all(p.exists() for p in (folder / COMPLETE, venv / "python", venv / "peerd"))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield


def build_baseline(commit: str = BASELINE_COMMIT, builds: Path = BUILDS) -> Path:
    """The baseline's ``peerd`` executable, built now unless a complete build of ``commit`` exists."""
    full = resolve_commit(commit)
    folder = builds / full
    with _locked(builds / f"{full}.lock"):
        if not _built(folder):
            if folder.exists():  # an interrupted build
                shutil.rmtree(folder)
            _extract(full, folder)
            _run(["uv", "sync", "--frozen", "--no-dev", "--no-editable", "--quiet"], "uv sync", cwd=folder,
                 env=_uv_env())
            (folder / COMPLETE).write_text(f"{BASELINE_VERSION} {full}\n")
    _check_own_code(folder)
    return folder / ".venv" / "bin" / "peerd"


@pytest.fixture(scope="session")
def baseline_peerd() -> Path:
    """The baseline release's ``peerd`` (built once per commit; a failure fails the test, never skips it)."""
    try:
        return build_baseline()
    except BaselineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


# -- what the tests do on a daemon, in each release's vocabulary -------------------------------------


@dataclass(frozen=True)
class Mail:
    """One message of an inbox."""

    id: str
    sender: str
    channel: str
    content: str
    receipt_id: str


@dataclass(frozen=True)
class Receipt:
    """One recipient's state of a message, as its sender sees it."""

    role: str
    instance: str | None
    delivered: bool
    read: bool


LOG_LIMIT = 1000  # the most one local API page holds: the tests' replicas hold fewer messages


class BaselineApi:
    """A daemon of 0.1.0, through its local API and MCP tools as 0.1.0 names them."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.daemon.name!r})"

    # -- the local API --------------------------------------------------------------------------

    def _api(self, method: str, path: str, body: Any = None) -> Any:
        return self.daemon.api(method, path, body)

    def send(self, sender: str, channel: str, content: str, *, instance: str | None = None) -> str:
        """Send; returns the message id."""
        body = {"from": sender, "channel": channel, "content": content, "instanceId": instance}
        return str(self._api("POST", "/api/send", body)["id"])

    def inbox(self, role: str) -> list[Mail]:
        """``role``'s unread messages, oldest first (recording their delivery)."""
        out = self._api("POST", "/api/check", {"recipient": role, "limit": LOG_LIMIT})
        return [_mail(m) for m in out["messages"]]

    def mark_read(self, receipt_ids: list[str]) -> int:
        return int(self._api("POST", "/api/read", {"receiptIds": receipt_ids})["marked"])

    def receipts(self, message_id: str) -> list[Receipt]:
        return [_receipt(r) for r in self._api("GET", f"/api/messages/{message_id}/status")]

    def has_message(self, message_id: str) -> bool:
        status, _ = self.daemon.call("GET", f"/api/messages/{message_id}/status")
        return status == 200

    def digest(self) -> str:
        return str(self._api("GET", "/api/digest")["digest"])

    def counter(self, name: str) -> int:
        """One of the daemon's counters (``refused``, ``rounds``, ...)."""
        return int(self._api("GET", "/api/status")["counters"][name])

    def reaches(self, other: Daemon) -> bool:
        """Whether this daemon's peer table has ``other`` reachable."""
        short = other.node_id[:16]
        return any(p["node_id"] == short and p["reachable"] for p in self._api("GET", "/api/peers"))

    def profile(self, role: str) -> dict[str, Any] | None:
        """A profile's name, static and dynamic objects, or None."""
        p = self._api("GET", f"/api/profiles/{role}")
        return None if p is None else {"name": p["name"], "static": p["static"], "dynamic": p["dynamic"]}

    def threads(self) -> dict[str, dict[str, Any]]:
        """Thread id -> participants (names, sorted) and message count."""
        return {t["thread_id"]: {"participants": sorted(t["participants"]), "messages": t["message_count"]}
                for t in self._api("GET", "/api/threads")}

    def visible_state(self, *, local: bool = False) -> dict[str, Any]:
        """What the local API shows of the replica, read only: every message with the state of each
        recipient, every profile, every thread. With ``local``, messages keep their local arrival
        numbers and order (the same replica before and after an upgrade); without, they are by id
        (different replicas number them differently)."""
        messages = [_logged(m, local=local) for m in self._log()]
        return {
            "messages": messages if local else sorted(messages, key=lambda m: m["id"]),
            "profiles": self._profiles(),
            "threads": sorted(([t["thread_id"], sorted(t["participants"]), t["message_count"], t["latest_activity"]]
                               for t in self._api("GET", "/api/threads")), key=lambda t: t[0]),
        }

    def _log(self) -> list[dict[str, Any]]:
        """The log with each recipient's state, in 0.1.0's names."""
        log = self._api("GET", f"/api/messages?limit={LOG_LIMIT}&receipts=1")["messages"]
        assert len(log) < LOG_LIMIT, "more messages than one page: raise LOG_LIMIT"
        return list(log)

    def _profiles(self) -> list[dict[str, Any]]:
        return [_profile(p) for p in self._api("GET", "/api/profiles")]

    # -- MCP tools (VantagePeers' and AgentMsgs' names) ---------------------------------------------

    def _tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return call_tool(self.daemon.info["mcp_url"], name, args, self.daemon.token)

    def set_profile(self, role: str, name: str, static: dict[str, Any] | None = None,
                    dynamic: dict[str, Any] | None = None) -> None:
        """Set a profile's name and the given keys of its static and dynamic objects."""
        fields = {"static": static, "dynamic": dynamic}
        self._tool("update_profile", {"orchestratorId": role, "name": name,
                                      **{k: v for k, v in fields.items() if v is not None}})

    def create_thread(self, agents: list[str]) -> str:
        """Register ``agents`` and start a thread between them; returns its id."""
        for agent in agents:
            self._tool("create_agent", {"name": agent})
        return str(self._tool("create_thread", {"participant_names": agents})["thread_id"])

    def append(self, thread_id: str, sender: str, content: str) -> int:
        return int(self._tool("append", {"thread_id": thread_id, "sender_name": sender, "content": content})["seq"])

    def thread_messages(self, thread_id: str) -> list[tuple[str, str]]:
        """(sender, content) of a thread's messages, in this replica's thread order."""
        out = self._tool("poll", {"thread_id": thread_id, "after_seq": 0})
        return [(m["sender"], m["content"]) for m in out["messages"]]


class CurrentApi(BaselineApi):
    """A daemon of the current code: the local API through the harness's ``Daemon`` methods (which
    follow the current API); the rest is asked as 0.1.0 asked it until the current code differs
    (then override it here). MCP tool names are VantagePeers' and AgentMsgs', kept by both."""

    def send(self, sender: str, channel: str, content: str, *, instance: str | None = None) -> str:
        extra = {} if instance is None else {"instanceId": instance}
        return str(self.daemon.send(sender, channel, content, **extra)["messageId"])

    def inbox(self, role: str) -> list[Mail]:
        return [Mail(m["messageId"], m["from"], m["channel"], m["content"], m["receiptId"])
                for m in self.daemon.check(role, limit=LOG_LIMIT)["messages"]]

    def mark_read(self, receipt_ids: list[str]) -> int:
        return self.daemon.mark_read(receipt_ids)

    def receipts(self, message_id: str) -> list[Receipt]:
        return [Receipt(r["role"], r["instanceId"], r["deliveredAt"] is not None, r["readAt"] is not None)
                for r in self.daemon.message_status(message_id)]

    def profile(self, role: str) -> dict[str, Any] | None:
        """The stored name, static and dynamic objects (the local API now shows VantagePeers' names and
        defaults, as MCP does: read from the replica file, as 0.1.0's API showed them)."""
        with open_home(self.daemon.home) as r:
            p = r.get_profile(role)
        return None if p is None else {"name": p.name, "static": p.static, "dynamic": p.dynamic}

    def _log(self) -> list[dict[str, Any]]:
        """The current API speaks the one vocabulary: its log in 0.1.0's names."""
        return [_as_0_1(m) for m in super()._log()]

    def _profiles(self) -> list[dict[str, Any]]:
        """Profiles as stored (read from the replica file, see ``profile``)."""
        with open_home(self.daemon.home) as r:
            return [_profile(p.to_dict()) for p in r.list_profiles()]


def _mail(m: dict[str, Any]) -> Mail:
    return Mail(m["id"], m["sender"], m["channel"], m["content"], m["receipt_id"])


def _receipt(r: dict[str, Any]) -> Receipt:
    return Receipt(r["role"], r["instance"], r["delivered_at"] is not None, r["read_at"] is not None)


_MESSAGE_FIELDS = ("id", "sender", "sender_instance", "channel", "target_instance", "thread", "content", "created")
_RECIPIENT_FIELDS = ("role", "instance", "receipt_id", "delivered_at", "read_at")
_PROFILE_FIELDS = ("orchestrator_id", "instance_id", "name", "static", "dynamic", "created", "updated")


def _logged(m: dict[str, Any], *, local: bool) -> dict[str, Any]:
    """A message of the log as the tests compare it: the fields 0.1.0 shows (a newer release may show more)."""
    out = {k: m[k] for k in _MESSAGE_FIELDS}
    if local:
        out["seq"] = m["seq"]
    out["recipients"] = sorted(([r[k] for k in _RECIPIENT_FIELDS] for r in m["recipients"]), key=repr)
    return out


def _as_0_1(m: dict[str, Any]) -> dict[str, Any]:
    """A log message of the current API (``replica.wire.log_view``) in 0.1.0's names and forms."""
    def iso(ms: int | None) -> str | None:
        return None if ms is None else iso_ms(ms)

    recipients = [{"role": r["role"], "instance": r["instanceId"], "receipt_id": r["receiptId"],
                   "delivered_at": iso(r["deliveredAt"]), "read_at": iso(r["readAt"])} for r in m["recipients"]]
    return {"id": m["messageId"], "sender": m["from"], "sender_instance": m["fromInstanceId"],
            "channel": m["channel"], "target_instance": m["instanceId"], "thread": m["threadId"],
            "content": m["content"], "created": iso_ms(m["createdAt"]), "seq": m["seq"], "recipients": recipients}


def _profile(p: dict[str, Any]) -> dict[str, Any]:
    return {k: p[k] for k in _PROFILE_FIELDS}


def call_tool(mcp_url: str, name: str, args: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    """One MCP tool call over streamable HTTP (with the home's token, when the daemon has one: the
    baseline release's has none), from synchronous test code; its structured result."""

    async def call() -> dict[str, Any]:
        async with mcp_client(mcp_url, token) as client:
            result = await client.call_tool(name, args)
        assert not result.is_error, f"{name}({args}) at {mcp_url}: {result.content}"
        assert isinstance(result.structured_content, dict), result
        return result.structured_content

    return asyncio.run(call())


def schema_version(db: Path) -> int:
    """The schema version a replica file says it has (read only)."""
    with read_only(db) as conn:
        row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    return int(row[0])


def contents(db: Path) -> list[str]:
    """Every table and row of a replica file, as SQL text (read only): equal lists, equal replicas."""
    with read_only(db) as conn:
        return list(conn.iterdump())
