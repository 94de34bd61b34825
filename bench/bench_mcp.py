"""MCP tool-call latency: send_message and check_messages over streamable HTTP (a real
daemon) and over stdio (a real `peerd mcp` process), with 100k messages in the replica.

Baseline, measured in the same run: the same calls made straight on the Python API
(in-process, no MCP, no transport). Target: p50 <= 5 ms over HTTP. The daemon is
started by the test suite's harness (``tests/daemons.py``).

    uv run python bench/bench_mcp.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import Figure, at_most, note, percentile, print_summary, report, section  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from sim import apply_in_batches, workload  # noqa: E402

from peerd.config import init_home  # noqa: E402
from replica import open_home  # noqa: E402
from tests.daemons import PEERD, Daemon  # noqa: E402 - needs the repo root on sys.path


def build_home(home: Path, messages: int) -> float:
    """A home whose replica holds ``messages`` foreign messages (4 origins); returns seconds."""
    init_home(home, name="bench")
    started = time.perf_counter()
    per = messages // 4
    with open_home(home) as rep:
        for raws in workload(4, per):
            apply_in_batches(rep, raws, 2_000)
        rep.catch_up()
    return time.perf_counter() - started


async def timed(call: Callable[[int], Awaitable[object]], count: int) -> list[float]:
    out = []
    for i in range(count):
        t = time.perf_counter()
        await call(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def tool_latencies(client: Client, count: int) -> dict[str, list[float]]:
    async def send(i: int) -> object:
        result = await client.call_tool("send_message", {"from": "bench", "channel": "reader", "content": f"m{i}"})
        assert not result.is_error, result.content
        return result

    async def check(_i: int) -> object:
        result = await client.call_tool("check_messages", {"recipient": "reader", "limit": 10})
        assert not result.is_error, result.content
        return result

    await timed(send, 20)  # warm up
    await timed(check, 20)
    return {"send_message": await timed(send, count), "check_messages": await timed(check, count)}


def direct_latencies(home: Path, count: int) -> dict[str, list[float]]:
    with open_home(home) as rep:
        def send(i: int) -> None:
            rep.send_message("bench", "reader", f"d{i}")

        def check(_i: int) -> None:
            rep.check_messages("reader", limit=10)

        out: dict[str, list[float]] = {"send_message": [], "check_messages": []}
        for name, fn in (("send_message", send), ("check_messages", check)):
            for i in range(count):
                t = time.perf_counter()
                fn(i)
                out[name].append((time.perf_counter() - t) * 1000)
    return out


def figures_for(label: str, lat: dict[str, list[float]], base: dict[str, list[float]],
                target: float | None) -> list[Figure]:
    figs = []
    for tool in ("send_message", "check_messages"):
        p50, p99 = percentile(lat[tool], 50), percentile(lat[tool], 99)
        b50, b99 = percentile(base[tool], 50), percentile(base[tool], 99)
        figs.append(report(Figure(f"{label} {tool} p50", p50, "ms", at_most(target) if target else None, b50)))
        figs.append(report(Figure(f"{label} {tool} p99", p99, "ms", None, b99)))
    return figs


async def run(messages: int, count: int, root: Path) -> list[Figure]:
    home = root / "home"
    section(f"building a replica with {messages:,} messages")
    note(f"built in {build_home(home, messages):.1f} s (not timed)")
    section("baseline: the Python API in-process")
    base = direct_latencies(home, count)
    for tool, xs in base.items():
        note(f"{tool}: p50 {percentile(xs, 50):.3f} ms, p99 {percentile(xs, 99):.3f} ms")
    figures: list[Figure] = []
    section("streamable HTTP to a running daemon (SDK client, one session)")
    daemon = Daemon("daemon", home, 0, fleet_key="", log_level="warning")
    daemon.initialised = True  # build_home made it
    info = await asyncio.to_thread(daemon.start)
    try:
        async with Client(info["mcp_url"]) as client:
            figures += figures_for("HTTP", await tool_latencies(client, count), base, 5.0)
    finally:
        daemon.stop(30)
    section("stdio to `peerd mcp` (SDK client)")
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home)])
    async with Client(params) as client:
        figures += figures_for("stdio", await tool_latencies(client, count), base, None)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="MCP tool-call latency over HTTP and stdio")
    parser.add_argument("--quick", action="store_true", help="10k messages, fewer calls")
    args = parser.parse_args(argv)
    messages, count = (10_000, 100) if args.quick else (100_000, 500)
    print(f"peerd MCP latency benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(run(messages, count, Path(tmp)))
    print_summary(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
