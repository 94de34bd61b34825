"""Shared helpers for peerd benchmarks: timing, percentiles, figures and their targets.

Invariants:
* A figure carries its own target; PASS/MISS is computed from the measured
  value and printed, never asserted. Benchmarks report, they do not gate.
* Every ratio printed is between two numbers measured in the same run.
* Times are wall-clock seconds from ``time.perf_counter``.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp import Client

PASS = "PASS"
MISS = "MISS"


def percentile(samples: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (0..100), linear between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * pct / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Stopwatch:
    """Elapsed seconds of a ``with stopwatch()`` block, readable once it ends."""

    start: float = 0.0
    seconds: float = 0.0


@contextmanager
def stopwatch() -> Iterator[Stopwatch]:
    watch = Stopwatch(start=time.perf_counter())
    try:
        yield watch
    finally:
        watch.seconds = time.perf_counter() - watch.start


def time_each(fn: Callable[[int], object], count: int) -> list[float]:
    """Seconds taken by each of ``fn(0) .. fn(count - 1)``."""
    out: list[float] = []
    clock = time.perf_counter
    for i in range(count):
        t0 = clock()
        fn(i)
        out.append(clock() - t0)
    return out


@dataclass(frozen=True)
class Target:
    """A bound a figure should meet: ``value >= bound`` or ``value <= bound``."""

    op: str
    bound: float

    def __post_init__(self) -> None:
        if self.op not in (">=", "<="):
            raise ValueError(f"target op must be '>=' or '<=', not {self.op!r}")

    def met(self, value: float) -> bool:
        return value >= self.bound if self.op == ">=" else value <= self.bound


def at_least(bound: float) -> Target:
    return Target(">=", bound)


def at_most(bound: float) -> Target:
    return Target("<=", bound)


@dataclass(frozen=True)
class Figure:
    """One measured number, with an optional target and a baseline in the same unit."""

    name: str
    value: float
    unit: str
    target: Target | None = None
    baseline: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "-"
        return PASS if self.target.met(self.value) else MISS


def fmt(value: float) -> str:
    """A number for humans: thousands separators for big ones, 3 significant digits for small."""
    if math.isnan(value):
        return "nan"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def fmt_unit(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{fmt(value)} {unit}".rstrip()


def describe(fig: Figure) -> str:
    """One line for a figure as soon as it is measured."""
    parts = [f"  {fig.name}: {fmt_unit(fig.value, fig.unit)}"]
    if fig.baseline is not None and fig.ratio is not None:
        parts.append(f"(baseline {fmt_unit(fig.baseline, fig.unit)}, ratio {fmt(fig.ratio)})")
    if fig.target is not None:
        parts.append(f"target {fig.target.op} {fmt_unit(fig.target.bound, fig.unit)}: {fig.verdict}")
    return "  ".join(parts)


def report(fig: Figure) -> Figure:
    """Print ``fig`` on one line and hand it back (so callers can collect it)."""
    print(describe(fig), flush=True)
    return fig


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def note(text: str) -> None:
    print(f"   {text}", flush=True)


def summary_rows(figures: Sequence[Figure]) -> list[list[str]]:
    rows = [["figure", "value", "target", "baseline", "ratio", "verdict"]]
    for f in figures:
        target = "-" if f.target is None else f"{f.target.op} {fmt_unit(f.target.bound, f.unit)}"
        ratio = "-" if f.ratio is None else fmt(f.ratio)
        rows.append([f.name, fmt_unit(f.value, f.unit), target, fmt_unit(f.baseline, f.unit), ratio, f.verdict])
    return rows


def print_summary(figures: Sequence[Figure]) -> int:
    """Print the summary table and a loud line per MISS; returns the number of misses."""
    rows = summary_rows(figures)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    rule = "-+-".join("-" * w for w in widths)
    print("\n== summary")
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        print(" | ".join(cells))
        if n == 0:
            print(rule)
    misses = [f for f in figures if f.verdict == MISS]
    for f in misses:
        assert f.target is not None
        bound = fmt_unit(f.target.bound, f.unit)
        print(f"*** MISS: {f.name} = {fmt_unit(f.value, f.unit)}, target {f.target.op} {bound}")
    targeted = sum(1 for f in figures if f.target is not None)
    print(f"\n{targeted - len(misses)} of {targeted} targets met" + (f", {len(misses)} MISS" if misses else ""))
    return len(misses)


FLOOR = Path(__file__).resolve().parent / "mcp_floor.py"
"""The bare MCP server the MCP figures are measured against."""


async def floor_http(payload_file: Path, schema_file: Path | None = None) -> tuple[asyncio.subprocess.Process, str]:
    """Start ``mcp_floor.py`` over HTTP with ``payload_file`` (and output schemas, if given); its
    process and MCP URL, once it listens."""
    extra = [] if schema_file is None else [str(schema_file)]
    proc = await asyncio.create_subprocess_exec(sys.executable, str(FLOOR), str(payload_file), "http", *extra,
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    port = int((await proc.stdout.readline()).decode())
    return proc, f"http://127.0.0.1:{port}/mcp"


# -- memory of a daemon against the MCP SDK's floor ------------------------------------------------


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident set size and its peak (VmRSS, VmHWM) of a process, in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


@asynccontextmanager
async def mcp_session(url: str, token: str | None) -> AsyncIterator[Client]:
    """An MCP SDK client on streamable HTTP at ``url``: the SDK's own HTTP client, plus the bearer
    token a daemon's local port asks for (None for the floor, which asks for none)."""
    from mcp import Client  # noqa: PLC0415 - only the MCP figures need the SDK
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415
    from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: PLC0415

    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (create_mcp_http_client(headers) as http,
                Client(streamable_http_client(url, http_client=http)) as client):
        yield client


async def mcp_checks(url: str, count: int, role: str, token: str | None = None) -> dict[str, Any]:
    """``count`` check_messages calls (limit 50) for ``role`` over MCP at ``url`` (with a daemon's
    ``token``; the floor takes none); the last call's structured result."""
    last: dict[str, Any] = {}
    async with mcp_session(url, token) as client:
        for _ in range(count):
            result = await client.call_tool("check_messages", {"recipient": role, "limit": 50})
            assert not result.is_error, result.content
            last = result.structured_content or {}
    return last


async def floor_rss(root: Path, payload: dict[str, Any], count: int, role: str) -> float:
    """RSS (MB) of a bare MCP server over HTTP (``mcp_floor.py``: the same SDK and transport) after
    the same ``count`` check_messages calls, each returning ``payload``."""
    payload_file = root / "floor-payloads.json"
    payload_file.write_text(json.dumps({"check_messages": payload}))
    proc, url = await floor_http(payload_file)
    try:
        await mcp_checks(url, count, role)
        return rss_mb(proc.pid)[0]
    finally:
        proc.terminate()
        await proc.wait()
