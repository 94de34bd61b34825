"""``peerd run``: open the home, start the node and the local server, write daemon.json.

Invariants: daemon.json appears only once both listeners accept connections
and is removed on clean shutdown; right after writing it, ``run`` calls its
``on_ready`` with the same object (``peerd run`` prints its ready block then, and with
``--json`` the object as one JSON line on stdout, ``announce_ready``: whoever started the
daemon waits for it instead of polling for the file); nothing else goes to
stdout; SIGTERM and SIGINT stop the daemon cleanly; the node id survives
restarts because the key lives in the home. The process has one change feed
(``replica.feed``), watching the replica file for other processes' writes; on
stop it is closed first of all, which ends every waiting request and change
stream at once (an event, not a poll). A daemon holds ``daemon.lock`` for its
whole life, so ``stop_daemon`` signals only a daemon that really runs (never a
process that merely inherited a stale pid) and waits for the process to exit.
The home is made owner-only before anything is read from it (``peerd.home.tighten``;
what another user owns is logged, not changed), and the local port answers only a
caller holding the home's ``local.token`` or a browser session opened by a login
link (``peerd.localauth``); daemon.json and the ready line never carry a secret, the login
link goes only to ``on_ready``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from discovery.seeds import format_seed
from mcp_server.localauth import LocalAuth
from mcp_server.wiring import Wiring
from peerd import home as homes
from peerd.config import Config, load_config, save_config
from peerd.dashboard import browser_path, login_routes, login_url
from peerd.errors import DaemonError
from peerd.keyring import KeyRing
from peerd.lazymount import McpBuilder
from peerd.limits import raise_open_file_limit
from peerd.local import LocalServer, build_app
from peerd.localapi import build_routes
from peerd.localauth import home_auth
from peerd.memory import limit_arenas
from peerd.node import Node
from peerd.pairapi import pairing_routes
from peerd.ratelog import RateFilter
from peerd.transport import HttpTransport
from replica import Replica, open_home
from replica.errors import LocalError

log = logging.getLogger("peerd")

LOCK_FILE = "daemon.lock"
EXIT_POLL = 0.05  # s between looks at a pid, only where the OS cannot tell us of an exit (no pidfd)


def _mcp_app(node: Node) -> McpBuilder:
    """What builds the MCP app at /mcp, on the first request to it (never at start); the fleet id
    is read on each use, since a key rotation changes it."""
    return node.wiring.mcp_http(fleet_id=lambda: node.keys.fleet_id)


class Daemon:
    def __init__(self, home: Path, cfg: Config, *, bind: str = "::", advertise: str = "127.0.0.1") -> None:
        self.home = home
        self.cfg = cfg
        self.bind = bind
        self.advertise = advertise
        self.rep: Replica | None = None
        self.wiring: Wiring | None = None
        self.node: Node | None = None
        self.local: LocalServer | None = None
        self.auth: LocalAuth | None = None
        self.info: dict[str, Any] = {}
        self._lock_fd: int | None = None

    def _lock_home(self) -> None:
        """One daemon per home: hold an exclusive lock on ``daemon.lock`` while running."""
        homes.ensure_home(self.home)
        fd = os.open(self.home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            other = homes.read_daemon_json(self.home) or {}
            raise DaemonError(
                f"another peerd is already running on {self.home} (pid {other.get('pid', '?')}); "
                "stop it first, or use another --home"
            ) from None
        self._lock_fd = fd
        for loose in homes.tighten(self.home):
            log.warning("%s stays open to other users: %s", loose.describe(), fix_loose(loose))

    async def start(self) -> dict[str, Any]:
        self._lock_home()
        nofile = raise_open_file_limit()  # before any listener sizes its connection caps from it
        self.rep = await asyncio.to_thread(
            lambda: open_home(self.home, broadcast_history_ms=self.cfg.broadcast_history_ms))
        await asyncio.to_thread(self._close_fleet, self.rep)
        self.wiring = await asyncio.to_thread(Wiring.watching, self.rep)
        self.node = Node(self.cfg, self.rep, bind=self.bind, wiring=self.wiring, home=self.home)
        self.node.on_keys = self._keys_changed
        await self.node.start()
        caps = self.node.transport.limits if isinstance(self.node.transport, HttpTransport) else None
        if caps is not None:
            log.info("open-file limit %d: peer port holds %d connections, %d per address", nofile,
                     caps.max_connections, caps.per_source)
        self.info = {
            "pid": os.getpid(), "node_id": self.rep.node_id, "name": self.cfg.name,
            "fleet_id": self.cfg.fleet_id, "home": str(self.home),
            "peer_port": self.node.peer_port, "peer_url": f"http://{format_seed(self.advertise, self.node.peer_port)}",
        }
        self.info["fleet_id"] = self.node.keys.fleet_id
        self.auth = auth = home_auth(self.home, browser=browser_path)
        app = build_app([*build_routes(self.node, self.info), *pairing_routes(self.node, self.reload),
                         *login_routes(auth)], _mcp_app(self.node), auth=auth)
        self.local = LocalServer(app, self.cfg.local_port)
        try:
            await self.local.start()
        except BaseException:
            await self.node.stop()
            raise
        self.info.update({
            "local_port": self.local.port, "local_url": self.local.url, "mcp_url": self.local.mcp_url,
            "started": time.time(),
        })
        homes.write_daemon_json(self.home, self.info)
        log.info("peerd ready: node %s, peer port %d, local %s",
                 self.rep.node_id[:16], self.node.peer_port, self.info["local_url"])
        return self.info

    def _close_fleet(self, rep: Replica) -> None:
        """A replica of a release before admission (still open) is closed on the members it knows,
        and vouches for them with admits, so replicas that learnt of a member later count it too."""
        grandfathered = rep.close_open_fleet()
        if grandfathered is not None and len(grandfathered) > 1:
            log.info("membership now needs admission: the %d members this replica knew stay members",
                     len(grandfathered))
        if rep.node_key not in rep.removed():
            with contextlib.suppress(LocalError):  # a node nobody let in vouches for nobody
                rep.vouch_for_roots(self.cfg.fleet_id)

    def login_url(self) -> str:
        """A fresh one-time link that opens the dashboard in a browser (``mcp_server.localauth``)."""
        assert self.auth is not None and self.local is not None
        return login_url(self.local.url, self.auth.new_login())

    def _keys_changed(self, ring: KeyRing) -> None:
        """A rotation (or a removal) changed the key this node seals with: config.toml and
        daemon.json say so, so a restart keeps it and ``peerd status`` shows the new fleet id."""
        path = homes.config_path(self.home)
        try:
            saved = load_config(path)
            if (saved.fleet_key, saved.previous_fleet_keys) != (ring.current, ring.previous):
                save_config(path, dataclasses.replace(saved, fleet_key=ring.current, previous_fleet_keys=ring.previous))
        except (DaemonError, OSError) as exc:
            log.error("could not save the rotated fleet key to %s: %s", path, exc)
        if self.info:
            self.info["fleet_id"] = ring.fleet_id
            homes.write_daemon_json(self.home, self.info)

    async def reload(self) -> dict[str, Any]:
        """Take the home's config.toml again (``peerd join`` wrote a fleet into it)."""
        assert self.node is not None
        cfg = await asyncio.to_thread(load_config, homes.config_path(self.home))
        await self.node.use_config(cfg)
        self.info["fleet_id"] = self.node.keys.fleet_id
        homes.write_daemon_json(self.home, self.info)
        return {"fleet_id": self.node.keys.fleet_id, "seeds": list(self.node.cfg.seeds)}

    async def stop(self) -> None:
        homes.remove_daemon_json(self.home, only_pid=os.getpid())
        if self.wiring is not None:
            self.wiring.waiter.close()  # waiting requests and change streams end now
        if self.local is not None:
            await self.local.stop()
        if self.node is not None:
            await self.node.stop()
        if self.wiring is not None:
            await self.wiring.aclose()
        if self.rep is not None:
            self.rep.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def fix_loose(loose: homes.Loose) -> str:
    """How to make one path of a home owner-only again, said to the person who runs peerd."""
    if loose.ours:
        return f"chmod go-rwx {loose.path}"
    return f"as its owner or root: chown $(id -un) {loose.path} && chmod go-rwx {loose.path}"


