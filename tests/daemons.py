"""The one harness that runs real ``peerd`` daemons as separate processes, for tests and benchmarks.

Usage::

    fleet = Fleet(tmp_path)                      # or the ``fleet`` fixture
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    fleet.mesh()                                 # seed every daemon with every other one
    fleet.start()                                # `peerd init` + `peerd run`, in parallel
    sent = a.send("alice", "bob", "hi")
    wait_until(lambda: c.has_message(sent["messageId"]), 10, "the message on c")
    b.kill(); b.restart()                        # same home, same peer port
    fleet.wait_converged()

Benchmarks (``bench/``) use the same ``Fleet`` and ``Daemon``.

A daemon runs the current code's ``peerd`` (``PEERD``) unless given another executable:
``fleet.add("old", executable=path)`` runs that one for ``peerd init`` and ``peerd run``, so
one fleet can mix releases (``tests/baseline.py`` builds the baseline release's).

Invariants:
- Every daemon of a ``Fleet`` shares one fleet key unless given another, and
  gets its peer port up front (a free port found now, or an explicit one), so a
  restarted daemon keeps its address and seeds stay valid.
- Readiness is an event, not a timeout: ``peerd run --json`` prints its ``daemon.json``
  as one line on stdout once both listeners accept connections (and ``-v`` sends its log to
  stderr, the harness's log file, rather than the home's ``peerd.log``), and
  ``wait_ready`` blocks on that line or on the process exiting, whichever comes
  first. There is no readiness timeout; pytest-timeout is the overall guard.
- Conditions without an event (a peer table filling, gossip converging) are
  polled by ``wait_until``, whose timeouts are scaled by ``tests.waiting.patience``.
- Every process a fleet starts is stopped by ``Fleet.close`` (SIGTERM, then
  SIGKILL), which fixtures run whatever the test's outcome.
- Each daemon's log (stderr) goes to its own file, kept across restarts; a failed
  test gets the tail of every open fleet's logs as a report section (test
  modules enable this with ``pytest_plugins = ["tests.daemons"]``; they import this
  module first, so pytest is told not to rewrite it: PYTEST_DONT_REWRITE).
- A daemon in a network namespace is reached through a relay process started in
  that namespace, since its local API listens on the namespace's 127.0.0.1.
- Every local API call carries the home's ``local.token`` (``Daemon.token``, read once the
  daemon is ready), as peerd's own clients do: the daemon answers nobody else.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from peerd.config import decode_fleet_key, encode_fleet_key, fleet_id, new_fleet_key
from peerd.home import LOCAL_TOKEN, read_token
from replica import identity, open_home
from tests import waiting
from tests.waiting import patience

__all__ = [
    "PEERD",
    "ApiError",
    "Daemon",
    "DaemonFailed",
    "Fleet",
    "NamespaceRelay",
    "free_ports",
    "integrity_check",
    "message_ids",
    "patience",
    "post_raw",
    "read_only",
    "wait_converged",
    "wait_until",
]

PEERD = Path(sys.executable).parent / "peerd"
STOP_TIMEOUT = 10.0
API_TIMEOUT = 30.0
LOG_TAIL_LINES = 80

T = TypeVar("T")
# Loopback and namespace traffic must never go through a proxy named in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ApiError(Exception):
    """The local API answered with an error status."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body!r}")
        self.status = status
        self.body = body


class DaemonFailed(Exception):
    """A daemon did not start, or did not stop, as it should."""


# -- small helpers ---------------------------------------------------------------------------


def wait_until(pred: Callable[[], T | None], timeout: float, what: str = "condition", interval: float = 0.04) -> T:
    """Poll ``pred`` until it returns something truthy; return it, or fail after ``patience(timeout)`` s.

    Connection errors and API errors count as "not yet" (a daemon may be restarting);
    the last value or error is named in the failure.
    """
    return waiting.wait_until(pred, timeout, what, interval, retry_on=(OSError, ApiError))


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free right now (held open together so none repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


def post_raw(url: str, body: bytes, timeout: float = API_TIMEOUT) -> tuple[int, bytes]:
    """POST raw bytes (a peer request) and return (status, body), error statuses included."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/octet-stream"})
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), exc.read()


@contextlib.contextmanager
def read_only(db: Path) -> Iterator[sqlite3.Connection]:
    """A read-only SQLite connection to a replica file (works while a daemon writes it)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        yield conn
    finally:
        conn.close()


def integrity_check(db: Path) -> str:
    """``PRAGMA integrity_check`` of a replica file, opened read-only."""
    with read_only(db) as conn:
        return "\n".join(str(row[0]) for row in conn.execute("PRAGMA integrity_check"))


def message_ids(db: Path) -> set[str]:
    """Ids of every message a replica file holds, read directly (read-only)."""
    with read_only(db) as conn:
        return {str(row[0]) for row in conn.execute("SELECT id FROM messages")}


# -- talking to the local API -----------------------------------------------------------------


class Transport(Protocol):
    def __call__(self, method: str, url: str, body: bytes | None, timeout: float,
                 token: str | None = None) -> tuple[int, bytes]: ...


def api_headers(token: str | None) -> dict[str, str]:
    """A local API request's headers: a JSON body, and the home's token when given."""
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}


