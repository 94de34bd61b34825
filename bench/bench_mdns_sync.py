"""Time from starting ``peerd run`` to its first sync with a peer it found by mDNS.

Run as root from the repository root: ``uv run python bench/bench_mdns_sync.py [--rounds N]``.

Each round builds fresh network namespaces on one bridge, each daemon in its
own namespace with mDNS on and no seeds:

- *joining a running peer* (the figure with the target): daemon A runs and
  has announced itself (its ``/api/status`` says ``mdns.announced``); B is
  spawned. The clock starts at B's process spawn and stops when B's
  ``/api/status`` lists a peer with ``found_by`` "mdns" whose
  ``last_sync_ago`` is set (the moment of that sync is the poll time minus
  ``last_sync_ago``, so the polling pace does not count). The split: spawn ->
  ``daemon.json`` written (its ``started`` stamp: interpreter, imports,
  replica, both listeners), then ``daemon.json`` -> first sync.
- *both start together* (no target): A and B are spawned at the same moment;
  the time until both have synced with each other (by whatever source each
  learnt the other first: one side often sees the other's request before its
  own mDNS answer). Registration probing (about 1.2 s) is in this one.

Target: joining p50 and max <= 2 s. The script always exits 0. Daemons are
started by the test suite's harness (``tests/daemons.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import Figure, at_most, fmt, note, percentile, print_summary, report, section  # noqa: E402

from peerd.config import new_fleet_key  # noqa: E402
from tests.daemons import Daemon, Fleet  # noqa: E402 - needs the repo root on sys.path
from tests.netns import NetnsLab  # noqa: E402
from tests.test_discovery_daemons import in_namespace  # noqa: E402

TARGET_S = 2.0
DEADLINE_S = 30.0


def _poll(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {DEADLINE_S:.0f} s")
        time.sleep(0.02)


def _mdns_sync_at(daemon: Daemon) -> float | None:
    """Wall-clock time of the daemon's first sync with an mDNS-found peer, if any yet."""
    now = time.time()
    ago = [float(p["last_sync_ago"]) for p in daemon.peers()
           if p["found_by"] == "mdns" and p["last_sync_ago"] is not None]
    return now - max(ago) if ago else None


def _pair(lab: NetnsLab, fleet: Fleet) -> tuple[Daemon, Daemon]:
    lan = lab.lan("ddbench")
    key = new_fleet_key()
    a, b = (in_namespace(fleet, lab.node(f"ddbench{i}", lan), key) for i in range(2))
    fleet.init([a, b])
    return a, b


def _announced(daemon: Daemon) -> bool:
    return bool((daemon.status().get("mdns") or {}).get("announced"))


def joining_round() -> tuple[float, float, float]:
    """(spawn -> first mDNS sync, spawn -> daemon.json, daemon.json -> first sync) in seconds."""
    with NetnsLab.create() as lab, tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        fleet = Fleet(Path(tmp))
        try:
            return _joining(*_pair(lab, fleet))
        finally:
            fleet.close()


def _joining(a: Daemon, b: Daemon) -> tuple[float, float, float]:
    a.start()
    _poll(lambda: _announced(a), "mDNS announcement of A")
    spawned = time.time()
    b.spawn()
    info = b.wait_ready()
    synced: list[float] = []

    def done() -> bool:
        at = _mdns_sync_at(b)
        if at is not None:
            synced.append(at)
        return bool(synced)

    _poll(done, "sync with an mDNS-found peer")
    ready = float(info["started"])
    return synced[0] - spawned, ready - spawned, synced[0] - ready


def together_round() -> float:
    """Seconds from spawning both daemons until each has synced with the other."""
    with NetnsLab.create() as lab, tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        fleet = Fleet(Path(tmp))
        try:
            pair = _pair(lab, fleet)
            spawned = time.time()
            fleet.start(*pair)
            _poll(lambda: all(d.synced_ids() for d in pair), "sync on both daemons")
            return max(_first_sync(d) for d in pair) - spawned
        finally:
            fleet.close()


def _first_sync(d: Daemon) -> float:
    now = time.time()
    return now - max(float(p["last_sync_ago"]) for p in d.peers() if p["last_sync_ago"] is not None)


def _figures(name: str, samples: list[float], target: float | None) -> list[Figure]:
    bound = None if target is None else at_most(target)
    return [report(Figure(f"{name} p50", percentile(samples, 50), "s", bound)),
            report(Figure(f"{name} max", max(samples), "s", bound))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per case (default 5)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_mdns_sync needs root: it builds network namespaces with `ip netns`")
        return 0
    print(f"peerd start -> first sync with an mDNS-found peer, between network namespaces; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds per case")
    figures: list[Figure] = []

    section("joining a running peer (B spawned after A announced)")
    rounds = [joining_round() for _ in range(args.rounds)]
    for total, start, sync in rounds:
        note(f"spawn -> first sync {fmt(total)} s = spawn -> daemon.json {fmt(start)} s "
             f"+ daemon.json -> first sync {fmt(sync)} s")
    figures += _figures("spawn -> first mDNS sync", [r[0] for r in rounds], TARGET_S)
    figures += _figures("  spawn -> daemon.json", [r[1] for r in rounds], None)
    figures += _figures("  daemon.json -> first sync", [r[2] for r in rounds], None)

    section("both start together (each must sync with the other)")
    together = [together_round() for _ in range(args.rounds)]
    note("rounds: " + ", ".join(f"{fmt(t)} s" for t in together))
    figures += _figures("both spawned -> both synced", together, None)

    print_summary(figures)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
