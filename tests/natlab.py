"""A fleet across real NAT, in network namespaces: reachable members on an "internet" LAN and
laptops behind routers that masquerade their LANs (iptables), for tests and ``bench/bench_nat.py``.

Topology::

    internet 10.77.1.0/24:  S .11, P .12, router r1 .2, router r2 .3
    home1    10.77.2.0/24:  r1 .1, L1 .11 (default route via r1)
    home2    10.77.3.0/24:  r2 .1, L2 .11 (default route via r2)

S and P have no route to the homes: only the routers' masquerading lets a laptop's calls out,
and nothing of S's or P's can call a laptop. mDNS is off; laptops are seeded with S, P with S.

``delivery`` measures what a person sees: from the end of a send on one member to the return
of a parked ``check`` with ``wait`` (what ``peerd inbox ROLE --wait`` does) on another.

Invariants: without root, iproute2, iptables or conntrack the lab fails the test (never skips);
everything the lab started is stopped by the fleet's and the lab's own teardown.
"""

from __future__ import annotations

import json
import shutil
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, Fleet, NamespaceRelay, wait_until
from tests.netns import Lan, NetnsLab, Node

BASE_PORT = 7811
NEEDS = ("iptables", "conntrack")


def require_nat_tools() -> None:
    """Fail (never skip) when the NAT tools are missing: ``scripts/test`` installs them."""
    missing = [tool for tool in NEEDS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"NAT tests need {' and '.join(missing)} on PATH (scripts/test installs them)")