def direct_transport(method: str, url: str, body: bytes | None, timeout: float,
                     token: str | None = None) -> tuple[int, bytes]:
    """HTTP from this process (the daemon's local API is on our 127.0.0.1)."""
    req = urllib.request.Request(url, data=body, method=method, headers=api_headers(token))
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), exc.read()


_RELAY_CODE = r"""
import json, sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for line in sys.stdin:
    q = json.loads(line)
    body = None if q["body"] is None else q["body"].encode("latin-1")
    headers = {"Content-Type": "application/json"}
    if q.get("token"):
        headers["Authorization"] = "Bearer " + q["token"]
    req = urllib.request.Request(q["url"], data=body, method=q["method"], headers=headers)
    try:
        with opener.open(req, timeout=q["timeout"]) as resp:
            out = {"status": resp.status, "body": resp.read().decode("latin-1")}
    except urllib.error.HTTPError as exc:
        out = {"status": exc.code, "body": exc.read().decode("latin-1")}
    except OSError as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


class NamespaceRelay:
    """A small process inside a network namespace that makes HTTP calls for us (JSON lines)."""

    def __init__(self, exec_prefix: Sequence[str]) -> None:
        self.proc = subprocess.Popen(
            [*exec_prefix, sys.executable, "-u", "-c", _RELAY_CODE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        self._lock = threading.Lock()

    def __call__(self, method: str, url: str, body: bytes | None, timeout: float,
                 token: str | None = None) -> tuple[int, bytes]:
        q = {"method": method, "url": url, "timeout": timeout, "body": None if body is None else body.decode("latin-1"),
             "token": token}
        with self._lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            if self.proc.poll() is not None:
                raise ConnectionError("the namespace relay has exited")
            self.proc.stdin.write(json.dumps(q) + "\n")
            line = self.proc.stdout.readline()
        if not line:
            raise ConnectionError("the namespace relay closed its output")
        out = json.loads(line)
        if "error" in out:
            raise ConnectionError(out["error"])
        return int(out["status"]), str(out["body"]).encode("latin-1")

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _ready_line(line: bytes) -> dict[str, Any] | None:
    """The daemon.json object ``peerd run`` prints once ready, or None for any other line."""
    try:
        info = json.loads(line)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


# -- one daemon --------------------------------------------------------------------------------


class Daemon:
    """One ``peerd`` daemon: its home, its process, its log and a client for its local API."""

    def __init__(
        self,
        name: str,
        home: Path,
        port: int,
        fleet_key: str,
        *,
        host: str = "127.0.0.1",
        bind: str | None = None,
        exec_prefix: Sequence[str] = (),
        transport: Transport = direct_transport,
        log_level: str = "info",
        mdns: bool = False,
        executable: Path = PEERD,
        config: dict[str, Any] | None = None,
        admit: bool = True,
    ) -> None:
        self.name = name
        self.admit = admit  # let in by its fleet's founder once initialised (``Fleet.init``)
        self.config = dict(config or {})  # config.toml keys written after `peerd init`
        self.home = home
        self.port = port
        self.fleet_key = fleet_key
        self.host = host
        self.bind = bind or host
        self.exec_prefix = list(exec_prefix)
        self.transport = transport
        self.log_level = log_level
        self.mdns = mdns
        self.executable = executable
        self.seeds: list[str] = []
        self.log_path = home.with_name(f"{name}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0  # time.monotonic() of the last spawn
        self.info: dict[str, Any] = {}
        self.token: str | None = None  # the home's local.token, read once the daemon is ready
        self.initialised = False
        self.init_node = ""  # the node id ``peerd init`` printed
        self.admitted = False

    def __repr__(self) -> str:
        return f"Daemon({self.name!r}, {self.addr})"

    # -- identity and files -----------------------------------------------------------------

    @property
    def addr(self) -> str:
        """``host:port`` of the peer port, as other daemons are seeded with it (``[host]:port`` for IPv6)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.addr}/v1"

    @property
    def db(self) -> Path:
        return self.home / "replica.db"

    @property
    def node_id(self) -> str:
        return str(self.info["node_id"])

    @property
    def short_id(self) -> str:
        """The 16-hex-digit node id prefix that peer tables show."""
        return self.node_id[:16]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- lifecycle ----------------------------------------------------------------------------

    def init_argv(self) -> list[str]:
        return [str(self.executable), "init", "--home", str(self.home), "--name", self.name,
                "--fleet-key", self.fleet_key, "--json"]

    def run_argv(self) -> list[str]:
        argv = [*self.exec_prefix, str(self.executable), "run", "--home", str(self.home),
                "--port", str(self.port), "--local-port", "0", "--bind", self.bind, "--advertise", self.host,
                "--log-level", self.log_level]
        if not self.mdns:
            argv.append("--no-mdns")
        if self.executable == PEERD:  # the ready line on stdout, the log on stderr (releases before printed both)
            argv += ["--json", "-v"]
        for seed in self.seeds:
            argv += ["--seed", seed]
        return argv

    def write_config(self) -> None:
        """Set ``self.config``'s keys in config.toml (each replaces the line ``peerd init`` wrote)."""
        path = self.home / "config.toml"
        lines = path.read_text().splitlines()
        for key, value in self.config.items():
            line = f"{key} = {json.dumps(value)}"
            at = [i for i, old in enumerate(lines) if old.split("=", 1)[0].strip() == key]
            if at:
                lines[at[0]] = line
            else:
                lines.append(line)
        path.write_text("\n".join(lines) + "\n")

    def spawn(self) -> None:
        """Start ``peerd run`` (without waiting for it to be ready): its log to the log file, its
        stdout (the ready line) to a pipe that ``wait_ready`` reads."""
        if self.running:
            raise DaemonFailed(f"{self.name} is already running")
        with self.log_path.open("ab") as log:
            log.write(f"---- harness: starting {self.name} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.spawned_at = time.monotonic()
            self.proc = subprocess.Popen(self.run_argv(), stdout=subprocess.PIPE, stderr=log,
                                         stdin=subprocess.DEVNULL)
        self.info = {}

    def wait_ready(self) -> dict[str, Any]:
        """Block until our process prints its ready line (its daemon.json), or fail with its log
        once it exits without one. No timeout of its own: pytest-timeout guards the test."""
        proc = self.proc
        assert proc is not None and proc.stdout is not None, "spawn first"
        with proc.stdout:  # after the ready line the daemon writes nothing more there
            for line in proc.stdout:
                info = _ready_line(line)
                if info is not None and info.get("pid") == proc.pid:
                    self.info = info
                    self.token = read_token(self.home / LOCAL_TOKEN)
                    if self.port == 0:  # keep the port the daemon picked, so a restart keeps its address
                        self.port = int(info["peer_port"])
                    return info
        code = proc.wait()
        raise DaemonFailed(f"{self.name} exited with code {code} before it was ready; log:\n{self.log_tail()}")

    def start(self) -> dict[str, Any]:
        self.spawn()
        return self.wait_ready()

    restart = start

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait; returns the exit code (fails if the daemon does not stop within
        ``patience(timeout)``)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=patience(timeout))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise DaemonFailed(f"{self.name} did not stop within {patience(timeout):.0f} s of SIGTERM; log:\n"
                                   f"{self.log_tail()}") from None
        return int(self.proc.returncode)

    def kill(self) -> None:
        """``kill -9``: no chance to clean up (daemon.json stays behind)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    # -- the local API ------------------------------------------------------------------------

    @property
    def auth(self) -> dict[str, str]:
        """The header that admits a client to this daemon's local port (MCP included)."""
        assert self.token is not None, f"{self.name} is not ready yet"
        return {"Authorization": f"Bearer {self.token}"}

    def call(self, method: str, path: str, body: Any = None, timeout: float = API_TIMEOUT) -> tuple[int, Any]:
        """One local API call: (status, decoded JSON body)."""
        if not self.info:
            raise ConnectionError(f"{self.name} is not running")
        data = None if body is None else json.dumps(body).encode()
        status, raw = self.transport(method, f"{self.info['local_url']}{path}", data, timeout, self.token)
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return status, decoded

    def api(self, method: str, path: str, body: Any = None, timeout: float = API_TIMEOUT) -> Any:
        """A local API call that must succeed (2xx); raises ApiError otherwise."""
        status, data = self.call(method, path, body, timeout)
        if not 200 <= status < 300:
            raise ApiError(status, data, f"{self.name} {method} {path}")
        return data

    def status(self) -> dict[str, Any]:
        return dict(self.api("GET", "/api/status"))

    def peers(self) -> list[dict[str, Any]]:
        return list(self.api("GET", "/api/peers"))

    def digest(self) -> str:
        return str(self.api("GET", "/api/digest")["digest"])

    def send(self, sender: str, channel: str, content: str, **extra: Any) -> dict[str, Any]:
        return dict(self.api("POST", "/api/send", {"from": sender, "channel": channel, "content": content, **extra}))

    def check(self, recipient: str, instance: str | None = None, **extra: Any) -> dict[str, Any]:
        body = {"recipient": recipient, "recipientInstanceId": instance, **extra}
        return dict(self.api("POST", "/api/check", body))

    def mark_read(self, receipt_ids: Sequence[str]) -> int:
        return int(self.api("POST", "/api/read", {"receiptIds": list(receipt_ids)})["marked"])

    def message_status(self, message_id: str) -> list[dict[str, Any]]:
        """Each recipient's state (the ``recipients`` of the local API's answer)."""
        return list(self.api("GET", f"/api/messages/{message_id}/status")["recipients"])

    def has_message(self, message_id: str) -> bool:
        status, _ = self.call("GET", f"/api/messages/{message_id}/status")
        return status == 200

    def profiles(self) -> list[dict[str, Any]]:
        return list(self.api("GET", "/api/profiles"))

    def update_profile(self, orchestrator_id: str, **fields: str) -> dict[str, Any]:
        return dict(self.api("POST", "/api/profiles", {"orchestratorId": orchestrator_id, **fields}))

    def peer(self, other: Daemon) -> dict[str, Any] | None:
        """This daemon's peer-table row for ``other`` (by node id), if any."""
        for row in self.peers():
            if row["node_id"] == other.short_id:
                return dict(row)
        return None

    def live_ids(self) -> set[str]:
        """Node ids of the peers this daemon currently reaches."""
        return {p["node_id"] for p in self.peers() if p["reachable"] and p["node_id"]}

    def synced_ids(self) -> set[str]:
        """Node ids of the peers this daemon has completed a round with."""
        return {p["node_id"] for p in self.peers() if p["last_sync_ago"] is not None and p["node_id"]}

    def inbox(self, role: str) -> list[str]:
        """Contents of ``role``'s unread messages (up to 100), oldest first."""
        return [m["content"] for m in self.check(role, limit=100)["messages"]]


