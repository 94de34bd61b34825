"""Ops of a newer release: verified as far as this release can, stored, counted, relayed byte for
byte and not applied; known kinds ignore fields they do not know; an upgrade applies what waited;
a peer of the first release is never offered an op it would refuse."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd import protocol
from peerd.protocol import client_round, drive
from replica import InvalidArgument, InvalidOp, Replica, migrate, open_home, project
from replica import ops as opsmod
from replica.sync import ALL, V1_ALL, V1_RUN
from tests.conftest import pull
from tests.daemons import PEERD, Fleet, wait_until
from tests.newer import NewerNode

pytest_plugins = ["tests.daemons"]


def _state(r: Replica) -> tuple[str, dict[bytes, int], dict[str, int]]:
    return r.state_digest(), r.vector(), r.stats()


def _inbox(r: Replica, role: str) -> list[str]:
    return [m.content for m in r.check_messages(role, limit=100).messages]


def test_an_op_of_an_unknown_kind_is_stored_counted_and_not_applied(mem: Replica) -> None:
    """A lease op (a kind this release does not know) is held and counted in its origin's vector;
    it projects nothing, and the origin's later messages are applied: nothing stalls behind it."""
    future = NewerNode()
    before = mem.state_digest()
    result = mem.apply([future.op("lease", {"p": "src/*.py", "ttl": 60}), future.message("planner", "coder", "hi")])
    assert result.new == 2
    assert mem.vector()[future.key] == 2
    assert mem.stats()["newer_ops"] == 1 and mem.newer_ops() == {"lease": 1}
    assert _inbox(mem, "coder") == ["hi"]
    assert before != mem.state_digest()  # the message changed the state; the lease op did not add a row to it


def test_a_newer_op_is_relayed_byte_for_byte(mem: Replica) -> None:
    """Pages carry a held op exactly as its origin signed it, so the next replica verifies it and
    the chain future -> a -> b ends with b holding every op, b's vector equal to a's."""
    future = NewerNode()
    raws = [future.op("lease", {"p": "x"}), future.message("planner", "coder", "hi", ak=True, pri=3),
            future.writes(["rcpt", ["m-1", "coder", ""], "d", 5], ["lease", ["x"], "holder", "coder"])]
    mem.apply(raws)
    served = mem.ops_missing({}, 1 << 20)
    assert [raw for raw in served.ops if raw in raws] == raws
    with Replica.open() as b:
        pull(b, mem)
        assert b.vector() == mem.vector()
        assert b.stats()["newer_ops"] == 3
        assert set(b.ops_missing({}, 1 << 20).ops) == set(mem.ops_missing({}, 1 << 20).ops)


def test_a_known_kind_ignores_fields_it_does_not_know(mem: Replica) -> None:
    """A message with fields of a newer release is delivered by the fields this release knows; a
    set op's known writes apply and its writes to unknown tables or fields wait."""
    future = NewerNode()
    mem.apply([future.message("planner", "coder", "with extras", ak=True, deadline=123)])
    assert _inbox(mem, "coder") == ["with extras"]
    mem.apply([future.writes(["prof", ["coder"], "name", "Coder"], ["lease", ["a"], "h", "x"],
                             ["prof", ["coder"], "avatar", "x"])])
    profile = mem.get_profile("coder")
    assert profile is not None and profile.name == "Coder"
    assert mem.stats()["newer_ops"] == 2


@pytest.mark.parametrize(("kind", "body", "match"), [
    ("msg", {"f": "a", "fi": None, "c": "b", "ti": None, "t": None, "x": 5, "new": 1}, "content must be a string"),
    ("msg", {"f": "a", "c": "b", "new": 1}, "must have the keys"),
    ("set", {"w": [["rcpt", ["m", "r", ""], "d", "soon"], ["lease", [], "x", 1]]}, "bad value for rcpt.d"),
    ("rtr", {"m": "", "f": "a", "why": "oops"}, "retracted message id"),
    ("admit", {"k": b"short", "nm": "n", "f": "0" * 16, "x": 1}, "32-byte node key"),
])
def test_a_field_this_release_knows_is_checked_in_full(mem: Replica, kind: str, body: dict[str, Any],
                                                        match: str) -> None:
    """Unknown fields beside known ones never excuse a known field that is wrong: the op is refused
    and nothing changes."""
    before = _state(mem)
    with pytest.raises(InvalidOp, match=match):
        mem.apply([NewerNode().op(kind, body)])
    assert _state(mem) == before


