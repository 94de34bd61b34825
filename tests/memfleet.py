"""The one in-memory fleet: whole nodes (real replicas, protocol, sealing, gossip, pairing) in one
process, on a network with no sockets and a clock the test moves by hand.

Usage::

    async def test_x(memfleet: MemFleet) -> None:
        a, b = await memfleet.add("a"), await memfleet.add("b", seeds=["a"])
        a.rep.send_message("ann", "bob", "hi")
        await memfleet.advance(5)                 # 5 s of rounds, pushes and backoffs happen
        assert memfleet.converged("a", "b")
        memfleet.cut(["a"], ["b"])                # a partition; memfleet.heal() ends it

Invariants:
- Nothing here sleeps: time is a ``ManualClock``; replica work runs inline on the loop (no
  worker threads), so when ``advance`` (or ``settle``) returns, everything that the passing time
  set off has happened — every round, push and reply, in the order the timers said.
- Randomness is one seeded ``random.Random`` per node (from the fleet's seed): a run repeats.
- Nodes share one fleet key unless given another; every node is stopped and its replica closed
  by the fixture, pass or fail. A node's address is ``127.0.0.1:<port>``, fixed when it is added.
- Test modules load the fixture with ``pytest_plugins = ["tests.memfleet"]`` after importing this
  module, so pytest is told not to rewrite it: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from peerd import protocol
from peerd.config import Config, new_fleet_key
from peerd.node import Node
from peerd.seal import open_sealed
from peerd.transport import MemoryNetwork, Post
from replica import Replica
from tests.fakeclock import ManualClock

T = TypeVar("T")
QUIET = {"gossip_interval": 600.0, "gossip_max_interval": 600.0}  # after the first contacts, no round for 10 min
SETTLE_STEPS = 100_000  # loop turns ``settle`` allows before it calls the fleet stuck (a bug, not slowness)


async def inline(fn: Callable[..., T], *args: Any) -> T:
    """Replica work on the loop itself: a test's nodes have no worker threads."""
    return fn(*args)


class MemFleet:
    def __init__(self, *, seed: int = 0) -> None:
        self.net = MemoryNetwork()
        self.clock = ManualClock()
        self.key = new_fleet_key()
        self.nodes: dict[str, Node] = {}
        self.ports: dict[str, int] = {}
        self._rng = random.Random(seed)
        self._next_port = 7000

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def config(self, name: str, *, key: bytes | None = None, seeds: Iterable[str] = (), **settings: Any) -> Config:
        if name not in self.ports:
            self._next_port += 1
            self.ports[name] = self._next_port
        return Config(name=name, fleet_key=key or self.key, port=self.ports[name], local_port=0, mdns=False,
                      seeds=tuple(s if ":" in s else self.addr(s) for s in seeds), **settings)

    async def add(self, name: str, *, key: bytes | None = None, seeds: Iterable[str] = (), writes: int = 0,
                  rep: Replica | None = None, home: Path | None = None, start: bool = True,
                  cfg: Config | None = None, threads: bool = False, **settings: Any) -> Node:
        """A node (started unless ``start`` is False) seeded with the named nodes (or ``host:port``s);
        ``writes`` messages are written before it starts, so nothing pushes them. ``threads``: the
        daemon's own clock and worker threads instead (for a test of them: it waits in real time)."""
        cfg = cfg or self.config(name, key=key, seeds=seeds, **settings)
        rep = rep or Replica.open(":memory:")
        for i in range(writes):
            rep.send_message(f"{name}-agent", "team", f"{name} says {i}")
        node = Node(cfg, rep, bind="127.0.0.1", transport=self.net.transport(), home=home,
                    clock=None if threads else self.clock, rng=random.Random(self._rng.random()),
                    offload=None if threads else inline)
        self.nodes[name] = node
        if start:
            await node.start()
            if not threads:
                await self.settle()
        return node

    async def mesh(self, names: Iterable[str], **settings: Any) -> list[Node]:
        """Nodes seeded with each other (the ones not added yet are added and started)."""
        names = list(names)
        for name in names:
            self.config(name)  # every address is fixed before any seed names it
        return [self.nodes[n] if n in self.nodes else await self.add(n, seeds=[o for o in names if o != n], **settings)
                for n in names]

    async def restart(self, name: str) -> Node:
        """Stop ``name`` and start it again on the same replica and config (a restart of the daemon)."""
        old = self.nodes[name]
        await old.stop()
        return await self.add(name, rep=old.rep, cfg=old.cfg)

    async def stop(self, name: str) -> None:
        """Stop ``name`` (its replica stays, for a later ``restart``): it is gone from the network."""
        await self.nodes[name].stop()
        await self.settle()

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    async def settle(self) -> None:
        """Let every node finish what it is doing: no round or push running, no wake-up pending,
        twice in a row (a change a round made reaches its node on the next loop turn)."""
        quiet = 0
        for _ in range(SETTLE_STEPS):
            await asyncio.sleep(0)
            quiet = quiet + 1 if all(n.idle for n in self.running()) else 0
            if quiet >= 3:
                return
        raise AssertionError(f"the fleet never settled: busy {[n.name for n in self.running() if not n.idle]}")

    async def advance(self, seconds: float) -> None:
        """``seconds`` of the fleet's life: every timer due fires in order, and the fleet settles."""
        await self.clock.advance(seconds, self.settle)

    async def until(self, what: Callable[[], T | None], within: float, step: float = 0.5) -> T:
        """Advance the clock ``step`` s at a time until ``what()`` holds; fail after ``within`` s of
        the fleet's time (not the wall clock's: this never waits on the machine)."""
        waited = 0.0
        while True:
            value = what()
            if value:
                return value
            if waited >= within:
                raise AssertionError(f"not within {within} s of fleet time")
            await self.advance(step)
            waited += step

    def running(self) -> list[Node]:
        """The started nodes on the fleet's clock that have not stopped."""
        return [n for n in self.nodes.values() if n.clock is self.clock and n._loop is not None
                and n.transport.addr in self.net.servers]

    def cut(self, *groups: Iterable[str]) -> None:
        """Partition the network between the named groups of nodes."""
        self.net.cut(*([self.addr(n) for n in g] for g in groups))

    def heal(self) -> None:
        self.net.heal()

    def converged(self, *names: str) -> bool:
        return len({self.nodes[n].rep.state_digest() for n in names or list(self.nodes)}) == 1

    def live(self, name: str, *others: str) -> bool:
        """Whether ``name`` reaches every one of ``others``."""
        known = {p.addr for p in self.nodes[name].table.live()}
        return all(self.addr(o) in known for o in others)

    def kinds(self, posts: list[Post], key: bytes | None = None) -> list[tuple[str, str, protocol.Msg]]:
        """(from, to, message) of each post, opened with the fleet key."""
        return [(p.src, p.dst, protocol.decode(open_sealed(key or self.key, p.body))) for p in posts]

    def contents(self, name: str) -> set[str]:
        return {m.content for m in self.nodes[name].rep.message_log(None, 500).messages}

    async def close(self) -> None:
        for node in self.nodes.values():
            if node._loop is not None:
                await node.stop()
        for node in {id(n.rep): n for n in self.nodes.values()}.values():
            node.rep.close()


@pytest.fixture
async def memfleet() -> AsyncIterator[MemFleet]:
    fleet = MemFleet()
    try:
        yield fleet
    finally:
        await fleet.close()
