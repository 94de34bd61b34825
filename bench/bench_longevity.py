"""Benchmarks of a fleet that lives for years, on real daemons: disk per message, a new member's
catch-up (a snapshot) against replaying every op, catch-up after a restart, and a daemon's memory at
1,000,000 messages against the MCP SDK's own.

Run from the repository root::

    uv run python bench/bench_longevity.py                 # 1,000,000 messages (10 minutes or more)
    uv run python bench/bench_longevity.py --quick         # 20,000 messages, about a minute
    uv run python bench/bench_longevity.py --messages N    # N messages (at least 20,000)

Every daemon is a ``peerd run`` process on 127.0.0.1 (mDNS off, seeds only) of the test suite's
harness (``tests/daemons.py``). The messages are signed by 4 foreign origins (``sim.workload``,
100 to 200 bytes of content each) and written into the source's replica file before it starts,
without checking the signatures the benchmark itself just made (generation, not timed):

a. Disk: the source's replica file (``replica.db`` plus its WAL, once the daemon has indexed every
   message for search), per message. Baseline: the ops' own bytes per message.
b. New member: a fresh daemon seeded with the source, timed from its spawn (start-up included)
   until its replica holds every op the source held (both vectors read from the files, read-only:
   polling ``/api/status`` would make the daemon count a million rows a call); it takes a snapshot.
   Baseline:
   replaying the ops by the ordinary path (``Replica.apply`` of pages, signatures checked), at the
   rate measured in (c)'s baseline, scaled to the same number of ops (``--replay-all`` measures it
   on every op instead).
c. Restart: the new member stopped; ``restart_ops`` more ops (4 new origins) written into the
   source's file while it runs; the member restarted and timed until it holds them all. Baseline:
   ``Replica.apply`` of the same ops, page by page, into a fresh replica file in this process.
d. Memory: the new member's RSS after 1,000 ``check_messages`` over MCP (streamable HTTP), once its
   background work after the snapshot (the signature check, the search index) is done. Baseline: the
   floor, a bare MCP server (``mcp_floor.py``) after the same calls and payloads, same run.
e. Two years of traffic: as many messages as the fleet holds (1,000,000), created evenly over 730
   days up to now, to two roles, each role's reader marking its mail delivered and read a minute
   after every page of 50 but for the last two days; written into two replica files (in this
   process, by the same bulk path, search index caught up). One is kept forever (the baseline); the
   other gets a 30-day horizon and one purge now. Figure: the purged file's size, checkpointed.

Every process started here is stopped at the end. The script always exits 0: benchmarks report,
they do not gate. The machine's load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sim  # noqa: E402
from _util import (  # noqa: E402
    Figure,
    at_most,
    floor_rss,
    fmt,
    mcp_checks,
    note,
    print_summary,
    report,
    rss_mb,
    section,
    stopwatch,
)
from sim import workload  # noqa: E402

from replica import Replica, bulk, hlc, identity, open_home, store  # noqa: E402
from replica import ops as opsmod  # noqa: E402
from replica.sync import _advance  # noqa: E402
from tests.daemons import Daemon, DaemonFailed, Fleet  # noqa: E402 - needs the repo root on sys.path

ROLE = "tau"  # one of sim.workload's channels: its inbox holds a quarter of the messages, plus broadcasts
CHECKS = 1_000
PAGE_OPS = 3_000  # ops per apply of the replay baseline (about one 1 MiB page)
FILL_BATCH = 10_000
NEW_MEMBER_S, RESTART_S, FLOOR_PLUS_MB = 60.0, 10.0, 25.0


@dataclass(frozen=True)
class Sizes:
    messages: int
    restart_ops: int
    checks: int
    settle_timeout: float  # seconds to wait for the background work after a snapshot


FULL = Sizes(1_000_000, 100_000, CHECKS, 900.0)
QUICK = Sizes(20_000, 12_000, 200, 120.0)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs"


def signed(count: int) -> tuple[list[bytes], float]:
    """``count`` message ops of 4 new origins, signed in worker processes; and the seconds it took."""
    with stopwatch() as gen:
        raws = [r for ops in workload(4, count // 4) for r in ops]
    return raws, gen.seconds


def fill(home: Path, raws: Sequence[bytes]) -> None:
    """Write ops the benchmark just signed into a replica file (its daemon may be running), by the
    store path snapshots use, without checking their signatures: generation, not the figure."""
    with open_home(home) as rep:
        for i in range(0, len(raws), FILL_BATCH):
            decoded = [opsmod.decode(raw, verify=False) for raw in raws[i : i + FILL_BATCH]]
            with rep._store.write() as cur:
                batch = [(store.origin_id(cur, op.origin), op) for op in decoded]
                bulk.store_batch(cur, batch, store.arrival_time(cur, int(time.time() * 1000)))
                for oid in {oid for oid, _op in batch}:
                    _advance(cur, oid)


def replay(root: Path, raws: Sequence[bytes]) -> float:
    """Seconds to apply ``raws`` page by page into a fresh replica file: the ordinary path."""
    db = root / "replay" / "replica.db"
    db.parent.mkdir()
    rep = Replica.open(db)
    try:
        with stopwatch() as took:
            for i in range(0, len(raws), PAGE_OPS):
                rep.apply(raws[i : i + PAGE_OPS])
    finally:
        rep.close()
        for f in db.parent.iterdir():
            f.unlink()
        db.parent.rmdir()
    return took.seconds


_VECTOR = (
    "SELECT node, CASE WHEN node = (SELECT v FROM meta WHERE k = 'self_node')"
    " THEN coalesce((SELECT max(seq) FROM ops WHERE ops.oid = origins.oid), 0) ELSE contig END FROM origins"
)


def vector_of(db: Path) -> dict[bytes, int]:
    """A replica file's vector (per origin, the highest seq held contiguously), read-only: watching
    a daemon through its file costs it nothing, where ``/api/status`` counts a million rows a call."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return {bytes(n): int(c) for n, c in conn.execute(_VECTOR)}
    finally:
        conn.close()


