"""Where the messaging commands send their requests: the running daemon's local
API, or the replica file itself when no daemon runs for the home.

Invariants:
* Both backends return the same JSON-ready shapes (the local API's), so a
  command prints the same whichever answered; the offline one gets them from
  ``Replica`` methods and their ``to_dict()``, never from the daemon's modules.
* The local API is on loopback: requests never go through a proxy named in the
  environment. An HTTP error becomes ``CliError`` with the daemon's message; a
  daemon that does not answer is exit code 3.
* A daemon counts as running only if the process named in ``daemon.json`` is
  alive; a file left by a crash sends commands to the replica file.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from peerd import home as homes
from peerd.cli.errors import EXIT_NO_DAEMON, EXIT_NO_HOME, CliError
from peerd.config import load_config
from replica import Replica, open_home
from replica.routing import DEFAULT_BROADCAST_HISTORY_MS

HTTP_TIMEOUT = 30.0

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Backend(Protocol):
    """What the messaging commands need; served by the daemon or by the replica directly."""

    live: bool  # a daemon answers (waits block there) rather than the replica file itself

    def send(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def message_status(self, message_id: str) -> list[dict[str, Any]]: ...
    def inbox(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def read(self, receipts: list[str]) -> dict[str, Any]: ...
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

    def __init__(self, url: str) -> None:
        self.live = True
        self.url = url

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             query: dict[str, Any] | None = None, timeout: float = HTTP_TIMEOUT) -> Any:
        qs = {k: v for k, v in (query or {}).items() if v is not None}
        full = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(qs)}" if qs else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(full, data=data, method=method, headers={"Content-Type": "application/json"})
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

    def message_status(self, message_id: str) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/api/messages/{urllib.parse.quote(message_id, safe='')}/status"))

    def inbox(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/check", body, timeout=HTTP_TIMEOUT + float(body.get("wait") or 0)))

    def read(self, receipts: list[str]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/read", {"receiptIds": receipts}))

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

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        check = self.rep.recipient_check(body["channel"])
        sent = self.rep.send_message(body["from"], body["channel"], body["content"], body.get("instanceId"),
                                     body.get("fromInstanceId"))
        return {**sent.to_dict(), **check.to_dict()}

    def message_status(self, message_id: str) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.rep.message_status(message_id)]

    def inbox(self, body: dict[str, Any]) -> dict[str, Any]:
        read = self.rep.inbox_all if body.get("all") else self.rep.check_messages
        return read(body["recipient"], body.get("recipientInstanceId"), body.get("since"),
                    body.get("limit", 50)).to_dict()

    def read(self, receipts: list[str]) -> dict[str, Any]:
        return {"marked": self.rep.mark_as_read(receipts)}

    def log(self, after: int | None, limit: int, wait: float) -> dict[str, Any]:
        return self.rep.message_log(after, limit).to_dict()

    def search(self, query: str, from_: str | None, channel: str | None, since: int | None,
               limit: int) -> dict[str, Any]:
        hits = self.rep.search_messages(query, from_=from_, channel=channel, since=since, limit=limit)
        return {"query": query, "hits": [h.to_dict() for h in hits]}

    def threads(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.rep.list_threads()]

    def profiles(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self.rep.list_profiles()]

    def profile(self, oid: str) -> dict[str, Any] | None:
        p = self.rep.get_profile(oid)
        return None if p is None else p.to_dict()

    def update_profile(self, oid: str, fields: dict[str, str]) -> dict[str, Any]:
        return self.rep.update_profile(oid, fields.get("name"), fields.get("static"), fields.get("dynamic")).to_dict()

    def close(self) -> None:
        self.rep.close()


def _history_ms(home: Path) -> int:
    """The home's broadcast history (config.toml), so that every process on one replica agrees."""
    path = homes.config_path(home)
    return load_config(path).broadcast_history_ms if path.exists() else DEFAULT_BROADCAST_HISTORY_MS


def running_daemon(home: Path) -> dict[str, Any] | None:
    """daemon.json of this home if its process is alive (a file left by a crash does not count)."""
    info = homes.read_daemon_json(home)
    if info is None or not homes.pid_alive(info.get("pid")) or not isinstance(info.get("local_url"), str):
        return None
    return info


def daemon(home: Path, flag: str = "") -> DaemonBackend:
    """The running daemon of ``home``; exit code 3 if there is none (``flag``: the ``--home`` for hints)."""
    info = running_daemon(home)
    if info is None:
        raise CliError(f"no daemon is running for {home} (start one with: peerd run{flag})", EXIT_NO_DAEMON)
    return DaemonBackend(str(info["local_url"]))


def _initialised(home: Path) -> bool:
    return homes.replica_path(home).exists() or homes.config_path(home).exists()


@contextlib.contextmanager
def backend(home: Path, flag: str = "") -> Iterator[Backend]:
    """The daemon if one runs for this home, else the replica file (which must exist);
    ``flag`` is the ``--home`` hints repeat."""
    info = running_daemon(home)
    if info is not None:
        yield DaemonBackend(str(info["local_url"]))
        return
    if not _initialised(home):
        raise CliError(f"no peerd home at {home} (create one with: peerd init{flag}, or give the home of "
                       "your node with --home)", EXIT_NO_HOME)
    off = OfflineBackend(home)
    try:
        yield off
    finally:
        off.close()
