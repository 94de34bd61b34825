"""Whole nodes (real replicas, protocol, sealing, gossip) syncing over the in-memory transport."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from peerd import protocol
from peerd.config import Config, new_fleet_key
from peerd.node import Node
from peerd.peers import Peer
from peerd.seal import open_sealed, seal
from peerd.transport import Answer, MemoryNetwork, Post
from replica import Replica
from tests.waiting import eventually

QUIET = {"gossip_interval": 600.0, "gossip_max_interval": 600.0}  # after the first contacts, no round within a test


class MemFleet:
    """Nodes on one memory network; every node is stopped and its replica closed at the end."""

    def __init__(self) -> None:
        self.net = MemoryNetwork()
        self.key = new_fleet_key()
        self.nodes: list[Node] = []
        self._port = 7000

    async def add(self, name: str, *, key: bytes | None = None, seeds: tuple[Node, ...] = (),
                  writes: int = 0, **settings: Any) -> Node:
        """A started node; ``writes`` messages are written before it starts (so nothing pushes them)."""
        self._port += 1
        cfg = Config(name=name, fleet_key=key or self.key, port=self._port, local_port=0, mdns=False,
                     seeds=tuple(f"127.0.0.1:{s.peer_port}" for s in seeds), **settings)
        rep = Replica.open(":memory:")
        for i in range(writes):
            rep.send_message(f"{name}-agent", "team", f"{name} says {i}")
        node = Node(cfg, rep, bind="127.0.0.1", transport=self.net.transport())
        await node.start()
        self.nodes.append(node)
        return node

    def kinds(self, posts: list[Post]) -> list[tuple[str, str, protocol.Msg]]:
        """(from, to, message) of each post, opened with the fleet key."""
        return [(p.src, p.dst, protocol.decode(open_sealed(self.key, p.body))) for p in posts]

    async def close(self) -> None:
        for node in self.nodes:
            await node.stop()
            node.rep.close()


@pytest.fixture
async def fleet() -> AsyncIterator[MemFleet]:
    f = MemFleet()
    try:
        yield f
    finally:
        await f.close()


def addr(node: Node) -> str:
    return f"127.0.0.1:{node.peer_port}"


def converged(*nodes: Node) -> bool:
    return len({n.rep.state_digest() for n in nodes}) == 1


def live(node: Node, *others: Node) -> bool:
    known = {p.addr for p in node.table.live()}
    return all(addr(o) in known for o in others)


async def test_three_nodes_converge_over_the_memory_transport(fleet: MemFleet) -> None:
    """A chain a-b-c, each with its own messages, ends with equal replicas; every body crossed sealed."""
    b = await fleet.add("b", writes=5)
    a = await fleet.add("a", seeds=(b,), writes=5)
    c = await fleet.add("c", seeds=(b,), writes=5)
    await eventually(lambda: converged(a, b, c) and len(a.rep.vector()) == 3, 10, "a, b and c converged")
    assert a.rep.stats()["messages"] == 15
    assert fleet.net.posts, "nothing crossed the network"
    with pytest.raises(protocol.ProtocolError):  # sealed: not readable without the key
        protocol.decode(fleet.net.posts[0].body)
    assert {m["t"] for _, _, m in fleet.kinds(fleet.net.posts)} >= {"sync", "push", "peers"}


async def test_a_fresh_write_is_forwarded_but_never_back_to_its_sender(fleet: MemFleet) -> None:
    """A pushes its new op to one peer x; x, finding it new, forwards it to y but never back to a;
    y, finding it new, forwards it on but never back to x."""
    a = await fleet.add("a", push_fanout=1, **QUIET)
    b = await fleet.add("b", seeds=(a,), **QUIET)
    c = await fleet.add("c", seeds=(a, b), **QUIET)
    await eventually(lambda: live(a, b, c) and live(b, a, c) and live(c, a, b), 10, "a full mesh")
    mark = len(fleet.net.posts)
    a.rep.send_message("alice", "team", "fresh")

    def fresh() -> list[tuple[str, str]]:
        return [(src, dst) for src, dst, m in fleet.kinds(fleet.net.posts[mark:]) if m["t"] == "push" and "r" not in m]

    # each of x and y forwards after the apply that made the op visible: wait for both forwards
    await eventually(lambda: len([p for p in fresh() if p[0] != addr(a)]) >= 2, 10, "forwards by b and c")
    direct = [dst for src, dst in fresh() if src == addr(a)]
    assert len(direct) == 1, direct
    x = direct[0]
    y = addr(c) if x == addr(b) else addr(b)
    forwards = [(src, dst) for src, dst in fresh() if src != addr(a)]
    assert (x, y) in forwards and (x, addr(a)) not in forwards, forwards
    assert (y, x) not in forwards, forwards
    assert b.counters["forwarded_ops"] == c.counters["forwarded_ops"] == 1


async def test_ops_a_round_pushes_are_not_forwarded(fleet: MemFleet) -> None:
    """Ops that reach b in a round's push (r: 1) travel on only by rounds, never by a forward."""
    a = await fleet.add("a", writes=3)
    b = await fleet.add("b")  # no seed: only a's round can bring b the ops (a round of b's own would pull them)
    c = await fleet.add("c", seeds=(b,))
    await a.sync_with(Peer("127.0.0.1", b.peer_port, "seed"))  # a pushes its 3 ops to b, r: 1
    await eventually(lambda: converged(a, b, c) and c.rep.stats()["messages"] == 3, 10, "c holds a's messages")
    pushes = [m for _, _, m in fleet.kinds(fleet.net.posts) if m["t"] == "push"]
    assert pushes and all(m.get("r") == 1 for m in pushes), pushes
    assert [n.counters["forwarded_ops"] for n in (a, b, c)] == [0, 0, 0]