def test_this_release_never_writes_what_it_would_not_understand(mem: Replica) -> None:
    """Local writes are checked strictly: an unknown kind or field is a bad call, not an op."""
    with pytest.raises(InvalidOp, match="unknown kind"):
        opsmod.validate_body("lease", {})
    with pytest.raises(InvalidOp, match="fields this release does not know"):
        opsmod.validate_body("rtr", {"m": "x-1", "f": "a", "why": "typo"})
    with pytest.raises(InvalidArgument):
        mem._write("rtr", lambda _seq, _hlc: {"m": "x-1", "f": "a", "why": "typo"})


def _mixed(r: Replica) -> NewerNode:
    """An origin holding msg 1, a lease op at 2 (a first-release peer refuses it), msgs 3 and 4."""
    future = NewerNode()
    r.apply([future.message("p", "c", "one"), future.op("lease", {"p": "x"}), future.message("p", "c", "three"),
             future.message("p", "c", "four")])
    return future


def _seqs(page_ops: list[bytes]) -> list[int]:
    return [ident[1] for raw in page_ops if (ident := opsmod.peek(raw)) is not None]


def test_a_first_release_peer_is_served_runs_it_takes(mem: Replica) -> None:
    """Serving a wire-2 peer (V1_RUN): ops from its seq up to the first it would refuse, and a range
    that says so; pushing to it (V1_ALL): every op it takes, past the gap; ALL: everything."""
    future = _mixed(mem)
    run = mem.ops_missing({}, 1 << 20, V1_RUN)
    assert _seqs(run.ops) == [1] and run.ranges[future.key] == (1, 1) and not run.more
    beyond = mem.ops_missing({future.key: 1}, 1 << 20, V1_RUN)
    assert beyond.ops == [] and future.key not in beyond.ranges
    pushed = mem.ops_missing({future.key: 1}, 1 << 20, V1_ALL)
    assert _seqs(pushed.ops) == [3, 4] and pushed.ranges[future.key] == (2, 4)
    every = mem.ops_missing({}, 1 << 20, ALL)
    assert _seqs(every.ops) == [1, 2, 3, 4] and every.ranges[future.key] == (1, 4)


def test_a_page_cut_by_the_budget_says_more_but_a_run_ended_by_a_gap_does_not(mem: Replica) -> None:
    """The byte budget stops a page after its first op and the page says more; a run for a
    first-release peer that ends at an op it refuses says no more (it could never take it)."""
    future = _mixed(mem)
    for mode, theirs, first in ((ALL, 0, 1), (V1_ALL, 0, 1), (V1_ALL, 2, 3)):
        page = mem.ops_missing({future.key: theirs}, 1, mode)
        assert _seqs(page.ops) == [first] and page.more and page.ranges[future.key] == (theirs + 1, first), mode
    run = mem.ops_missing({}, 1, V1_RUN)
    assert _seqs(run.ops) == [1] and not run.more


def test_a_covered_range_moves_the_vector_over_a_hole(tmp_path: Path) -> None:
    """A page that covers seqs its sender no longer holds (purged) moves the receiver's vector over
    them; a range that starts past the receiver's next seq leaves the hole (nothing is assumed)."""
    with Replica.open(tmp_path / "a.db") as a, Replica.open() as b, Replica.open() as c:
        future = NewerNode()
        a.apply([future.message("p", "c", f"m{i}") for i in range(1, 6)])
        with a._store.write() as cur:
            cur.execute("DELETE FROM ops WHERE seq IN (2, 3)")
        page = a.ops_missing({}, 1 << 20)
        assert _seqs(page.ops) == [1, 4, 5] and page.ranges[future.key] == (1, 5)
        b.apply(page.ops, page.ranges)
        assert b.vector()[future.key] == 5
        c.apply(page.ops[1:], {future.key: (4, 5)})  # c lacks seq 1: the range does not reach it
        assert future.key not in c.vector()


