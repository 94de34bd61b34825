"""Real ``peerd run`` daemons, one per network namespace, finding each other by mDNS and seeds.

Each daemon runs inside its own namespace of a ``NetnsLab`` (its peer port bound
to the namespace's LAN address); its local API listens on that namespace's
127.0.0.1, so the tests reach it through a small relay process started in the
same namespace. Namespace labels start with ``dd`` (daemon discovery); the lab
itself puts the test process id into every name, so parallel runs never
collide. The lab removes every namespace and process afterwards, pass or fail,
and fails (never skips) where namespaces cannot be made.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from peerd.config import encode_fleet_key, new_fleet_key
from peerd.peers import FAIL_THRESHOLD
from tests.daemons import Daemon, Fleet, patience, wait_until
from tests.netns import Lan, NetnsLab, Node

pytestmark = pytest.mark.netns
pytest_plugins = ["tests.daemons"]

FIRST_SYNC_LIMIT = 10.0  # s from spawn, three daemons starting at once; bench_mdns_sync holds the 2 s target
GOODBYE_LIMIT = 3.0  # the mDNS goodbye drops a node at once; without it FAIL_THRESHOLD failures take longer
CRASH_LIMIT = 20.0  # a kill -9 is noticed by FAIL_THRESHOLD failed contacts, with backoff
T = TypeVar("T")


def wait_for(pred: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05,
             explain: Callable[[], Any] | None = None) -> T:
    """``wait_until``, naming ``explain()`` (the state that matters) when it fails."""
    try:
        return wait_until(pred, timeout, what, interval)
    except AssertionError as exc:
        detail = "" if explain is None else f"; {explain()!r}"
        pytest.fail(f"{exc}{detail}")


def in_namespace(fleet: Fleet, node: Node, fleet_key: bytes, port: int = 0, seeds: Sequence[str] = ()) -> Daemon:
    """A daemon (mDNS on) inside ``node``'s namespace, its peer port on the namespace's LAN address
    (0: the daemon picks one), its local API reached through a relay in the same namespace."""
    daemon = fleet.add(node.label, port=port, fleet_key=encode_fleet_key(fleet_key), host=node.address,
                       exec_prefix=node.exec_prefix(), transport=fleet.relay(node.exec_prefix()), mdns=True)
    daemon.seeds = list(seeds)
    return daemon


def wait_live(d: Daemon, ids: set[str], timeout: float, what: str) -> None:
    """Wait until every node in ``ids`` is a reachable peer of ``d``."""
    wait_for(lambda: d.live_ids() >= ids, timeout, f"{d.name} to see {what} live", explain=d.peers)


def wait_synced(d: Daemon, ids: set[str], timeout: float, what: str) -> None:
    """Wait until ``d`` has completed a sync round with every node in ``ids``."""
    wait_for(lambda: d.synced_ids() >= ids, timeout, f"{d.name} to sync with {what}", explain=d.peers)


def wait_dropped(d: Daemon, node: str, timeout: float, what: str) -> None:
    """Wait until ``node`` is no longer a reachable peer of ``d``."""
    wait_for(lambda: node not in d.live_ids(), timeout, f"{d.name} to drop {what}", explain=d.peers)


def wait_message(d: Daemon, role: str, content: str, timeout: float) -> None:
    wait_for(lambda: content in d.inbox(role), timeout, f"{content!r} in {role}'s inbox on {d.name}")


@pytest.fixture
def lab() -> Iterator[NetnsLab]:
    """A fresh namespace lab, removed after the test whatever its outcome."""
    with NetnsLab.create() as lab:
        yield lab


@pytest.fixture
def cluster(lab: NetnsLab, tmp_path: Path) -> Iterator[Fleet]:
    """Daemons in ``lab``'s namespaces, stopped after the test (before the lab goes)."""
    fleet = Fleet(tmp_path / "fleet")
    try:
        yield fleet
    finally:
        fleet.close()


def _lan(lab: NetnsLab, label: str, count: int) -> tuple[Lan, list[Node]]:
    lan = lab.lan(f"dd{label}")
    return lan, [lab.node(f"dd{label}{i}", lan) for i in range(count)]


