"""Sync benchmarks of the peer protocol: bytes on the wire, and a simulated fleet.

Run from the repository root::

    uv run python bench/bench_sync.py            # full sizes (a few minutes)
    uv run python bench/bench_sync.py --quick    # small sizes, < 60 s

Figures:

1. Bytes of a round between two replicas already in sync (100 origins): the
   sealed request and reply bodies, measured by driving ``peerd.protocol`` in
   memory with the daemon's framing; then the same round on the wire between two
   in-process peerd ``Node`` objects over loopback TCP, through a byte-counting
   proxy (HTTP/1.1 headers included, TCP/IP headers not).
2. Bytes to bring a replica missing d ops (of N, 4 origins, 100-200 byte
   messages) up to date in one round, both directions, against the encoded size
   of the missing ops and against shipping the whole set.
3. A simulated fleet of 300 and 1,000 real in-memory replicas: rounds and
   requests until one new message reaches every node, with and without push.

Every ratio compares two numbers measured in this run. The script always exits
0: benchmarks report, they do not gate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _util import Figure, at_most, fmt, note, print_summary, report, section, stopwatch
from sim import Link, SimFleet, Spread, Tally, apply_in_batches, pack, signed_ops, unpack, workload

from peerd import protocol
from peerd.config import Config, new_fleet_key
from peerd.node import Node
from peerd.peers import Peer
from peerd.seal import SEAL_OVERHEAD, open_sealed
from replica import Replica, identity

PAGE_BYTES = Config(name="bench", fleet_key=bytes(32)).page_bytes  # the daemon's default page budget
IN_SYNC_TARGET = 256
IN_SYNC_REQUEST_TARGET = 68  # the in-sync request: head, digest, wire versions (3 B since wire 3) and seal
CATCH_UP_FACTOR = 1.05
ORIGINS = 4
PUSH_FANOUT = Config(name="bench", fleet_key=bytes(32)).push_fanout


@dataclass(frozen=True)
class Sizes:
    sweep: tuple[int, ...]  # origin counts for the in-sync sweep
    http_rounds: int
    total_ops: int  # ops in the up-to-date replica (figure 2)
    missing: tuple[int, ...]  # d values
    sim: tuple[tuple[int, int], ...]  # (nodes, repetitions)


FULL = Sizes((1, 4, 16, 17, 100, 1000), 20, 100_000, (10, 1_000, 100_000), ((300, 20), (1000, 10)))
QUICK = Sizes((1, 16, 17, 100), 5, 8_000, (10, 1_000, 8_000), ((300, 3), (1000, 1)))


# -- 1. an in-sync round ----------------------------------------------------------------------


def origin_ops(count: int) -> list[bytes]:
    """One signed message op from each of ``count`` fresh origins."""
    return [signed_ops(os.urandom(identity.SEED_BYTES), 0, 1, 1_700_000_000_000 + i)[0] for i in range(count)]


def synced_pair(raws: Sequence[bytes]) -> tuple[Replica, Replica]:
    a, b = Replica.open(), Replica.open()
    for rep in (a, b):
        apply_in_batches(rep, raws)
    return a, b


def in_sync_round(raws: Sequence[bytes], link: Link) -> tuple[Tally, protocol.RoundResult]:
    a, b = synced_pair(raws)
    tally = Tally()
    result = link.round(a, b, PAGE_BYTES, tally)
    a.close()
    b.close()
    return tally, result


def full_vector_body(raws: Sequence[bytes], link: Link) -> int:
    """The naive in-sync check: a request carrying the whole vector with full 32-byte keys."""
    with Replica.open() as a:
        apply_in_batches(a, raws)
        size, _ = link.carry(protocol.stamp({"t": protocol.SYNC, "v": a.vector()}, me=a.node_key, port=link.port))
    return size


@dataclass
class Wire:
    """One request or reply as seen on the TCP stream."""

    head: bytes
    body: bytes

    @property
    def size(self) -> int:
        return len(self.head) + len(self.body)


def split_http(stream: bytes) -> list[Wire]:
    """HTTP/1.1 messages framed by Content-Length (what aiohttp sends for a bytes body)."""
    out: list[Wire] = []
    pos = 0
    while pos < len(stream):
        end = stream.index(b"\r\n\r\n", pos) + 4
        head = stream[pos:end]
        found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        length = int(found.group(1)) if found else 0
        out.append(Wire(head, stream[end : end + length]))
        pos = end + length
    return out


class CountingProxy:
    """A TCP relay on 127.0.0.1 that records every byte each way, per connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.streams: list[tuple[bytearray, bytearray]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        c2s, s2c = bytearray(), bytearray()
        self.streams.append((c2s, s2c))
        await asyncio.gather(self._pump(reader, up_writer, c2s), self._pump(up_reader, writer, s2c))

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, log: bytearray) -> None:
        try:
            while chunk := await src.read(65536):
                log += chunk
                dst.write(chunk)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()


