"""Waking agents: how soon a waiting MCP call returns after another process writes, and what
waiting costs while nothing happens.

* Wake latency: a `peerd mcp` (stdio, SDK client) has `check_messages(wait=30)` waiting; a
  separate writer process commits a message for it; latency = the call's return minus the
  writer's commit (wall clock, both on this machine). Measured with no daemon (the mcp
  process's own file watch) and beside a running daemon (the daemon notices the write and
  tells the mcp process over its change stream, `/api/feed`).
* Idle CPU: the same `peerd mcp` with 10 calls waiting, CPU time from /proc/<pid>/stat over
  a window with nothing written, with and without a daemon. The daemon's own idle CPU is
  printed for information.

Targets: wake p50 and p99 <= 50 ms; idle CPU of `peerd mcp` with 10 waiting calls < 1 %.
Linux only (/proc).

    uv run python bench/bench_wake.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _util import Figure, at_most, note, percentile, print_summary, report, section
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

PEERD = Path(sys.executable).parent / "peerd"
WAKE_TARGET_MS = 50.0
IDLE_TARGET_PCT = 1.0
WAITING_CALLS = 10
# A writer that stays up (so its start-up is not timed): one message per stdin line, each
# answered with the wall-clock time right after its commit.
WRITER = """
import sys, time
from pathlib import Path
from replica import open_home
with open_home(Path(sys.argv[1])) as r:
    for line in sys.stdin:
        r.send_message("bench", line.strip(), "wake up")
        print(time.time(), flush=True)
"""
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_percent(pid: int, seconds: float) -> float:
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - t0)


def watchers(pid: int) -> int:
    """File watches (inotify instances) the process holds: 0 while it follows a daemon's stream."""
    out = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            out += os.readlink(fd) == "anon_inode:inotify"
    return out


def mcp_pid(home: Path) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mcp" in argv and os.fsencode(home) in argv:
                return int(entry.name)
    raise RuntimeError("no peerd mcp process found")


def until(pred: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_writer(home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def start_daemon(home: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([str(PEERD), "run", "--home", str(home), "--port", "0", "--local-port", "0",
                             "--no-mdns", "--log-level", "warning"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    info = home / "daemon.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if info.exists() and json.loads(info.read_text()).get("pid") == proc.pid:
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("daemon did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def wake_latencies(client: Client, writer: subprocess.Popen[str], count: int) -> list[float]:
    """``count`` samples: a call waits for role r<i>; the writer writes to r<i>; ms until it returns."""
    assert writer.stdin is not None and writer.stdout is not None
    out = []
    for i in range(count):
        role = f"r{i}-{time.monotonic_ns()}"
        call = asyncio.create_task(client.call_tool("check_messages", {"recipient": role, "wait": 30}))
        await client.call_tool("whoami", {})  # a later round trip: the call is parked by now
        await asyncio.sleep(0.02)  # let the process settle between samples (not a synchronisation)
        writer.stdin.write(role + "\n")
        writer.stdin.flush()
        committed = float(await asyncio.to_thread(writer.stdout.readline))
        messages = ok(await call)["messages"]
        returned = time.time()
        assert [m["content"] for m in messages] == ["wake up"], messages
        out.append((returned - committed) * 1000)
    return out


async def idle_cpu(client: Client, pid: int, seconds: float) -> float:
    calls = [asyncio.create_task(client.call_tool("check_messages", {"recipient": f"idle{i}", "wait": seconds + 30}))
             for i in range(WAITING_CALLS)]
    await client.call_tool("whoami", {})
    await asyncio.sleep(1.0)  # let start-up work of the calls finish before the window opens
    pct = await asyncio.to_thread(cpu_percent, pid, seconds)
    assert not any(c.done() for c in calls), "a waiting call returned during the idle window"
    for c in calls:
        c.cancel()
    return pct


async def scenario(home: Path, label: str, count: int, idle_s: float, *, daemon: bool) -> list[Figure]:
    figures: list[Figure] = []
    proc = await asyncio.to_thread(start_daemon, home) if daemon else None
    writer = await asyncio.to_thread(start_writer, home)
    try:
        params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home)])
        async with Client(params) as client:
            pid = mcp_pid(home)
            if daemon:
                await asyncio.to_thread(until, lambda: watchers(pid) == 0, "peerd mcp to follow the daemon's stream")
                note("peerd mcp follows the daemon's change stream (no file watch of its own)")
            else:
                note(f"peerd mcp watches the replica file itself ({watchers(pid)} file watch)")
            await wake_latencies(client, writer, 5)  # warm up
            lat = await wake_latencies(client, writer, count)
            figures.append(report(Figure(f"{label}: wake p50", percentile(lat, 50), "ms", at_most(WAKE_TARGET_MS))))
            figures.append(report(Figure(f"{label}: wake p99", percentile(lat, 99), "ms", at_most(WAKE_TARGET_MS))))
            pct = await idle_cpu(client, pid, idle_s)
            figures.append(report(Figure(f"{label}: idle CPU of peerd mcp, {WAITING_CALLS} calls waiting", pct, "%",
                                         at_most(IDLE_TARGET_PCT))))
            if proc is not None:
                note(f"the daemon's own idle CPU over the same kind of window: "
                     f"{await asyncio.to_thread(cpu_percent, proc.pid, idle_s):.2f} %")
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        await asyncio.to_thread(writer.wait, 30)
        if proc is not None:
            await asyncio.to_thread(stop, proc)
    return figures


async def run(home: Path, count: int, idle_s: float) -> list[Figure]:
    section("no daemon: `peerd mcp` watches the replica file")
    figures = await scenario(home, "no daemon", count, idle_s, daemon=False)
    section("with a daemon: `peerd mcp` follows the daemon's change stream")
    figures += await scenario(home, "with daemon", count, idle_s, daemon=True)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="wake latency and idle cost of waiting MCP calls")
    parser.add_argument("--quick", action="store_true", help="fewer samples, a shorter idle window")
    args = parser.parse_args(argv)
    count, idle_s = (30, 5.0) if args.quick else (200, 10.0)
    print(f"peerd wake benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        subprocess.run([str(PEERD), "init", "--home", str(home), "--name", "bench"], check=True,
                       stdout=subprocess.DEVNULL)
        figures = asyncio.run(run(home, count, idle_s))
    print_summary(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
