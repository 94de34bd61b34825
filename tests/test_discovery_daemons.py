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

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from peerd.config import init_home, new_fleet_key
from peerd.peers import FAIL_THRESHOLD
from tests.netns import Lan, NetnsLab, Node

pytestmark = pytest.mark.netns

PEERD = str(Path(sys.executable).parent / "peerd")
READY_TIMEOUT = 20.0
FIRST_SYNC_LIMIT = 10.0  # s from spawn, three daemons starting at once; bench_mdns_sync holds the 2 s target
GOODBYE_LIMIT = 3.0  # the mDNS goodbye drops a node at once; without it FAIL_THRESHOLD failures take longer
CRASH_LIMIT = 20.0  # a kill -9 is noticed by FAIL_THRESHOLD failed contacts, with backoff
T = TypeVar("T")

_RELAY = r"""
import json, sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for line in sys.stdin:
    q = json.loads(line)
    data = None if q["body"] is None else q["body"].encode()
    req = urllib.request.Request(q["url"], data=data, method=q["method"],
                                 headers={"Content-Type": "application/json"})
    try:
        with opener.open(req, timeout=10) as resp:
            out = {"status": resp.status, "body": resp.read().decode()}
    except urllib.error.HTTPError as exc:
        out = {"status": exc.code, "body": exc.read().decode()}
    except OSError as exc:
        out = {"status": 0, "body": json.dumps({"error": repr(exc)})}
    print(json.dumps(out), flush=True)
"""


