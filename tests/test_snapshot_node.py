"""Snapshots between whole nodes over the in-memory transport, on the fleet's clock: when a node
takes one, what it does meanwhile (others' rounds refused as busy), that a peer of wire 2 is never
asked, that ordinary rounds follow, and bad requests through a node's peer answer."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from peerd import doctor, protocol, snapshotting
from peerd.cli import format
from peerd.node import Node
from peerd.peers import Peer
from peerd.protocol import versions
from peerd.seal import seal
from peerd.transport import Answer
from tests.memfleet import QUIET, MemFleet

BEHIND = 40  # ops from which these tests' nodes take a snapshot (the daemon's threshold is 10,000)


@pytest.fixture
async def memfleet(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MemFleet]:
    monkeypatch.setattr(snapshotting, "SNAPSHOT_BEHIND", BEHIND)
    fleet = MemFleet()
    try:
        yield fleet
    finally:
        await fleet.close()


def sent(fleet: MemFleet, kind: str, dst: str | None = None) -> list[protocol.Msg]:
    return [m for _src, to, m in fleet.kinds(fleet.net.posts)
            if m["t"] == kind and (dst is None or to == fleet.addr(dst))]


async def test_a_new_node_far_behind_takes_a_snapshot_then_syncs_by_rounds(memfleet: MemFleet,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A node joining a member that holds more than the threshold takes a snapshot (pages of
    ``shot``), never pulls those ops op by op, and ends with the member's state; a message
    written afterwards arrives by the ordinary ways; the skipped signatures are checked."""
    caplog.set_level(logging.INFO, logger="peerd.snapshot")
    a = await memfleet.add("a", writes=150, page_bytes=8192, max_content_bytes=4096)  # pages of about 50 ops
    b = await memfleet.add("b", seeds=["a"])
    await memfleet.until(lambda: memfleet.converged("a", "b") and b.rep.stats()["messages"] == 150, 30)
    assert b.snapshots.taken >= 150
    assert len(sent(memfleet, "snap", "a")) > 3, "b took the snapshot in several pages"
    assert sent(memfleet, "pull", "a") == [], "b pulled nothing op by op"
    assert "took the snapshot from" in caplog.text
    later = a.rep.send_message("late", "team", "after the snapshot")
    await memfleet.until(lambda: b.rep.state_digest() == a.rep.state_digest(), 30)
    assert b.rep.get_message(later.id).content == "after the snapshot"
    await memfleet.until(lambda: b.snapshots.unchecked == 0 and b.snapshots.checked >= 150, 60)
    assert b.snapshots.status()["forged"] == {}


