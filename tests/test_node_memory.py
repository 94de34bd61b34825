"""Whole nodes (real replicas, protocol, sealing, gossip) syncing over the in-memory transport, on a
clock the tests move: rounds, pushes, forwards, exchanges, partitions and heals, with no sleep."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import pytest

from peerd import protocol
from peerd.config import new_fleet_key
from peerd.node import Node
from peerd.peers import Peer
from peerd.seal import open_sealed, seal
from peerd.transport import Answer
from tests.memfleet import QUIET, MemFleet
from tests.waiting import eventually

pytest_plugins = ["tests.memfleet"]


async def test_three_nodes_converge_over_the_memory_transport(memfleet: MemFleet) -> None:
    """A chain a-b-c, each with its own messages, ends with equal replicas; every body crossed sealed."""
    await memfleet.add("b", writes=5)
    a = await memfleet.add("a", seeds=["b"], writes=5)
    await memfleet.add("c", seeds=["b"], writes=5)
    await memfleet.until(lambda: memfleet.converged("a", "b", "c") and len(a.rep.vector()) == 3, 30)
    assert a.rep.stats()["messages"] == 15
    posts = memfleet.net.posts
    assert posts, "nothing crossed the network"
    with pytest.raises(protocol.ProtocolError):  # sealed: not readable without the key
        protocol.decode(posts[0].body)
    assert {m["t"] for _, _, m in memfleet.kinds(posts)} >= {"sync", "push", "peers"}


async def test_a_partition_and_a_heal_on_the_fleet_clock(memfleet: MemFleet) -> None:
    """Three nodes in a mesh; a is cut off from b and c: both sides keep writing, and each side
    converges within itself; rounds back off (no request crosses the cut once the failures are
    told); the heal, and the next rounds bring all three to one state with every message."""
    for name in "abc":
        await memfleet.add(name, seeds=[n for n in "abc" if n < name])
    await memfleet.until(lambda: all(memfleet.live(n, *(o for o in "abc" if o != n)) for n in "abc"), 30)
    memfleet.cut(["a"], ["b", "c"])
    mark = len(memfleet.net.posts)
    memfleet["a"].rep.send_message("ann", "team", "from the island")
    memfleet["b"].rep.send_message("bob", "team", "from the mainland")
    memfleet["c"].rep.send_message("cat", "team", "also from the mainland")
    await memfleet.advance(60)
    assert memfleet.converged("b", "c") and not memfleet.converged("a", "b")
    assert memfleet.contents("a") == {"from the island"}
    assert not [p for p in memfleet.net.posts[mark:] if memfleet.addr("a") in (p.src, p.dst)], "through the cut"
    tries = [peer.failures for peer in memfleet["a"].table.peers.values()]
    assert all(3 <= n <= 12 for n in tries), tries  # a tried, backed off and gave up: no loop of retries
    memfleet.heal()
    await memfleet.until(lambda: memfleet.converged("a", "b", "c"), 120)
    assert memfleet.contents("a") == {"from the island", "from the mainland", "also from the mainland"}
    # each link comes back as its backoff lets a round through (the first one healed the data)
    await memfleet.until(lambda: all(memfleet.live(n, *(o for o in "abc" if o != n)) for n in "abc"), 120)


async def test_a_fresh_write_is_forwarded_but_never_back_to_its_sender(memfleet: MemFleet) -> None:
    """A pushes its new op to one peer x; x, finding it new, forwards it to y but never back to a;
    y, finding it new, forwards it on but never back to x."""
    a = await memfleet.add("a", push_fanout=1, **QUIET)
    b = await memfleet.add("b", seeds=["a"], **QUIET)
    c = await memfleet.add("c", seeds=["a", "b"], **QUIET)
    await memfleet.until(lambda: memfleet.live("a", "b", "c") and memfleet.live("b", "a", "c")
                         and memfleet.live("c", "a", "b"), 30)
    mark = len(memfleet.net.posts)
    a.rep.send_message("alice", "team", "fresh")
    await memfleet.settle()
    fresh = [(src, dst) for src, dst, m in memfleet.kinds(memfleet.net.posts[mark:])
             if m["t"] == "push" and "r" not in m]
    direct = [dst for src, dst in fresh if src == memfleet.addr("a")]
    assert len(direct) == 1, direct
    x = direct[0]
    y = memfleet.addr("c") if x == memfleet.addr("b") else memfleet.addr("b")
    forwards = [(src, dst) for src, dst in fresh if src != memfleet.addr("a")]
    assert (x, y) in forwards and (x, memfleet.addr("a")) not in forwards, forwards
    assert (y, x) not in forwards, forwards
    assert b.counters["forwarded_ops"] == c.counters["forwarded_ops"] == 1


async def test_ops_a_round_pushes_are_not_forwarded(memfleet: MemFleet) -> None:
    """Ops that reach b in a round's push (r: 1) travel on only by rounds, never by a forward."""
    a = await memfleet.add("a", writes=3)
    b = await memfleet.add("b")  # no seed: only a's round can bring b the ops (a round of b's own would pull them)
    c = await memfleet.add("c", seeds=["b"])
    await a.sync_with(Peer("127.0.0.1", b.peer_port, "seed"))  # a pushes its 3 ops to b, r: 1
    await memfleet.until(lambda: memfleet.converged("a", "b", "c") and c.rep.stats()["messages"] == 3, 30)
    pushes = [m for _, _, m in memfleet.kinds(memfleet.net.posts) if m["t"] == "push"]
    assert pushes and all(m.get("r") == 1 for m in pushes), pushes
    assert [n.counters["forwarded_ops"] for n in (a, b, c)] == [0, 0, 0]


