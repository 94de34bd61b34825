"""Where the messaging commands send their requests: the running daemon's local
API, or the replica file itself when no daemon runs for the home.

Invariants:
* Both backends return the same JSON-ready shapes (the local API's, which are
  ``replica.service``'s), so a command prints the same whichever answered; the
  offline one calls the same service, never the daemon's modules.
* ``inbox`` with ``wait`` waits with or without a daemon: offline on the replica's
  change feed (a file watch), never a sleep.
* The local API is on loopback: requests never go through a proxy named in the
  environment. An HTTP error becomes ``CliError`` with the daemon's message; a
  daemon that does not answer is exit code 3.
* A daemon counts as running only if the process named in ``daemon.json`` is
  alive; a file left by a crash sends commands to the replica file.
* Every request to the daemon carries the home's ``local.token`` as a bearer token (the
  daemon answers nobody else); a home is made owner-only as it is opened (``homes.tighten``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from peerd import home as homes
from peerd.cli.errors import EXIT_NO_DAEMON, EXIT_NO_HOME, CliError
from peerd.config import load_config
from replica import Replica, open_home
from replica.api import now_ms
from replica.feed import ChangeFeed
from replica.routing import DEFAULT_BROADCAST_HISTORY_MS
from replica.service import CLI_WORDS, Service

HTTP_TIMEOUT = 30.0

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Backend(Protocol):
    """What the messaging commands need; served by the daemon or by the replica directly."""

    live: bool  # a daemon answers (waits block there) rather than the replica file itself

    def send(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def message_status(self, message_id: str) -> dict[str, Any]: ...
    def inbox(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def read(self, receipts: list[str]) -> dict[str, Any]: ...
    def retract(self, message_id: str, sender: str) -> dict[str, Any]: ...
    def log(self, after: int | None, limit: int, wait: float) -> dict[str, Any]: ...
    def search(self, query: str, from_: str | None, channel: str | None, since: int | None,
               limit: int) -> dict[str, Any]: ...
    def threads(self) -> list[dict[str, Any]]: ...
    def profiles(self) -> list[dict[str, Any]]: ...
    def profile(self, oid: str) -> dict[str, Any] | None: ...
    def update_profile(self, oid: str, fields: dict[str, str]) -> dict[str, Any]: ...
    def close(self) -> None: ...


class DaemonBackend:
    """The running daemon's local API."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.live = True
        self.url = url
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             query: dict[str, Any] | None = None, timeout: float = HTTP_TIMEOUT) -> Any:
        qs = {k: v for k, v in (query or {}).items() if v is not None}
        full = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(qs)}" if qs else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(full, data=data, method=method, headers=self.headers)
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise CliError(_http_error_detail(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise CliError(f"the daemon at {self.url} did not answer ({exc}); is it still running?",
                           EXIT_NO_DAEMON) from None

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/send", body))

    def message_status(self, message_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/api/messages/{urllib.parse.quote(message_id, safe='')}/status"))

    def inbox(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/check", body, timeout=HTTP_TIMEOUT + float(body.get("wait") or 0)))

    def read(self, receipts: list[str]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/read", {"receiptIds": receipts}))

    def retract(self, message_id: str, sender: str) -> dict[str, Any]:
        return dict(self.call("POST", "/api/retract", {"messageId": message_id, "from": sender}))

    def log(self, after: int | None, limit: int, wait: float) -> dict[str, Any]:
        return dict(self.call("GET", "/api/messages", query={"after": after, "limit": limit, "wait": wait or None},
                              timeout=HTTP_TIMEOUT + wait))

    def search(self, query: str, from_: str | None, channel: str | None, since: int | None,
               limit: int) -> dict[str, Any]:
        return dict(self.call("GET", "/api/search", query={"q": query, "from": from_, "channel": channel,
                                                            "since": since, "limit": limit}))

    def threads(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/api/threads"))

    def profiles(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/api/profiles"))

    def profile(self, oid: str) -> dict[str, Any] | None:
        out = self.call("GET", f"/api/profiles/{urllib.parse.quote(oid, safe='')}")
        return None if out is None else dict(out)

    def update_profile(self, oid: str, fields: dict[str, str]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/profiles", {"orchestratorId": oid, **fields}))

    def close(self) -> None:
        pass


def _http_error_detail(exc: urllib.error.HTTPError) -> str:
    """The ``error`` of the daemon's JSON answer, else the HTTP reason."""
    with exc:
        raw = exc.read()
    try:
        return str(json.loads(raw or b"{}").get("error", exc.reason))
    except (ValueError, AttributeError):
        return str(exc.reason)


class OfflineBackend:
    """The replica file itself, when no daemon runs (a daemon started later pushes what we wrote)."""

    def __init__(self, home: Path) -> None:
        self.live = False
        self.rep: Replica = open_home(home, broadcast_history_ms=_history_ms(home))
        self.svc = Service(self.rep, CLI_WORDS)

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.svc.send(body["from"], body["channel"], body["content"], instance=body.get("instanceId"),
                             from_instance=body.get("fromInstanceId")).wire()

    def message_status(self, message_id: str) -> dict[str, Any]:
        return self.svc.status(message_id)

    def inbox(self, body: dict[str, Any]) -> dict[str, Any]:
        """A page of the inbox; with ``wait``, block (on the replica's change feed: a file watch,
        so a write by any process wakes it) until something arrives or the time is up."""
        def look() -> dict[str, Any]:
            return self.svc.inbox(body["recipient"], body.get("recipientInstanceId"), body.get("since"),
                                  body.get("limit", 50), include_read=bool(body.get("all")), now_ms=now_ms())

        wait = float(body.get("wait") or 0)
        if wait <= 0:
            return look()
        return wait_offline(self.rep, look, wait)

    def read(self, receipts: list[str]) -> dict[str, Any]:
        return self.svc.mark(receipts).wire()

    def retract(self, message_id: str, sender: str) -> dict[str, Any]:
        return self.svc.retract(message_id, sender)

    def log(self, after: int | None, limit: int, wait: float) -> dict[str, Any]:
        return self.svc.log(after, limit)

    def search(self, query: str, from_: str | None, channel: str | None, since: int | None,
               limit: int) -> dict[str, Any]:
        return self.svc.search(query, from_=from_, channel=channel, since=since, limit=limit)

    def threads(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.rep.list_threads()]

    def profiles(self) -> list[dict[str, Any]]:
        return self.svc.profiles()

    def profile(self, oid: str) -> dict[str, Any] | None:
        return self.svc.profile(oid)

    def update_profile(self, oid: str, fields: dict[str, str]) -> dict[str, Any]:
        return self.svc.update_profile(oid, fields.get("name"), fields.get("static"), fields.get("dynamic"))

    def close(self) -> None:
        self.rep.close()


def wait_offline(rep: Replica, look: Callable[[], dict[str, Any]], wait: float) -> dict[str, Any]:
    """``look()`` until it finds messages or ``wait`` seconds pass, looking again after each change
    the replica's feed reports (its file watch sees every process's commits); the mark is taken
    before each look, so a change between the look and the wait is never missed."""
    feed = ChangeFeed.watching(rep)
    changed = threading.Event()
    unsubscribe = feed.subscribe(changed.set)
    deadline = time.monotonic() + wait
    warning = None  # the first look's: a role never seen is known once it has looked
    try:
        while True:
            changed.clear()
            out = look()
            warning = warning or out.get("warning")
            left = deadline - time.monotonic()
            if out["messages"] or left <= 0:
                return {**out, "warning": warning}
            changed.wait(left)
    finally:
        unsubscribe()
        feed.close()


def _history_ms(home: Path) -> int:
    """The home's broadcast history (config.toml), so that every process on one replica agrees."""
    path = homes.config_path(home)
    return load_config(path).broadcast_history_ms if path.exists() else DEFAULT_BROADCAST_HISTORY_MS


def for_home(info: dict[str, Any], home: Path) -> DaemonBackend:
    """The local API of the daemon ``info`` (its daemon.json) describes, as the home's owner."""
    return DaemonBackend(str(info["local_url"]), {**homes.auth_headers(home), homes.CLIENT_HEADER: "cli"})


def opened(home: Path) -> Path:
    """``home``, made owner-only first if it is a peerd home (the CLI opening it)."""
    homes.tighten(home)
    return home


def running_daemon(home: Path) -> dict[str, Any] | None:
    """daemon.json of this home if its process is alive (a file left by a crash does not count)."""
    info = homes.read_daemon_json(home)
    if info is None or not homes.pid_alive(info.get("pid")) or not isinstance(info.get("local_url"), str):
        return None
    return info


def daemon(home: Path, flag: str = "") -> DaemonBackend:
    """The running daemon of ``home``; exit code 3 if there is none, 4 if the home itself does not
    exist (never a hint to start one there) (``flag``: the ``--home`` for hints)."""
    info = running_daemon(opened(home))
    if info is None and not _initialised(home):  # a typo: starting a daemon there would make a new fleet
        raise CliError(f"no peerd home at {home}: nothing runs or was ever set up there; check --home or "
                       "PEERD_HOME (the home of your node holds config.toml and replica.db)", EXIT_NO_HOME)
    if info is None:
        raise CliError(f"no daemon is running for {home} (start one with: peerd run{flag})", EXIT_NO_DAEMON)
    return for_home(info, home)


def _initialised(home: Path) -> bool:
    return homes.replica_path(home).exists() or homes.config_path(home).exists()


@contextlib.contextmanager
def backend(home: Path, flag: str = "") -> Iterator[Backend]:
    """The daemon if one runs for this home, else the replica file (which must exist);
    ``flag`` is the ``--home`` hints repeat."""
    info = running_daemon(opened(home))
    if info is not None:
        yield for_home(info, home)
        return
    if not _initialised(home):
        raise CliError(f"no peerd home at {home} (create one with: peerd init{flag}, or give the home of "
                       "your node with --home)", EXIT_NO_HOME)
    off = OfflineBackend(home)
    try:
        yield off
    finally:
        off.close()
