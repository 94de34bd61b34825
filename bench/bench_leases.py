"""File reservations: how fast a grant reaches another daemon, and what the pre-commit guard costs.

Cases:
* grant to seen: two daemons, seeded with each other; a reservation taken on A's replica (as
  `peerd mcp` takes it: another process on A's file, which A's daemon notices and pushes) until B's
  replica holds it, watched on B's file (a commit visible to a reader). Baseline, same run: a
  message written the same way, until B holds it.
* guard check: `replica.guard.blocking` (what `peerd guard check` runs) for 20 staged paths on a
  replica holding 10,000 live leases in the project; baseline, same run: the same replica with no
  lease in that project. Also the whole `peerd guard check` process, start to exit, for information.

Targets: grant to seen p50 <= 1 s; guard check p99 <= 50 ms (commits stay instant).

    uv run python bench/bench_leases.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import Figure, at_most, fmt, note, percentile, print_summary, report, section  # noqa: E402

from replica import guard, identity, leases, open_home  # noqa: E402
from replica.feed import FileWatch  # noqa: E402
from replica.ops import encode  # noqa: E402
from tests.daemons import Fleet, wait_until  # noqa: E402

PEERD = Path(sys.executable).parent / "peerd"
GRANT_TARGET_MS = 1000.0
GUARD_TARGET_MS = 50.0
LEASES = 10_000
STAGED = 20


class Marks:
    """Stands in for a change feed: wakes the waiter on every commit seen on B's file."""

    def __init__(self) -> None:
        self.changed = threading.Event()

    def advance(self, _mark: int) -> None:
        self.changed.set()


def _holds(db: Path, sql: str, arg: str) -> bool:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, (arg,)).fetchone() is not None
    finally:
        conn.close()


def _until_seen(marks: Marks, seen: Callable[[], bool]) -> float:
    deadline = time.perf_counter() + 60
    while not seen():
        marks.changed.wait(1.0)
        marks.changed.clear()
        if time.perf_counter() > deadline:
            raise TimeoutError("B never got it")
    return time.perf_counter()


def grant_to_seen(root: Path, count: int) -> list[Figure]:
    fleet = Fleet(root / "fleet")
    try:
        a, b = fleet.add("a"), fleet.add("b")
        fleet.mesh()
        fleet.start()
        wait_until(lambda: (a.peer(b) or {}).get("reachable") and (b.peer(a) or {}).get("reachable"), 60,
                   "the daemons to see each other")
        marks = Marks()
        watch = FileWatch(b.db)
        watch.start(marks)  # type: ignore[arg-type] - it only calls advance()
        lease_ms: list[float] = []
        msg_ms: list[float] = []
        try:
            with open_home(a.home) as rep:
                for i in range(count + 3):
                    t0 = time.perf_counter()
                    lid = rep.reserve("repo", f"r{i % 7}", [f"src/m{i}.py"], ttl_seconds=600).granted[0].id
                    got = _until_seen(marks, lambda lid=lid: _holds(b.db, "SELECT 1 FROM leases WHERE id = ?", lid))
                    t1 = time.perf_counter()
                    mid = rep.send_message("alpha", "beta", f"ping {i}").id
                    got2 = _until_seen(marks, lambda mid=mid: _holds(b.db, "SELECT 1 FROM ops WHERE id = ?", mid))
                    if i >= 3:  # the first few warm up both daemons
                        lease_ms.append((got - t0) * 1000)
                        msg_ms.append((got2 - t1) * 1000)
        finally:
            watch.stop()
    finally:
        fleet.close()
    base50, base99 = percentile(msg_ms, 50), percentile(msg_ms, 99)
    return [report(Figure("grant on A to held on B p50", percentile(lease_ms, 50), "ms", at_most(GRANT_TARGET_MS),
                          baseline=base50)),
            report(Figure("grant on A to held on B p99", percentile(lease_ms, 99), "ms", baseline=base99))]


def build(db_home: Path, project: str, n: int) -> Path:
    """A home whose replica holds ``n`` live exclusive leases of ``project`` (50 roles)."""
    ident = identity.generate()
    now = time.time_ns() // 1_000_000
    raws = [encode(ident.public_key, i + 1, ((now - n + i) << 16), leases.KIND_TAKE,
                   {"p": project, "g": f"src/pkg{i % 100}/mod{i}.py", "r": f"role{i % 50}", "i": None, "x": True,
                    "ttl": 3_600_000, "why": "bench"}, sign=ident.sign) for i in range(n)]
    with open_home(db_home) as rep:
        for k in range(0, len(raws), 1000):
            rep.apply(raws[k:k + 1000])
        return Path(rep.path)


def guard_check(root: Path, runs: int) -> list[Figure]:
    t0 = time.perf_counter()
    full = build(root / "full", "repo", LEASES)
    empty = build(root / "empty", "other", LEASES)
    note(f"built two replicas of {LEASES:,} leases in {time.perf_counter() - t0:.1f} s (not counted)")
    rng = random.Random(7)
    held = [rng.randrange(LEASES) for _ in range(STAGED // 2)]  # half the staged paths are reserved
    staged = [f"src/pkg{i % 100}/mod{i}.py" for i in held] + [f"src/pkg{k}/new{k}.py" for k in range(STAGED // 2)]

    def timed(db: Path) -> list[float]:
        out = []
        for _ in range(runs):
            s = time.perf_counter()
            guard.blocking(db, "repo", staged, "committer", time.time_ns() // 1_000_000)
            out.append((time.perf_counter() - s) * 1000)
        return out

    blocked = guard.blocking(full, "repo", staged, "committer", time.time_ns() // 1_000_000)
    note(f"{len(blocked)} of {STAGED} staged paths blocked on the full replica")
    full_ms, empty_ms = timed(full), timed(empty)
    procs = []
    for _ in range(max(5, runs // 20)):
        s = time.perf_counter()
        subprocess.run([str(PEERD), "guard", "check", "--home", str(full.parent), "--project", "repo", "--role",
                        "committer", *staged], capture_output=True, check=False)
        procs.append((time.perf_counter() - s) * 1000)
    note(f"the whole `peerd guard check` process, start to exit: p50 {fmt(percentile(procs, 50))} ms")
    return [report(Figure(f"guard check, {LEASES:,} leases, p50", percentile(full_ms, 50), "ms",
                          baseline=percentile(empty_ms, 50))),
            report(Figure(f"guard check, {LEASES:,} leases, p99", percentile(full_ms, 99), "ms",
                          at_most(GUARD_TARGET_MS), baseline=percentile(empty_ms, 99)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="file reservations: grant latency and guard cost")
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args(argv)
    count, runs = (20, 100) if args.quick else (100, 500)
    print(f"peerd leases benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="peerd-bench-leases-") as tmp:
        section("guard check on a replica of many leases (baseline: none in the project)")
        figures = guard_check(Path(tmp), runs)
        section("grant on one daemon to held on another (baseline: a message the same way)")
        figures += grant_to_seen(Path(tmp), count)
    print_summary(figures)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