@dataclass
class HttpRound:
    request: Wire
    reply: Wire
    kinds: tuple[str, str]


async def http_rounds(raws: Sequence[bytes], rounds: int) -> list[HttpRound]:
    """In-sync rounds between two in-process peerd Nodes, captured on the wire (first one dropped)."""
    key = new_fleet_key()
    a_rep, b_rep = synced_pair(raws)
    nodes = [Node(Config(name=f"bench-{i}", fleet_key=key, port=0, local_port=0, mdns=False), rep, bind="127.0.0.1")
             for i, rep in enumerate((a_rep, b_rep))]
    for node in nodes:
        await node.start()
    # A starting node writes an op of its own (it admits itself to the fleet), so the pair
    # differs by one op each way until a first round, taken outside the capture, trades them.
    warm_up = await nodes[0].sync_with(Peer("127.0.0.1", nodes[1].peer_port, "seed"))
    assert not warm_up.same and (warm_up.pulled, warm_up.pushed) == (1, 1), warm_up
    proxy = CountingProxy(nodes[1].peer_port)
    await proxy.start()
    try:
        peer = Peer("127.0.0.1", proxy.port, "seed")
        for _ in range(rounds + 1):  # the first round opens the keep-alive connection
            result = await nodes[0].sync_with(peer)
            assert result.same, "replicas were not in sync"
    finally:
        await proxy.stop()
        for node in nodes:
            await node.stop()
            node.rep.close()
    out: list[HttpRound] = []
    for c2s, s2c in proxy.streams:
        for req, rep in zip(split_http(bytes(c2s)), split_http(bytes(s2c)), strict=True):
            kinds = (str(unpack(open_sealed(key, req.body))["t"]), str(unpack(open_sealed(key, rep.body))["t"]))
            out.append(HttpRound(req, rep, kinds))
    return out[1:]


def show_head(head: bytes) -> None:
    for line in head.decode("latin-1").rstrip("\r\n").split("\r\n"):
        note(f"    | {line}")


@dataclass(frozen=True)
class HttpOverhead:
    request_head: float
    reply_head: float