def _others(daemon: Daemon, group: Sequence[Daemon]) -> set[str]:
    """Node ids (as peer tables show them) of everyone in ``group`` but ``daemon``."""
    return {o.short_id for o in group if o is not daemon}


def _wait_first_sync(daemons: Sequence[Daemon], timeout: float) -> dict[str, float]:
    """Seconds from each daemon's spawn to its first completed sync with any peer."""
    firsts: dict[str, float] = {}

    def all_synced() -> bool:
        for d in daemons:
            if d.name not in firsts and d.synced_ids():
                firsts[d.name] = time.monotonic() - d.spawned_at
        return len(firsts) == len(daemons)

    wait_for(all_synced, timeout, "a first sync on every daemon", interval=0.02)
    return firsts


def test_three_daemons_on_one_lan_converge_by_mdns_alone(cluster: Fleet, lab: NetnsLab) -> None:
    """Three daemons with mDNS and no seeds find each other, sync, and share a message."""
    _, nodes = _lan(lab, "m", 3)
    key = new_fleet_key()
    daemons = [in_namespace(cluster, node, key) for node in nodes]
    cluster.start(*daemons)
    firsts = _wait_first_sync(daemons, 15)
    print("time from spawn to first sync (s):", {k: round(v, 2) for k, v in sorted(firsts.items())})
    assert max(firsts.values()) <= patience(FIRST_SYNC_LIMIT)

    for d in daemons:
        wait_live(d, _others(d, daemons), 10, "every peer")
    daemons[0].send("alice", "bob", "hello over mdns")
    for d in daemons[1:]:
        wait_message(d, "bob", "hello over mdns", 10)
    cluster.wait_converged(daemons, 10)

    sources = {p["found_by"] for d in daemons for p in d.peers()}
    assert "mdns" in sources
    assert sources <= {"mdns", "inbound", "exchange"}, sources  # no seeds were given
    for d in daemons:
        assert d.short_id not in {p["node_id"] for p in d.peers()}  # never lists itself


def test_fleets_sharing_a_lan_only_see_their_own_members(cluster: Fleet, lab: NetnsLab) -> None:
    """Two fleets on one bridge: peers are same-fleet only, and no sealed request is ever refused."""
    _, nodes = _lan(lab, "f", 4)
    key_a, key_b = new_fleet_key(), new_fleet_key()
    a1, a2 = in_namespace(cluster, nodes[0], key_a), in_namespace(cluster, nodes[1], key_a)
    b1, b2 = in_namespace(cluster, nodes[2], key_b), in_namespace(cluster, nodes[3], key_b)
    cluster.start(a1, a2, b1, b2)
    fleets = {a1: a2, a2: a1, b1: b2, b2: b1}
    for d, mate in fleets.items():
        wait_synced(d, {mate.short_id}, 15, mate.name)
    sent = a1.send("alice", "broadcast", "fleet a only")
    wait_message(a2, "bob", "fleet a only", 10)
    rounds = {d.name: d.status()["counters"]["rounds"] for d in fleets}
    wait_for(lambda: all(d.status()["counters"]["rounds"] >= rounds[d.name] + 2 for d in fleets), 15,
             "two more gossip rounds on every daemon (every advert has been on the wire for a while)")

    for d, mate in fleets.items():
        status = d.status()
        assert {p["node_id"] for p in status["peers"]} == {mate.short_id}, (d.name, status["peers"])
        assert status["counters"]["refused"] == 0, (d.name, status["counters"])
        assert "refused request" not in d.log_text(), d.name
    assert b1.call("GET", f"/api/messages/{sent['messageId']}/status")[0] == 404
    assert a1.digest() == a2.digest() != b1.digest()


