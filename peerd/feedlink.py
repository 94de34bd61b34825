"""The change feed of a process beside a daemon (``peerd mcp``): follow the daemon's
change stream while one runs for the home, watch the replica file otherwise.

Invariants:
* One outside source runs at a time: the daemon's ``/api/feed`` stream (once
  its first mark has arrived) or a ``FileWatch`` (otherwise), so the process
  keeps one watcher however many calls wait, and none while the daemon serves.
* The watcher is armed before ``daemon.json`` is read, so a daemon that comes
  up in between is never missed; each ``daemon.json`` is tried once (a daemon
  that refuses the stream is not retried in a loop, only a new one is).
* When the stream ends (the daemon stops or dies) the watcher takes over and
  reads the mark at once, so nothing written in between is missed.
* Marks from the stream only ``advance`` the feed: it never runs ahead of the
  replica, since the daemon reports only commits it can see.
* The stream is asked for with the home's ``local.token`` (the daemon answers nobody else).
* Imports only the standard library, ``replica`` and ``peerd.home``: ``peerd mcp``
  must start fast.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
from pathlib import Path

from peerd import home as homes
from peerd.errors import DaemonError
from replica.feed import ChangeFeed, FileWatch

log = logging.getLogger("peerd.feedlink")

FEED_PATH = "/api/feed"
CONNECT_TIMEOUT = 5.0  # to connect and get the first mark from a local daemon


def parse_mark(line: bytes) -> int | None:
    """The mark in one stream line ``{"lseq": N}``, or None for anything else."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    mark = value.get("lseq") if isinstance(value, dict) else None
    return mark if isinstance(mark, int) and not isinstance(mark, bool) and mark >= 0 else None


def daemon_key(info: dict[str, object] | None) -> tuple[object, ...] | None:
    """What tells one daemon run from another (None: no usable daemon.json)."""
    if info is None or not isinstance(info.get("local_port"), int):
        return None
    return info.get("pid"), info.get("started"), info.get("local_port")


class DaemonLink:
    """A ``replica.feed.Source``: the daemon's change stream when one runs, else a ``FileWatch``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.following = False  # True while the daemon's stream is the source
        self._stopping = threading.Event()
        self._changed = threading.Event()  # daemon.json was written (or stop)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._watch: FileWatch | None = None
        self._thread: threading.Thread | None = None

    def start(self, feed: ChangeFeed) -> None:
        self._ensure_watch(feed)  # the first mark is read before start returns
        self._thread = threading.Thread(target=self._run, args=(feed,), name="peerd-feed-link", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # unblocks the stream read
        if self._thread is not None:
            self._thread.join()
        self._stop_watch()

    def _run(self, feed: ChangeFeed) -> None:
        tried: tuple[object, ...] | None = None
        while not self._stopping.is_set():
            self._changed.clear()
            self._ensure_watch(feed)
            key, info = self._daemon()
            if key is not None and key != tried and info is not None:
                tried = key
                self._follow(info, feed)
                continue
            self._changed.wait()

    def _daemon(self) -> tuple[tuple[object, ...] | None, dict[str, object] | None]:
        try:
            info = homes.read_daemon_json(self.home)
        except DaemonError:  # half a file, a stale mess: wait for the next write
            return None, None
        if info is None or not homes.pid_alive(info.get("pid")):
            return None, None
        return daemon_key(info), info

    def _follow(self, info: dict[str, object], feed: ChangeFeed) -> None:
        """Take marks from the daemon's stream until it ends (any error just ends it)."""
        port = info["local_port"]
        assert isinstance(port, int)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CONNECT_TIMEOUT)
        try:
            conn.connect()
            sock = conn.sock
            assert isinstance(sock, socket.socket)
            with self._lock:
                self._sock = sock
            if self._stopping.is_set():
                return
            conn.request("GET", FEED_PATH, headers=homes.auth_headers(self.home))  # the home's token
            resp = conn.getresponse()
            first = parse_mark(resp.readline()) if resp.status == 200 else None
            if first is None:
                log.info("daemon on port %d offers no change stream (HTTP %d); watching the file", port, resp.status)
                return
            self._stop_watch()
            self.following = True
            feed.advance(first)
            sock.settimeout(None)  # the stream is quiet while nothing changes
            for line in iter(resp.readline, b""):
                mark = parse_mark(line)
                if mark is not None:
                    feed.advance(mark)
        except (OSError, http.client.HTTPException) as exc:
            log.debug("daemon change stream on port %d ended: %s", port, exc)
        finally:
            self.following = False
            with self._lock:
                self._sock = None
            conn.close()

    def _ensure_watch(self, feed: ChangeFeed) -> None:
        if self._watch is None:
            self._watch = FileWatch(homes.replica_path(self.home), also={homes.DAEMON_JSON: self._changed.set})
            self._watch.start(feed)

    def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()
