"""Benchmarks of real peerd daemons on this machine: push latency, catch-up, spread across a fleet.

Run from the repository root::

    uv run python bench/bench_fleet.py            # full sizes (a few minutes)
    uv run python bench/bench_fleet.py --quick    # small sizes, < 60 s
    uv run python bench/bench_fleet.py --messages 1000000   # the memory figure with N messages

Every daemon is a separate ``peerd run`` process on 127.0.0.1 (mDNS off, seeds
only), started and stopped by the test suite's harness (``tests/daemons.py``),
and driven through its local API exactly as an agent's tools would be:

3. Push latency: ``POST /api/send`` on A until the message comes back from a
   ``POST /api/check`` long-poll (``wait``) on B. Baseline: the same on one
   daemon (send and check on A), so the ratio is what the peer hop costs.
4. Catch-up: B is stopped, 100,000 foreign ops are applied into A's replica file
   (the Python API, while A runs), then B is started and timed until its
   ``/api/status`` totals.ops equals A's. Baseline: applying the same ops into
   A's file in this process.
5. Spread: 32 daemons seeded as a chain (each knows only the one before it),
   left to settle, then one message is sent at one end and timed until every
   daemon's check long-poll returns it. Baseline: the one-hop push latency of 3.

A timed call starts only once every long-poll it depends on has been sent
(an aiohttp trace signal), and the next sample only once the daemons hold the
same state again (delivery receipts included), never after a fixed pause.

Every process started here is stopped at the end (SIGTERM, then SIGKILL). The
script always exits 0: benchmarks report, they do not gate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import (  # noqa: E402
    Figure,
    at_most,
    floor_rss,
    fmt,
    mcp_checks,
    note,
    percentile,
    print_summary,
    report,
    rss_mb,
    section,
    stopwatch,
)
from sim import apply_in_batches, workload  # noqa: E402

from peerd.config import encode_fleet_key, new_fleet_key  # noqa: E402
from replica import open_home  # noqa: E402
from tests.daemons import Daemon, DaemonFailed, Fleet, free_ports  # noqa: E402 - needs the repo root on sys.path

ROLE = "bench"
SENDER = "bench-writer"
PAGE_OPS = 1_000  # ops per apply when filling A (about one 256 KiB page)
SPREAD_TIMEOUT = 60.0
SETTLE_TIMEOUT = 30.0
SHARED_ADDRESS_CAP = 256  # connections per address on each peer port: the whole fleet comes from 127.0.0.1


@dataclass(frozen=True)
class Sizes:
    samples: int  # push latency samples (figure 3)
    local_samples: int  # baseline samples on one daemon
    catch_up_ops: int  # ops B misses (figure 4)
    fleet: int  # daemons in figure 5
    spreads: int  # messages timed across the fleet
    settle_timeout: float
    rss_messages: int  # messages in the replica of the loaded memory figure (6)


FULL = Sizes(200, 100, 100_000, 32, 5, 90.0, 1_000_000)
QUICK = Sizes(40, 20, 10_000, 8, 2, 30.0, 20_000)
IDLE_RSS_MB, LOADED_RSS_MB = 60.0, 80.0
RSS_CHECKS = 1_000  # check_messages calls over MCP before the loaded figure


async def _request_sent(_session: aiohttp.ClientSession, ctx: SimpleNamespace, _params: object) -> None:
    sent = (ctx.trace_request_ctx or {}).get("sent")
    if isinstance(sent, asyncio.Event):
        sent.set()


def _tracing() -> aiohttp.TraceConfig:
    """Sets the ``sent`` event a request carries once its body has been written to the connection."""
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_request_sent)
    trace.on_request_end.append(_request_sent)  # a body-less request has no chunk: its end still tells
    return trace


def share_one_address(d: Daemon) -> None:
    """Let ``d`` take every other daemon of the benchmark from one address: they all connect from
    127.0.0.1, where machines of a real fleet would each have their own (the per-address cap of the
    peer port, 32 by default, would refuse a fleet of 32 on one address)."""
    cfg = d.home / "config.toml"
    lines = [x for x in cfg.read_text().splitlines() if not x.startswith("peer_connections_per_address")]
    cfg.write_text("\n".join([*lines, f"peer_connections_per_address = {SHARED_ADDRESS_CAP}", ""]))


class Bench:
    """Daemons of one fleet (the test harness's ``Fleet``) and an HTTP client for their local APIs."""

    def __init__(self, root: Path) -> None:
        self.fleet = Fleet(root)
        timeout = aiohttp.ClientTimeout(total=120)
        self.keep = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0),
                                          trace_configs=[_tracing()])
        self.fresh = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                           trace_configs=[_tracing()])

    @property
    def daemons(self) -> list[Daemon]:
        return self.fleet.daemons

    def add(self, name: str, key: bytes, port: int, seeds: Sequence[Daemon] = ()) -> Daemon:
        return self.fleet.add(name, port=port, fleet_key=encode_fleet_key(key), seeds=seeds, log_level="warning")

    async def start(self, group: Sequence[Daemon], batch: int) -> None:
        """Start ``group`` in order, ``batch`` at a time (each batch ready before the next)."""
        for i in range(0, len(group), batch):
            part = group[i : i + batch]
            await asyncio.to_thread(self.fleet.init, part)
            for d in part:
                share_one_address(d)
            await asyncio.to_thread(self.fleet.start, *part)

    async def api(self, d: Daemon, method: str, path: str, body: Any = None, *, fresh: bool = False,
                  sent: asyncio.Event | None = None) -> Any:
        """One local API call, on a kept-alive connection (as MCP clients hold them) or a new one;
        ``sent`` is set once the request is on its way."""
        session = self.fresh if fresh else self.keep
        async with session.request(method, f"{d.info['local_url']}{path}", json=body, headers=d.auth,
                                   trace_request_ctx={"sent": sent}) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{d.name} {method} {path}: HTTP {resp.status}: {data}")
            return data

    async def status(self, d: Daemon) -> dict[str, Any]:
        out: dict[str, Any] = await self.api(d, "GET", "/api/status")
        return out

    async def send(self, d: Daemon, text: str, *, fresh: bool = False) -> dict[str, Any]:
        body = {"from": SENDER, "channel": ROLE, "content": text}
        out: dict[str, Any] = await self.api(d, "POST", "/api/send", body, fresh=fresh)
        return out

    async def check(self, d: Daemon, since: int, wait: float, *, fresh: bool = False,
                    sent: asyncio.Event | None = None) -> dict[str, Any]:
        body = {"recipient": ROLE, "since": since, "wait": wait}
        out: dict[str, Any] = await self.api(d, "POST", "/api/check", body, fresh=fresh, sent=sent)
        return out

    async def digest(self, d: Daemon) -> str:
        return str((await self.api(d, "GET", "/api/digest"))["digest"])

    async def settled(self, group: Sequence[Daemon], within: float = SETTLE_TIMEOUT) -> bool:
        """Wait until every daemon of ``group`` holds the same state (receipts of the last delivery
        included); False if they still differ after ``within`` seconds (the run goes on)."""
        deadline = time.monotonic() + within
        while len({await self.digest(d) for d in group}) > 1:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def close(self) -> None:
        await self.keep.close()
        await self.fresh.close()
        try:
            await asyncio.to_thread(self.fleet.close)
        except DaemonFailed as exc:  # crashes in a daemon's log: show them, keep the figures
            print(f"*** {exc}")