def test_departures_clean_stop_at_once_and_crash_after_failed_contacts(cluster: Fleet, lab: NetnsLab) -> None:
    """SIGTERM drops a daemon from peers' live lists within seconds; kill -9 after FAIL_THRESHOLD failures."""
    _, nodes = _lan(lab, "d", 3)
    key = new_fleet_key()
    watcher, polite, crashed = (in_namespace(cluster, node, key) for node in nodes)
    everyone = [watcher, polite, crashed]
    cluster.start(*everyone)
    for d in everyone:
        wait_live(d, _others(d, everyone), 15, "every peer")

    time.sleep(1.0)  # a scenario step, not a wait: the fleet idles a moment, as fleets mostly do
    assert polite.proc is not None and crashed.proc is not None
    polite.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert polite.proc.wait(timeout=patience(10)) == 0
    for d in (watcher, crashed):
        wait_dropped(d, polite.short_id, max(0.1, stopped + GOODBYE_LIMIT - time.monotonic()), polite.name)
    print(f"clean stop: gone from live peers {time.monotonic() - stopped:.2f} s after SIGTERM")
    time.sleep(0.5)  # an observation window for a negative check: nothing sent late may bring it back
    for d in (watcher, crashed):  # listed as not reachable, or not listed at all
        left = next((p for p in d.peers() if p["node_id"] == polite.short_id), None)
        assert left is None or not left["reachable"], (d.name, left)
        # its goodbye reached d (on a busy machine failed contacts may also have counted up first)
        wait_for(lambda d=d: f"peer {polite.short_id} said goodbye" in d.log_text(), 10, f"{d.name} to hear the goodbye")

    crashed.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()

    def marked_down() -> dict[str, Any] | None:
        entry = next((p for p in watcher.peers() if p["node_id"] == crashed.short_id), None)
        return entry if entry is not None and not entry["reachable"] else None

    entry = wait_for(marked_down, CRASH_LIMIT, f"{watcher.name} to mark {crashed.name} unreachable", interval=0.1)
    print(f"kill -9: marked unreachable {time.monotonic() - killed:.2f} s after the kill; entry {entry}")
    assert entry["failures"] >= FAIL_THRESHOLD
    assert entry["last_error"]
    assert watcher.status()["live_peers"] == 0


def test_two_lans_converge_through_one_seed_and_peer_exchange(cluster: Fleet, lab: NetnsLab) -> None:
    """mDNS stays in each LAN; one seed entry on C plus peer exchange joins LAN1 (A, B) and LAN2 (C, D)."""
    lan1, lan2 = lab.lan("dd1"), lab.lan("dd2")
    router = lab.router("ddr", [lan1, lan2])
    node_a, node_b = lab.node("dda", lan1), lab.node("ddb", lan1)
    node_c, node_d = lab.node("ddc", lan2), lab.node("ddd", lan2)
    for node in (node_a, node_b, node_c, node_d):
        lab.route_via(node, router)
    key = new_fleet_key()
    a, b = in_namespace(cluster, node_a, key, 7711), in_namespace(cluster, node_b, key, 7712)
    c = in_namespace(cluster, node_c, key, 7721, seeds=[f"{node_a.address}:7711"])
    d = in_namespace(cluster, node_d, key, 7722)
    everyone = [a, b, c, d]
    cluster.start(*everyone)
    a.send("alice", "broadcast", "from lan1")
    d.send("dave", "broadcast", "from lan2")
    cluster.wait_converged(everyone, 20)
    wait_message(a, "bob", "from lan2", 5)
    wait_message(d, "bob", "from lan1", 5)

    seeds = [p for p in c.peers() if p["found_by"] == "seed"]
    assert [(p["address"], p["node_id"]) for p in seeds] == [(a.addr, a.short_id)]
    for x in everyone:  # mDNS never crossed the router
        lan = x.host.rsplit(".", 1)[0] + "."
        assert all(p["address"].startswith(lan) for p in x.peers() if p["found_by"] == "mdns"), x.name
    # D may first hear of C through exchange (convergence does not wait for mDNS); C shares D's LAN,
    # so mDNS (or C's own contact) must come to be D's best source for it.
    wait_for(lambda: {p["node_id"]: p["found_by"] for p in d.peers()}.get(c.short_id) in ("mdns", "inbound"), 15,
             "D to find C on its own LAN (mDNS) or hear from it directly")
    found_d = {p["node_id"]: p["found_by"] for p in d.peers()}
    print("D's peers found by:", {x.name: found_d.get(x.short_id) for x in (a, b, c)})
    assert "exchange" in (found_d.get(a.short_id), found_d.get(b.short_id)), found_d

    # Exchange is meant to give direct links: every listed peer gets contacted, none waits forever.
    for x in everyone:
        wait_live(x, _others(x, everyone), 15, "every node (peers learnt by exchange must be contacted directly)")
