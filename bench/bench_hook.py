"""`peerd hook` end to end on a replica with 1,000,000 messages: the time from starting the
process to its exit, as Claude Code and Codex wait for it on every prompt.

Cases (each a fresh `peerd hook` process with the hook's JSON on stdin):
* no new mail: prompt-submit for a role whose mail was all delivered before (prints nothing);
* new mail: prompt-submit for `tau` (1,000 messages addressed to it, none delivered yet): each
  run shows 10 and records their delivery in a detached child after answering;
* session start: every unread message of `tau` (shows 10 of them);
* long history: prompt-submit for `sigma`, 50,000 messages addressed to it, all but 50 read
  and those delivered (prints nothing); its first look scans the history and leaves a cursor
  (printed), the figures are the looks after it.

Between runs the script waits for the previous run's delivery to be recorded (not timed), so a
background child never slows the next measured run; how long that recording took after the
answer is printed for information.

Target: p50 and p99 <= 150 ms in every case. The replica is built fast with
`bench_replica.build_inbox` (a worker signs, the main process applies); build time is printed,
never counted.

    uv run python bench/bench_hook.py [--quick] [--dir DIR] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _util import Figure, at_most, fmt, note, percentile, print_summary, report, section, stopwatch
from bench_replica import CALLER, FULL, HEAVY, HEAVY_EVERY, QUICK, Sizes, build_inbox, read_some

from replica import open_home

PEERD = Path(sys.executable).parent / "peerd"
TARGET_MS = 150.0
QUIET = "quiet"
PROMPT = json.dumps({"session_id": "bench", "hook_event_name": "UserPromptSubmit", "prompt": "go on", "cwd": "/"})
START = json.dumps({"session_id": "bench", "hook_event_name": "SessionStart", "source": "startup"})
MESSAGE_ID = re.compile(r"message_id (\S+),")


CPU: list[float] = []  # CPU seconds of each hook process (user + system), whatever the machine's load


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def hook(home: Path, role: str, payload: str) -> tuple[float, str]:
    """Seconds from starting `peerd hook` to its exit, and what it printed."""
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    out = subprocess.run([str(PEERD), "hook", "--home", str(home), "--role", role], input=payload,
                         capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    CPU.append(children_cpu() - cpu0)
    if out.returncode != 0 or out.stderr:
        raise RuntimeError(f"peerd hook failed ({out.returncode}): {out.stderr}")
    return took, out.stdout


def shown_ids(stdout: str) -> list[str]:
    if not stdout:
        return []
    return MESSAGE_ID.findall(json.loads(stdout)["hookSpecificOutput"]["additionalContext"])


def all_delivered(db: Path, role: str, ids: Sequence[str]) -> bool:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        marks = "?" * len(ids)
        got = conn.execute(f"SELECT count(*) FROM receipts WHERE role = ? AND inst = '' AND delivered IS NOT NULL"
                           f" AND msg_id IN ({','.join(marks)})", (role, *ids)).fetchone()[0]
    finally:
        conn.close()
    return int(got) == len(ids)


def wait_delivered(db: Path, role: str, ids: Sequence[str]) -> float:
    """Seconds until the detached child has recorded delivery of ``ids`` (polled: there is no event)."""
    t0 = time.perf_counter()
    while not all_delivered(db, role, ids):
        if time.perf_counter() - t0 > 60:
            raise RuntimeError("the hook's delivery was never recorded")
        time.sleep(0.005)
    return time.perf_counter() - t0


def figures_for(name: str, samples: Sequence[float]) -> list[Figure]:
    ms = [s * 1000 for s in samples]
    cpu = [c * 1000 for c in CPU[-len(samples):]]
    note(f"CPU time of the hook process: p50 {fmt(percentile(cpu, 50))} ms, p99 {fmt(percentile(cpu, 99))} ms "
         "(wall time above it is waiting for a CPU on a busy machine)")
    return [report(Figure(f"{name} p50", percentile(ms, 50), "ms", at_most(TARGET_MS))),
            report(Figure(f"{name} p99", percentile(ms, 99), "ms", at_most(TARGET_MS)))]


def build_home(sizes: Sizes, home: Path) -> None:
    home.mkdir(parents=True)
    rep = build_inbox(sizes, home / "replica.db")
    with stopwatch() as w:
        heavy = sizes.inbox_total // HEAVY_EVERY
        read = read_some(rep, HEAVY, heavy - 50, page=1000)
        rep.record_delivered(rep.mail(HEAVY, limit=1000))
        rep.record_delivered(rep.mail(QUIET, limit=1000))
    note(f"setup (not timed): {read:,} of {heavy:,} messages of {HEAVY!r} read, the rest delivered; "
         f"every message for {QUIET!r} delivered; {fmt(w.seconds)} s")
    rep.close()
    open_home(home).close()  # the home's node key


def run_cases(home: Path, runs: int) -> list[Figure]:
    db = home / "replica.db"
    figures: list[Figure] = []
    hook(home, QUIET, PROMPT)  # warm the page cache once, as an active machine has it

    section(f"no new mail: prompt-submit for {QUIET!r} (all its mail delivered before)")
    quiet = [hook(home, QUIET, PROMPT) for _ in range(runs)]
    assert not any(out for _t, out in quiet), "the quiet role had mail"
    figures += figures_for("no new mail", [t for t, _o in quiet])

    section(f"new mail: prompt-submit for {CALLER!r}, 10 new messages shown per run")
    new: list[float] = []
    recorded: list[float] = []
    for _ in range(runs):
        took, out = hook(home, CALLER, PROMPT)
        ids = shown_ids(out)
        assert len(ids) == 10, f"expected 10 messages shown, got {len(ids)}"
        new.append(took)
        recorded.append(wait_delivered(db, CALLER, ids))
    figures += figures_for("new mail", new)
    note(f"delivery recorded by the detached child within p50 {fmt(percentile(recorded, 50) * 1000)} ms, "
         f"p99 {fmt(percentile(recorded, 99) * 1000)} ms after the hook's exit (not on the prompt's path)")

    section(f"session start: every unread message of {CALLER!r} (10 shown)")
    start: list[float] = []
    for _ in range(runs):
        took, out = hook(home, CALLER, START)
        ids = shown_ids(out)
        assert len(ids) == 10
        start.append(took)
        wait_delivered(db, CALLER, ids)
    figures += figures_for("session start", start)

    section(f"long history: prompt-submit for {HEAVY!r} (its read history is skipped, nothing new)")
    first, _out = hook(home, HEAVY, PROMPT)
    note(f"the first look scans the history and leaves its cursor (hook-cursors.json): {fmt(first * 1000)} ms; "
         "the figures are the looks after it, as on every later prompt")
    heavy = [hook(home, HEAVY, PROMPT) for _ in range(runs)]
    assert not any(out for _t, out in heavy)
    figures += figures_for("long read history", [t for t, _o in heavy])
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="peerd hook end to end on a big replica")
    parser.add_argument("--quick", action="store_true", help="a 50,000-message replica and fewer runs")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the replica (default: a temp dir)")
    parser.add_argument("--runs", type=int, default=None, help="runs per case (default 50, quick 15)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    runs = args.runs or (15 if args.quick else 50)
    print(f"peerd hook benchmark; {sizes.inbox_total:,} messages; Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="peerd-bench-hook-") as tmp:
        home = Path(tmp) / "home"
        section("building the replica")
        build_home(sizes, home)
        figures = run_cases(home, runs)
    print_summary(figures)
    print(f"load average now {os.getloadavg()[0]:.2f} (percentiles are only comparable on an otherwise idle machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