def test_the_upgrade_step_applies_what_an_older_release_held(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that did not know retractions stored one without applying it; the next release
    to open the replica applies it in order, and clears the mark."""
    db = tmp_path / "r.db"
    with Replica.open(db) as r:
        mid = r.send_message("p", "c", "a typo").id
    retraction = [NewerNode().op("rtr", {"m": mid, "f": "p"})]  # by the sender role, from another node
    older = {k: v for k, v in opsmod._CHECKS.items() if k != opsmod.KIND_RETRACT}
    with monkeypatch.context() as m:
        m.setattr(opsmod, "_CHECKS", older)
        m.setattr(project, "KNOWN_KINDS", frozenset(older))
        m.setattr(opsmod, "OP_LEVEL", 1)
        m.setattr(migrate, "OP_LEVEL", 1)
        with Replica.open(db) as r:
            r.apply(retraction)
            assert r.stats()["newer_ops"] == 1
            assert r.get_message(mid).content == "a typo"
    with Replica.open(db) as r:
        assert r.get_message(mid).content is None
        assert r.stats()["newer_ops"] == 0


_OPS = st.lists(st.sampled_from(["msg", "extra", "lease", "set-mixed"]), min_size=1, max_size=8)


@settings(deadline=None, max_examples=40)
@given(kinds=_OPS, order=st.randoms(use_true_random=False))
def test_any_order_of_newer_and_known_ops_gives_one_state(kinds: list[str], order: Any) -> None:
    """Replicas that apply the same mix of known and newer ops in any order, in any batches, end
    with the same state digest, vector and held-newer count."""
    future = NewerNode()
    made = {"msg": lambda i: future.message("p", "c", f"m{i}"),
            "extra": lambda i: future.message("p", "c", f"e{i}", ak=True),
            "lease": lambda i: future.op("lease", {"i": i}),
            "set-mixed": lambda i: future.writes(["prof", ["c"], "name", f"n{i}"], ["lease", ["c"], "h", i])}
    raws = [made[k](i) for i, k in enumerate(kinds)]
    shuffled = list(raws)
    order.shuffle(shuffled)
    with Replica.open() as one, Replica.open() as two:
        one.apply(raws)
        for raw in shuffled:
            two.apply([raw])
        assert one.state_digest() == two.state_digest()
        assert one.vector() == two.vector() == {future.key: len(raws)}
        assert one.stats()["newer_ops"] == two.stats()["newer_ops"] == sum(k != "msg" for k in kinds)


# -- the protocol with a peer of the first release (wire 2) ------------------------------------------


class FirstRelease:
    """The first release's replica as the protocol meets it: it refuses a whole batch holding one op
    it does not know (as 0.1.0's ``validate_body`` does) and reads no covered ranges."""

    def __init__(self) -> None:
        self.rep = Replica.open()
        self.refused_batches = 0

    def vector(self) -> dict[bytes, int]:
        return self.rep.vector()

    def removed(self) -> dict[bytes, int]:
        return self.rep.removed()

    @property
    def node_key(self) -> bytes:
        return self.rep.node_key

    def barring(self) -> Any:
        return self.rep.barring()

    def fleet_digest(self) -> bytes:  # what our round asks of a replica (the first release sends none on)
        return self.rep.fleet_digest()

    def membership_ops(self) -> list[bytes]:
        return self.rep.membership_ops()

    def ops_missing(self, theirs: Any, byte_budget: int, mode: str = ALL) -> Any:
        return self.rep.ops_missing(theirs, byte_budget)  # it never filters: it holds only what it knows

    def apply(self, raws: Any, covered: Any = None) -> Any:
        if not all(opsmod.read_stored(raw).v1 for raw in raws):
            self.refused_batches += 1
            raise InvalidOp("unknown kind 'lease'")
        return self.rep.apply(raws)


FIRST_RELEASE_IGNORES = {protocol.versions.KEY, "fd", "fo"}  # wire versions, the membership set's digest and ops


def _as_first_release(msg: protocol.Msg) -> protocol.Msg:
    """A message as the first release sends it: no wire versions stated, no membership set."""
    return {k: v for k, v in msg.items() if k not in FIRST_RELEASE_IGNORES}


def _round_with_first_release(ours: Replica, old: FirstRelease, marks: dict[bytes, tuple[int, int]]
                              ) -> protocol.RoundResult:
    def answer(msg: protocol.Msg) -> protocol.Msg:
        return _as_first_release(protocol.serve(old, _as_first_release(msg), 4096))  # type: ignore[arg-type]

    return drive(client_round(ours, budget=4096, pushed=marks), answer)


def test_our_round_never_hands_a_first_release_peer_an_op_it_refuses() -> None:
    """Our round pushes a wire-2 peer every op it takes past the one it would refuse, so it gets the
    origin's later mail; the next round offers nothing again (the marks), and its vector stays where
    it must (it can never hold the refused op)."""
    ours, old = Replica.open(), FirstRelease()
    future = _mixed(ours)
    marks: dict[bytes, tuple[int, int]] = {}
    first = _round_with_first_release(ours, old, marks)
    assert first.wire == frozenset({2}) and old.refused_batches == 0
    got = old.rep.check_messages("c", limit=10).messages
    assert [m.content for m in got] == ["one", "three", "four"]
    old.rep.mark_as_read([m.receipt_id for m in got])
    assert old.vector()[future.key] == 1
    again = _round_with_first_release(ours, old, marks)
    assert again.pushed == 0 and old.refused_batches == 0
    ours.apply([future.message("p", "c", "five")])
    later = _round_with_first_release(ours, old, marks)
    assert later.pushed == 1 and [m.content for m in old.rep.check_messages("c").messages] == ["five"]


def test_a_first_release_peer_asking_is_served_only_what_it_takes() -> None:
    """A wire-2 peer's own round against us (its requests state no versions) is answered with runs
    it can take: it never receives the refused op, and its round ends without an error."""
    ours, old = Replica.open(), FirstRelease()
    _mixed(ours)

    def answer(msg: protocol.Msg) -> protocol.Msg:
        return protocol.serve(ours, _as_first_release(msg), 4096)

    result = drive(client_round(old, budget=4096), answer)  # type: ignore[arg-type]
    assert result.pulled == 1 and old.refused_batches == 0
    assert drive(client_round(old, budget=4096), answer).pulled == 0  # type: ignore[arg-type]


def test_a_peer_of_this_release_gets_every_op_and_the_ranges() -> None:
    """Between two peers of this release a round carries the op neither knows, byte for byte, and
    the pushes state their ranges."""
    a, b = Replica.open(), Replica.open()
    future = _mixed(a)
    pushes: list[protocol.Msg] = []

    def answer(msg: protocol.Msg) -> protocol.Msg:
        if msg["t"] == "push":
            pushes.append(msg)
        return protocol.serve(b, msg, 4096)

    result = drive(client_round(a, budget=4096), answer)
    assert result.wire == frozenset({2, 3})
    assert b.vector() == a.vector() and b.stats()["newer_ops"] == 1
    assert pushes and all("c" in p for p in pushes) and pushes[0]["c"][protocol.short(future.key)] == [1, 4]


def test_a_caller_with_no_version_in_common_is_refused() -> None:
    """A request stating only wire versions this release does not speak is a ProtocolError naming
    both sides' versions (and the reply states ours, so the caller can tell)."""
    msg = protocol.stamp({"t": "sync", "d": b"12345678", "V": protocol.versions.mask({5, 6})}, me=b"A" * 8, port=1)
    with pytest.raises(protocol.ProtocolError, match="speaks wire 5, 6, this peerd speaks 2, 3"):
        protocol.decode_request(protocol.encode(msg))
    assert protocol.versions.stated(protocol.error_reply(ValueError("x"))) == {2, 3}


# -- what people are told ---------------------------------------------------------------------------


def test_status_and_doctor_say_what_waits_for_an_upgrade(fleet: Fleet) -> None:
    """A daemon holding ops of a newer release: ``peerd status`` says how many, of which kinds, and
    that upgrading applies them; ``peerd doctor`` warns with the same fix; its peer gets them too."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.start()
    future = NewerNode()
    with open_home(a.home) as rep:  # another process on a's replica, as a newer peer's push would land
        rep.admit_node(future.key, "future", a.status()["fleet_id"])  # a member, let in by a
        rep.apply([future.op("lease", {"p": "x"}), future.op("lease", {"p": "y"}), future.message("p", "c", "hi")])
    wait_until(lambda: b.status()["totals"]["newer_ops"] == 2, 30, "the newer ops relayed to b")
    shown = subprocess.run([str(PEERD), "status", "--home", str(a.home)], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert ("newer   2 ops from a newer peerd (lease x2): held and passed on, not applied here; upgrading this "
            "peerd applies them") in shown
    assert a.status()["totals"]["newer_kinds"] == {"lease": 2}
    doctor = subprocess.run([str(PEERD), "doctor", "--home", str(a.home), "--json"], capture_output=True,
                            text=True, timeout=60, check=False)
    replica = next(f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "replica")
    assert replica["status"] == "warn" and "2 from a newer peerd" in replica["detail"]
    assert "upgrade peerd" in replica["fix"]


def test_this_releases_own_new_kinds_are_never_offered_to_a_first_release_peer(mem: Replica) -> None:
    """A retention op this node writes (a kind 0.1.0 does not know) is marked so: the first-release
    modes skip it, and the messages after it still go."""
    mem.send_message("p", "c", "before")
    mem.set_retention(365 * 86_400_000)
    mem.send_message("p", "c", "after")
    every = mem.ops_missing({}, 1 << 20)
    pushed = mem.ops_missing({}, 1 << 20, V1_ALL)
    assert len(every.ops) == len(pushed.ops) + 1
    assert {opsmod.read_stored(r).kind for r in every.ops} - {opsmod.read_stored(r).kind for r in pushed.ops} == {"ret"}
    run = mem.ops_missing({}, 1 << 20, V1_RUN)
    assert "ret" not in {opsmod.read_stored(r).kind for r in run.ops}
