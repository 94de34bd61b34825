"""Waking agents across real processes: a waiting `peerd mcp` call wakes on writes made by other
processes, with no daemon (its file watch) and beside a daemon (the daemon's change stream); the
daemon notices other processes' writes without polling and ends waiting requests at stop."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from peerd.config import Config
from peerd.node import Node
from replica import Replica
from tests.daemons import PEERD, Daemon, Fleet, wait_until
from tests.waiting import eventually

pytest_plugins = ["tests.daemons"]

REPO = Path(__file__).resolve().parent.parent

WAKE_BOUND = 5.0  # seconds from a write to the waiting call's return: generous for a busy machine
WRITER = """
import sys
from pathlib import Path
from replica import open_home
with open_home(Path(sys.argv[1])) as r:
    print(r.send_message("writer", sys.argv[2], "written by another process").id, flush=True)
"""


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def peerd(*args: str) -> dict[str, Any]:
    out = subprocess.run([str(PEERD), *args, "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def mcp_pid(home: Path) -> int:
    """The pid of the `peerd mcp` process serving ``home``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mcp" in argv and os.fsencode(home) in argv:
                return int(entry.name)
    raise AssertionError(f"no peerd mcp process for {home}")


def fds(pid: int) -> list[str]:
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            continue
    return out


def watchers(pid: int) -> int:
    """How many file watches (inotify instances) the process holds."""
    return sum(1 for target in fds(pid) if target == "anon_inode:inotify")


def db_handles(pid: int, home: Path) -> int:
    """How many SQLite connections of the process have the replica file open."""
    db = str(home / "replica.db")
    return sum(1 for target in fds(pid) if target == db)


@asynccontextmanager
async def stdio(home: Path, role: str | None = None) -> AsyncIterator[Client]:
    args = ["mcp", "--home", str(home), *(["--role", role] if role else [])]
    async with Client(StdioServerParameters(command=str(PEERD), args=args)) as c:
        yield c


async def waiting_check(c: Client, **args: Any) -> asyncio.Task[CallToolResult]:
    """Start a check_messages(wait) call and see that it is still waiting after a later round trip."""
    call = asyncio.create_task(c.call_tool("check_messages", {"wait": 120, **args}))
    await c.call_tool("whoami", {})
    assert not call.done()
    return call


async def woken_with(call: asyncio.Task[CallToolResult], written_at: float, c: Client | None = None) -> list[str]:
    """What the waiting call returned (checking that it came soon); with ``c``, marks it read."""
    result = data(await asyncio.wait_for(call, 30))
    assert time.monotonic() - written_at < WAKE_BOUND, "the waiting call woke too late"
    if c is not None:
        data(await c.call_tool("mark_as_read", {"receiptIds": [m["receiptId"] for m in result["messages"]]}))
    return [m["content"] for m in result["messages"]]


def live_with(a: Daemon, b: Daemon) -> None:
    wait_until(lambda: (a.peer(b) or {}).get("reachable") and (b.peer(a) or {}).get("reachable"), 30,
               "the two daemons to see each other")


# -- no daemon: the file watch ------------------------------------------------------------------------


async def test_peerd_send_wakes_a_waiting_stdio_call_with_no_daemon(tmp_path: Path) -> None:
    """`peerd send` in another process on the same home wakes `peerd mcp`'s check_messages(wait)."""
    home = tmp_path / "home"
    peerd("init", "--home", str(home), "--name", "solo")
    async with stdio(home, "beta") as c:
        call = await waiting_check(c)
        await asyncio.to_thread(peerd, "send", "--home", str(home), "--from", "alpha", "--to", "beta", "wake up")
        assert await woken_with(call, time.monotonic()) == ["wake up"]


async def test_one_watcher_per_process_however_many_calls_wait(tmp_path: Path) -> None:
    """Ten calls waiting on one `peerd mcp` share one file watch and one extra connection; one
    broadcast written elsewhere wakes all ten."""
    home = tmp_path / "home"
    peerd("init", "--home", str(home), "--name", "solo")
    async with stdio(home) as c:
        one = await waiting_check(c, recipient="r0")
        pid = mcp_pid(home)
        alone = (watchers(pid), db_handles(pid, home))
        calls = [one, *[await waiting_check(c, recipient=f"r{i}") for i in range(1, 10)]]
        assert (watchers(pid), db_handles(pid, home)) == alone == (1, 2)  # the replica's connection + the watch's
        await asyncio.to_thread(peerd, "send", "--home", str(home), "--from", "alpha", "--to", "broadcast", "all")
        written = time.monotonic()
        for call in calls:
            assert await woken_with(call, written) == ["all"]


# -- beside a daemon: its change stream ----------------------------------------------------------------


async def test_stdio_follows_the_daemon_stream_and_falls_back_to_the_file(fleet: Fleet) -> None:
    """`peerd mcp` drops its file watch for the daemon's change stream when a daemon starts on its home,
    wakes on writes through the daemon, and watches the file again once the daemon stops."""
    d = fleet.add("d")
    fleet.init([d])
    async with stdio(d.home, "beta") as c:
        pid = mcp_pid(d.home)
        assert watchers(pid) == 1
        await asyncio.to_thread(fleet.start, d)
        await asyncio.to_thread(wait_until, lambda: watchers(pid) == 0, 30, "peerd mcp to follow the daemon")
        call = await waiting_check(c)
        await asyncio.to_thread(peerd, "send", "--home", str(d.home), "--from", "alpha", "--to", "beta", "via daemon")
        assert await woken_with(call, time.monotonic(), c) == ["via daemon"]

        assert await asyncio.to_thread(d.stop) == 0
        await asyncio.to_thread(wait_until, lambda: watchers(pid) == 1, 30, "peerd mcp to watch the file again")
        call = await waiting_check(c)
        await asyncio.to_thread(peerd, "send", "--home", str(d.home), "--from", "alpha", "--to", "beta", "offline")
        assert await woken_with(call, time.monotonic()) == ["offline"]


