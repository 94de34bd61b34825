"""A throw-away network lab made of Linux network namespaces, for tests.

Usage (a context manager, or the ``netns_lab`` fixture)::

    with NetnsLab.create() as lab:
        lan = lab.lan("a")                     # a bridge, subnet 10.77.1.0/24
        n1, n2 = lab.node("n1", lan), lab.node("n2", lan)   # 10.77.1.11, .12
        proc = lab.spawn(n1, [sys.executable, "agent.py"])  # runs inside n1
        lab.run(n2, ["ip", "addr"])
        # two LANs joined by a router namespace:
        lan_b = lab.lan("b")                   # 10.77.2.0/24
        r = lab.router("r", [lan, lan_b])      # 10.77.1.1 and 10.77.2.1, forwarding
        n3 = lab.node("n3", lan_b)
        for n in (n1, n2, n3):
            lab.route_via(n, r)

The fixture is plain pytest: make it visible with
``from tests.netns import netns_lab  # noqa: F401`` in ``tests/conftest.py``,
or wrap ``NetnsLab.create()`` in a fixture of your own test module.

Invariants:
- The root namespace is never changed: every bridge lives in one "switch"
  namespace of the lab, every veth end inside a lab namespace.
- Every namespace is named ``pdt<pid>x<lab>-<label>``, so labs of parallel
  test runs never collide, and a lab's start removes namespaces (and any
  root links) whose owning pid no longer runs: leftovers of a crashed run.
- Addresses come from 10.77.<lan>.0/24 (fd77:<lan>::/64 for a node attached
  with ``ipv6=True``, which then has no IPv4 address but loopback): the router
  (if any) is ``.1``, nodes count up from ``.11``. Each LAN is one broadcast and multicast
  domain (bridge multicast snooping off); LANs are joined only through a
  router namespace, which forwards unicast and never multicast.
- ``close`` always runs (context manager / fixture teardown): it stops the
  processes the lab spawned, then deletes the lab's namespaces.
- Without root or iproute2 the lab *fails* the test (``pytest.fail``); it
  never skips, so a CI runner lacking privileges is noticed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["Lan", "NetnsLab", "Node", "netns_lab"]

PREFIX = "pdt"
_NAME = re.compile(rf"^{PREFIX}(\d+)x\d+-")
_lab_numbers = itertools.count(1)


@dataclass(frozen=True)
class Lan:
    """One broadcast domain: a bridge in the lab's switch namespace."""

    index: int
    bridge: str

    @property
    def subnet(self) -> str:
        return f"10.77.{self.index}.0/24"

    def address(self, host: int) -> str:
        return f"10.77.{self.index}.{host}"

    def address6(self, host: int) -> str:
        """The IPv6 address a node attached with ``ipv6=True`` gets (fd77:<lan>::<host>/64)."""
        return f"fd77:{self.index}::{host}"


@dataclass
class Node:
    """A network namespace with one interface per LAN it is attached to."""

    label: str
    netns: str
    addresses: dict[int, str] = field(default_factory=dict)  # lan index -> address

    @property
    def address(self) -> str:
        """The node's address on its first LAN."""
        return next(iter(self.addresses.values()))

    def exec_prefix(self) -> list[str]:
        """Prepend to a command to run it inside this namespace."""
        return ["ip", "netns", "exec", self.netns]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(netns: str) -> None:
    pids = _ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def list_namespaces() -> list[str]:
    """Names of every network namespace ``ip netns`` knows."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Delete lab namespaces and root links whose owning process is gone; return their names."""
    removed: list[str] = []
    for name in list_namespaces():
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    links = _ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        link = parts[1].strip().split("@", 1)[0]
        match = _NAME.match(link)
        if match and not _pid_alive(int(match.group(1))):
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