async def test_a_node_a_little_behind_syncs_by_rounds_only(memfleet: MemFleet) -> None:
    """Below the threshold nothing changes: no snapshot is opened, rounds bring the ops."""
    await memfleet.add("a", writes=BEHIND // 2)
    b = await memfleet.add("b", seeds=["a"])
    await memfleet.until(lambda: memfleet.converged("a", "b") and b.rep.stats()["messages"] == BEHIND // 2, 30)
    assert sent(memfleet, "snap") == []
    assert b.snapshots.taken == 0


def sealed(fleet: MemFleet, caller: Node, msg: protocol.Msg, *, wire2: bool = False) -> bytes:
    msg = protocol.stamp(msg, me=caller.me, port=caller.peer_port)
    if wire2:
        msg.pop(versions.KEY, None)
    return seal(fleet.key, protocol.encode(msg))


async def test_while_taking_a_snapshot_rounds_of_others_are_refused_as_busy(memfleet: MemFleet) -> None:
    """A node taking a snapshot answers others' syncs, round pushes and snapshot requests with 503
    (busy), and still takes a fresh push."""
    a = await memfleet.add("a")
    b = await memfleet.add("b")
    b.snapshots.idle.clear()
    try:
        for msg in (protocol.sync_request(a.rep.vector()), {"t": "push", "o": [], "r": 1},
                    protocol.snapshot.open_request(a.rep.vector())):
            answer = await b.answer(sealed(memfleet, a, versions.state(msg)), "127.0.0.1")
            assert answer.status == 503
            assert "busy taking a snapshot" in protocol.decode(a.keys.open(answer.body)[0])["e"]
        mid = a.rep.send_message("alice", "team", "fresh").id
        op = a.rep.local_ops_after(0)[-1][1]
        answer = await b.answer(sealed(memfleet, a, versions.state({"t": "push", "o": [op]})), "127.0.0.1")
        assert answer.status == 200 and b.rep.get_message(mid).content == "fresh"
    finally:
        b.snapshots.idle.set()


class FirstRelease:
    """A node's server that answers as 0.1.0 would: no version statement (wire 2), and an unknown
    head code refused with a 400."""

    def __init__(self, node: Node, fleet: MemFleet) -> None:
        self.node, self.fleet = node, fleet
        self.unknown = 0

    async def answer(self, body: bytes, remote: str) -> Answer:
        plain, _key = self.node.keys.open(body)
        try:
            msg = protocol.decode(plain)
        except protocol.ProtocolError:
            self.unknown += 1
            return Answer(400, b"")
        if msg["t"] not in ("sync", "pull", "push", "peers"):
            self.unknown += 1
            return Answer(400, b"")
        msg.pop(versions.KEY, None)
        answer = await self.node.answer(seal(self.fleet.key, protocol.encode(msg)), remote)
        reply = protocol.decode(self.node.keys.open(answer.body)[0])
        reply.pop(versions.KEY, None)
        return Answer(answer.status, seal(self.fleet.key, protocol.encode(reply)))

    async def join(self, body: bytes, remote: str) -> Answer:
        return Answer(404, b"")


async def test_a_peer_of_wire_2_is_never_asked_for_a_snapshot(memfleet: MemFleet) -> None:
    """Far behind a peer that speaks only wire 2 (the first release), a node syncs by rounds and never
    sends it a message kind it does not know."""
    a = await memfleet.add("a", writes=BEHIND * 2)
    old = FirstRelease(a, memfleet)
    memfleet.net.servers[memfleet.addr("a")] = old
    b = await memfleet.add("b", seeds=["a"])
    await memfleet.until(lambda: b.rep.stats()["messages"] == BEHIND * 2, 30)
    assert b.table.peers[memfleet.addr("a")].wire == versions.FIRST_RELEASE
    assert sent(memfleet, "snap") == [] and old.unknown == 0
    assert b.snapshots.taken == 0


async def test_a_member_that_offers_no_snapshot_is_synced_with_by_rounds(memfleet: MemFleet) -> None:
    """A member that refuses to open a snapshot (here: one taking a snapshot of its own) is not asked
    again for a while; the round goes on as always."""
    a = await memfleet.add("a", writes=BEHIND * 2)
    b = await memfleet.add("b", **QUIET)  # no seeds, no rounds of its own: only the two below
    real = a.snapshots.answer

    async def refusing(req: protocol.Request, remote: str) -> tuple[protocol.Msg, int] | None:
        if req.kind == protocol.SNAP:
            return protocol.error_reply(RuntimeError("not now")), 503
        return await real(req, remote)

    a.snapshots.answer = refusing  # type: ignore[method-assign]
    peer = Peer("127.0.0.1", a.peer_port, "seed")
    b.table.peers[peer.addr] = peer
    await b.sync_with(peer)
    assert b.rep.stats()["messages"] == BEHIND * 2
    assert len(sent(memfleet, "snap")) == 1 and b.snapshots.taken == 0
    await b.sync_with(peer)
    assert len(sent(memfleet, "snap")) == 1, "not asked again at once"


async def test_bad_snapshot_requests_get_a_clear_400_and_change_nothing(memfleet: MemFleet) -> None:
    """Through a node's peer answer: a malformed snap, a cursor beyond the snapshot and a caller of
    wire 2 get 400 with the reason; an unknown snapshot id is answered 'gone'; the replica is unchanged."""
    a = await memfleet.add("a", writes=5)
    b = await memfleet.add("b")
    before = a.rep.state_digest()

    async def ask(msg: protocol.Msg, *, wire2: bool = False) -> tuple[int, protocol.Msg]:
        answer = await a.answer(sealed(memfleet, b, msg, wire2=wire2), "127.0.0.1")
        return answer.status, protocol.decode(a.keys.open(answer.body)[0])

    status, opening = await ask(protocol.snapshot.open_request(b.rep.vector()))
    assert status == 200 and opening["t"] == protocol.SHOT
    cases = [
        (versions.state({"t": protocol.SNAP, "v": "all of it"}), "lacks a valid 'v'"),
        (versions.state({"t": protocol.SNAP, "s": opening["s"], "k": [99, 1]}), "beyond the snapshot"),
        (versions.state({"t": protocol.SNAP, "s": opening["s"], "k": [0, "1"]}), "cursor must be"),
    ]
    for msg, why in cases:
        status, reply = await ask(msg)
        assert status == 400 and why in reply["e"], reply
    status, reply = await ask({"t": protocol.SNAP, "v": {}}, wire2=True)
    assert status == 400 and "wire 3 or later" in reply["e"]
    status, reply = await ask(protocol.snapshot.page_request(b"\x07" * 16, (0, 1)))
    assert status == 200 and protocol.snapshot.gone(reply)
    assert a.rep.state_digest() == before


def test_forged_ops_fail_peerd_doctor_and_show_in_peerd_status() -> None:
    """A signer whose snapshot held forged ops is a failure of peerd doctor naming it, with the fix, and
    a line of peerd status; a snapshot under way and signatures still to check show there too."""
    signer = "ab" * 32
    findings = doctor.membership_findings({"snapshot": {"forged": {signer: 3}}})
    assert [(f.check, f.status) for f in findings] == [("snapshot", doctor.FAIL)]
    assert "did not verify" in findings[0].detail and f"peerd remove {signer[:16]}" in (findings[0].fix or "")
    assert format.snapshot_lines({"forged": {signer: 3}}) == [
        f"FORGED  3 ops that member {signer[:16]} vouched for in a snapshot did not verify: dropped and fetched "
        "again; see peerd doctor"]
    assert "taking one from 127.0.0.1:7001" in format.snapshot_lines(
        {"taking": {"peer": "127.0.0.1:7001", "signer": signer}})[0]
    assert "1,200 ops taken in a snapshot still to have" in format.snapshot_lines({"unchecked": 1200})[0]
