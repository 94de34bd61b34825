"""Mail that wakes the agent: how soon a message that lands in a replica reaches an agent session
as a Claude Code channel event, or as a resource update on a 2026-07-28 listen stream, and what
waiting sessions cost while nothing happens.

* Arrival to notification, two daemons: `peerd mcp --role beta` (stdio, SDK client) runs on B's
  home and follows B's daemon; a message for beta is sent on A, reaches B by push-on-write, and
  is pushed to the session. Latency = the event's arrival at the client minus the moment the
  message became visible in B's replica, seen by a file watch of this script on B's replica (the
  event's `seq` meta is B's arrival position). Send-to-event (A's API call to the event) is
  printed too.
* The same with no daemon: a writer process commits a message on the home of a `peerd mcp`
  session; latency = event minus the writer's commit.
* The listen path (MCP 2026-07-28), beside each: an SDK client pinned to 2026-07-28 listens
  (`subscriptions/listen`) to `peerd://inbox/beta` on `peerd mcp` (stdio, on B's home) and on
  B's /mcp (HTTP), and to `peerd://inbox/solo` on `peerd mcp` with no daemon; latency = the
  `notifications/resources/updated` at the client minus the arrival (the first new mark this
  script's file watch saw after the send) or the writer's commit.
* Idle CPU: 10 `peerd mcp --role rN` channel sessions beside a daemon, CPU time from
  /proc/<pid>/stat over a window with nothing written (each one, and their sum); and 10
  sessions bound by X-Peerd-Role on the daemon's /mcp, the daemon's CPU over the same window;
  then the same with 10 listen streams instead (10 `peerd mcp` processes, 10 streams on /mcp).

Targets, channel and listen path alike: arrival to notification p50 and p99 <= 50 ms; idle CPU
of each `peerd mcp` < 1 % (and of the daemon with 10 HTTP sessions). Linux only (/proc, inotify).

    uv run python bench/bench_push.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import Figure, at_most, fmt, note, percentile, print_summary, report, section  # noqa: E402
from bench_wake import WRITER, cpu_percent, cpu_seconds  # noqa: E402

from replica.feed import FileWatch  # noqa: E402
from tests.channels import Pushes, pushed_client  # noqa: E402 - needs the repo root on sys.path
from tests.daemons import Daemon, Fleet, wait_until  # noqa: E402

PEERD = Path(sys.executable).parent / "peerd"
LATENCY_TARGET_MS = 50.0
IDLE_TARGET_PCT = 1.0
SESSIONS = 10


class Arrivals:
    """Stands in for a change feed: a ``FileWatch`` on B's replica tells it each new mark; it keeps
    the moment each mark was first seen (a commit visible to a reader of the file)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._seen: list[tuple[int, float]] = []
        self.mark = 0

    def advance(self, mark: int) -> None:
        now = time.perf_counter()
        with self._lock:
            if mark > self.mark:
                self.mark = mark
                self._seen.append((mark, now))
                self._lock.notify_all()

    def when(self, seq: int) -> float | None:
        with self._lock:
            return next((t for mark, t in self._seen if mark >= seq), None)

    def first_beyond(self, mark: int, timeout: float = 5.0) -> float | None:
        """When a mark beyond ``mark`` was first seen (waiting for it up to ``timeout`` s: the event
        may reach the client before this script's watch sees the commit)."""
        with self._lock:
            self._lock.wait_for(lambda: self.mark > mark, timeout)
        return self.when(mark + 1)


def stdio(home: Path, role: str | None) -> StdioServerParameters:
    """`peerd mcp` on ``home``, bound to ``role`` (a channel session), or unbound (None)."""
    bound = [] if role is None else ["--role", role]
    return StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), *bound])


def mcp_pids(home: Path) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mcp" in argv and os.fsencode(home) in argv:
                out.append(int(entry.name))
    return out