async def test_a_message_synced_from_a_peer_wakes_a_stdio_call(fleet: Fleet) -> None:
    """A message sent on daemon A reaches daemon B by sync and wakes a `peerd mcp` call on B's home."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    await asyncio.to_thread(live_with, a, b)
    async with stdio(b.home, "beta") as c:
        pid = mcp_pid(b.home)
        await asyncio.to_thread(wait_until, lambda: watchers(pid) == 0, 30, "peerd mcp to follow daemon B")
        call = await waiting_check(c)
        await asyncio.to_thread(a.send, "alpha", "beta", "from across the fleet")
        assert await woken_with(call, time.monotonic()) == ["from across the fleet"]


def set_gossip(home: Path, interval: float) -> None:
    """Slow periodic rounds right down, so only a push can carry a write quickly."""
    cfg = home / "config.toml"
    text = re.sub(r"(?m)^gossip_interval = .*$", f"gossip_interval = {interval}", cfg.read_text())
    text = re.sub(r"(?m)^gossip_max_interval = .*$", f"gossip_max_interval = {interval * 2}", text)
    cfg.write_text(text)


def test_daemon_pushes_an_op_written_by_another_process(fleet: Fleet) -> None:
    """A write made on A's home by a separate process (not through A) is noticed by A's feed and
    pushed to B at once: it arrives long before the next periodic round could carry it."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.init([a, b])
    for d in (a, b):
        set_gossip(d.home, 120.0)
    fleet.start()
    live_with(a, b)
    out = subprocess.run([sys.executable, "-c", WRITER, str(a.home), "beta"],
                         capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    msg_id = out.stdout.strip()
    wait_until(lambda: b.has_message(msg_id), 20, "B to receive the op pushed by A")
    assert a.has_message(msg_id)


async def test_node_runs_no_periodic_watch_task(tmp_path: Path) -> None:
    """A running node's background tasks are the gossip schedule, the pusher, the indexer, the purger,
    the check of what snapshots let through and the keeper of relay links (woken by rounds and links,
    ``peerd.relaylink``): none polls the database; its pusher is woken by the feed."""
    with Replica.open(tmp_path / "replica.db") as rep:
        node = Node(Config(name="n", fleet_key=b"k" * 32, port=0, local_port=0, mdns=False), rep, bind="127.0.0.1")
        await node.start()
        try:
            names = {getattr(t.get_coro(), "__qualname__", None) for t in node._tasks}
            assert names == {"Node._gossip", "Node._pusher", "keep_indexed", "keep_retention", "Snapshotting._check_loop",
                             "RelayLinks.keep"}
            assert not hasattr(node, "_watch")
        finally:
            await node.stop()


async def test_pusher_alone_steps_past_writes_without_reading_them(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With no live peer, a write wakes the pusher, which moves past it without a trip to the replica
    (nothing to push to); its position still follows the feed, as if it had read and pushed nothing."""
    with Replica.open(tmp_path / "replica.db") as rep:
        node = Node(Config(name="n", fleet_key=b"k" * 32, port=0, local_port=0, mdns=False), rep, bind="127.0.0.1")
        await node.start()
        reads: list[int] = []
        real = Replica.local_ops_after
        monkeypatch.setattr(Replica, "local_ops_after",
                            lambda self, lseq, limit=1000: reads.append(lseq) or real(self, lseq, limit))
        try:
            assert not node.table.live()
            for i in range(3):
                await asyncio.to_thread(rep.send_message, "a", "b", f"m{i}")
            mark = await asyncio.to_thread(rep.max_lseq)
            await eventually(lambda: node._pushed == mark or None, 10, "the pusher to reach the newest op")
            assert reads == []
        finally:
            await node.stop()


# -- daemon stop ends waiting requests ---------------------------------------------------------------------


def stream(d: Daemon, path: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", int(d.info["local_port"]), timeout=60)
    conn.request("GET", path, headers=d.auth)
    return conn, conn.getresponse()


def test_waiting_api_requests_and_streams_end_at_daemon_stop(fleet: Fleet) -> None:
    """A check waiting 300 s, the dashboard's event stream and the change feed all end cleanly as
    soon as the daemon is told to stop, and the daemon exits 0."""
    d = fleet.add("d")
    fleet.start(d)
    port = int(d.info["local_port"])
    check = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    check.request("POST", "/api/check", body=json.dumps({"recipient": "nobody", "wait": 300}),
                  headers={**d.auth, "Content-Type": "application/json"})
    # The server accepts connections in order: once the streams below answer, it holds the check too.
    events_conn, events = stream(d, "/api/events")
    assert events.readline() == b"retry: 1000\n"
    feed_conn, feed = stream(d, "/api/feed")
    assert isinstance(json.loads(feed.readline())["lseq"], int)
    results: dict[str, Any] = {}

    def answer() -> None:
        resp = check.getresponse()
        results["check"] = (resp.status, json.loads(resp.read()), time.monotonic())

    reader = threading.Thread(target=answer)
    reader.start()
    stopped = time.monotonic()
    assert d.stop() == 0
    reader.join(30)
    status, inbox, ended = results["check"]
    assert status == 200 and inbox["messages"] == [] and ended - stopped < WAKE_BOUND
    assert b"event: hello" in events.read()  # read() to a clean end of the chunked stream (no IncompleteRead)
    assert feed.read() == b""
    for conn in (events_conn, feed_conn, check):
        conn.close()
