"""Removing a node and rotating the fleet key, with whole nodes on the in-memory transport:
members switch, an offline member catches up, the removed node is cut off and told so."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from peerd.config import Config, fleet_id, new_fleet_key
from peerd.node import Node
from peerd.transport import MemoryNetwork
from replica import Replica
from tests.waiting import eventually

FAST = {"gossip_interval": 0.1, "gossip_max_interval": 0.3}
QUIET = {"gossip_interval": 300.0, "gossip_max_interval": 300.0}


@dataclass
class Lab:
    net: MemoryNetwork = field(default_factory=MemoryNetwork)
    key: bytes = field(default_factory=new_fleet_key)
    nodes: dict[str, Node] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    settings: dict[str, dict[str, float]] = field(default_factory=dict)  # per node, instead of FAST

    def config(self, name: str) -> Config:
        seeds = tuple(f"127.0.0.1:{p}" for n, p in self.ports.items() if n != name)
        return Config(name=name, fleet_key=self.key, port=self.ports[name], local_port=0, mdns=False,
                      seeds=seeds, **self.settings.get(name, FAST))

    async def start(self, *names: str) -> None:
        for name in names:
            self.ports.setdefault(name, 7200 + len(self.ports))
        for name in names:
            rep = self.nodes[name].rep if name in self.nodes else Replica.open(":memory:")
            cfg = self.nodes[name].cfg if name in self.nodes else self.config(name)
            node = Node(cfg, rep, bind="127.0.0.1", transport=self.net.transport())
            await node.start()
            self.nodes[name] = node

    def contents(self, name: str) -> set[str]:
        return {m.content for m in self.nodes[name].rep.message_log(None, 500).messages}

    async def close(self) -> None:
        for node in self.nodes.values():
            await node.stop()
            node.rep.close()


@pytest.fixture
async def lab() -> AsyncIterator[Lab]:
    lab = Lab()
    try:
        yield lab
    finally:
        await lab.close()


async def removed_fleet(lab: Lab, *, offline: str | None = None, names: str = "abcx") -> bytes:
    """a, b, c and x share messages; then (with ``offline`` stopped) a removes x; the new key."""
    await lab.start(*names)
    for name, node in lab.nodes.items():
        node.rep.send_message(name, "team", f"hello from {name}")
    everyone = {f"hello from {n}" for n in lab.nodes}
    await eventually(lambda: all(lab.contents(n) == everyone for n in lab.nodes), 10, "everyone's hellos")
    if offline:
        await lab.nodes[offline].stop()
    key = new_fleet_key()
    a = lab.nodes["a"]
    a.rep.remove_node(lab.nodes["x"].rep.node_key, key, fleet_id(key))
    await a.refresh_keys()
    return key


async def test_removed_node_is_cut_off_while_the_others_keep_talking(lab: Lab) -> None:
    """After the rotation, x's new message reaches nobody, a's reaches b and c, and x is told."""
    key = await removed_fleet(lab)
    a, b, c, x = (lab.nodes[n] for n in "abcx")
    await eventually(lambda: b.keys.current == c.keys.current == key, 10, "b and c on the new key")
    await eventually(lambda: x.keys.removed, 10, "x to learn it was removed")
    assert x.keys.current == lab.key and key not in (x.keys.current, *x.keys.previous)
    x.rep.send_message("x", "team", "x after its removal")
    a.rep.send_message("a", "team", "a after the removal")
    await eventually(lambda: all("a after the removal" in lab.contents(n) for n in "bc"), 10, "a's message")
    b.rep.send_message("b", "team", "b after the removal")
    await eventually(lambda: all("b after the removal" in lab.contents(n) for n in "ac"), 10, "b's message")
    for name in "abc":
        assert "x after its removal" not in lab.contents(name)
        assert lab.nodes[name].keys.fleet_id == fleet_id(key)
    assert "a after the removal" not in lab.contents("x")


async def test_a_member_offline_during_the_rotation_catches_up_when_back(lab: Lab) -> None:
    """c misses the rotation; back, it opens its entry, switches key, and gets what it missed."""
    key = await removed_fleet(lab, offline="c")
    a = lab.nodes["a"]
    await eventually(lambda: lab.nodes["b"].keys.current == key, 10, "b on the new key")
    a.rep.send_message("a", "team", "while c was away")
    await eventually(lambda: "while c was away" in lab.contents("b"), 10, "b has it")
    await lab.start("c")
    c = lab.nodes["c"]
    await eventually(lambda: c.keys.current == key, 10, "c to catch up with the rotation")
    await eventually(lambda: "while c was away" in lab.contents("c"), 10, "c gets what it missed")
    c.rep.send_message("c", "team", "c is back")
    await eventually(lambda: all("c is back" in lab.contents(n) for n in "ab"), 10, "c's message reaches a and b")
    assert lab.key in c.keys.previous


async def test_a_member_the_others_call_first_is_told_of_the_rotation(caplog: pytest.LogCaptureFixture) -> None:
    """A member that rotated calls one still on the old key (which calls nobody): it pushes that one
    the rotation sealed with the old key, and its call then goes through on the new key."""
    net, old = MemoryNetwork(), new_fleet_key()
    ra, rb, rx = (Replica.open(":memory:") for _ in range(3))
    for r in (ra, rb, rx):
        r.send_message("someone", "team", "hi")
    for src in (ra, rb, rx):
        for dst in (ra, rb, rx):
            dst.apply([raw for _, raw in src.ops_after(0)])
    key = new_fleet_key()
    ra.remove_node(rx.node_key, key, fleet_id(key))  # before a starts: nothing pushes it on write
    b = Node(Config(name="b", fleet_key=old, port=7301, local_port=0, mdns=False, **QUIET), rb, bind="127.0.0.1",
             transport=net.transport())
    a = Node(Config(name="a", fleet_key=old, port=7300, local_port=0, mdns=False, seeds=("127.0.0.1:7301",), **FAST),
             ra, bind="127.0.0.1", transport=net.transport())
    caplog.set_level(logging.INFO, "peerd.node")
    await b.start()
    await a.start()
    try:
        assert a.keys.current == key and b.keys.current == old
        await eventually(lambda: b.keys.current == key, 10, "b on the new key, told by a")
        told = [r.getMessage() for r in caplog.records if "of the fleet's key rotation" in r.getMessage()]
        assert told == ["told 127.0.0.1:7301 of the fleet's key rotation"], told
        await eventually(lambda: any(p.last_sync is not None and p.failures == 0 for p in a.table.peers.values()),
                         10, "a round of a's with b on the new key")
    finally:
        for node in (a, b):
            await node.stop()
        for r in (ra, rb, rx):
            r.close()


async def test_the_winner_re_rotates_when_its_rotation_missed_a_member(lab: Lab) -> None:
    """A member a rotation left out (admitted with the old key) is given the key by a mending rotation."""
    key = await removed_fleet(lab)
    a = lab.nodes["a"]
    late = Replica.open(":memory:")
    a.rep.admit_node(late.node_key, "late", fleet_id(lab.key))  # let in with the old key, after the rotation
    await eventually(lambda: a.keys.epoch == 2, 10, "a mends its rotation")
    assert a.keys.current != key
    winner = a.rep.fleet_view().standing.winner
    assert winner is not None and late.node_key in winner.entries
    late.close()