async def latency_two_daemons(a: Daemon, b: Daemon, count: int) -> list[Figure]:
    arrivals = Arrivals()
    watch = FileWatch(b.db)
    watch.start(arrivals)  # type: ignore[arg-type] - it only calls advance()
    try:
        async with pushed_client(stdio(b.home, "beta")) as (client, pushes):
            await client.call_tool("whoami", {})
            samples: list[float] = []
            e2e: list[float] = []
            for i in range(count + 5):
                sent_at = time.perf_counter()
                await asyncio.to_thread(a.send, "alpha", "beta", f"ping {i}")
                event = await pushes.next_event()
                got = time.perf_counter()
                landed = arrivals.when(int(event.meta["seq"]))
                if i >= 5 and landed is not None:  # the first few warm up both processes
                    samples.append(max(0.0, got - landed) * 1000)
                    e2e.append((got - sent_at) * 1000)
                await asyncio.sleep(0.02)  # let both daemons settle between samples (not a synchronisation)
    finally:
        watch.stop()
    note(f"send on A to event at the client: p50 {fmt(percentile(e2e, 50))} ms, p99 {fmt(percentile(e2e, 99))} ms "
         "(includes the push from A to B)")
    return [report(Figure("two daemons: arrival to event p50", percentile(samples, 50), "ms",
                          at_most(LATENCY_TARGET_MS))),
            report(Figure("two daemons: arrival to event p99", percentile(samples, 99), "ms",
                          at_most(LATENCY_TARGET_MS)))]


@asynccontextmanager
async def listener(target: Any, uri: str) -> AsyncIterator[asyncio.Queue[float]]:
    """An SDK client pinned to 2026-07-28 on ``target``, listening to ``uri``: the queue gets the
    moment each of its updates reached the client."""
    heard: asyncio.Queue[float] = asyncio.Queue()
    async with Client(target, mode="2026-07-28") as client, client.listen(resource_subscriptions=[uri]) as stream:

        async def pump() -> None:
            async for _event in stream:
                heard.put_nowait(time.perf_counter())

        task = asyncio.create_task(pump())
        try:
            yield heard
        finally:
            task.cancel()


@asynccontextmanager
async def http_target(url: str, auth: dict[str, str]) -> AsyncIterator[Any]:
    async with httpx2.AsyncClient(headers=auth) as http:
        yield streamable_http_client(url, http_client=http)


async def listen_latency_two_daemons(a: Daemon, b: Daemon, count: int, how: str, target: Any) -> list[Figure]:
    """A message for beta sent on A, to the listen stream's update at a client of B (``how``)."""
    arrivals = Arrivals()
    watch = FileWatch(b.db)
    watch.start(arrivals)  # type: ignore[arg-type] - it only calls advance()
    try:
        async with listener(target, "peerd://inbox/beta") as heard:
            samples: list[float] = []
            for i in range(count + 5):
                before = arrivals.mark
                await asyncio.to_thread(a.send, "alpha", "beta", f"ping {i}")
                got = await asyncio.wait_for(heard.get(), 30)
                landed = await asyncio.to_thread(arrivals.first_beyond, before)
                if i >= 5 and landed is not None:  # the first few warm up both processes
                    samples.append(max(0.0, got - landed) * 1000)
                await asyncio.sleep(0.02)  # let both daemons settle between samples (not a synchronisation)
    finally:
        watch.stop()
    return [report(Figure(f"two daemons, listen ({how}): arrival to update p{pct}", percentile(samples, pct), "ms",
                          at_most(LATENCY_TARGET_MS))) for pct in (50, 99)]


def start_writer(home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)


async def commit_to_event(writer: subprocess.Popen[str], count: int, heard: Callable[[], Awaitable[object]]
                          ) -> list[float]:
    """ms from each of ``count`` commits by ``writer`` (after 5 to warm up) to the event ``heard`` awaits."""
    assert writer.stdin is not None and writer.stdout is not None
    samples = []
    for i in range(count + 5):
        writer.stdin.write("solo\n")
        writer.stdin.flush()
        committed = float(await asyncio.to_thread(writer.stdout.readline))
        await heard()
        if i >= 5:
            samples.append((time.time() - committed) * 1000)
        await asyncio.sleep(0.02)  # (not a synchronisation)
    return samples


