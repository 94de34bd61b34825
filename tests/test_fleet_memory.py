"""Removing a node and rotating the fleet key, with whole nodes on the in-memory fleet and its
clock: members switch, an offline member catches up, the removed node is cut off and told so."""

from __future__ import annotations

import logging

import pytest

from peerd.config import fleet_id, new_fleet_key
from peerd.following import MEND_STAGGER
from replica import Replica
from tests.memfleet import QUIET, MemFleet

pytest_plugins = ["tests.memfleet"]


async def removed_fleet(memfleet: MemFleet, *, offline: str | None = None, names: str = "abcx") -> bytes:
    """a, b, c and x share messages; then (with ``offline`` stopped) a removes x; the new key."""
    await memfleet.mesh(names)
    for name in names:
        memfleet[name].rep.send_message(name, "team", f"hello from {name}")
    everyone = {f"hello from {n}" for n in names}
    await memfleet.until(lambda: all(memfleet.contents(n) == everyone for n in names), 30)
    if offline:
        await memfleet.stop(offline)
    key = new_fleet_key()
    a = memfleet["a"]
    a.rep.remove_node(memfleet["x"].rep.node_key, key, fleet_id(key))
    await a.refresh_keys()
    return key


async def test_removed_node_is_cut_off_while_the_others_keep_talking(memfleet: MemFleet) -> None:
    """After the rotation, x's new message reaches nobody, a's reaches b and c, and x is told."""
    key = await removed_fleet(memfleet)
    a, b, c, x = (memfleet[n] for n in "abcx")
    await memfleet.until(lambda: b.keys.current == c.keys.current == key, 30)
    await memfleet.until(lambda: x.keys.removed, 30)
    assert x.keys.current == memfleet.key and key not in (x.keys.current, *x.keys.previous)
    x.rep.send_message("x", "team", "x after its removal")
    a.rep.send_message("a", "team", "a after the removal")
    await memfleet.until(lambda: all("a after the removal" in memfleet.contents(n) for n in "bc"), 30)
    b.rep.send_message("b", "team", "b after the removal")
    await memfleet.until(lambda: all("b after the removal" in memfleet.contents(n) for n in "ac"), 30)
    await memfleet.advance(60)  # a minute of rounds: x's message still reaches nobody
    for name in "abc":
        assert "x after its removal" not in memfleet.contents(name)
        assert memfleet[name].keys.fleet_id == fleet_id(key)
    assert "a after the removal" not in memfleet.contents("x")


async def test_a_member_offline_during_the_rotation_catches_up_when_back(memfleet: MemFleet) -> None:
    """c misses the rotation; back, it opens its entry, switches key, and gets what it missed."""
    key = await removed_fleet(memfleet, offline="c")
    a = memfleet["a"]
    await memfleet.until(lambda: memfleet["b"].keys.current == key, 30)
    a.rep.send_message("a", "team", "while c was away")
    await memfleet.until(lambda: "while c was away" in memfleet.contents("b"), 30)
    c = await memfleet.restart("c")
    await memfleet.until(lambda: c.keys.current == key, 30)
    await memfleet.until(lambda: "while c was away" in memfleet.contents("c"), 30)
    c.rep.send_message("c", "team", "c is back")
    await memfleet.until(lambda: all("c is back" in memfleet.contents(n) for n in "ab"), 30)
    assert memfleet.key in c.keys.previous


async def test_a_member_the_others_call_first_is_told_of_the_rotation(memfleet: MemFleet,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A member that rotated calls one still on the old key (which calls nobody): it pushes that one
    the rotation sealed with the old key, and its call then goes through on the new key."""
    ra, rb, rx = (Replica.open(":memory:") for _ in range(3))
    for r in (ra, rb, rx):
        r.send_message("someone", "team", "hi")
    for src in (ra, rb, rx):
        for dst in (ra, rb, rx):
            dst.apply([raw for _, raw in src.ops_after(0)])
    key = new_fleet_key()
    ra.remove_node(rx.node_key, key, fleet_id(key))  # before a starts: nothing pushes it on write
    caplog.set_level(logging.INFO, "peerd.node")
    b = await memfleet.add("b", rep=rb, **QUIET)
    a = await memfleet.add("a", rep=ra, seeds=["b"])
    rx.close()
    assert a.keys.current == key
    await memfleet.until(lambda: b.keys.current == key, 30)
    told = [r.getMessage() for r in caplog.records if "of the fleet's key rotation" in r.getMessage()]
    assert told == [f"told {memfleet.addr('b')} of the fleet's key rotation"], told
    await memfleet.until(lambda: any(p.last_sync is not None and p.failures == 0 for p in a.table.peers.values()), 30)


async def test_the_winner_re_rotates_when_its_rotation_missed_a_member(memfleet: MemFleet) -> None:
    """A member a rotation left out (admitted with the old key) is given the key by a mending rotation."""
    key = await removed_fleet(memfleet)
    a = memfleet["a"]
    late = Replica.open(":memory:")
    a.rep.admit_node(late.node_key, "late", fleet_id(memfleet.key))  # let in with the old key, after the rotation
    await memfleet.until(lambda: a.keys.epoch == 2, 30)
    assert a.keys.current != key
    winner = a.rep.fleet_view().standing.winner
    assert winner is not None and late.node_key in winner.entries
    late.close()


async def test_removals_that_conflict_leave_both_out_and_the_next_member_mends_the_key(memfleet: MemFleet) -> None:
    """a removes x while x, cut off, removes a and writes on: once the fleet is whole again both are out
    everywhere, x's later message reaches no one, and the members left move to a key neither holds.
    The first member in turn to mend it is away: the next one mends after its wait."""
    await memfleet.mesh("abcx")
    for name in "abcx":
        memfleet[name].rep.send_message(name, "team", f"hello from {name}")
    await memfleet.until(lambda: all(len(memfleet.contents(n)) == 4 for n in "abcx"), 30)
    a, b, c, x = (memfleet[n] for n in "abcx")
    first, second = sorted((b, c), key=lambda n: n.rep.node_key)
    memfleet.cut(["a", "b", "c"], ["x"])
    mine, theirs = new_fleet_key(), new_fleet_key()
    a.rep.remove_node(x.rep.node_key, mine, fleet_id(mine))
    x.rep.remove_node(a.rep.node_key, theirs, fleet_id(theirs))
    x.rep.send_message("x", "team", "x after the theft")
    await a.refresh_keys()
    await x.refresh_keys()
    await memfleet.until(lambda: b.keys.current == c.keys.current == mine, 30)
    await memfleet.stop(first.cfg.name)
    memfleet.heal()
    await memfleet.until(lambda: a.rep.node_key in second.rep.removed(), 60)
    assert set(second.rep.removed()) == {a.rep.node_key, x.rep.node_key}
    await memfleet.advance(MEND_STAGGER / 2)
    assert second.keys.current == mine  # not its turn yet: a's key, which a holds, is still in use
    await memfleet.advance(MEND_STAGGER / 2 + 5)  # the first in turn is away: the next one's turn comes
    await memfleet.until(lambda: second.keys.current not in (mine, theirs, memfleet.key), 30)
    back = await memfleet.restart(first.cfg.name)
    await memfleet.until(lambda: back.keys.current == second.keys.current, 60)
    assert set(back.rep.removed()) == {a.rep.node_key, x.rep.node_key}
    for node in (back, second):
        assert "x after the theft" not in memfleet.contents(node.cfg.name)