# -- 3. push latency -----------------------------------------------------------------------------


@dataclass
class Cursors:
    """Each daemon's position in its inbox for ROLE, so a check only returns new messages."""

    at: dict[str, int] = field(default_factory=dict)


async def deliver(
    bench: Bench, sender: Daemon, receiver: Daemon, cursors: Cursors, text: str, *, fresh: bool
) -> float:
    """Seconds from the send call on ``sender`` until ``receiver``'s waiting check returns the message."""

    sent = asyncio.Event()

    def waiter() -> asyncio.Task[dict[str, Any]]:
        return asyncio.create_task(bench.check(receiver, cursors.at.get(receiver.name, 0), 10.0, fresh=fresh,
                                               sent=sent))

    waiting = waiter()
    await sent.wait()  # the check is on its way: it waits there before the send reaches A
    t0 = time.perf_counter()
    sent = await bench.send(sender, text, fresh=fresh)
    while True:
        inbox = await waiting
        cursors.at[receiver.name] = inbox["cursor"]
        if any(m["messageId"] == sent["messageId"] for m in inbox["messages"]):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > 10:
            raise RuntimeError(f"{receiver.name} did not receive {sent['id']} within 10 s")
        waiting = waiter()


async def wait_live(bench: Bench, group: Sequence[Daemon], live: int, within: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within  # returns the last state then, rather than raising
    while True:
        statuses = await asyncio.gather(*(bench.status(d) for d in group))
        if all(s["live_peers"] >= live for s in statuses) or time.monotonic() > deadline:
            return list(statuses)
        await asyncio.sleep(0.2)


async def samples_ms(
    bench: Bench, pair: tuple[Daemon, Daemon], count: int, cursors: Cursors, *, fresh: bool
) -> list[float]:
    out: list[float] = []
    for i in range(count):
        out.append(1000 * await deliver(bench, *pair, cursors, f"latency sample {i}", fresh=fresh))
        await bench.settled(pair)  # the delivery receipt is back on the sender before the next sample
    return out


def latency_line(what: str, ms: Sequence[float]) -> None:
    note(f"{what}: p50 {fmt(percentile(ms, 50))} ms, p99 {fmt(percentile(ms, 99))} ms, "
         f"min {fmt(min(ms))} ms, max {fmt(max(ms))} ms ({len(ms)} samples)")


async def bench_push(bench: Bench, sizes: Sizes) -> tuple[list[Figure], Daemon, Daemon, float]:
    section(f"3. push latency between two daemons ({sizes.samples} samples each way of calling the local API)")
    key = new_fleet_key()
    pa, pb = free_ports(2)
    a = bench.add("a", key, pa)
    b = bench.add("b", key, pb, seeds=[a])
    with stopwatch() as boot:
        await bench.start([a, b], batch=2)
        await wait_live(bench, [a, b], 1, 20)
    note(f"two daemons up and peered in {fmt(boot.seconds)} s")
    cursors = Cursors()
    figures: list[Figure] = []
    hop_p50 = 0.0
    for fresh, how in ((False, "kept-alive connections (as MCP clients)"), (True, "a new connection per call")):
        await samples_ms(bench, (a, b), 10, cursors, fresh=fresh)  # warm-up: connections, caches
        local = await samples_ms(bench, (a, a), sizes.local_samples, cursors, fresh=fresh)
        hop = await samples_ms(bench, (a, b), sizes.samples, cursors, fresh=fresh)
        note(f"local API over {how}:")
        latency_line("  baseline, send and check on the same daemon", local)
        latency_line("  send on A, check on B", hop)
        tag = "new conn" if fresh else "keep-alive"
        figures += [
            report(Figure(f"push latency A->B p50 ({tag})", percentile(hop, 50), "ms", at_most(15),
                          percentile(local, 50))),
            report(Figure(f"push latency A->B p99 ({tag})", percentile(hop, 99), "ms", at_most(50),
                          percentile(local, 99))),
        ]
        hop_p50 = percentile(hop, 50) / 1000
    note("baseline column: the same measurement with sender and receiver on one daemon (no peer hop)")
    return figures, a, b, hop_p50


# -- 4. catch-up after a restart -----------------------------------------------------------------


async def wait_ops(bench: Bench, d: Daemon, want: int, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within  # returns the last state then, rather than raising
    while True:
        with contextlib.suppress(aiohttp.ClientError, KeyError):
            st = await bench.status(d)
            if st["totals"]["ops"] >= want or time.monotonic() > deadline:
                return st
        await asyncio.sleep(0.1)


async def round_counters(bench: Bench, d: Daemon, within: float) -> dict[str, int]:
    """``d``'s counters once it has finished a round (they are only added up when a round ends)."""
    deadline = time.monotonic() + within  # returns the last state then, rather than raising
    while True:
        counters: dict[str, int] = (await bench.status(d))["counters"]
        if counters["rounds"] > 0 or time.monotonic() > deadline:
            return counters
        await asyncio.sleep(0.1)


async def bench_catch_up(bench: Bench, sizes: Sizes, a: Daemon, b: Daemon) -> list[Figure]:
    n = sizes.catch_up_ops
    section(f"4. catch-up of a restarted daemon that missed {n:,} ops")
    b.stop()
    with stopwatch() as gen:
        work = workload(4, n // 4)
    note(f"B stopped; signed {n:,} foreign ops from 4 origins (not timed): {fmt(gen.seconds)} s")
    raws = [r for ops in work for r in ops]
    with open_home(a.home) as rep, stopwatch() as fill:
        await asyncio.to_thread(apply_in_batches, rep, raws, PAGE_OPS)
    want = (await bench.status(a))["totals"]["ops"]
    note(f"applied them into A's replica file while A runs: {fmt(fill.seconds)} s "
         f"({fmt(n / fill.seconds)} ops/s); A now holds {want:,} ops")
    t0 = time.perf_counter()
    await asyncio.to_thread(b.start)
    ready = time.perf_counter() - t0
    st = await wait_ops(bench, b, want, 300)
    took = time.perf_counter() - t0
    got = st["totals"]["ops"]
    note(f"B restarted: ready (its ready line printed) after {fmt(ready)} s, holds all {got:,} ops after "
         f"{fmt(took)} s; sync part {fmt(took - ready)} s = {fmt(n / (took - ready))} ops/s")
    if got < want:
        note(f"*** B holds only {got:,} of {want:,} ops after 300 s")
    counters = await round_counters(bench, b, 10.0)
    pushed = (await bench.status(a))["counters"]["pushed_ops"]
    note(f"B's counters once its first round ended: {counters}")
    note(f"  pulled by B's own rounds: {counters['pulled_ops']:,}; pushed by A's rounds (A's pushed_ops, all "
         f"peers, never forwarded): {pushed:,}")
    return [report(Figure(f"catch-up of {n:,} ops after restart (incl. start-up)", took, "s", at_most(10),
                          fill.seconds))]


# -- 5. spread across a fleet ---------------------------------------------------------------------


def table_shape(statuses: Sequence[dict[str, Any]]) -> list[tuple[int, int, bool]]:
    return [(s["live_peers"], len(s["peers"]), s["counters"]["rounds"] > 0) for s in statuses]


async def settle(bench: Bench, group: Sequence[Daemon], within: float) -> list[dict[str, Any]]:
    """Wait until every daemon has done a round and no peer table has changed for 5 s."""
    deadline = time.monotonic() + within  # returns the last state then, rather than raising
    shapes: list[list[tuple[int, int, bool]]] = []
    while True:
        statuses = await asyncio.gather(*(bench.status(d) for d in group))
        shapes.append(table_shape(statuses))
        rounds_done = all(done for _live, _known, done in shapes[-1])
        stable = len(shapes) >= 6 and all(shape == shapes[-1] for shape in shapes[-6:])
        if (rounds_done and stable) or time.monotonic() > deadline:
            return list(statuses)
        await asyncio.sleep(1.0)


async def arrival(bench: Bench, d: Daemon, since: int, msg_id: asyncio.Future[str],
                  sent: asyncio.Event) -> tuple[str, float, int]:
    """When ``d``'s check returns the message (perf_counter), and its new cursor."""
    cursor = since
    while True:
        inbox = await bench.check(d, cursor, 30.0, fresh=True, sent=sent)
        at = time.perf_counter()
        cursor = inbox["cursor"]
        want = await msg_id
        if any(m["messageId"] == want for m in inbox["messages"]):
            return d.name, at, cursor


async def spread_once(bench: Bench, group: Sequence[Daemon], sender: Daemon, cursors: Cursors) -> list[float]:
    """Seconds from the send until each other daemon's check returned the message."""
    others = [d for d in group if d is not sender]
    msg_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    sent = [asyncio.Event() for _ in others]
    waits = [asyncio.create_task(arrival(bench, d, cursors.at.get(d.name, 0), msg_id, ev))
             for d, ev in zip(others, sent, strict=True)]
    await asyncio.gather(*(ev.wait() for ev in sent))  # every check is on its way
    t0 = time.perf_counter()
    sent = await bench.send(sender, "spread", fresh=True)
    msg_id.set_result(sent["messageId"])
    done, pending = await asyncio.wait(waits, timeout=SPREAD_TIMEOUT)
    for task in pending:
        task.cancel()
    out: list[float] = [SPREAD_TIMEOUT] * len(pending)  # never arrived: counted as the timeout
    for task in done:
        name, at, cursor = task.result()
        cursors.at[name] = cursor
        out.append(at - t0)
    if pending:
        note(f"  *** {len(pending)} daemon(s) did not receive the message within {SPREAD_TIMEOUT:.0f} s")
    return sorted(out)


def spread_note(times: Sequence[float], before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> None:
    ms = [t * 1000 for t in times]
    pulled = sum(x["counters"]["pulled_ops"] - y["counters"]["pulled_ops"] for x, y in zip(after, before, strict=True))
    late = [fmt(t) for t in ms if t > 500]
    note(f"  all {len(ms)} others in {fmt(ms[-1])} ms; median {fmt(statistics.median(ms))} ms; "
         f"arrivals after 500 ms: {late or 'none'}; ops pulled by rounds meanwhile: {pulled}")


async def bench_spread(bench: Bench, sizes: Sizes, hop_s: float) -> list[Figure]:
    n = sizes.fleet
    section(f"5. {n} daemons seeded as a chain: time until all hold one new message")
    key = new_fleet_key()
    ports = free_ports(n)
    group: list[Daemon] = []
    for i in range(n):
        group.append(bench.add(f"f{i:02d}", key, ports[i], seeds=group[-1:]))
    with stopwatch() as boot:
        await bench.start(group, batch=4)
    note(f"{n} daemons started (4 at a time, each seeded with the one before) in {fmt(boot.seconds)} s")
    with stopwatch() as settling:
        statuses = await settle(bench, group, sizes.settle_timeout)
    live = sorted(s["live_peers"] for s in statuses)
    known = sorted(len(s["peers"]) for s in statuses)
    note(f"settled after {fmt(settling.seconds)} s (every daemon did a round; peer tables unchanged for 5 s)")
    note(f"  live peers per daemon: min {live[0]} / median {statistics.median(live)} / max {live[-1]}; "
         f"known peers: min {known[0]} / median {statistics.median(known)} / max {known[-1]}")
    note("  arrivals are timed with a new connection per local API call (see figure 3)")
    cursors = Cursors()
    worst: list[float] = []
    for rep in range(sizes.spreads):
        sender = group[-1] if rep % 2 == 0 else group[0]
        before = await asyncio.gather(*(bench.status(d) for d in group))
        times = await spread_once(bench, group, sender, cursors)
        after = await asyncio.gather(*(bench.status(d) for d in group))
        note(f"message {rep + 1}, sent on {sender.name}:")
        spread_note(times, before, after)
        worst.append(times[-1])
        if rep + 1 < sizes.spreads and not await bench.settled(group):
            note("  *** the fleet did not settle (equal state everywhere) before the next message")
    return [
        report(Figure(f"spread to all {n} daemons (worst of {len(worst)})", max(worst), "s", at_most(2), hop_s)),
        report(Figure(f"spread to all {n} daemons (median of {len(worst)})", statistics.median(worst), "s",
                      at_most(2), hop_s)),
    ]


# -- 6. memory -----------------------------------------------------------------------------------


async def bench_memory(bench: Bench, sizes: Sizes) -> list[Figure]:
    n = sizes.rss_messages
    section(f"6. daemon memory: idle, then with {n:,} messages caught up and {RSS_CHECKS:,} MCP check_messages")
    key = new_fleet_key()
    p_src, p_dst = free_ports(2)
    src = bench.add("mem-src", key, p_src)
    dst = bench.add("mem-dst", key, p_dst, seeds=[src])
    await bench.start([src], 1)
    with stopwatch() as gen:
        raws = [r for ops in workload(4, n // 4) for r in ops]
    with open_home(src.home) as rep:
        await asyncio.to_thread(apply_in_batches, rep, raws, PAGE_OPS)
    want = (await bench.status(src))["totals"]["ops"]
    note(f"source daemon holds {want:,} ops (signing and applying them, not timed: {fmt(gen.seconds)} s + ...)")
    await bench.start([dst], 1)
    pid = int(dst.info["pid"])
    idle, _ = rss_mb(pid)
    figures = [report(Figure("daemon RSS, idle (fresh start, empty replica)", idle, "MB", at_most(IDLE_RSS_MB)))]
    with stopwatch() as caught:
        await wait_ops(bench, dst, want, 900)
    note(f"caught up {want:,} ops in {fmt(caught.seconds)} s; RSS then {fmt(rss_mb(pid)[0])} MB")
    payload = await mcp_checks(dst.info["mcp_url"], RSS_CHECKS, ROLE, dst.token)
    loaded, peak = rss_mb(pid)
    note(f"after {RSS_CHECKS:,} check_messages over MCP: RSS {fmt(loaded)} MB, peak {fmt(peak)} MB")
    floor = await floor_rss(bench.fleet.root, payload, RSS_CHECKS, ROLE)
    note(f"floor: a bare MCP server (same SDK, HTTP) after the same {RSS_CHECKS:,} calls and payload: "
         f"{fmt(floor)} MB; peerd's own part above it: {fmt(loaded - floor)} MB")
    figures.append(report(Figure(f"daemon RSS, {n:,} messages, after catch-up and {RSS_CHECKS:,} checks", loaded,
                                 "MB", at_most(LOADED_RSS_MB), floor)))
    src.stop()
    dst.stop()
    return figures


# -- main ---------------------------------------------------------------------------------------


async def run(sizes: Sizes, root: Path) -> list[Figure]:
    bench = Bench(root)
    try:
        figures, a, b, hop_s = await bench_push(bench, sizes)
        figures += await bench_catch_up(bench, sizes, a, b)
        a.stop()
        b.stop()
        figures += await bench_spread(bench, sizes, hop_s)
        note("baseline of the spread figures: the one-hop push latency p50 of figure 3 (new connection per call)")
        for d in bench.daemons:
            d.stop()
        figures += await bench_memory(bench, sizes)
        return figures
    except BaseException:
        for d in bench.daemons:
            if d.proc is not None and d.proc.poll() is not None and d.proc.returncode != 0:
                print(f"--- {d.name} exited with {d.proc.returncode}:\n{d.log_tail()}")
        raise
    finally:
        await bench.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the daemons' homes (default: a temp dir)")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages in the replica of the memory figure (6); default 1,000,000, quick 20,000")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.messages is not None:
        sizes = dataclasses.replace(sizes, rss_messages=args.messages)
    print(f"peerd fleet benchmark ({'quick' if args.quick else 'full'} sizes); Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with stopwatch() as total, tempfile.TemporaryDirectory(dir=args.dir, prefix="peerd-fleet-") as tmp:
        figures = asyncio.run(run(sizes, Path(tmp)))
    print_summary(figures)
    print(f"total run time {fmt(total.seconds)} s; load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