async def latency_no_daemon(home: Path, count: int) -> list[Figure]:
    writer = await asyncio.to_thread(start_writer, home)
    assert writer.stdin is not None
    try:
        async with pushed_client(stdio(home, "solo")) as (client, pushes):
            await client.call_tool("whoami", {})
            samples = await commit_to_event(writer, count, pushes.next_event)
    finally:
        writer.stdin.close()
        await asyncio.to_thread(writer.wait, 30)
    return [report(Figure("no daemon: commit to event p50", percentile(samples, 50), "ms",
                          at_most(LATENCY_TARGET_MS))),
            report(Figure("no daemon: commit to event p99", percentile(samples, 99), "ms",
                          at_most(LATENCY_TARGET_MS)))]


async def listen_latency_no_daemon(home: Path, count: int) -> list[Figure]:
    writer = await asyncio.to_thread(start_writer, home)
    assert writer.stdin is not None
    try:
        async with listener(stdio(home, None), "peerd://inbox/solo") as heard:
            samples = await commit_to_event(writer, count, lambda: asyncio.wait_for(heard.get(), 30))
    finally:
        writer.stdin.close()
        await asyncio.to_thread(writer.wait, 30)
    return [report(Figure(f"no daemon, listen (stdio): commit to update p{pct}", percentile(samples, pct), "ms",
                          at_most(LATENCY_TARGET_MS))) for pct in (50, 99)]


@asynccontextmanager
async def stdio_sessions(home: Path, count: int) -> AsyncIterator[list[Pushes]]:
    async with AsyncExitStack() as stack:
        out = []
        for i in range(count):
            client, pushes = await stack.enter_async_context(pushed_client(stdio(home, f"idle{i}")))
            await client.call_tool("whoami", {})
            out.append(pushes)
        yield out


@asynccontextmanager
async def http_sessions(url: str, count: int, auth: dict[str, str]) -> AsyncIterator[list[Pushes]]:
    async with AsyncExitStack() as stack:
        out = []
        for i in range(count):
            http = await stack.enter_async_context(httpx2.AsyncClient(headers={"X-Peerd-Role": f"web{i}", **auth}))
            client, pushes = await stack.enter_async_context(
                pushed_client(streamable_http_client(url, http_client=http)))
            await client.call_tool("whoami", {})
            out.append(pushes)
        yield out


async def idle_cpu(d: Daemon, seconds: float) -> list[Figure]:
    figures: list[Figure] = []
    async with stdio_sessions(d.home, SESSIONS):
        pids = mcp_pids(d.home)
        assert len(pids) == SESSIONS, pids
        await asyncio.sleep(1.0)  # let start-up work finish before the window opens
        before = {pid: cpu_seconds(pid) for pid in pids}
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        took = time.monotonic() - t0
        pct = [100 * (cpu_seconds(pid) - before[pid]) / took for pid in pids]
        figures.append(report(Figure(f"idle CPU of each peerd mcp channel session (max of {SESSIONS})", max(pct),
                                     "%", at_most(IDLE_TARGET_PCT))))
        note(f"all {SESSIONS} together: {fmt(sum(pct))} %")
    assert d.proc is not None
    alone = await asyncio.to_thread(cpu_percent, d.proc.pid, seconds)
    note(f"the daemon alone (gossip with its peer, no MCP session) over the same window: {fmt(alone)} %")
    async with http_sessions(d.info["mcp_url"], SESSIONS, d.auth):
        await asyncio.sleep(1.0)
        pct_d = await asyncio.to_thread(cpu_percent, d.proc.pid, seconds)
        figures.append(report(Figure(f"idle CPU of the daemon with {SESSIONS} HTTP push sessions", pct_d, "%",
                                     at_most(IDLE_TARGET_PCT))))
    return figures