def wait_for(pred: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05,
             explain: Callable[[], Any] | None = None) -> T:
    """Poll ``pred`` until it returns something truthy; fail naming ``what``, the last value and ``explain()``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        with contextlib.suppress(ConnectionError):
            value = pred()
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            detail = "" if explain is None else f"; {explain()!r}"
            pytest.fail(f"timed out after {timeout:.1f} s waiting for {what}; last: {last!r}{detail}")
        time.sleep(interval)


class Peerd:
    """One ``peerd run`` in a namespace: its home, process, log, and a relay to its local API."""

    def __init__(self, lab: NetnsLab, node: Node, home: Path, fleet_key: bytes, port: int,
                 seeds: Sequence[str] = ()) -> None:
        self.lab, self.node, self.home, self.port = lab, node, home, port
        self.seeds = list(seeds)
        self.log = home.with_suffix(".log")
        init_home(home, name=node.label, fleet_key=fleet_key)
        self.relay = lab.spawn(node, [sys.executable, "-u", "-c", _RELAY], stdin=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
        self.proc: subprocess.Popen[str] | None = None
        self.spawned_at = 0.0
        self.info: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self.node.label

    @property
    def addr(self) -> str:
        return f"{self.node.address}:{self.port}"

    @property
    def short_id(self) -> str:
        """The node id prefix that peer tables show (16 hex digits)."""
        return str(self.info["node_id"])[:16]

    def spawn(self) -> None:
        argv = [PEERD, "run", "--home", str(self.home), "--port", str(self.port), "--local-port", "0",
                "--bind", self.node.address, "--advertise", self.node.address]
        for seed in self.seeds:
            argv += ["--seed", seed]
        with self.log.open("a") as log:
            self.spawned_at = time.monotonic()
            self.proc = self.lab.spawn(self.node, argv, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.proc.returncode}:\n{self.log_text()}")
            with contextlib.suppress(FileNotFoundError, ValueError):
                info: dict[str, Any] = json.loads((self.home / "daemon.json").read_text())
                return info if info.get("pid") == self.proc.pid else None
            return None

        self.info = wait_for(ready, READY_TIMEOUT, f"{self.name}'s daemon.json")
        return self.info

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """One local API call through the relay; the decoded JSON of a 2xx reply."""
        status, reply = self.call(method, path, body)
        if not 200 <= status < 300:
            raise AssertionError(f"{self.name} {method} {path}: HTTP {status} {reply!r}")
        return reply

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.relay.stdin is not None and self.relay.stdout is not None
        query = {"method": method, "url": f"{self.info['local_url']}{path}",
                 "body": None if body is None else json.dumps(body)}
        self.relay.stdin.write(json.dumps(query) + "\n")
        line = self.relay.stdout.readline()
        if not line:
            raise ConnectionError(f"the relay in {self.name} exited")
        out = json.loads(line)
        if out["status"] == 0:
            raise ConnectionError(f"{self.name}: {out['body']}")
        return int(out["status"]), json.loads(out["body"])

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.api("GET", "/api/status")
        return result

    def peers(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("GET", "/api/peers")
        return result

    def digest(self) -> str:
        return str(self.api("GET", "/api/digest")["digest"])

    def send(self, sender: str, channel: str, content: str) -> dict[str, Any]:
        result: dict[str, Any] = self.api("POST", "/api/send", {"from": sender, "channel": channel,
                                                                "content": content})
        return result

    def inbox(self, role: str) -> list[str]:
        reply = self.api("POST", "/api/check", {"recipient": role, "limit": 100})
        return [m["content"] for m in reply["messages"]]

    def live_ids(self) -> set[str]:
        return {p["node_id"] for p in self.peers() if p["reachable"] and p["node_id"]}

    def synced_ids(self) -> set[str]:
        return {p["node_id"] for p in self.peers() if p["last_sync_ago"] is not None and p["node_id"]}

    def wait_live(self, ids: set[str], timeout: float, what: str) -> None:
        """Wait until every node in ``ids`` is a reachable peer of this daemon."""
        wait_for(lambda: self.live_ids() >= ids, timeout, f"{self.name} to see {what} live", explain=self.peers)

    def wait_synced(self, ids: set[str], timeout: float, what: str) -> None:
        """Wait until this daemon has completed a sync round with every node in ``ids``."""
        wait_for(lambda: self.synced_ids() >= ids, timeout, f"{self.name} to sync with {what}", explain=self.peers)

    def wait_dropped(self, node: str, timeout: float, what: str) -> None:
        """Wait until ``node`` is no longer a reachable peer of this daemon."""
        wait_for(lambda: node not in self.live_ids(), timeout, f"{self.name} to drop {what}", explain=self.peers)

    def wait_message(self, role: str, content: str, timeout: float) -> None:
        wait_for(lambda: content in self.inbox(role), timeout, f"{content!r} in {role}'s inbox on {self.name}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)


class Cluster:
    """The daemons of one test; ``close`` stops them (SIGTERM, then SIGKILL) and prints their logs."""

    def __init__(self, lab: NetnsLab, tmp: Path) -> None:
        self.lab, self.tmp = lab, tmp
        self.daemons: list[Peerd] = []

    def add(self, node: Node, fleet_key: bytes, port: int = 0, seeds: Sequence[str] = ()) -> Peerd:
        daemon = Peerd(self.lab, node, self.tmp / node.label, fleet_key, port, seeds)
        self.daemons.append(daemon)
        return daemon

    def start(self, *daemons: Peerd) -> None:
        """Spawn the daemons together, then wait until each has written its daemon.json."""
        for d in daemons:
            d.spawn()
        for d in daemons:
            d.wait_ready()

    def wait_converged(self, daemons: Sequence[Peerd], timeout: float) -> str:
        def same() -> str | None:
            digests = {d.digest() for d in daemons}
            return digests.pop() if len(digests) == 1 else None

        return wait_for(same, timeout, f"equal digests on {[d.name for d in daemons]}", interval=0.1)

    def close(self) -> None:
        running = [d for d in self.daemons if d.proc is not None and d.proc.poll() is None]
        for d in running:
            d.signal(signal.SIGTERM)
        for d in running:
            assert d.proc is not None
            try:
                d.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                d.proc.kill()
        for d in self.daemons:  # shown by pytest only when the test failed
            print(f"==== {d.name} ({d.node.address}:{d.port})\n{d.log_text()}")


@pytest.fixture
def lab() -> Iterator[NetnsLab]:
    """A fresh namespace lab, removed after the test whatever its outcome."""
    with NetnsLab.create() as lab:
        yield lab


@pytest.fixture
def cluster(lab: NetnsLab, tmp_path: Path) -> Iterator[Cluster]:
    """Daemons in ``lab``'s namespaces, stopped after the test (before the lab goes)."""
    c = Cluster(lab, tmp_path)
    try:
        yield c
    finally:
        c.close()