def wait_converged(daemons: Sequence[Daemon], timeout: float = 30.0) -> str:
    """Wait until all ``daemons`` report the same state digest (/api/digest); return it."""

    def same() -> str | None:
        digests = {d.digest() for d in daemons}
        return digests.pop() if len(digests) == 1 else None

    return wait_until(same, timeout, f"equal digests on {[d.name for d in daemons]}", interval=0.1)


# -- a fleet of daemons ---------------------------------------------------------------------------

_OPEN_FLEETS: list[Fleet] = []
_JUST_CLOSED: list[Fleet] = []  # closed during the current test (e.g. by a failing fixture)


class Fleet:
    """Daemons sharing a fleet key, started and stopped together; see the module docstring."""

    def __init__(self, root: Path, fleet_key: str | None = None) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.key = fleet_key or encode_fleet_key(new_fleet_key())
        self.daemons: list[Daemon] = []
        self.relays: list[NamespaceRelay] = []
        self.founders: dict[str, Daemon] = {}  # fleet key -> the daemon whose home made that fleet
        _OPEN_FLEETS.append(self)

    def __getitem__(self, name: str) -> Daemon:
        return next(d for d in self.daemons if d.name == name)

    def add(
        self,
        name: str,
        *,
        port: int | None = None,
        fleet_key: str | None = None,
        host: str = "127.0.0.1",
        seeds: Iterable[Daemon] = (),
        **options: Any,
    ) -> Daemon:
        """A new daemon (not started) with its own home; its peer port is fixed now. ``options`` go
        to ``Daemon`` (``executable``, ``log_level``, ...)."""
        port = port if port is not None else free_ports(1, host)[0]
        daemon = Daemon(name, self.root / name, port, fleet_key or self.key, host=host, **options)
        daemon.seeds = [s.addr for s in seeds]
        self.daemons.append(daemon)
        return daemon

    def mesh(self, daemons: Sequence[Daemon] | None = None) -> None:
        """Seed every daemon with every other one's address."""
        group = list(daemons or self.daemons)
        for d in group:
            d.seeds = [o.addr for o in group if o is not d]

    def relay(self, exec_prefix: Sequence[str]) -> NamespaceRelay:
        """A relay for local API calls inside a namespace; closed with the fleet."""
        relay = NamespaceRelay(exec_prefix)
        self.relays.append(relay)
        return relay

    def init(self, daemons: Sequence[Daemon]) -> None:
        """``peerd init`` every daemon not yet initialised, in parallel."""
        todo = [d for d in daemons if not d.initialised]
        procs = [(d, subprocess.Popen(d.init_argv(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
                 for d in todo]
        for d, proc in procs:
            out, _ = proc.communicate(timeout=patience(60))
            if proc.returncode != 0:
                raise DaemonFailed(f"peerd init of {d.name} failed ({proc.returncode}): {out.decode(errors='replace')}")
            d.initialised = True
            d.init_node = str(json.loads(out.decode()[out.decode().index("{"):])["node_id"])
            if d.config:
                d.write_config()
        self.admit()

    def admit(self) -> None:
        """Let every initialised daemon into its fleet, as a member does with ``peerd admit``: the
        first daemon of a key that runs the current code founds that fleet (it trusts itself); the
        others trust whoever lets them in, which is a running member of the current code if there is
        one (so the admit spreads at once), else the founder. Daemons of an earlier release are let in
        too; nothing opens their replicas."""
        for d in self.daemons:
            if d.initialised and d.executable == PEERD and d.fleet_key not in self.founders:
                self.founders[d.fleet_key] = d
                with contextlib.closing(open_home(d.home)) as rep:
                    rep.set_fleet_roots(frozenset({rep.node_key}))
                d.admitted = True
        for key, founder in self.founders.items():
            todo = [d for d in self.daemons if d.fleet_key == key and d.initialised and d.admit and not d.admitted]
            if not todo:
                continue
            member = next((d for d in self.daemons if d.fleet_key == key and d.admitted and d.running
                           and d.executable == PEERD), founder)
            with contextlib.closing(open_home(member.home)) as rep:
                for d in todo:
                    node = (bytes.fromhex(d.init_node) if d.init_node  # a home made otherwise: its key says
                            else identity.load_or_create(d.home / "node.key").public_key)
                    rep.admit_node(node, d.name, fleet_id(decode_fleet_key(key)))
                    d.admitted = True

    def start(self, *daemons: Daemon) -> None:
        """Initialise and start the given daemons (default: all not running) in parallel; returns
        once every one has printed its ready line."""
        group = list(daemons) or [d for d in self.daemons if not d.running]
        self.init(group)
        for d in group:
            d.spawn()
        for d in group:
            d.wait_ready()

    def running(self) -> list[Daemon]:
        return [d for d in self.daemons if d.running and d.info]

    def wait_converged(self, daemons: Sequence[Daemon] | None = None, timeout: float = 30.0) -> str:
        """Wait until every daemon (default: all running) reports the same state digest."""
        return wait_converged(daemons or self.running(), timeout)

    def logs(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(f"==== {d.name} ({d.log_path})\n{d.log_tail(lines)}" for d in self.daemons)

    def close(self) -> None:
        """Stop every daemon (SIGTERM, then SIGKILL) and every relay; safe to call twice."""
        live = [d for d in self.daemons if d.proc is not None and d.proc.poll() is None]
        for d in live:
            assert d.proc is not None
            with contextlib.suppress(ProcessLookupError):
                d.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + patience(STOP_TIMEOUT)
        for d in live:
            assert d.proc is not None
            try:
                d.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
        for relay in self.relays:
            relay.close()
        self.relays.clear()
        if self in _OPEN_FLEETS:
            _OPEN_FLEETS.remove(self)
            _JUST_CLOSED.append(self)
        crashes = [f"{d.name}: {line}" for d in self.daemons for line in d.log_text().splitlines()
                   if "Traceback" in line or "background task failed" in line]
        if crashes:  # a daemon that crashed a task inside may still pass the test's checks: fail anyway
            raise DaemonFailed("daemon logs show crashes:\n" + "\n".join(crashes[:20]) + "\n" + self.logs())


# -- pytest integration ------------------------------------------------------------------------------


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """An empty fleet in the test's tmp folder; every daemon is stopped afterwards, pass or fail."""
    f = Fleet(tmp_path / "fleet")
    try:
        yield f
    finally:
        f.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the logs of every open fleet to a failed test's report."""
    report = yield
    fleets = _OPEN_FLEETS + _JUST_CLOSED
    if report.failed and fleets:
        report.sections.append((f"peerd daemon logs ({call.when})", "\n".join(f.logs() for f in fleets)))
    if call.when == "teardown":
        _JUST_CLOSED.clear()
    return report
