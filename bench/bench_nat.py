"""Mail for laptops behind NAT: how soon a member nobody can call gets its mail, next to two
reachable members in the same run, in network namespaces with real NAT (``tests/natlab.py``:
S and P reachable, L1 and L2 each behind a masquerading router, mDNS off, laptops seeded with S,
every setting at its default: the laptops find out by themselves that nobody can call them).

* Delivery after quiet: each cycle waits ``--idle`` seconds (default 20) with nothing sent, then
  times S -> P (the baseline: both reachable), S -> L1, L2 -> L1 and L1 -> L2, in an order that
  rotates from cycle to cycle (each path is timed first, right after the quiet, as often as the
  others). Time = from the end of the send on one member to the return of a parked
  ``check`` with ``wait`` on the other (what ``peerd inbox ROLE --wait`` does). Goals: median
  <= 100 ms and worst <= 500 ms for S -> L1 and L2 -> L1; each path's median as a ratio to
  S -> P's (goal <= 2x). Idle CPU of L1 (holding its links) and S (holding the laptops' links)
  over the last quiet (goal < 1 % of a core).
* Twenty behind one NAT: S and 20 laptops behind one router (``peer_connections_per_address``
  raised on S, as docs/fleet.md says for many members behind one address); one broadcast from S,
  timed until the last of 20 parked waits returns. Goal <= 1 s.

Needs root, iproute2, iptables and conntrack (``scripts/test`` installs the last two).

    uv run python bench/bench_nat.py [--quick] [--idle SECONDS] [--cycles N] [--twenty N]

Every process and namespace started here is removed at the end; the script exits 0 (benchmarks
report, they do not gate).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import Figure, at_most, note, print_summary, report, section  # noqa: E402
from bench_wake import cpu_seconds  # noqa: E402

from tests.natlab import NatLab, delivery, park_all  # noqa: E402
from tests.netns import NetnsLab  # noqa: E402

PATHS = (("s", "p"), ("s", "l1"), ("l2", "l1"), ("l1", "l2"))
GOALS = {("s", "l1"), ("l2", "l1")}
MEDIAN_GOAL_MS, WORST_GOAL_MS, RATIO_GOAL, BROADCAST_GOAL_MS = 100.0, 500.0, 2.0, 1000.0
IDLE_CPU_GOAL = 1.0  # percent of one core while quiet, links open


def delivery_after_quiet(root: Path, idle: float, cycles: int) -> list[Figure]:
    section(f"delivery after {idle:g} s of quiet, {cycles} cycles (S, P reachable; L1, L2 behind NAT)")
    figures: list[Figure] = []
    with NetnsLab.create() as lab:
        nat = NatLab.build(lab, root / "four")
        try:
            nat.start()
            nat.wait_linked(60, want=2)
            daemons = {**nat.reachable, **nat.laptops}
            samples: dict[tuple[str, str], list[float]] = {p: [] for p in PATHS}
            idle_cpu: dict[str, float] = {}
            for cycle in range(cycles):
                before = {n: cpu_seconds(int(d.info["pid"])) for n, d in daemons.items()}
                t0 = time.monotonic()
                time.sleep(idle)  # the quiet being measured: rounds back off, only keepalives cross
                if cycle == cycles - 1:
                    idle_cpu = {n: 100 * (cpu_seconds(int(d.info["pid"])) - before[n]) / (time.monotonic() - t0)
                                for n, d in daemons.items()}
                order = PATHS[cycle % len(PATHS):] + PATHS[:cycle % len(PATHS)]
                for sender, receiver in order:
                    role = f"c{cycle}{sender}{receiver}"
                    samples[(sender, receiver)].append(delivery(nat.fleet, daemons[sender], daemons[receiver],
                                                                role, f"to {role}"))
            base = statistics.median(samples[("s", "p")]) * 1000
            for path in PATHS:
                ms = [x * 1000 for x in samples[path]]
                name = f"{path[0].upper()} -> {path[1].upper()}"
                goal = path in GOALS
                figures.append(report(Figure(f"{name} median", statistics.median(ms), "ms",
                                             at_most(MEDIAN_GOAL_MS) if goal else None,
                                             None if path == ("s", "p") else base)))
                figures.append(report(Figure(f"{name} worst", max(ms), "ms", at_most(WORST_GOAL_MS) if goal else None)))
                if path != ("s", "p"):
                    figures.append(report(Figure(f"{name} median / S -> P median", statistics.median(ms) / base, "x",
                                                 at_most(RATIO_GOAL))))
            for n in ("l1", "s"):
                what = "links to S and P" if n == "l1" else "holds the laptops' links"
                figures.append(report(Figure(f"idle CPU of {n.upper()} ({what}), {idle:g} s of quiet",
                                             idle_cpu[n], "%", at_most(IDLE_CPU_GOAL))))
        finally:
            nat.fleet.close()
    return figures


def twenty_behind_one_nat(root: Path, count: int) -> list[Figure]:
    section(f"{count} members behind one NAT, one broadcast from S")
    with NetnsLab.create() as lab:
        nat = NatLab.build(lab, root / "twenty", reachable=("s",), homes=1, laptops_per_home=count,
                           server_config={"peer_connections_per_address": 1024})
        try:
            started = time.monotonic()
            nat.start()
            nat.wait_linked(180)
            note(f"{count + 1} daemons started and linked in {time.monotonic() - started:.0f} s")
            laptops = list(nat.laptops.values())
            parked = park_all(nat.fleet, laptops, [f"w{i}" for i in range(len(laptops))])
            nat.reachable["s"].send("sender", "broadcast", "to all")
            sent = time.monotonic()
            last = max(p.woke_with("to all") for p in parked) - sent
            return [report(Figure(f"broadcast to {count} NAT'd members, last arrival", last * 1000, "ms",
                                  at_most(BROADCAST_GOAL_MS)))]
        finally:
            nat.fleet.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 s of quiet, 2 cycles, 8 members behind one NAT")
    ap.add_argument("--idle", type=float, help="seconds of quiet before each cycle (default 20)")
    ap.add_argument("--cycles", type=int, help="cycles of the four paths (default 4)")
    ap.add_argument("--twenty", type=int, help="members behind one NAT (default 20)")
    args = ap.parse_args()
    idle = args.idle if args.idle is not None else (3.0 if args.quick else 20.0)
    cycles = args.cycles or (2 if args.quick else 4)
    twenty = args.twenty or (8 if args.quick else 20)
    with tempfile.TemporaryDirectory(prefix="bench-nat-") as tmp:
        figures = delivery_after_quiet(Path(tmp), idle, cycles)
        figures += twenty_behind_one_nat(Path(tmp), twenty)
    print_summary(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