def announce_ready(info: dict[str, Any]) -> None:
    """The ready line: daemon.json's content as one JSON line on stdout."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.write(json.dumps(info) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # stdout closed, or a pipe nobody reads any more: nobody to tell
        pass


LOCAL_REFUSALS = ("Invalid HTTP request received.",)  # what uvicorn logs for each malformed local request


def quiet_library_logs() -> None:
    """Libraries' lines about outsiders' requests, held to what ours are: the MCP SDK's per-session
    INFO lines only at DEBUG, uvicorn's malformed-request warnings rate-limited."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("mcp").setLevel(logging.WARNING)
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, RateFilter) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(RateFilter(LOCAL_REFUSALS))


async def run(home: Path, cfg: Config, *, bind: str = "::", advertise: str = "127.0.0.1",
              on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT; once ready, call ``on_ready`` with daemon.json's object plus
    ``login_url`` (a one-time link to the dashboard: for a person's eyes, never in daemon.json)."""
    limit_arenas()  # before the first worker thread (peerd.memory)
    quiet_library_logs()
    daemon = Daemon(home, cfg, bind=bind, advertise=advertise)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        info = await daemon.start()
        if on_ready is not None:
            on_ready({**info, "login_url": daemon.login_url()})
    except BaseException:
        if daemon.wiring is not None:
            daemon.wiring.close()
        if daemon.rep is not None:
            daemon.rep.close()
        if daemon._lock_fd is not None:
            os.close(daemon._lock_fd)
        raise
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await daemon.stop()


# -- stopping a daemon from another process ----------------------------------------------------------


def _lock_held(home: Path) -> bool:
    """Whether a daemon holds ``home``'s lock (it does from start to exit)."""
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also lets go of the lock if we got it
    return False


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for process ``pid`` to exit; whether it did. Woken by the exit
    itself (a pidfd) where the OS offers one."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # no pidfd here: look now and then
        deadline = time.monotonic() + timeout
        while homes.pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(EXIT_POLL)
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))
    finally:
        os.close(fd)


def stop_daemon(home: Path, timeout: float) -> int | None:
    """SIGTERM the daemon serving ``home`` and wait until it has exited; its pid, or None when no
    daemon runs there (a daemon.json a crash left behind is removed). ``DaemonError`` if it
    cannot be stopped within ``timeout`` seconds."""
    if not _lock_held(home):
        homes.remove_daemon_json(home)
        return None
    info = homes.read_daemon_json(home) or {}
    pid = info.get("pid")
    if not isinstance(pid, int) or not homes.pid_alive(pid):
        raise DaemonError(f"a daemon holds {home / LOCK_FILE} but has not written daemon.json yet (still starting?); "
                          "try again in a moment")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return pid
    except PermissionError:
        raise DaemonError(f"the daemon of {home} (pid {pid}) belongs to another user; stop it as that user") from None
    if not wait_exit(pid, timeout):
        raise DaemonError(f"the daemon of {home} (pid {pid}) is still running {timeout:g} s after SIGTERM; "
                          f"look at its log, or end it with: kill -9 {pid}")
    return pid