class NetnsLab:
    """Namespaces, bridges and processes of one test; see the module docstring."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}x{next(_lab_numbers)}"
        self.switch = f"{self.tag}-sw"
        self.namespaces: list[str] = []
        self.lans: list[Lan] = []
        self.nodes: list[Node] = []
        self.processes: list[subprocess.Popen[Any]] = []
        self._ports = itertools.count(1)
        self._next_host: dict[int, itertools.count[int]] = {}

    # -- lifecycle ----------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def create(cls) -> Iterator[NetnsLab]:
        """A fresh lab that is torn down on exit, whatever happens inside."""
        require_netns()
        remove_stale()
        lab = cls()
        try:
            lab._add_namespace(lab.switch)
            yield lab
        finally:
            lab.close()

    def close(self) -> None:
        """Stop spawned processes, then delete every namespace of the lab."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.processes.clear()
        for netns in reversed(self.namespaces):
            _kill_namespace_processes(netns)
            _ip("netns", "del", netns, check=False)
        self.namespaces.clear()

    # -- topology -----------------------------------------------------------

    def _add_namespace(self, netns: str) -> None:
        _ip("netns", "add", netns)
        self.namespaces.append(netns)
        _ip("-n", netns, "link", "set", "lo", "up")

    def lan(self, label: str) -> Lan:
        """A new LAN (bridge) with the next free 10.77.N.0/24 subnet."""
        lan = Lan(index=len(self.lans) + 1, bridge=f"br-{label}"[:15])
        _ip("-n", self.switch, "link", "add", lan.bridge, "type", "bridge")
        _ip("-n", self.switch, "link", "set", lan.bridge, "type", "bridge", "mcast_snooping", "0")
        _ip("-n", self.switch, "link", "set", lan.bridge, "up")
        self.lans.append(lan)
        return lan

    def bare_node(self, label: str) -> Node:
        """A namespace with only loopback up (no network at all)."""
        node = Node(label=label, netns=f"{self.tag}-{label}")
        self._add_namespace(node.netns)
        self.nodes.append(node)
        return node

    def attach(self, node: Node, lan: Lan, host: int | None = None, ifname: str = "", *, ipv6: bool = False) -> str:
        """Wire ``node`` to ``lan`` with a veth pair; return its address on that LAN (with
        ``ipv6``: its only address there is ``lan.address6(host)``, usable at once)."""
        if host is None:
            host = next(self._next_host.setdefault(lan.index, itertools.count(11)))
        ifname = ifname or f"eth{len(node.addresses)}"
        port = f"p{next(self._ports)}"
        address = lan.address6(host) if ipv6 else lan.address(host)
        _ip("-n", self.switch, "link", "add", port, "type", "veth",
            "peer", "name", ifname, "netns", node.netns)
        _ip("-n", self.switch, "link", "set", port, "master", lan.bridge, "up")
        if ipv6:
            _ip("-n", node.netns, "addr", "add", f"{address}/64", "dev", ifname, "nodad")
        else:
            _ip("-n", node.netns, "addr", "add", f"{address}/24", "dev", ifname)
        _ip("-n", node.netns, "link", "set", ifname, "up")
        node.addresses[lan.index] = address
        return address

    def node(self, label: str, lan: Lan, host: int | None = None) -> Node:
        """A namespace with ``eth0`` on ``lan`` (address ``.11``, ``.12``, ... unless given)."""
        node = self.bare_node(label)
        self.attach(node, lan, host)
        return node

    def router(self, label: str, lans: Sequence[Lan]) -> Node:
        """A namespace on every LAN in ``lans`` (as ``.1``) that forwards unicast between them."""
        node = self.bare_node(label)
        for lan in lans:
            self.attach(node, lan, host=1)
        self.run(node, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        return node

    def route_via(self, node: Node, router: Node) -> None:
        """Give ``node`` a default route through ``router`` on their shared LAN."""
        shared = next(i for i in node.addresses if i in router.addresses)
        _ip("-n", node.netns, "route", "add", "default", "via", router.addresses[shared])

    # -- processes ----------------------------------------------------------

    def run(
        self, node: Node, argv: Sequence[str], *, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside ``node`` and wait for it."""
        return subprocess.run(
            [*node.exec_prefix(), *argv], capture_output=True, text=True, check=check,
            timeout=timeout,
        )

    def spawn(self, node: Node, argv: Sequence[str], **popen: Any) -> subprocess.Popen[str]:
        """Start a command inside ``node`` (stdout/stderr piped, text mode); killed on close.

        ``ip netns exec`` execs the command, so the returned pid is the command's own.
        """
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
        proc: subprocess.Popen[str] = subprocess.Popen(
            [*node.exec_prefix(), *argv], text=True, bufsize=1, **popen
        )
        self.processes.append(proc)
        return proc


def require_netns() -> None:
    """Fail the current test (never skip) when namespaces cannot be made here."""
    if os.geteuid() != 0:
        pytest.fail("network namespace tests need root (run the netns tests as root, e.g. in CI)")
    if shutil.which("ip") is None:
        pytest.fail("network namespace tests need iproute2's `ip` command on PATH")
    probe = f"{PREFIX}{os.getpid()}x0-probe"
    result = _ip("netns", "add", probe, check=False)
    _ip("netns", "del", probe, check=False)
    if result.returncode != 0:
        pytest.fail(f"cannot create a network namespace: {result.stderr.strip()}")


@pytest.fixture
def netns_lab() -> Iterator[NetnsLab]:
    """A fresh ``NetnsLab``; everything it made is removed after the test, pass or fail."""
    with NetnsLab.create() as lab:
        yield lab