def _lan(lab: NetnsLab, label: str, count: int) -> tuple[Lan, list[Node]]:
    lan = lab.lan(f"dd{label}")
    return lan, [lab.node(f"dd{label}{i}", lan) for i in range(count)]


def _others(daemon: Peerd, group: Sequence[Peerd]) -> set[str]:
    """Node ids (as peer tables show them) of everyone in ``group`` but ``daemon``."""
    return {o.short_id for o in group if o is not daemon}


def _wait_first_sync(daemons: Sequence[Peerd], timeout: float) -> dict[str, float]:
    """Seconds from each daemon's spawn to its first completed sync with any peer."""
    firsts: dict[str, float] = {}

    def all_synced() -> bool:
        for d in daemons:
            if d.name not in firsts and d.synced_ids():
                firsts[d.name] = time.monotonic() - d.spawned_at
        return len(firsts) == len(daemons)

    wait_for(all_synced, timeout, "a first sync on every daemon", interval=0.02)
    return firsts


def test_three_daemons_on_one_lan_converge_by_mdns_alone(cluster: Cluster, lab: NetnsLab) -> None:
    """Three daemons with mDNS and no seeds find each other, sync, and share a message."""
    _, nodes = _lan(lab, "m", 3)
    key = new_fleet_key()
    daemons = [cluster.add(node, key) for node in nodes]
    cluster.start(*daemons)
    firsts = _wait_first_sync(daemons, 15)
    print("time from spawn to first sync (s):", {k: round(v, 2) for k, v in sorted(firsts.items())})
    assert max(firsts.values()) <= FIRST_SYNC_LIMIT

    for d in daemons:
        d.wait_live(_others(d, daemons), 10, "every peer")
    daemons[0].send("alice", "bob", "hello over mdns")
    for d in daemons[1:]:
        d.wait_message("bob", "hello over mdns", 10)
    cluster.wait_converged(daemons, 10)

    sources = {p["found_by"] for d in daemons for p in d.peers()}
    assert "mdns" in sources
    assert sources <= {"mdns", "inbound", "exchange"}, sources  # no seeds were given
    for d in daemons:
        assert d.short_id not in {p["node_id"] for p in d.peers()}  # never lists itself


def test_fleets_sharing_a_lan_only_see_their_own_members(cluster: Cluster, lab: NetnsLab) -> None:
    """Two fleets on one bridge: peers are same-fleet only, and no sealed request is ever refused."""
    _, nodes = _lan(lab, "f", 4)
    key_a, key_b = new_fleet_key(), new_fleet_key()
    a1, a2 = cluster.add(nodes[0], key_a), cluster.add(nodes[1], key_a)
    b1, b2 = cluster.add(nodes[2], key_b), cluster.add(nodes[3], key_b)
    cluster.start(a1, a2, b1, b2)
    fleets = {a1: a2, a2: a1, b1: b2, b2: b1}
    for d, mate in fleets.items():
        d.wait_synced({mate.short_id}, 15, mate.name)
    sent = a1.send("alice", "broadcast", "fleet a only")
    a2.wait_message("bob", "fleet a only", 10)
    time.sleep(1.5)  # every advert has been on the wire for a while, several gossip rounds passed

    for d, mate in fleets.items():
        status = d.status()
        assert {p["node_id"] for p in status["peers"]} == {mate.short_id}, (d.name, status["peers"])
        assert status["counters"]["refused"] == 0, (d.name, status["counters"])
        assert "refused request" not in d.log_text(), d.name
    assert b1.call("GET", f"/api/messages/{sent['id']}/status")[0] == 404
    assert a1.digest() == a2.digest() != b1.digest()