def nat_router(lab: NetnsLab, label: str, outside: Lan, host: int, inside: Lan) -> Node:
    """A router on ``outside`` (as .host) and ``inside`` (as .1) that masquerades ``inside``."""
    node = lab.bare_node(label)
    lab.attach(node, outside, host=host, ifname="wan")
    lab.attach(node, inside, host=1, ifname="lan")
    lab.run(node, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    lab.run(node, ["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", inside.subnet, "-o", "wan", "-j", "MASQUERADE"])
    return node


@dataclass
class NatLab:
    lab: NetnsLab
    fleet: Fleet
    internet: Lan
    reachable: dict[str, Daemon] = field(default_factory=dict)
    laptops: dict[str, Daemon] = field(default_factory=dict)
    routers: list[Node] = field(default_factory=list)
    places: dict[str, Node] = field(default_factory=dict)
    router_of: dict[str, Node] = field(default_factory=dict)

    @classmethod
    def build(cls, lab: NetnsLab, root: Path, *, reachable: Sequence[str] = ("s", "p"), homes: int = 2,
              laptops_per_home: int = 1, laptop_config: dict[str, Any] | None = None,
              server_config: dict[str, Any] | None = None) -> NatLab:
        require_nat_tools()
        internet = lab.lan("inet")
        me = cls(lab, Fleet(root), internet)
        port = BASE_PORT
        first: Daemon | None = None
        for name in reachable:
            node = lab.node(name, internet)
            me.places[name] = node
            d = me.fleet.add(name, port=port, host=node.address, exec_prefix=node.exec_prefix(),
                             transport=me.fleet.relay(node.exec_prefix()), config=dict(server_config or {}),
                             seeds=[first] if first else [])
            first = first or d
            me.reachable[name] = d
            port += 1
        assert first is not None
        for h in range(1, homes + 1):
            home = lab.lan(f"home{h}")
            router = nat_router(lab, f"r{h}", internet, 1 + h, home)
            me.routers.append(router)
            for i in range(1, laptops_per_home + 1):
                name = f"l{h}" if laptops_per_home == 1 else f"l{h}x{i}"
                node = lab.node(name, home)
                lab.route_via(node, router)
                me.places[name] = node
                me.router_of[name] = router
                me.laptops[name] = me.fleet.add(name, port=port, host=node.address, exec_prefix=node.exec_prefix(),
                                                transport=me.fleet.relay(node.exec_prefix()),
                                                config=dict(laptop_config or {}), seeds=[first])
                port += 1
        return me

    def start(self) -> None:
        self.fleet.start()

    def flush_conntrack(self) -> None:
        """Every NAT mapping of the routers is lost."""
        for router in self.routers:
            self.lab.run(router, ["conntrack", "-F"], check=False)

    def forward_port(self, laptop: Daemon) -> None:
        """The laptop's router forwards its peer port (DNAT): from now on it can be called."""
        self.lab.run(self.router_of[laptop.name], ["iptables", "-t", "nat", "-A", "PREROUTING", "-i", "wan", "-p",
                                                   "tcp", "--dport", str(laptop.port), "-j", "DNAT",
                                                   "--to-destination", f"{laptop.host}:{laptop.port}"])

    def relays_of(self, laptop: Daemon) -> set[str]:
        """Node ids (short) of the members relaying for ``laptop``, as its status says."""
        return {v["node_id"] for v in laptop.status()["relay"]["via"] if v["node_id"]}

    def wait_linked(self, timeout: float, want: int = 1) -> None:
        for d in self.laptops.values():
            wait_until(lambda d=d: len(self.relays_of(d)) >= want, timeout, f"{d.name} to link to a relaying member")


class Parked:
    """A ``check`` with ``wait`` parked on ``receiver`` for ``role`` (what ``peerd inbox ROLE --wait``
    does), in a thread of its own through a relay of its own (``park_all`` waits until the daemon
    counts it among its waiting calls)."""

    def __init__(self, fleet: Fleet, receiver: Daemon, role: str, timeout: float = 30.0) -> None:
        self.receiver, self.role, self.timeout = receiver, role, timeout
        self.relay: NamespaceRelay = fleet.relay(receiver.exec_prefix)
        self.at: float | None = None
        self.reply: tuple[int, bytes] = (0, b"")
        self.thread = threading.Thread(target=self._wait, daemon=True)

    def _wait(self) -> None:
        body = json.dumps({"recipient": self.role, "wait": self.timeout}).encode()
        self.reply = self.relay("POST", f"{self.receiver.info['local_url']}/api/check", body, self.timeout + 10,
                                self.receiver.token)
        self.at = time.monotonic()

    def start(self) -> Parked:
        self.thread.start()
        return self

    def woke_with(self, text: str) -> float:
        """When the wait returned (``time.monotonic``), holding a message of ``text``."""
        self.thread.join(self.timeout + 15)
        assert self.at is not None, f"the wait on {self.receiver.name} did not return"
        status, raw = self.reply
        messages = json.loads(raw)["messages"] if status == 200 else []
        assert any(m["content"] == text for m in messages), \
            f"{self.receiver.name} woke without {text!r}: {status} {raw[:300]!r}"
        return self.at


def park_all(fleet: Fleet, receivers: Sequence[Daemon], roles: Sequence[str]) -> list[Parked]:
    """Park a wait on each receiver (one role each); returns once every daemon counts its wait."""
    before = {d.name: int(d.status()["waiting"]) for d in receivers}
    parked = [Parked(fleet, d, role).start() for d, role in zip(receivers, roles, strict=True)]
    for d in receivers:
        n = sum(1 for p in parked if p.receiver is d)
        wait_until(lambda d=d, n=n: int(d.status()["waiting"]) >= before[d.name] + n, 20, f"a parked wait on {d.name}")
    return parked


def delivery(fleet: Fleet, sender: Daemon, receiver: Daemon, role: str, text: str) -> float:
    """Seconds from the end of a send on ``sender`` to the return of a parked wait on ``receiver``
    (``role`` should be new to the fleet: a role's unread mail would end the wait at once)."""
    (parked,) = park_all(fleet, [receiver], [role])
    sender.send("sender", role, text)
    sent = time.monotonic()
    return parked.woke_with(text) - sent


def summary(samples: Sequence[float]) -> tuple[float, float]:
    """(median, worst) in milliseconds."""
    return statistics.median(samples) * 1000, max(samples) * 1000