@asynccontextmanager
async def listen_streams(d: Daemon, count: int) -> AsyncIterator[None]:
    """``count`` listen streams on ``peerd mcp`` processes on ``d``'s home, and ``count`` on its /mcp."""
    async with AsyncExitStack() as stack:
        for i in range(count):
            await stack.enter_async_context(listener(stdio(d.home, None), f"peerd://inbox/idle{i}"))
            target = await stack.enter_async_context(http_target(d.info["mcp_url"], d.auth))
            await stack.enter_async_context(listener(target, f"peerd://inbox/web{i}"))
        yield


async def idle_cpu_listening(d: Daemon, seconds: float) -> list[Figure]:
    async with listen_streams(d, SESSIONS):
        pids = mcp_pids(d.home)
        assert len(pids) == SESSIONS, pids
        await asyncio.sleep(1.0)  # let start-up work finish before the window opens
        assert d.proc is not None
        before, t0 = {pid: cpu_seconds(pid) for pid in pids}, time.monotonic()
        pct_d = await asyncio.to_thread(cpu_percent, d.proc.pid, seconds)  # the daemon's, over the same window
        took = time.monotonic() - t0
        pct = [100 * (cpu_seconds(pid) - before[pid]) / took for pid in pids]
    note(f"all {SESSIONS} listening peerd mcp together: {fmt(sum(pct))} %")
    return [report(Figure(f"idle CPU of each peerd mcp with a listen stream (max of {SESSIONS})", max(pct), "%",
                          at_most(IDLE_TARGET_PCT))),
            report(Figure(f"idle CPU of the daemon with {SESSIONS} HTTP listen streams", pct_d, "%",
                          at_most(IDLE_TARGET_PCT)))]


async def run(root: Path, count: int, idle_s: float) -> list[Figure]:
    fleet = Fleet(root / "fleet")
    try:
        a, b = fleet.add("a"), fleet.add("b")
        fleet.mesh()
        await asyncio.to_thread(fleet.start)
        await asyncio.to_thread(wait_until, lambda: (a.peer(b) or {}).get("reachable") and
                                (b.peer(a) or {}).get("reachable"), 30, "the daemons to see each other")
        section("two daemons: a message sent on A, pushed to `peerd mcp --role beta` on B's home")
        figures = await latency_two_daemons(a, b, count)
        section("two daemons, listen path (2026-07-28): the same message, an update on a listen stream at B")
        figures += await listen_latency_two_daemons(a, b, count, "stdio", stdio(b.home, None))
        async with http_target(b.info["mcp_url"], b.auth) as target:
            figures += await listen_latency_two_daemons(a, b, count, "HTTP", target)
        section(f"idle: {SESSIONS} channel sessions beside daemon B, then {SESSIONS} HTTP sessions on its /mcp")
        figures += await idle_cpu(b, idle_s)
        section(f"idle, listen path: {SESSIONS} `peerd mcp` listen streams and {SESSIONS} on daemon B's /mcp")
        figures += await idle_cpu_listening(b, idle_s)
    finally:
        await asyncio.to_thread(fleet.close)
    section("no daemon: a write by another process, pushed to `peerd mcp --role solo`")
    home = root / "solo"
    await asyncio.to_thread(subprocess.run, [str(PEERD), "init", "--home", str(home), "--name", "solo"], check=True,
                            stdout=subprocess.DEVNULL)
    figures += await latency_no_daemon(home, count)
    section("no daemon, listen path: the same write, an update on a listen stream of `peerd mcp`")
    figures += await listen_latency_no_daemon(home, count)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="push latency and idle cost of channel sessions")
    parser.add_argument("--quick", action="store_true", help="fewer samples, a shorter idle window")
    args = parser.parse_args(argv)
    count, idle_s = (30, 5.0) if args.quick else (200, 10.0)
    print(f"peerd push benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="peerd-bench-push-") as tmp:
        figures = asyncio.run(run(Path(tmp), count, idle_s))
    print_summary(figures)
    print(f"load average now {os.getloadavg()[0]:.1f} (latency percentiles are only comparable on an idle machine)")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