def test_departures_clean_stop_at_once_and_crash_after_failed_contacts(cluster: Cluster, lab: NetnsLab) -> None:
    """SIGTERM drops a daemon from peers' live lists within seconds; kill -9 after FAIL_THRESHOLD failures."""
    _, nodes = _lan(lab, "d", 3)
    key = new_fleet_key()
    watcher, polite, crashed = (cluster.add(node, key) for node in nodes)
    everyone = [watcher, polite, crashed]
    cluster.start(*everyone)
    for d in everyone:
        d.wait_live(_others(d, everyone), 15, "every peer")

    time.sleep(1.0)  # the fleet idles a moment, as fleets mostly do
    polite.signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert polite.proc is not None and polite.proc.wait(timeout=10) == 0
    for d in (watcher, crashed):
        d.wait_dropped(polite.short_id, max(0.1, stopped + GOODBYE_LIMIT - time.monotonic()), polite.name)
    print(f"clean stop: gone from live peers {time.monotonic() - stopped:.2f} s after SIGTERM")
    time.sleep(0.5)  # nothing the stopping daemon sent late may bring it back
    for d in (watcher, crashed):  # listed as not reachable, or not listed at all
        left = next((p for p in d.peers() if p["node_id"] == polite.short_id), None)
        assert left is None or not left["reachable"], (d.name, left)
        assert left is None or left["failures"] < FAIL_THRESHOLD, ("dropped by failed contacts, not its goodbye", left)

    crashed.signal(signal.SIGKILL)
    killed = time.monotonic()

    def marked_down() -> dict[str, Any] | None:
        entry = next((p for p in watcher.peers() if p["node_id"] == crashed.short_id), None)
        return entry if entry is not None and not entry["reachable"] else None

    entry = wait_for(marked_down, CRASH_LIMIT, f"{watcher.name} to mark {crashed.name} unreachable", interval=0.1)
    print(f"kill -9: marked unreachable {time.monotonic() - killed:.2f} s after the kill; entry {entry}")
    assert entry["failures"] >= FAIL_THRESHOLD
    assert entry["last_error"]
    assert watcher.status()["live_peers"] == 0


def test_two_lans_converge_through_one_seed_and_peer_exchange(cluster: Cluster, lab: NetnsLab) -> None:
    """mDNS stays in each LAN; one seed entry on C plus peer exchange joins LAN1 (A, B) and LAN2 (C, D)."""
    lan1, lan2 = lab.lan("dd1"), lab.lan("dd2")
    router = lab.router("ddr", [lan1, lan2])
    node_a, node_b = lab.node("dda", lan1), lab.node("ddb", lan1)
    node_c, node_d = lab.node("ddc", lan2), lab.node("ddd", lan2)
    for node in (node_a, node_b, node_c, node_d):
        lab.route_via(node, router)
    key = new_fleet_key()
    a, b = cluster.add(node_a, key, 7711), cluster.add(node_b, key, 7712)
    c = cluster.add(node_c, key, 7721, seeds=[f"{node_a.address}:7711"])
    d = cluster.add(node_d, key, 7722)
    everyone = [a, b, c, d]
    cluster.start(*everyone)
    a.send("alice", "broadcast", "from lan1")
    d.send("dave", "broadcast", "from lan2")
    cluster.wait_converged(everyone, 20)
    a.wait_message("bob", "from lan2", 5)
    d.wait_message("bob", "from lan1", 5)

    seeds = [p for p in c.peers() if p["found_by"] == "seed"]
    assert [(p["address"], p["node_id"]) for p in seeds] == [(a.addr, a.short_id)]
    for x in everyone:  # mDNS never crossed the router
        lan = x.node.address.rsplit(".", 1)[0] + "."
        assert all(p["address"].startswith(lan) for p in x.peers() if p["found_by"] == "mdns"), x.name
    found_d = {p["node_id"]: p["found_by"] for p in d.peers()}
    print("D's peers found by:", {x.name: found_d.get(x.short_id) for x in (a, b, c)})
    assert found_d.get(c.short_id) in ("mdns", "inbound")
    assert "exchange" in (found_d.get(a.short_id), found_d.get(b.short_id)), found_d

    # Exchange is meant to give direct links: every listed peer gets contacted, none waits forever.
    for x in everyone:
        x.wait_live(_others(x, everyone), 15,
                    "every node (peers learnt by exchange must be contacted directly)")