async def test_a_node_with_another_fleet_key_is_refused(memfleet: MemFleet) -> None:
    """A node of another fleet gets 'not in the same fleet'; nothing of it is stored or remembered."""
    a = await memfleet.add("a")
    stranger = await memfleet.add("x", key=new_fleet_key(), seeds=["a"], writes=2)
    peer = stranger.table.peers[memfleet.addr("a")]
    assert "not in the same fleet" in (peer.last_error or "")
    assert a.counters["refused"] >= 1
    assert a.table.peers == {} and a.rep.stats()["messages"] == 0


async def test_peer_exchange_teaches_a_node_about_its_peers_peers(memfleet: MemFleet) -> None:
    """a knows only b, c knows only b: by exchange a learns c (and c's name) and reaches it."""
    await memfleet.add("b")
    a = await memfleet.add("a", seeds=["b"])
    c = await memfleet.add("c", seeds=["b"])

    def a_knows_c() -> Peer | None:
        peer = a.table.peers.get(memfleet.addr("c"))
        return peer if peer is not None and peer.reachable and peer.name == "c" else None

    peer = await memfleet.until(a_knows_c, 60)
    assert peer.source in ("exchange", "inbound")  # learnt from b, or c reached a first having learnt a
    assert peer.node == protocol.short(c.rep.node_key)


async def test_a_failing_peer_is_retried_with_backoff_then_given_up(memfleet: MemFleet) -> None:
    """A seed that is not there: retried after growing backoffs (0.5, 1, 2 s, jittered), marked
    unreachable after three failures, and still retried now and then, never in a loop."""
    a = await memfleet.add("a", seeds=["127.0.0.1:7999"])
    seed = a.table.peers["127.0.0.1:7999"]
    assert seed.failures == 1
    await memfleet.advance(0.3)
    assert seed.failures == 1  # the first backoff (0.4-0.6 s) has not passed
    await memfleet.until(lambda: seed.failures >= 3, 30)
    assert not seed.reachable
    tries = seed.failures
    await memfleet.advance(60)
    assert 1 <= seed.failures - tries <= 6, seed.failures  # retried now and then as the backoff grows


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
    memfleet: MemFleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that refuses exchanges: each failure counts, its last_error says so, one log line per streak."""
    caplog.set_level(logging.WARNING, logger="peerd.node")
    b = await memfleet.add("b", **QUIET)
    memfleet.net.servers[memfleet.addr("b")] = NoPeerLists(b)  # type: ignore[assignment]
    a = await memfleet.add("a", seeds=["b"], **QUIET)
    assert a.counters["exchange_failures"] == 1  # the first contact's exchange
    peer = a.table.peers[memfleet.addr("b")]
    for _ in range(2):
        await a._round(peer, exchange=True)
    assert a.counters["exchange_failures"] == 3
    assert (peer.last_error or "").startswith("peer exchange failed:") and "no lists today" in peer.last_error
    assert peer.reachable, "a failed exchange does not make the peer unreachable"

    def logged() -> int:
        return sum("peer exchange with" in r.getMessage() for r in caplog.records)

    assert logged() == 1
    memfleet.net.servers[memfleet.addr("b")] = b
    await a._round(peer, exchange=True)
    memfleet.net.servers[memfleet.addr("b")] = NoPeerLists(b)  # type: ignore[assignment]
    await a._round(peer, exchange=True)
    assert logged() == 2, "a new streak after a working exchange is logged again"


async def test_the_node_reads_its_vector_off_the_event_loop(memfleet: MemFleet,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With the daemon's worker threads and clock, rounds, pushes, answers and the peer report never
    run the vector query on the loop thread."""
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    b = await memfleet.add("b", writes=3, threads=True)
    a = await memfleet.add("a", writes=3, threads=True)
    for node in (a, b):
        real = node.rep.vector

        def watched(real: Callable[[], dict[bytes, int]] = real, name: str = node.cfg.name) -> dict[bytes, int]:
            if threading.get_ident() == loop_thread:
                on_loop.append(name)
            return real()

        monkeypatch.setattr(node.rep, "vector", watched)
    a.add_candidate("127.0.0.1", b.peer_port, source="seed")
    await eventually(lambda: memfleet.converged("a", "b") and a.rep.stats()["origins"] == 2, 10,
                     "a and b converged", in_thread=True)  # the test's own reads stay off the loop too
    await asyncio.to_thread(a.rep.send_message, "alice", "team", "pushed")
    await eventually(lambda: b.rep.stats()["messages"] == 7, 10, "the push on b", in_thread=True)
    report = await a.peers_report()
    assert report[0]["lag"] == 0 and report[0]["address"] == memfleet.addr("b")
    assert on_loop == []