def bench_in_sync(sizes: Sizes) -> tuple[list[Figure], HttpOverhead]:
    section("1. a round between two replicas already in sync")
    link = Link(new_fleet_key())
    pool = origin_ops(max((*sizes.sweep, 100)))
    note(f"sealed body = head (kind, and the n/p fields the transport adds) + msgpack of the other fields + "
         f"{SEAL_OVERHEAD} bytes seal; "
         f"full vector sent up front while origins <= {protocol.FULL_VECTOR_MAX}")
    for count in sizes.sweep:
        tally, result = in_sync_round(pool[:count], link)
        note(f"{count:>5} origins: request {tally.up} B, reply {tally.down} B, "
             f"{tally.requests} request(s) {dict(tally.kinds)}, same={result.same}")
    tally, result = in_sync_round(pool[:100], link)
    assert result.same and tally.requests == 1
    naive = full_vector_body(pool[:100], link)
    figures = [
        report(Figure("in-sync round, 100 origins: request body", tally.up, "B", at_most(IN_SYNC_REQUEST_TARGET),
                      naive)),
        report(Figure("in-sync round, 100 origins: reply body", tally.down, "B", at_most(IN_SYNC_TARGET), naive)),
    ]
    note(f"baseline: a request carrying the full vector (100 x 32-byte keys), sealed: {naive} B")

    captured = asyncio.run(http_rounds(pool[:100], sizes.http_rounds))
    assert all(r.kinds == ("sync", "same") for r in captured), {r.kinds for r in captured}
    req_head = statistics.mean(len(r.request.head) for r in captured)
    rep_head = statistics.mean(len(r.reply.head) for r in captured)
    req_wire = statistics.mean(r.request.size for r in captured)
    rep_wire = statistics.mean(r.reply.size for r in captured)
    bodies = {(len(r.request.body), len(r.reply.body)) for r in captured}
    note(f"on the wire: {len(captured)} in-sync rounds between two peerd Nodes over loopback TCP, "
         f"captured by a relay (keep-alive connection; TCP/IP headers not counted)")
    note(f"  body sizes seen on the wire: {sorted(bodies)} (in-memory link said {tally.up}/{tally.down})")
    if bodies != {(tally.up, tally.down)}:
        note("  *** the in-memory link frames bodies differently from the daemon: update sim.Link to match")
    note("  request head, as sent by the daemon's aiohttp client:")
    show_head(captured[-1].request.head)
    note("  reply head, as sent by the daemon's aiohttp server:")
    show_head(captured[-1].reply.head)
    figures += [
        report(Figure("in-sync round on the wire incl. HTTP: request", req_wire, "B", at_most(IN_SYNC_TARGET),
                      tally.up)),
        report(Figure("in-sync round on the wire incl. HTTP: reply", rep_wire, "B", at_most(IN_SYNC_TARGET),
                      tally.down)),
    ]
    note(f"HTTP framing adds {fmt(req_head)} B to a request and {fmt(rep_head)} B to a reply "
         f"(baseline column: the sealed body alone)")
    return figures, HttpOverhead(req_head, rep_head)


# -- 2. catching up ---------------------------------------------------------------------------


