"""Cold start: how long each way of starting peerd takes, against a bare MCP server's start.

Figures (medians over rounds; the kinds alternate within each round, so load hits all alike):

* ``peerd run`` spawn to ``daemon.json`` naming its pid (both listeners accept);
* the daemon's first MCP ``initialize`` over HTTP after that (MCP is built on this request);
* ``peerd mcp`` spawn to the SDK client's ``initialize()`` done (stdio);
* ``peerd send`` with no daemon (straight on the replica file), spawn to exit;
* floors, measured in the same run on the same interpreter: a bare ``MCPServer`` (same SDK,
  stdio, one tool) spawn to ``initialize()`` done, and ``python -c pass``.

Targets: ``peerd mcp`` and ``peerd run`` within 1.2x the bare MCP server.

    uv run python bench/bench_startup.py [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from _util import Figure, at_most, mcp_session, note, percentile, print_summary, report, section
from mcp import Client, StdioServerParameters

from peerd.config import init_home
from peerd.home import read_local_token

PEERD = Path(sys.executable).parent / "peerd"
READY_POLL = 0.002  # seconds between looks for daemon.json (the resolution of that figure)

FLOOR_SERVER = """
from mcp.server import MCPServer

server = MCPServer("floor")


@server.tool()
def echo(text: str) -> str:
    return text


server.run("stdio")
"""


async def mcp_start(params: StdioServerParameters) -> float:
    """Seconds from spawning a stdio MCP server to the client's initialize() done."""
    t = time.perf_counter()
    async with Client(params):
        return time.perf_counter() - t


async def run_to_ready(home: Path) -> tuple[float, float]:
    """``peerd run`` spawn to daemon.json (s), then its first MCP initialize over HTTP (s)."""
    (home / "daemon.json").unlink(missing_ok=True)
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        str(PEERD), "run", "--home", str(home), "--port", "0", "--local-port", "0", "--no-mdns", "--log-level",
        "warning", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        info = await _wait_info(home, proc)
        ready = time.perf_counter() - t
        t = time.perf_counter()
        async with mcp_session(str(info["mcp_url"]), read_local_token(home)):
            first_mcp = time.perf_counter() - t
        return ready, first_mcp
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def _wait_info(home: Path, proc: asyncio.subprocess.Process) -> dict[str, object]:
    path = home / "daemon.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"peerd run exited with {proc.returncode}")
        try:
            info = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            info = None
        if isinstance(info, dict) and info.get("pid") == proc.pid:
            return info
        await asyncio.sleep(READY_POLL)
    raise RuntimeError("peerd run not ready within 120 s")


async def spawn_to_exit(argv: list[str]) -> float:
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[1:3]} failed ({proc.returncode}): {err.decode(errors='replace')}")
    return time.perf_counter() - t


async def measure(root: Path, rounds: int) -> dict[str, list[float]]:
    home = root / "home"
    init_home(home, name="bench")
    floor = StdioServerParameters(command=sys.executable, args=["-c", FLOOR_SERVER])
    stdio = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), "--role", "bench"])
    send = [str(PEERD), "send", "--home", str(home), "--from", "bench", "--to", "reader", "cold start"]
    kinds: dict[str, Callable[[], Awaitable[float]]] = {
        "python -c pass": lambda: spawn_to_exit([sys.executable, "-c", "pass"]),
        "bare MCPServer (stdio) to initialize": lambda: mcp_start(floor),
        "peerd mcp to initialize": lambda: mcp_start(stdio),
        "peerd send, no daemon": lambda: spawn_to_exit(send),
    }
    out: dict[str, list[float]] = {name: [] for name in [*kinds, "peerd run to daemon.json",
                                                          "daemon's first MCP initialize"]}
    await asyncio.gather(*(fn() for fn in kinds.values()))  # warm the disk cache: not counted
    for i in range(rounds):
        for name, fn in kinds.items():
            out[name].append(await fn())
        ready, first = await run_to_ready(home)
        out["peerd run to daemon.json"].append(ready)
        out["daemon's first MCP initialize"].append(first)
        note(f"round {i + 1}/{rounds}: " + ", ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in out.items()))
    return out


def figures(samples: dict[str, list[float]]) -> list[Figure]:
    med = {name: percentile(xs, 50) * 1000 for name, xs in samples.items()}
    floor = med["bare MCPServer (stdio) to initialize"]
    python = med["python -c pass"]
    section("medians, with the bare MCP server as baseline")
    return [
        report(Figure("python -c pass", python, "ms")),
        report(Figure("bare MCPServer (stdio) to initialize", floor, "ms", None, python)),
        report(Figure("peerd mcp to initialize", med["peerd mcp to initialize"], "ms", at_most(1.2 * floor), floor)),
        report(Figure("peerd run to daemon.json", med["peerd run to daemon.json"], "ms", at_most(1.2 * floor),
                      floor)),
        report(Figure("daemon's first MCP initialize", med["daemon's first MCP initialize"], "ms", None, floor)),
        report(Figure("peerd send, no daemon", med["peerd send, no daemon"], "ms", None, floor)),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cold start of peerd against a bare MCP server")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of every kind (default 10)")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    print(f"peerd cold-start benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        samples = asyncio.run(measure(Path(tmp), rounds))
    print_summary(figures(samples))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
