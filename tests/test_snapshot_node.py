"""Snapshots between whole nodes over the in-memory transport: when a node takes one, what it does
meanwhile (others' rounds refused as busy, its own rounds and the indexer held back), that a peer
of wire 2 is never asked, and that ordinary rounds follow."""

from __future__ import annotations

import asyncio
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
from tests.test_node_memory import QUIET, MemFleet, addr, converged
from tests.waiting import eventually

BEHIND = 40  # ops from which these tests' nodes take a snapshot (the daemon's threshold is 10,000)


@pytest.fixture
async def fleet(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MemFleet]:
    monkeypatch.setattr(snapshotting, "SNAPSHOT_BEHIND", BEHIND)
    f = MemFleet()
    try:
        yield f
    finally:
        await f.close()


def sent(fleet: MemFleet, kind: str, dst: Node | None = None) -> list[protocol.Msg]:
    return [m for _src, to, m in fleet.kinds(fleet.net.posts) if m["t"] == kind and (dst is None or to == addr(dst))]


async def test_a_new_node_far_behind_takes_a_snapshot_then_syncs_by_rounds(fleet: MemFleet,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A node joining a member that holds more than the threshold takes a snapshot (pages of
    ``shot``), never pulls those ops op by op, and ends with the member's state; a message
    written afterwards arrives by the ordinary ways."""
    caplog.set_level(logging.INFO, logger="peerd.snapshot")
    a = await fleet.add("a", writes=150, page_bytes=8192, max_content_bytes=4096)  # pages of about 50 ops
    b = await fleet.add("b", seeds=(a,))
    await eventually(lambda: converged(a, b) and b.rep.stats()["messages"] == 150, 20, "b caught up")
    assert b.snapshots.taken >= 150
    assert sent(fleet, "snap", a), "b asked a for a snapshot"
    assert not [m for m in sent(fleet, "pull", a)], "b pulled nothing op by op"
    await eventually(lambda: "took the snapshot from" in caplog.text, 10, "the snapshot's last line logged")
    later = await asyncio.to_thread(a.rep.send_message, "late", "team", "after the snapshot")
    await eventually(lambda: b.rep.state_digest() == a.rep.state_digest(), 20, "the later message on b")
    assert b.rep.get_message(later.id).content == "after the snapshot"
    await eventually(lambda: b.snapshots.unchecked == 0 and b.snapshots.checked >= 150, 20,
                     "the signatures checked in the background")
    assert b.snapshots.status()["forged"] == {}


async def test_a_node_a_little_behind_syncs_by_rounds_only(fleet: MemFleet) -> None:
    """Below the threshold nothing changes: no snapshot is opened, rounds bring the ops."""
    a = await fleet.add("a", writes=BEHIND // 2)
    b = await fleet.add("b", seeds=(a,))
    await eventually(lambda: converged(a, b) and b.rep.stats()["messages"] == BEHIND // 2, 20, "b caught up")
    assert sent(fleet, "snap") == []
    assert b.snapshots.taken == 0


async def test_while_taking_a_snapshot_rounds_of_others_are_refused_as_busy(fleet: MemFleet) -> None:
    """A node taking a snapshot answers others' syncs, round pushes and snapshot requests with 503
    (busy), and still takes a fresh push."""
    a = await fleet.add("a")
    b = await fleet.add("b")
    b.snapshots.idle.clear()
    try:
        for msg in (protocol.sync_request(a.rep.vector()), {"t": "push", "o": [], "r": 1},
                    snapshot_open(a)):
            answer = await b.answer(sealed(a, msg, fleet), "127.0.0.1")
            assert answer.status == 503
            assert "busy taking a snapshot" in protocol.decode(a.keys.open(answer.body)[0])["e"]
        mid = (await asyncio.to_thread(a.rep.send_message, "alice", "team", "fresh")).id
        op = a.rep.local_ops_after(0)[-1][1]
        answer = await b.answer(sealed(a, {"t": "push", "o": [op]}, fleet), "127.0.0.1")
        assert answer.status == 200 and b.rep.get_message(mid).content == "fresh"
    finally:
        b.snapshots.idle.set()


def snapshot_open(a: Node) -> protocol.Msg:
    return protocol.snapshot.open_request(a.rep.vector())


def sealed(caller: Node, msg: protocol.Msg, fleet: MemFleet) -> bytes:
    body = protocol.encode(protocol.stamp(versions.state(msg), me=caller.me, port=caller.peer_port))
    return seal(fleet.key, body)


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


async def test_a_peer_of_wire_2_is_never_asked_for_a_snapshot(fleet: MemFleet) -> None:
    """Far behind a peer that speaks only wire 2 (the first release), a node syncs by rounds and never
    sends it a message kind it does not know."""
    a = await fleet.add("a", writes=BEHIND * 2)
    old = FirstRelease(a, fleet)
    fleet.net.servers[addr(a)] = old
    b = await fleet.add("b", seeds=(a,))
    await eventually(lambda: b.rep.stats()["messages"] == BEHIND * 2, 20, "b caught up by rounds")
    peer = b.table.peers[addr(a)]
    assert peer.wire == versions.FIRST_RELEASE
    assert sent(fleet, "snap") == [] and old.unknown == 0
    assert b.snapshots.taken == 0


async def test_a_member_that_offers_no_snapshot_is_synced_with_by_rounds(fleet: MemFleet) -> None:
    """A member that refuses to open a snapshot (here: one taking a snapshot of its own) is not asked
    again for a while; the round goes on as always."""
    a = await fleet.add("a", writes=BEHIND * 2)
    b = await fleet.add("b", **QUIET)  # no rounds of its own: only the two below
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
    assert len(sent(fleet, "snap")) == 1 and b.snapshots.taken == 0
    await b.sync_with(peer)
    assert len(sent(fleet, "snap")) == 1, "not asked again at once"


async def test_bad_snapshot_requests_get_a_clear_400_and_change_nothing(fleet: MemFleet) -> None:
    """Through a node's peer answer: a malformed snap, a cursor beyond the snapshot and a caller of
    wire 2 get 400 with the reason; an unknown snapshot id is answered 'gone'; the replica is unchanged."""
    a = await fleet.add("a", writes=5)
    b = await fleet.add("b")
    before = a.rep.state_digest()

    async def ask(msg: protocol.Msg, *, wire2: bool = False) -> tuple[int, protocol.Msg]:
        body = protocol.encode(protocol.stamp(msg, me=b.me, port=b.peer_port))
        if wire2:
            decoded = protocol.decode(body)
            decoded.pop(versions.KEY, None)
            body = protocol.encode(decoded)
        answer = await a.answer(seal(fleet.key, body), "127.0.0.1")
        return answer.status, protocol.decode(a.keys.open(answer.body)[0])

    status, opening = await ask(snapshot_open(b))
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