def alive(d: Daemon) -> None:
    """Fail at once (with its log) when a daemon being waited for is gone."""
    if not d.running:
        raise DaemonFailed(f"{d.name} exited while the benchmark waited for it; log:\n{d.log_tail()}")


def holds(d: Daemon, want: dict[bytes, int]) -> bool:
    """Whether ``d`` holds every op of ``want`` (a vector) but its own."""
    alive(d)
    have, me = vector_of(d.db), bytes.fromhex(d.node_id)
    return all(have.get(o, 0) >= n for o, n in want.items() if o != me)


def wait_for(pred: Any, within: float, every: float = 0.05) -> tuple[Any, float]:
    """Poll ``pred`` until it is truthy or ``within`` seconds pass: (its last value, seconds taken)."""
    t0 = time.perf_counter()
    value = None
    while True:
        with contextlib.suppress(OSError, KeyError):  # a daemon that is not answering yet, a row not there yet
            value = pred()
        if value or time.perf_counter() - t0 > within:
            return value, time.perf_counter() - t0
        time.sleep(every)


def indexed(db: Path) -> bool:
    """Whether the search index of a replica file holds every op that landed (read-only look)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        upto = int(conn.execute("SELECT v FROM meta WHERE k = 'fts_upto'").fetchone()[0])
        return upto >= int(conn.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])
    finally:
        conn.close()


def disk_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())


# -- a. disk per message ------------------------------------------------------------------------


def bench_disk(src: Daemon, raws: Sequence[bytes], sizes: Sizes) -> list[Figure]:
    section(f"a. disk per message: the source's replica of {sizes.messages:,} messages")
    _, waited = wait_for(lambda: indexed(src.db), sizes.settle_timeout, 0.5)
    size = disk_bytes(src.db)
    n = sizes.messages
    own = sum(map(len, raws))
    content = sum(len(opsmod.read_stored(r).body["x"].encode()) for r in raws[:10_000]) / min(n, 10_000)
    note(f"search index caught up {fmt(waited)} s after the start; file {size / 1e6:,.1f} MB (db + WAL); "
         f"content {fmt(content)} bytes per message on average")
    return [report(Figure("bytes on disk per message", size / n, "B", None, own / n))]


# -- b. a new member --------------------------------------------------------------------------


def bench_new_member(fleet: Fleet, src: Daemon, sizes: Sizes, want: dict[bytes, int]) -> tuple[Daemon, float]:
    section(f"b. a new member of a fleet holding {sizes.messages:,} messages")
    member = fleet.add("member", seeds=[src], log_level="info")
    fleet.init([member])
    t0 = time.perf_counter()
    member.start()
    ready = time.perf_counter() - t0
    _, took = wait_for(lambda: holds(member, want), 1800)
    took += ready
    st = member.status()
    snap = st["snapshot"]
    n = sum(want.values())
    note(f"ready after {fmt(ready)} s; holds all {st['totals']['ops']:,} ops after {fmt(took)} s "
         f"({fmt(n / max(took - ready, 1e-6))} ops/s after start-up); by snapshot: {snap['taken_ops']:,} ops, "
         f"{load()}")
    return member, took


# -- c. catch-up after a restart ------------------------------------------------------------------


def bench_restart(root: Path, src: Daemon, member: Daemon, sizes: Sizes) -> tuple[Figure, float]:
    n = sizes.restart_ops
    section(f"c. catch-up of {n:,} ops after a restart")
    member.stop()
    raws, gen = signed(n)
    note(f"member stopped; signed {n:,} more ops of 4 new origins (not timed): {fmt(gen)} s")
    with stopwatch() as filled:
        fill(src.home, raws)
    want = vector_of(src.db)
    note(f"written into the source's file while it runs (not timed): {fmt(filled.seconds)} s; it holds "
         f"{sum(want.values()):,} ops")
    t0 = time.perf_counter()
    member.restart()
    ready = time.perf_counter() - t0
    _, took = wait_for(lambda: holds(member, want), 600)
    took += ready
    note(f"restarted: ready after {fmt(ready)} s, holds them all after {fmt(took)} s, {load()}")
    base = replay(root, raws)
    note(f"baseline, the ordinary path: Replica.apply of the same {n:,} ops in pages of {PAGE_OPS:,}, signatures "
         f"checked, into a fresh file: {fmt(base)} s = {fmt(n / base)} ops/s")
    fig = report(Figure(f"catch-up of {n:,} ops after a restart (incl. start-up)", took, "s", at_most(RESTART_S),
                        base))
    return fig, n / base


# -- d. memory ------------------------------------------------------------------------------------


def bench_memory(root: Path, member: Daemon, sizes: Sizes) -> Figure:
    section(f"d. the member's memory at {sizes.messages:,} messages after {sizes.checks:,} MCP check_messages")
    pid = int(member.info["pid"])

    def quiet() -> bool:
        alive(member)
        return member.status()["snapshot"]["unchecked"] == 0 and indexed(member.db)

    done, waited = wait_for(quiet, sizes.settle_timeout, 2.0)
    snap = member.status()["snapshot"]
    note(f"background work after the snapshot {'done' if done else 'NOT done'} after {fmt(waited)} s more: "
         f"{snap['checked']:,} signatures checked ({snap['forged'] or 'none forged'}), search index "
         f"{'caught up' if indexed(member.db) else 'behind'}; RSS then {fmt(rss_mb(pid)[0])} MB")
    payload = asyncio.run(mcp_checks(member.info["mcp_url"], sizes.checks, ROLE, member.token))
    loaded, peak = rss_mb(pid)
    note(f"after {sizes.checks:,} check_messages over MCP: RSS {fmt(loaded)} MB, peak {fmt(peak)} MB")
    floor = asyncio.run(floor_rss(root, payload, sizes.checks, ROLE))
    note(f"floor: a bare MCP server (same SDK, HTTP) after the same calls and payload: {fmt(floor)} MB; "
         f"peerd's own part above it: {fmt(loaded - floor)} MB (target: at most {fmt(FLOOR_PLUS_MB)} MB)")
    return report(Figure(f"daemon RSS, {sizes.messages:,} messages, after {sizes.checks:,} checks", loaded, "MB",
                         at_most(floor + FLOOR_PLUS_MB), floor))


# -- e. two years with a horizon --------------------------------------------------------------------

YEARS_DAYS = 730
HORIZON_DAYS = 30
DAY_MS = 86_400_000
READ_BATCH = 50  # messages a reader marks read at once (one check_messages page, then mark_as_read)
UNREAD_DAYS = 2  # the newest messages nobody has read yet


def _history_chunk(seed: bytes, kind: str, jobs: list[tuple[int, int, Any]]) -> list[bytes]:
    """Signed ops of one origin (in a worker process): ``jobs`` are (seq, hlc, body)."""
    ident = identity.from_seed(seed)
    return [opsmod.encode(ident.public_key, seq, stamp, kind, body, sign=ident.sign) for seq, stamp, body in jobs]


def history(count: int, now_ms: int) -> list[bytes]:
    """Two years of traffic ending now: ``count`` messages of 4 origins to ``tau`` and ``phi``, created
    evenly over the two years, and each role's reader marking its mail delivered and read a minute
    after every page of 50 (what check_messages and mark_as_read write), but for the last two days."""
    span = YEARS_DAYS * DAY_MS
    base = now_ms - span
    seeds = [os.urandom(identity.SEED_BYTES) for _ in range(6)]
    keys = [identity.from_seed(sd).public_key for sd in seeds]
    msgs: list[list[tuple[int, int, Any]]] = [[] for _ in range(4)]
    reads: dict[str, list[list[Any]]] = {"tau": [], "phi": []}
    receipts: list[list[tuple[int, int, Any]]] = [[], []]
    for i in range(count):
        at = base + i * span // count
        k, role = i % 4, ("tau", "phi")[i % 2]
        seq = len(msgs[k]) + 1
        body = {"f": f"agent-{i % 7}", "fi": None, "c": role, "ti": None, "t": None, "x": sim.content_for(i)}
        msgs[k].append((seq, hlc.pack(at), body))
        if at > now_ms - UNREAD_DAYS * DAY_MS:
            continue
        mid = opsmod.message_id(keys[k], seq)
        page = reads[role]
        page += [["rcpt", [mid, role, ""], "d", at + 60_000], ["rcpt", [mid, role, ""], "r", at + 60_000]]
        if len(page) >= 2 * READ_BATCH:
            r = ("tau", "phi").index(role)
            receipts[r].append((len(receipts[r]) + 1, hlc.pack(at + 60_000), {"w": list(page)}))
            page.clear()
    jobs = [(seeds[k], opsmod.KIND_MSG, msgs[k][i:i + sim.SIGN_CHUNK]) for k in range(4)
            for i in range(0, len(msgs[k]), sim.SIGN_CHUNK)]
    jobs += [(seeds[4 + r], opsmod.KIND_SET, receipts[r][i:i + sim.SIGN_CHUNK]) for r in range(2)
             for i in range(0, len(receipts[r]), sim.SIGN_CHUNK)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        return [raw for chunk in pool.map(_history_chunk, *zip(*jobs, strict=True)) for raw in chunk]


def bench_retention(root: Path, count: int) -> list[Figure]:
    """(e) The same two years of traffic in two replicas: one kept forever, one with a 30-day horizon
    purged now; the size of each file (checkpointed, search index caught up)."""
    section(f"e. replica size after two simulated years ({count:,} messages), {HORIZON_DAYS}-day horizon vs "
            "kept forever")
    now = int(time.time() * 1000)
    with stopwatch() as gen:
        raws = history(count, now)
    forever_home, kept_home = root / "forever", root / "horizon"
    with stopwatch() as filled:
        open_home(forever_home).close()
        fill(forever_home, raws)
        with open_home(forever_home) as rep:
            rep.catch_up()
            forever = rep.database_bytes()
        shutil.copytree(forever_home, kept_home)
    note(f"signed {len(raws):,} ops ({count:,} messages, {len(raws) - count:,} receipt ops) in {fmt(gen.seconds)} s; "
         f"written and indexed in {fmt(filled.seconds)} s (neither timed)")
    with open_home(kept_home) as rep:
        rep.set_retention(HORIZON_DAYS * DAY_MS)
        with stopwatch() as took:
            done = rep.purge()
        kept = rep.database_bytes()
        left = rep.stats()
    removed = done.removed
    note(f"purge: {removed.messages:,} messages, {removed.receipts:,} receipts, {removed.ops:,} ops removed in "
         f"{fmt(took.seconds)} s; {left['messages']:,} messages and {left['ops']:,} ops left "
         f"({fmt(100 * left['messages'] / count)} % of the messages: the last {HORIZON_DAYS} days, and what was "
         f"not read yet of the {2 * HORIZON_DAYS} before); {load()}")
    note(f"kept forever: {forever / 1e6:,.1f} MB ({fmt(forever / count)} B per message); with the horizon: "
         f"{kept / 1e6:,.1f} MB ({fmt(kept / max(left['messages'], 1))} B per message left)")
    return [report(Figure(f"replica after two years of {count:,} messages, {HORIZON_DAYS}-day horizon", kept / 1e6,
                          "MB", None, forever / 1e6))]


# -- main ---------------------------------------------------------------------------------------


def run(sizes: Sizes, root: Path, replay_all: bool) -> list[Figure]:
    fleet = Fleet(root / "fleet")
    try:
        raws, gen = signed(sizes.messages)
        src = fleet.add("source", log_level="info")
        fleet.init([src])
        with stopwatch() as filled:
            fill(src.home, raws)
        note(f"signed {len(raws):,} message ops of 4 origins in {fmt(gen)} s and wrote them into the source's "
             f"file in {fmt(filled.seconds)} s (neither timed)")
        src.start()
        want = vector_of(src.db)
        figures = bench_disk(src, raws, sizes)
        member, took = bench_new_member(fleet, src, sizes, want)
        if replay_all:
            rate = len(raws) / replay(root, raws)
            how = "measured on every op"
        else:
            rate = 0.0
            how = "at the rate of (c)'s baseline"
        figures.append(bench_memory(root, member, sizes))
        restart, restart_rate = bench_restart(root, src, member, sizes)
        rate = rate or restart_rate
        baseline = len(raws) / rate
        note(f"(b)'s baseline: replaying {len(raws):,} ops by the ordinary path takes {fmt(baseline)} s "
             f"({how}, {fmt(rate)} ops/s)")
        figures.insert(1, report(Figure(f"new member caught up on {sizes.messages:,} messages (incl. start-up)", took,
                                        "s", at_most(NEW_MEMBER_S), baseline)))
        figures.append(restart)
        figures += bench_retention(root, sizes.messages)
        return figures
    except BaseException:
        for d in fleet.daemons:
            if d.proc is not None and d.proc.poll() is not None and d.proc.returncode != 0:
                print(f"--- {d.name} exited with {d.proc.returncode}:\n{d.log_tail()}")
        raise
    finally:
        try:
            fleet.close()
        except DaemonFailed as exc:
            print(f"*** {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="20,000 messages, 12,000 after the restart")
    parser.add_argument("--messages", type=int, default=None, help="messages the fleet holds (at least 20,000)")
    parser.add_argument("--replay-all", action="store_true",
                        help="measure (b)'s baseline by replaying every op (as long again as the ops take at "
                             "the ordinary rate) rather than at the rate of (c)'s baseline")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the daemons' homes (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.messages is not None:
        sizes = Sizes(max(args.messages, 20_000), sizes.restart_ops, sizes.checks, sizes.settle_timeout)
    print(f"peerd longevity benchmark ({'quick' if args.quick else 'full'} sizes: {sizes.messages:,} messages); "
          f"Python {sys.version.split()[0]}, {load()}")
    with stopwatch() as total, tempfile.TemporaryDirectory(dir=args.dir, prefix="peerd-longevity-") as tmp:
        figures = run(sizes, Path(tmp), args.replay_all)
    print_summary(figures)
    print(f"total run time {fmt(total.seconds)} s; at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
