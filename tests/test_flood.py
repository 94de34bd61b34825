"""A slow-body flood from one source against a real daemon with 1,024 open files (issue 12, item 1).

1,100 connections from 127.0.0.2, each sending a request head and then its body one byte a second,
are held (and reopened whenever the daemon closes one) against daemon ``a``, which runs under an
open-file limit of 1,024, as in the issue. Meanwhile ``a`` must keep syncing with an honest daemon
``b`` (from 127.0.0.1) both ways, its local API and MCP must answer within a second, and its log
must stay short: no ``socket.accept() out of system resource``, no traceback, a few lines per minute
about the flooding address.
"""

from __future__ import annotations

import contextlib
import json
import resource
import selectors
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

from tests.daemons import Daemon, Fleet, patience, wait_until

pytest_plugins = ["tests.daemons"]

SLOW = 1100
NOFILE = 1024
SOURCE = "127.0.0.2"
HEAD = b"POST /v1 HTTP/1.1\r\nHost: peer\r\nContent-Length: 100000\r\n\r\n"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SlowFlood:
    """``count`` connections from ``source`` that send a head, then one body byte per second; each one
    the server closes is opened again on the next sweep (an attacker that keeps the pressure on)."""

    def __init__(self, port: int, count: int, source: str) -> None:
        self.port, self.count, self.source = port, count, source
        self.opened = 0  # connections made, reopenings included
        self.closed_by_server = 0
        self.replies: dict[bytes, int] = {}  # status lines the server sent before closing
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SlowFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _open(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((self.source, 0))
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", self.port))
        self._sel.register(s, selectors.EVENT_READ, [HEAD])  # data: what is still to send
        self.opened += 1

    def _close(self, s: socket.socket) -> None:
        self._sel.unregister(s)
        s.close()

    def _sweep(self) -> None:
        for key in list(self._sel.get_map().values()):
            s: socket.socket = key.fileobj  # type: ignore[assignment]
            pending: list[bytes] = key.data
            try:
                s.send(pending.pop() if pending else b"x")
            except (BlockingIOError, InterruptedError):
                if not pending:
                    pending.append(HEAD)
            except OSError:
                self.closed_by_server += 1
                self._close(s)

    def _drain(self, timeout: float) -> None:
        for key, _ in self._sel.select(timeout):
            s: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 "):
                status = data[:12]
                self.replies[status] = self.replies.get(status, 0) + 1
            self.closed_by_server += 1
            self._close(s)

    def _run(self) -> None:
        while not self._stop.is_set():
            while len(self._sel.get_map()) < self.count:
                self._open()
            self._sweep()
            deadline = time.monotonic() + 1.0
            while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                self._drain(left)
        for key in list(self._sel.get_map().values()):
            self._close(key.fileobj)  # type: ignore[arg-type]


@contextlib.contextmanager
def open_files(at_least: int) -> Iterator[None]:
    """This test process may hold ``at_least`` sockets (raised for the test, restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, at_least)) if hard != resource.RLIM_INFINITY else max(soft, at_least)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def timed(fn: object) -> float:
    start = time.perf_counter()
    assert callable(fn)
    fn()
    return time.perf_counter() - start


def mcp_initialize(d: Daemon) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}}).encode()
    req = urllib.request.Request(d.info["mcp_url"], data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **d.auth})
    with _OPENER.open(req, timeout=300) as resp:  # a guard against a hang: the first call builds MCP
        assert resp.status == 200 and b'"serverInfo"' in resp.read()


def test_a_slow_body_flood_from_one_source_stalls_nothing(fleet: Fleet) -> None:
    """1,100 slow bodies held from 127.0.0.2: a and b still sync both ways, a's local API and MCP answer
    within 1 s, the flood is held to a's per-address cap, and a's log stays short and free of tracebacks."""
    a = fleet.add("a", exec_prefix=["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"])
    b = fleet.add("b", seeds=[a])
    fleet.start()
    wait_until(lambda: b.short_id in a.synced_ids() and a.short_id in b.synced_ids(), 30, "a and b synced")
    mcp_initialize(a)  # the daemon builds MCP on the first /mcp request: a one-time cost, not the flood's
    with open_files(SLOW + 256), SlowFlood(a.port, SLOW, SOURCE) as flood:
        wait_until(lambda: flood.opened >= SLOW and flood.closed_by_server >= SLOW - 64, 30,
                   "the whole flood opened, and all but a's per-address share of it closed at once")
        within = patience(1.0)
        sent_by_b = b.send("bob", "alice", "through the flood")
        sent_by_a = a.send("alice", "bob", "out through the flood")

        def answers_then_drops() -> bool:
            """a's API and MCP answer in time (checked on every poll) until a has dropped slow bodies (408)."""
            slowest = max(timed(a.status), timed(lambda: mcp_initialize(a)))
            assert slowest < within, f"a's local side took {slowest:.2f} s under the flood"
            return bool(flood.replies.get(b"HTTP/1.1 408"))

        wait_until(answers_then_drops, 60, "a dropping the slow bodies it admitted", interval=0.2)
        wait_until(lambda: a.has_message(sent_by_b["messageId"]), 30, "b's message on a during the flood")
        wait_until(lambda: b.has_message(sent_by_a["messageId"]), 30, "a's message on b during the flood")
        assert a.running and timed(a.status) < within
        assert flood.opened > SLOW, "the flood kept reopening what a closed"
    counters = a.status()["counters"]
    assert counters["refused"] >= SLOW - 64, "every connection over the cap is counted"
    log = a.log_text()
    assert "out of system resource" not in log and "Traceback" not in log
    about_flood = [line for line in log.splitlines() if SOURCE in line]
    minutes = 1 + (time.monotonic() - a.spawned_at) // 60
    assert len(about_flood) <= 6 * minutes, f"{len(about_flood)} lines about {SOURCE}:\n" + "\n".join(about_flood)
