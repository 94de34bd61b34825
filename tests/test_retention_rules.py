"""Retention's pure rules (``replica.retention``): the op, the horizon's winner, what is read, what leaves."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import identity, ops
from replica import retention as ret
from replica.errors import InvalidOp
from replica.hlc import pack

H = 10_000
NOW = 1_000_000_000

ROLES = ["tau", "phi", "rho"]
receipts = st.lists(st.builds(ret.Receipt, st.sampled_from([*ROLES, "sigma"]), st.sampled_from(["", "sigma-vps", "i1"]),
                              st.booleans()), max_size=6)
mails = st.builds(
    ret.Mail, st.integers(0, NOW), st.sampled_from(["tau", "tau,phi", "broadcast", "sigma-vps", None]),
    st.none(), st.sampled_from(ROLES), st.sampled_from([None, "i1"]), st.booleans())


@dataclass(frozen=True)
class FakeOp:
    kind: str
    hlc: int
    body: dict[str, Any]


def test_horizons_parse_and_print_in_their_units() -> None:
    """30d, 12h, 90m, 45s and forever parse to ms, and print back in the largest unit that fits."""
    assert [ret.parse_horizon(t) for t in ("30d", "12h", "90m", "45s", "forever", " 7D ")] == [
        30 * 86_400_000, 12 * 3_600_000, 90 * 60_000, 45_000, 0, 7 * 86_400_000]
    assert [ret.format_horizon(ms) for ms in (30 * 86_400_000, 36 * 3_600_000, 90 * 60_000, 45_000, 0)] == [
        "30d", "36h", "90m", "45s", "forever"]
    assert ret.spoken(86_400_000) == "1 day" and ret.spoken(20_000) == "20 seconds"


@pytest.mark.parametrize("text", ["30", "1w", "0s", "-5d", "d", "1.5d", "36501d", ""])
def test_a_bad_horizon_says_what_to_write(text: str) -> None:
    """A horizon without a unit, of zero, negative, fractional or beyond a century is refused with the forms to use."""
    with pytest.raises(ValueError, match="horizon"):
        ret.parse_horizon(text)


@pytest.mark.parametrize(("body", "reason"), [
    ({}, "exactly the key h"), ({"x": 2}, "exactly the key h"), ({"h": -1, "x": 2}, "integer"),
    ({"h": True}, "integer"), ({"h": "30d"}, "integer"), ({"h": ret.MAX_HORIZON_MS + 1}, "integer"),
])
def test_a_malformed_ret_op_is_refused(body: dict[str, Any], reason: str) -> None:
    """A signed ret op whose h is missing or not ms from 0 to a century fails verification (a field of a
    newer release beside a valid h is kept, tests/test_forward_compat.py)."""
    ident = identity.generate()
    raw = ops.encode(ident.public_key, 1, pack(NOW), ret.KIND_RET, body, sign=ident.sign)
    with pytest.raises(InvalidOp, match=reason):
        ops.decode(raw)


def test_a_well_formed_ret_op_verifies() -> None:
    """The ret kind is registered with the other kinds."""
    ident = identity.generate()
    op = ops.decode(ops.encode(ident.public_key, 1, pack(NOW), ret.KIND_RET, ret.ret_body(H), sign=ident.sign))
    assert (op.kind, op.body) == ("ret", {"h": H})


@given(st.lists(st.builds(ret.Setting, st.integers(0, ret.MAX_HORIZON_MS), st.integers(0, 50),
                          st.binary(min_size=2, max_size=2)), min_size=1, max_size=8,
                unique_by=lambda s: s.stamp), st.randoms())
def test_the_horizon_in_force_does_not_depend_on_arrival_order(settings: list[ret.Setting], rnd: random.Random) -> None:
    """The setting with the highest (hlc, origin) wins, whatever the order the ops came in (stamps never tie)."""
    shuffled = list(settings)
    rnd.shuffle(shuffled)
    assert ret.in_force(shuffled) == ret.in_force(settings) == max(settings, key=lambda s: (s.hlc, s.origin))


@given(mails, receipts, st.lists(st.sampled_from(ROLES), max_size=3), st.randoms())
def test_read_does_not_depend_on_the_order_of_receipts(mail: ret.Mail, got: list[ret.Receipt], members: list[str],
                                                      rnd: random.Random) -> None:
    """Whether a message is read is a function of the set of its receipts (and members)."""
    again = list(got)
    rnd.shuffle(again)
    assert ret.is_read(mail, got, members) == ret.is_read(mail, again, list(reversed(members)))


def r(role: str, read: bool, inst: str = "") -> ret.Receipt:
    return ret.Receipt(role, inst, read)


def test_read_direct_and_multi_role_messages() -> None:
    """To roles: every role named has a receipt and every receipt of it is read."""
    to_tau, to_two = ret.Mail(0, "tau"), ret.Mail(0, "tau,phi")
    assert not ret.is_read(to_tau, [])
    assert not ret.is_read(to_tau, [r("tau", False)])
    assert ret.is_read(to_tau, [r("tau", True)])
    assert not ret.is_read(to_tau, [r("tau", True, "i1"), r("tau", False, "i2")])  # one instance has not read it
    assert not ret.is_read(to_two, [r("tau", True)])
    assert ret.is_read(to_two, [r("tau", True), r("phi", True)])
    assert ret.is_read(ret.Mail(0, "sigma-vps"), [r("sigma", True, "sigma-vps")])  # an instance address


def test_read_broadcasts_threads_and_retracted_messages() -> None:
    """A broadcast needs a receipt and all of them read; a thread every other participant; a retraction is read."""
    everyone = ret.Mail(0, "broadcast")
    assert not ret.is_read(everyone, [])
    assert not ret.is_read(everyone, [r("tau", True), r("phi", False)])
    assert ret.is_read(everyone, [r("tau", True), r("phi", True)])
    talk = ret.Mail(0, None, thread="th_1", sender="ag_a")
    assert not ret.is_read(talk, [r("ag_b", True)], ["ag_a", "ag_b", "ag_c"])
    assert ret.is_read(talk, [r("ag_b", True), r("ag_c", True)], ["ag_a", "ag_b", "ag_c"])
    assert ret.is_read(talk, [], ["ag_a"])  # nobody else to read it
    assert ret.is_read(ret.Mail(0, "tau", retracted=True), [])


@given(mails, st.booleans(), st.integers(1, 10**9), st.integers(0, 2 * NOW), st.integers(0, 10**9))
def test_once_a_message_leaves_it_leaves_at_every_later_time(mail: ret.Mail, read: bool, h: int, now: int,
                                                             later: int) -> None:
    """Leaving is monotonic in time: the purge never has to undo a decision."""
    if ret.message_leaves(mail, read, h, now):
        assert ret.message_leaves(mail, read, h, now + later)
    assert ret.message_leaves(mail, read, h, now) == (now - mail.created_ms > 2 * h or (
        now - mail.created_ms > h and read))


@given(st.sampled_from(["msg", "rtr", "set"]), st.integers(1, 10**9), st.integers(1, 10**9), st.data())
def test_what_sync_may_drop_on_arrival_every_replica_would_purge(kind: str, h: int, age_past: int,
                                                                 data: st.DataObject) -> None:
    """A message, receipt-only set op or retraction older than twice the horizon is purgeable on arrival,
    and the full rules remove it whatever the replica holds (read or not); one just younger is not."""
    now = 2 * NOW + 2 * h
    created = now - 2 * h - age_past
    body = {"w": [["rcpt", ["m-1", "tau", ""], "r", 1]]} if kind == "set" else {}
    op = FakeOp(kind, pack(max(created, 0), data.draw(st.integers(0, 0xFFFF))), body)
    assert ret.purgeable_on_arrival(op, h, now)
    if kind == "msg":
        mail = ret.Mail(op.hlc >> 16, "tau")
        assert ret.message_leaves(mail, False, h, now) and ret.message_leaves(mail, True, h, now)
    else:
        assert ret.op_leaves(op, h, now)
    young = FakeOp(kind, pack(now - 2 * h), body)
    assert not ret.purgeable_on_arrival(young, h, now)


def test_what_never_leaves() -> None:
    """Membership ops, the ret op in force, mixed or profile set ops and unknown kinds stay, however old."""
    ancient = pack(0)
    for op in (FakeOp("admit", ancient, {}), FakeOp("rekey", ancient, {}), FakeOp("lease", ancient, {}),
               FakeOp("set", ancient, {"w": [["prof", ["tau"], "name", "T"]]}),
               FakeOp("set", ancient, {"w": [["rcpt", ["m-1", "t", ""], "r", 1], ["seen", ["t"], "at", 1]]})):
        assert not ret.op_leaves(op, H, NOW), op
    assert not ret.op_leaves(FakeOp("ret", ancient, {"h": H}), H, NOW, in_force=True)
    assert ret.op_leaves(FakeOp("ret", ancient, {"h": H}), H, NOW)
    assert not ret.purgeable_on_arrival(FakeOp("msg", ancient, {}), 0, NOW)  # keep everything keeps everything


def test_only_ops_at_or_below_the_mark_leave() -> None:
    """A hole in an origin's log stays: the vector says held or purged up to the mark, no further."""
    assert ret.within_mark(3, 3) and not ret.within_mark(4, 3) and not ret.within_mark(-4, 9)


def test_the_next_expiry_is_the_first_crossing() -> None:
    """The first message to pass the horizon, or the first op to pass twice it; none without a horizon."""
    assert ret.next_expiry(H, 100, 50) == min(100 + H, 50 + 2 * H)
    assert ret.next_expiry(H, None, 50) == 50 + 2 * H
    assert ret.next_expiry(H, None, None) is None
    assert ret.next_expiry(0, 100, 50) is None
    assert ret.granule(10_000) == 1000 and ret.granule(30 * 86_400_000) == 600_000