async def test_a_node_with_another_fleet_key_is_refused(fleet: MemFleet) -> None:
    """A node of another fleet gets 'not in the same fleet'; nothing of it is stored or remembered."""
    a = await fleet.add("a")
    stranger = await fleet.add("x", key=new_fleet_key(), seeds=(a,), writes=2)

    def failure() -> str | None:
        peer = stranger.table.peers.get(addr(a))
        return peer.last_error if peer is not None else None

    assert "not in the same fleet" in await eventually(failure, 10, "the stranger's failed round")
    assert a.counters["refused"] >= 1
    assert a.table.peers == {} and a.rep.stats()["messages"] == 0


async def test_peer_exchange_teaches_a_node_about_its_peers_peers(fleet: MemFleet) -> None:
    """a knows only b, c knows only b: by exchange a learns c (and c's name) and reaches it."""
    b = await fleet.add("b")
    a = await fleet.add("a", seeds=(b,))
    c = await fleet.add("c", seeds=(b,))

    def a_knows_c() -> Peer | None:
        peer = a.table.peers.get(addr(c))
        return peer if peer is not None and peer.reachable and peer.name == "c" else None

    peer = await eventually(a_knows_c, 10, "c live and named in a's table")
    assert peer.source in ("exchange", "inbound")  # learnt from b, or c reached a first having learnt a
    assert peer.node == protocol.short(c.rep.node_key)


class NoPeerLists:
    """A node's place on the network that refuses every peer exchange with a sealed error."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def answer(self, body: bytes, remote: str) -> Answer:
        key = self.node.cfg.fleet_key
        if protocol.decode(open_sealed(key, body))["t"] == "peers":
            return Answer(400, seal(key, protocol.encode(protocol.error_reply(ValueError("no lists today")))))
        return await self.node.answer(body, remote)

    def refuse(self, remote: str, why: str) -> None:
        self.node.refuse(remote, why)


async def test_exchange_failures_are_counted_and_logged_once_per_streak(
    fleet: MemFleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that refuses exchanges: each failure counts, its last_error says so, one log line per streak."""
    caplog.set_level(logging.WARNING, logger="peerd.node")
    b = await fleet.add("b", **QUIET)
    fleet.net.servers[addr(b)] = NoPeerLists(b)
    a = await fleet.add("a", seeds=(b,), **QUIET)
    await eventually(lambda: a.counters["exchange_failures"] >= 1, 10, "the first exchange failing")
    peer = a.table.peers[addr(b)]
    for _ in range(2):
        await a._round(peer, exchange=True)
    assert a.counters["exchange_failures"] >= 3
    assert (peer.last_error or "").startswith("peer exchange failed:") and "no lists today" in peer.last_error
    assert peer.reachable, "a failed exchange does not make the peer unreachable"

    def logged() -> int:
        return sum("peer exchange with" in r.getMessage() for r in caplog.records)

    assert logged() == 1
    fleet.net.servers[addr(b)] = b
    await a._round(peer, exchange=True)
    fleet.net.servers[addr(b)] = NoPeerLists(b)
    await a._round(peer, exchange=True)
    assert logged() == 2, "a new streak after a working exchange is logged again"


async def test_the_node_reads_its_vector_off_the_event_loop(fleet: MemFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds, pushes, answers and the peer report never run the vector query on the loop thread."""
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    b = await fleet.add("b", writes=3)
    a = await fleet.add("a", writes=3)
    for node in (a, b):
        real = node.rep.vector

        def watched(real: Callable[[], dict[bytes, int]] = real, name: str = node.cfg.name) -> dict[bytes, int]:
            if threading.get_ident() == loop_thread:
                on_loop.append(name)
            return real()

        monkeypatch.setattr(node.rep, "vector", watched)
    a.add_candidate("127.0.0.1", b.peer_port, source="seed")
    await eventually(lambda: converged(a, b) and a.rep.stats()["origins"] == 2, 10, "a and b converged",
                     in_thread=True)  # the test's own reads stay off the loop too
    await asyncio.to_thread(a.rep.send_message, "alice", "team", "pushed")
    await eventually(lambda: b.rep.stats()["messages"] == 7, 10, "the push on b", in_thread=True)
    report = await a.peers_report()
    assert report[0]["lag"] == 0 and report[0]["address"] == addr(b)
    assert on_loop == []