def tails(d: int, origins: int) -> list[int]:
    """How many of each origin's last ops a replica missing ``d`` ops lacks."""
    return [d // origins + (1 if k < d % origins else 0) for k in range(origins)]


def holding(work: list[list[bytes]], lacking: list[int], start: list[int] | None = None) -> list[bytes]:
    """Each origin's ops from ``start`` up to (not including) its last ``lacking``."""
    begin = start or [0] * len(work)
    return [raw for k, ops in enumerate(work) for raw in ops[begin[k] : len(ops) - lacking[k]]]


def copy_replica(src: Path, dst: Path) -> Replica:
    shutil.copyfile(src, dst)
    return Replica.open(dst)


@dataclass
class CatchUp:
    d: int
    tally: Tally
    ops_bytes: int
    seconds: float
    converged: bool


def field_costs(msg: protocol.Msg, ops_bytes: int) -> str:
    """Bytes the head and each body field of ``msg`` take on the wire; for a page's ops (``g``),
    their bytes beyond the ops' own size ``ops_bytes`` (negative: the origin keys said once)."""
    body = {k: v for k, v in msg.items() if k not in protocol.HEAD_FIELDS}
    parts = [f"head {len(pack(msg)) - (len(protocol.encode_map(body)) if body else 0)}"]
    for key, value in body.items():
        size = len(protocol.encode_map({key: value})) - 1
        if key == "pg" and isinstance(value, dict):
            inner = {k: len(protocol.encode_map({k: v})) - 1 for k, v in value.items()}
            inner["g"] -= ops_bytes
            parts.append(f"pg {size - ops_bytes} ({', '.join(f'{k} {n}' for k, n in inner.items())})")
        else:
            parts.append(f"{key} {size}")
    return f"{msg.get('t')}: " + ", ".join(parts)


def catch_up(a: Replica, b: Replica, missing: list[bytes], link: Link) -> CatchUp:
    """Round started by the lagging ``b`` against the up-to-date ``a``."""
    tally = Tally()
    with stopwatch() as w:
        result = link.round(b, a, PAGE_BYTES, tally)
    assert result.pulled == len(missing), (result.pulled, len(missing))
    same = a.vector() == b.vector() and a.state_digest() == b.state_digest()
    return CatchUp(len(missing), tally, sum(map(len, missing)), w.seconds, same)


def bench_catch_up(sizes: Sizes, tmp: Path, http: HttpOverhead) -> list[Figure]:
    n = sizes.total_ops
    section(f"2. bringing a replica missing d of {n:,} ops up to date ({ORIGINS} origins, one round)")
    link = Link(new_fleet_key())
    with stopwatch() as gen:
        work = workload(ORIGINS, n // ORIGINS)
    all_ops = [raw for ops in work for raw in ops]
    sizes_b = [len(r) for r in all_ops]
    note(f"signing (not timed): {fmt(gen.seconds)} s; op size {min(sizes_b)}..{max(sizes_b)} B, "
         f"mean {fmt(statistics.mean(sizes_b))} B (content 100-200 B + header + 64 B signature)")
    small = [d for d in sizes.missing if d < n]
    deepest = tails(max(small), ORIGINS)
    with stopwatch() as build:
        base = Replica.open(tmp / "base.db")
        apply_in_batches(base, holding(work, deepest))
        base.close()
        a = copy_replica(tmp / "base.db", tmp / "a.db")
        apply_in_batches(a, holding(work, [0] * ORIGINS, [len(o) - t for o, t in zip(work, deepest, strict=True)]))
    note(f"building the replicas (not timed): {fmt(build.seconds)} s")
    naive = len(pack(protocol.sign_reply({"t": protocol.PUSH, "o": all_ops}, me=a.node_key, kind="", clock_ms=0)))
    naive += len(pack(protocol.stamp({"t": protocol.SYNC}, me=a.node_key, port=link.port))) + 2 * SEAL_OVERHEAD
    note(f"baseline (b), shipping the whole set: request + reply of all {n:,} ops = {naive:,} B")

    figures: list[Figure] = []
    for d in sizes.missing:
        lack = tails(d, ORIGINS)
        if d == n:
            b = Replica.open(tmp / f"b{d}.db")
        else:
            b = copy_replica(tmp / "base.db", tmp / f"b{d}.db")
            apply_in_batches(b, holding(work, lack, [len(o) - t for o, t in zip(work, deepest, strict=True)]))
        missing = [raw for k, ops in enumerate(work) for raw in ops[len(ops) - lack[k] :]]
        link.trace = [] if d == min(sizes.missing) else None
        res = catch_up(a, b, missing, link)
        b.close()
        t = res.tally
        est = t.total + t.requests * (http.request_head + http.reply_head)
        note(f"d={d:,}: {t.requests} requests {dict(t.kinds)}, up {t.up:,} B, down {t.down:,} B, "
             f"ops {res.ops_bytes:,} B; converged={res.converged}; round took {fmt(res.seconds)} s in memory")
        note(f"        with HTTP framing (estimated: requests x measured head sizes): {fmt(est)} B "
             f"= {fmt(est / res.ops_bytes)} x the ops")
        if link.trace:
            note(f"        the {t.total - res.ops_bytes} B beyond the ops: {SEAL_OVERHEAD} B seal per body, "
                 f"the head (kind, n, p), and per body field")
            note("        (bytes on the wire; for a page's ops, their bytes beyond the ops' own size):")
            for msg in link.trace:
                note(f"          {field_costs(msg, res.ops_bytes if 'pg' in msg else 0)}")
            link.trace = None
        figures += [
            report(Figure(f"catch-up d={d:,}: bytes both ways / ops' own size", t.total, "B",
                          at_most(CATCH_UP_FACTOR * res.ops_bytes), res.ops_bytes)),
            report(Figure(f"catch-up d={d:,}: bytes both ways / ship all {n:,}", t.total, "B", None, naive)),
        ]
    a.close()
    return figures


# -- 3. simulated fleet -----------------------------------------------------------------------


def bench_sim(sizes: Sizes) -> list[Figure]:
    section("3. simulated fleet: in-memory replicas, real protocol; one new message until every node has it")
    note("each round every node syncs with one random peer (the daemon picks 2); rounds are synchronous;")
    note(f"push: the writer pushes to {PUSH_FANOUT} random peers; a node that finds the op new forwards it "
         f"to {PUSH_FANOUT} others")
    figures: list[Figure] = []
    rng = random.Random(20_240_601)
    for nodes, reps in sizes.sim:
        with stopwatch() as opening:
            fleet = SimFleet(nodes, budget=PAGE_BYTES, rng=rng)
        note(f"{nodes} nodes: {reps} repetition(s) each way; opening the replicas took {fmt(opening.seconds)} s")
        runs: dict[int, list[Spread]] = {0: [], PUSH_FANOUT: []}
        with stopwatch() as w:
            for _ in range(reps):
                for fanout, spreads in runs.items():
                    spreads.append(fleet.spread(rng.randrange(nodes), fanout=fanout))
        fleet.close()
        figures += sim_figures(nodes, runs[0], runs[PUSH_FANOUT])
        note(f"   simulated in {fmt(w.seconds)} s")
    return figures


def sim_figures(nodes: int, p: list[Spread], q: list[Spread]) -> list[Figure]:
    assert all(s.converged for s in p + q)
    mean = statistics.mean
    note(f"   without push: rounds {[s.rounds for s in p]}; coverage of one run {p[-1].coverage}")
    note(f"   with push: after the flood {fmt(mean(s.after_push for s in q) / nodes * 100)} % of nodes "
         f"(min {min(s.after_push for s in q)}), flood depth {max(s.push_hops for s in q)} hops, "
         f"{fmt(mean(s.push_requests for s in q))} pushes; rounds {[s.rounds for s in q]}")
    note(f"   bytes per node until convergence: without push {fmt(mean(s.bytes for s in p) / nodes)} B, "
         f"with push {fmt(mean(s.bytes for s in q) / nodes)} B")
    plain_rounds = mean(s.rounds for s in p)
    plain_req = mean(s.requests for s in p)
    return [
        report(Figure(f"sim {nodes} nodes, no push: rounds to converge (mean)", plain_rounds, "rounds")),
        report(Figure(f"sim {nodes} nodes, no push: rounds (worst)", max(s.rounds for s in p), "rounds")),
        report(Figure(f"sim {nodes} nodes, push: rounds to converge (mean)", mean(s.rounds for s in q), "rounds",
                      None, plain_rounds)),
        report(Figure(f"sim {nodes} nodes, push: rounds (worst)", max(s.rounds for s in q), "rounds")),
        report(Figure(f"sim {nodes} nodes, no push: requests to converge", plain_req, "req")),
        report(Figure(f"sim {nodes} nodes, push: requests to converge", mean(s.requests for s in q), "req",
                      None, plain_req)),
    ]


# -- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes (< 60 s)")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the database files (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    print(f"peerd sync benchmark ({'quick' if args.quick else 'full'} sizes); Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; page budget {PAGE_BYTES // 1024} KiB")
    with stopwatch() as total, tempfile.TemporaryDirectory(dir=args.dir, prefix="peerd-bench-") as tmp:
        figures, http = bench_in_sync(sizes)
        figures += bench_catch_up(sizes, Path(tmp), http)
        figures += bench_sim(sizes)
    print_summary(figures)
    print(f"total run time {fmt(total.seconds)} s; load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
