"""Benchmarks of the replica core: local writes, applying foreign ops, reading an inbox.

Run from the repository root::

    uv run python bench/bench_replica.py            # full sizes (a few minutes)
    uv run python bench/bench_replica.py --quick    # small sizes, < 60 s (CI smoke)

Every figure is printed with its target and PASS/MISS; every ratio compares two
numbers measured in the same run, on the same disk, with the same SQLite
pragmas. The script always exits 0: benchmarks report, they do not gate.
Time spent generating input (signing foreign ops, filling replicas) is
reported separately and never counted in a figure.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

from _util import (
    Figure,
    at_least,
    at_most,
    fmt,
    note,
    percentile,
    print_summary,
    report,
    section,
    stopwatch,
    time_each,
)

from replica import Replica, hlc, identity, ops
from replica.store import BUSY_TIMEOUT_MS, CACHE_KIB

# The pragmas replica.store sets on every connection; the raw baseline uses the same.
PRAGMAS = (
    f"busy_timeout = {BUSY_TIMEOUT_MS}",
    "journal_mode = WAL",
    "synchronous = NORMAL",
    f"cache_size = -{CACHE_KIB}",
)
RAW_TABLE = (
    "CREATE TABLE messages(lseq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, sender TEXT NOT NULL,"
    " sender_inst TEXT, channel TEXT, to_inst TEXT, thread TEXT, content TEXT NOT NULL, hlc INTEGER NOT NULL)"
)
RAW_INSERT = (
    "INSERT INTO messages(id, sender, sender_inst, channel, to_inst, thread, content, hlc)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
PAGE_BUDGET = 256 * 1024
CHANNELS = ("tau", "phi", "tau, phi", "broadcast")
CALLER = "tau"
ALSO_CALLER = "tau, phi"  # a role list that includes the caller
HEAVY = "sigma"  # a second caller with a long history: one message in HEAVY_EVERY
HEAVY_EVERY = 20


@dataclass(frozen=True)
class Sizes:
    sends: int  # send_message calls (and raw inserts)
    send_block: int  # calls per alternating replica/raw block
    apply_ops: int  # foreign ops applied
    origins: int  # replicas that made them
    inbox_total: int  # messages in the inbox replica
    inbox_mine: int  # of them addressed to the caller
    repeat_calls: int  # check_messages calls after the first
    first_calls: int  # first calls, each by a fresh instance of the caller
    build_batch: int  # ops per apply while building the inbox replica
    heavy_calls: int  # check_messages calls by the heavy caller, per case


FULL = Sizes(20_000, 1_000, 100_000, 4, 1_000_000, 1_000, 500, 200, 10_000, 100)
QUICK = Sizes(2_000, 500, 10_000, 4, 50_000, 1_000, 100, 30, 5_000, 30)


def content_for(i: int) -> str:
    """A message body of about 120 bytes, different for every i."""
    return f"status {i:08d}: build green, 3 tests flaky, rerunning shard {i % 16} of 16 before the merge window closes"


# -- 1. send_message vs raw sqlite3 ----------------------------------------------------------


def open_raw(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)  # autocommit: each INSERT is its own transaction
    for pragma in PRAGMAS:
        conn.execute(f"PRAGMA {pragma}")
    conn.execute(RAW_TABLE)
    return conn


def pragma_values(conn: sqlite3.Connection) -> str:
    names = ("journal_mode", "synchronous", "busy_timeout", "cache_size")
    return ", ".join(f"{n}={conn.execute(f'PRAGMA {n}').fetchone()[0]}" for n in names)


def raw_rows(count: int, offset: int) -> list[tuple[Any, ...]]:
    now = hlc.pack(int(time.time() * 1000))
    return [
        (os.urandom(16).hex(), "orchestrator", "i1", CHANNELS[i % 4], None, None, content_for(i), now + i)
        for i in range(offset, offset + count)
    ]


def bench_send(sizes: Sizes, tmp: Path) -> list[Figure]:
    section(f"1. send_message: {sizes.sends:,} single calls on a file replica vs raw sqlite3 autocommit inserts")
    rep = Replica.open(tmp / "send.db")
    raw = open_raw(tmp / "raw.db")
    note(f"replica pragmas: {pragma_values(rep._store.conn)}")  # read back, not assumed
    note(f"raw     pragmas: {pragma_values(raw)}; isolation_level=None (autocommit)")
    note("replica: check arguments, sign (Ed25519), BEGIN IMMEDIATE, store the op and its projections, COMMIT")
    note("raw:     one INSERT of the same message columns (rows prepared beforehand), autocommitted")

    def send(i: int) -> None:
        rep.send_message("orchestrator", CHANNELS[i % 4], content_for(i), from_instance_id="i1")

    def send_from(first: int, i: int) -> None:
        send(first + i)

    def insert(rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            raw.execute(RAW_INSERT, row)

    for i in range(200):  # warm-up, not timed
        send(i)
    insert(raw_rows(200, 0))
    rep_times: list[float] = []
    rep_rates: list[float] = []
    raw_rates: list[float] = []
    raw_seconds = 0.0
    for start in range(0, sizes.sends, sizes.send_block):  # alternate blocks so load bursts hit both sides
        count = min(sizes.send_block, sizes.sends - start)
        rows = raw_rows(count, 200 + start)
        with stopwatch() as w:
            insert(rows)
        raw_rates.append(count / w.seconds)
        raw_seconds += w.seconds
        times = time_each(partial(send_from, 200 + start), count)
        rep_rates.append(count / sum(times))
        rep_times += times
    rep.close()
    raw.close()
    ratios = [a / b for a, b in zip(rep_rates, raw_rates, strict=True)]
    note(f"{len(ratios)} alternating blocks of {sizes.send_block:,}; figures are medians over blocks "
         f"(whole run: replica {fmt(sizes.sends / sum(rep_times))}/s, "
         f"raw {fmt(sizes.sends / raw_seconds)}/s)")
    note(f"send_message latency p50 {fmt(percentile(rep_times, 50) * 1e6)} us, "
         f"p99 {fmt(percentile(rep_times, 99) * 1e6)} us")
    return [
        report(Figure("send_message rate", median(rep_rates), "msg/s", at_least(5_000), baseline=median(raw_rates))),
        report(Figure("send_message / raw sqlite3", median(ratios), "x", at_least(0.3))),
    ]


# -- 2. apply foreign ops --------------------------------------------------------------------


def fill_origin(rep: Replica, count: int, k: int) -> None:
    """``count`` local ops on ``rep``: messages, and every 20th a profile update."""
    for i in range(count):
        if i % 20 == 19:
            rep.update_profile(f"orch-{k}", dynamic=f"working on item {i}")
        else:
            rep.send_message(f"orch-{k}", CHANNELS[i % 4], content_for(i), from_instance_id=f"i{k}")


def pages_of(source: Replica, budget: int) -> list[list[bytes]]:
    """Every op ``source`` holds, as the pages a fresh peer would pull."""
    vec: dict[bytes, int] = {}
    pages: list[list[bytes]] = []
    while True:
        page = source.ops_missing(vec, budget)
        pages.append(page.ops)
        for origin, (_lo, hi) in page.ranges.items():
            vec[origin] = hi
        if not page.more:
            return pages


def bench_apply(sizes: Sizes, tmp: Path) -> list[Figure]:
    section(f"2. apply: {sizes.apply_ops:,} foreign ops from {sizes.origins} origins, "
            f"pages of <= {PAGE_BUDGET // 1024} KiB")
    with stopwatch() as gen:
        hub = Replica.open(":memory:")
        per = sizes.apply_ops // sizes.origins
        for k in range(sizes.origins):
            src = Replica.open(":memory:")
            fill_origin(src, per if k else sizes.apply_ops - per * (sizes.origins - 1), k)
            after = 0
            while batch := src.ops_after(after, 5_000):
                hub.apply([b for _, b in batch])
                after = batch[-1][0]
            src.close()
        pages = pages_of(hub, PAGE_BUDGET)
    total = sum(len(p) for p in pages)
    raw_ops = [op for p in pages for op in p]
    note(f"generation (not timed): {fmt(gen.seconds)} s for {total:,} ops in {len(pages)} pages "
         f"(avg {fmt(sum(map(len, raw_ops)) / total)} bytes/op)")

    with stopwatch() as dec:
        for raw in raw_ops:
            ops.decode(raw)
    note(f"decode + verify alone (no store): {fmt(total / dec.seconds)} ops/s")

    target = Replica.open(tmp / "apply.db")
    with stopwatch() as w:
        for page_ops in pages:
            target.apply(page_ops)
    same = target.vector() == hub.vector() and target.state_digest() == hub.state_digest()
    note(f"target converged with the source: {same}")
    target.close()

    puller = Replica.open(tmp / "pull.db")
    with stopwatch() as loop:
        while True:
            page = hub.ops_missing(puller.vector(), PAGE_BUDGET)
            puller.apply(page.ops)
            if not page.more:
                break
    puller.close()
    hub.close()
    return [
        report(Figure("apply rate (signature checks included)", total / w.seconds, "ops/s", at_least(10_000))),
        report(Figure("pull loop: vector + ops_missing + apply", total / loop.seconds, "ops/s")),
    ]


# -- 3. check_messages on a big replica --------------------------------------------------------


def inbox_body(i: int, stride: int) -> dict[str, Any]:
    """Message i of the inbox replica; every ``stride``-th is for the caller, every 20th for the heavy one."""
    if i % stride == stride // 2:
        mine = i // stride
        channel = "broadcast" if mine % 10 == 0 else ALSO_CALLER if mine % 10 == 1 else CALLER
    elif i % HEAVY_EVERY == 1:
        channel = HEAVY
    else:
        channel = f"r{i % 200}" if i % 7 else f"r{i % 200}, r{(i + 1) % 200}"
    return {"f": f"r{(i * 7) % 200}", "fi": None, "c": channel, "ti": None, "t": None, "x": content_for(i)}


def signed_batch(seed: bytes, start: int, count: int, stride: int, base_ms: int) -> list[bytes]:
    """Signed msg ops start+1 .. start+count of the foreign origin (runs in a worker)."""
    ident = identity.from_seed(seed)
    origin = ident.public_key
    return [
        ops.encode(origin, i + 1, hlc.pack(base_ms + i), ops.KIND_MSG, inbox_body(i, stride), sign=ident.sign)
        for i in range(start, start + count)
    ]


def build_inbox(sizes: Sizes, path: Path) -> Replica:
    rep = Replica.open(path)
    seed = os.urandom(identity.SEED_BYTES)
    stride = sizes.inbox_total // sizes.inbox_mine
    base_ms = int(time.time() * 1000) - sizes.inbox_total - 60_000
    starts = range(0, sizes.inbox_total, sizes.build_batch)
    applying = 0.0
    stored = 0
    with stopwatch() as build, ProcessPoolExecutor(max_workers=1) as pool:  # signs while we apply
        batches = pool.map(
            signed_batch, itertools.repeat(seed), starts,
            [min(sizes.build_batch, sizes.inbox_total - s) for s in starts],
            itertools.repeat(stride), itertools.repeat(base_ms),
        )
        for batch in batches:
            with stopwatch() as w:
                stored += rep.apply(batch).new
            applying += w.seconds
    size_mb = sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1e6
    note(f"build (not timed): {fmt(build.seconds)} s, of which apply {fmt(applying)} s "
         f"({fmt(stored / applying)} msg/s); {stored:,} messages, {fmt(size_mb)} MB on disk")
    return rep


def latency_figures(name: str, samples: Sequence[float], p99_target: float | None) -> list[Figure]:
    ms = [s * 1000 for s in samples]
    return [
        report(Figure(f"{name} p50", percentile(ms, 50), "ms")),
        report(Figure(f"{name} p99", percentile(ms, 99), "ms",
                      None if p99_target is None else at_most(p99_target))),
    ]


def read_some(rep: Replica, role: str, count: int, page: int = 50) -> int:
    """Check and mark read in rounds, as an agent would, until ``count`` more messages are read."""
    read = 0
    while read < count:
        inbox = rep.check_messages(role, limit=page)
        if not inbox.messages:
            break
        read += rep.mark_as_read([m.receipt_id for m in inbox.messages][: count - read])
    return read


def bench_inbox(sizes: Sizes, tmp: Path) -> list[Figure]:
    section(f"3. check_messages: {sizes.inbox_total:,} messages in the replica, "
            f"{sizes.inbox_mine:,} addressed to {CALLER!r} (direct, role lists, broadcasts)")
    rep = build_inbox(sizes, tmp / "inbox.db")
    figures: list[Figure] = []

    first = time_each(lambda _i: rep.check_messages(CALLER), 1)[0]
    inbox = rep.check_messages(CALLER)
    note(f"first call by {CALLER!r}: {fmt(first * 1000)} ms, recorded delivery of {len(inbox.messages)} messages")
    repeat = time_each(lambda _i: rep.check_messages(CALLER), sizes.repeat_calls)
    figures += latency_figures(f"check_messages x{sizes.repeat_calls} (after the first)", repeat, 5.0)

    firsts = time_each(lambda i: rep.check_messages(CALLER, f"inst-{i}"), sizes.first_calls)
    figures += latency_figures(f"first check_messages x{sizes.first_calls} (fresh instances, writes delivery)",
                               firsts, None)

    to_read = sizes.inbox_mine - 50
    with stopwatch() as w:
        read = read_some(rep, CALLER, to_read)
    note(f"marked {read:,} of {sizes.inbox_mine:,} read in {fmt(w.seconds)} s (check + mark_as_read rounds)")
    after_read = time_each(lambda _i: rep.check_messages(CALLER), sizes.repeat_calls)
    figures += latency_figures(f"check_messages x{sizes.repeat_calls}, {to_read} of {sizes.inbox_mine} read",
                               after_read, 5.0)
    figures += bench_heavy(sizes, rep)
    rep.close()
    return figures


def bench_heavy(sizes: Sizes, rep: Replica) -> list[Figure]:
    """The same call by a role with a long history: does its cost grow with the messages it already has?"""
    heavy = sizes.inbox_total // HEAVY_EVERY
    note(f"heavy caller {HEAVY!r}: {heavy:,} messages addressed to it; the same 5 ms target applies")
    rep.check_messages(HEAVY)  # records delivery of the first page, like the first call above
    unread = time_each(lambda _i: rep.check_messages(HEAVY), sizes.heavy_calls)
    figures = latency_figures(f"heavy caller x{sizes.heavy_calls}, {heavy:,} unread", unread, 5.0)
    with stopwatch() as w:
        read = read_some(rep, HEAVY, heavy - 50, page=1000)
    note(f"marked {read:,} of {heavy:,} read in {fmt(w.seconds)} s (check + mark_as_read rounds of 1,000)")
    after = time_each(lambda _i: rep.check_messages(HEAVY), sizes.heavy_calls)
    return figures + latency_figures(f"heavy caller x{sizes.heavy_calls}, {read:,} of {heavy:,} read", after, 5.0)


# -- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes (< 60 s), for CI smoke runs")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the database files (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    print(f"peerd replica benchmark ({'quick' if args.quick else 'full'} sizes); "
          f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    with stopwatch() as total, tempfile.TemporaryDirectory(dir=args.dir, prefix="peerd-bench-") as tmp:
        figures = bench_send(sizes, Path(tmp)) + bench_apply(sizes, Path(tmp)) + bench_inbox(sizes, Path(tmp))
    print_summary(figures)
    print(f"total run time {fmt(total.seconds)} s; load average now {os.getloadavg()[0]:.2f} "
          "(latency percentiles are only comparable between runs on an otherwise idle machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
