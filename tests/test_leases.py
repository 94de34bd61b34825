"""Leases: the pure rule (who holds, from the set of ops: any order, any duplicates), the store held
to it, the replica API (grants, clashes refused with the holder named, renew, release, force), bad
input changing nothing, and ops of 0.2.0 and the first release's peers."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replica import InvalidArgument, InvalidOp, NotFound, Replica, identity, migrate, project
from replica import leases as rules
from replica import ops as opsmod
from replica.ops import encode
from tests.conftest import pull, sync_all

PATTERNS = ["src/a.py", "src/*.py", "src/", "docs/x.md", "src/b/c.py"]
ROLES = ["alice", "bob", "carol"]
MINUTE = 60_000


class Writer:
    """A node that signs lease ops stamped at the wall times a test gives."""

    def __init__(self) -> None:
        self.ident = identity.generate()
        self.seq = 0

    def op(self, kind: str, body: dict[str, Any], at_ms: int) -> bytes:
        self.seq += 1
        return encode(self.ident.public_key, self.seq, (at_ms << 16) | self.seq, kind, body, sign=self.ident.sign)

    def take(self, at_ms: int, role: str, pattern: str, *, x: bool = True, ttl: int = 10 * MINUTE,
             project: str = "proj") -> tuple[bytes, str]:
        raw = self.op(rules.KIND_TAKE, {"p": project, "g": pattern, "r": role, "i": None, "x": x, "ttl": ttl,
                                        "why": ""}, at_ms)
        return raw, rules.lease_id(self.ident.public_key, self.seq)


# -- the pure rule ----------------------------------------------------------------------------------

_takes = st.lists(st.tuples(st.integers(0, 30), st.sampled_from(ROLES), st.sampled_from(PATTERNS), st.booleans(),
                            st.integers(1, 15)), min_size=2, max_size=8)
_changes = st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["renew", "release", "force"]),
                              st.sampled_from(ROLES), st.integers(0, 30), st.integers(1, 15)), max_size=6)


def _model(takes: list[Any], changes: list[Any]) -> tuple[list[rules.Take], list[rules.Change]]:
    ts = [rules.Take(f"fr_{i:020d}", "proj", p, r, x, (at * MINUTE << 16, bytes([i]), 1), ttl * MINUTE)
          for i, (at, r, p, x, ttl) in enumerate(takes)]
    kinds = {"renew": rules.KIND_RENEW, "release": rules.KIND_RELEASE, "force": rules.KIND_FORCE}
    cs = [rules.Change(ts[i % len(ts)].id, kinds[k], r, ((at * MINUTE << 16) + 1, bytes([100 + j]), 1), ttl * MINUTE)
          for j, (i, k, r, at, ttl) in enumerate(changes)]
    return ts, cs


def _outcome(takes: list[rules.Take], changes: list[rules.Change]) -> dict[str, tuple[int, str | None]]:
    spans = [rules.span(t, [c for c in changes if c.lease == t.id]) for t in takes]
    decided = rules.decide(spans)
    return {s.take.id: (s.end, decided[s.take.id]) for s in spans}


@settings(max_examples=300, deadline=None)
@given(takes=_takes, changes=_changes, seed=st.integers(0, 2**32), dupes=st.integers(0, 3))
def test_who_holds_depends_on_the_set_of_ops_alone(takes: list[Any], changes: list[Any], seed: int,
                                                   dupes: int) -> None:
    """Any order of the same ops, with any ops held twice, gives every lease the same span and the
    same winner (commutative, idempotent)."""
    ts, cs = _model(takes, changes)
    rng = random.Random(seed)
    ts2, cs2 = ts + rng.sample(ts, min(dupes, len(ts))), cs + rng.sample(cs, min(dupes, len(cs)))
    rng.shuffle(ts2)
    rng.shuffle(cs2)
    unique = list({t.id: t for t in ts2}.values())
    assert _outcome(unique, list(set(cs2))) == _outcome(ts, cs)


@settings(max_examples=300, deadline=None)
@given(takes=_takes, changes=_changes, cut=st.integers(0, 8))
def test_deciding_from_a_pivot_keeps_what_was_settled_before_it(takes: list[Any], changes: list[Any],
                                                                cut: int) -> None:
    """The store's shortcut: the leases stamped before a pivot keep their outcome, and deciding the
    rest from the leases still live at the pivot gives what deciding everything gives."""
    ts, cs = _model(takes, changes)
    spans = sorted((rules.span(t, [c for c in cs if c.lease == t.id]) for t in ts), key=lambda s: s.take.stamp)
    full = rules.decide(spans)
    pivot = spans[min(cut, len(spans) - 1)]
    in_play = [s for s in spans if s.take.stamp >= pivot.take.stamp or s.end > pivot.start]
    settled = {s.take.id: full[s.take.id] for s in in_play if s.take.stamp < pivot.take.stamp}
    assert rules.decide(in_play, settled) == {s.take.id: full[s.take.id] for s in in_play}


@settings(max_examples=200, deadline=None)
@given(takes=_takes)
def test_no_two_clashing_leases_both_hold_at_any_time(takes: list[Any]) -> None:
    """Whatever was taken apart, the leases that hold never clash while both are live."""
    ts, _ = _model(takes, [])
    spans = [rules.span(t, []) for t in ts]
    decided = rules.decide(spans)
    holding = [s for s in spans if decided[s.take.id] is None]
    for a in holding:
        for b in holding:
            if a is not b and rules.clash(a.take, b.take):
                assert a.end <= b.start or b.end <= a.start


def test_the_earlier_take_wins_and_a_later_one_is_lost_to_it() -> None:
    ts, _ = _model([(0, "alice", "src/*.py", True, 10), (5, "bob", "src/a.py", True, 10),
                    (12, "carol", "src/a.py", True, 10)], [])
    out = _outcome(ts, [])
    assert out[ts[1].id] == (15 * MINUTE, ts[0].id)  # bob's take fell inside alice's lease
    assert out[ts[2].id][1] is None  # carol's came after alice's expired (bob's never held)


@pytest.mark.parametrize(("a", "b", "overlap"), [
    ("src/a.py", "src/a.py", True), ("src/*.py", "src/a.py", True), ("src/", "src/b/c.py", True),
    ("src", "src/b/c.py", True), ("src/*.py", "docs/x.md", False), ("src/a.py", "src/ab.py", False),
    ("src/b/*", "src/*", True), ("docs/x.md", "docs/y.md", False),
])
def test_patterns_overlap_symmetrically(a: str, b: str, overlap: bool) -> None:
    assert rules.overlaps(a, b) is overlap and rules.overlaps(b, a) is overlap


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "src/../../x", "~/x", "", "  ", "a\x00b", "C:/x",
                                 "x" * 2000, "./"])
def test_a_path_that_escapes_or_names_nothing_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        rules.normal_pattern(bad)


def test_paths_are_normalised() -> None:
    assert rules.normal_pattern("./src//a.py") == "src/a.py"
    assert rules.normal_pattern("src\\b\\") == "src/b/"


# -- the store held to the rule -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(takes=st.lists(st.tuples(st.integers(0, 20), st.sampled_from(ROLES), st.sampled_from(PATTERNS),
                                st.booleans()), min_size=2, max_size=6),
       releases=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 20)), max_size=3),
       seed=st.integers(0, 2**32))
def test_replicas_applying_lease_ops_in_any_order_agree_with_the_rule(takes: list[Any], releases: list[Any],
                                                                      seed: int) -> None:
    """Two replicas that apply the same signed lease ops in different orders end with the same
    holders, and those are what the pure rule decides."""
    w = Writer()
    base = int(time.time() * 1000) - 45 * MINUTE  # every stamp in the past: none beyond the allowed drift
    raws, ids, roles = [], [], []
    for at, role, pattern, x in takes:
        raw, lid = w.take(base + at * MINUTE, role, pattern, x=x)
        raws.append(raw)
        ids.append(lid)
        roles.append(role)
    for i, at in releases:
        k = i % len(ids)
        raws.append(w.op(rules.KIND_RELEASE, {"l": ids[k], "r": roles[k]}, base + (takes[k][0] + at) * MINUTE))
    shuffled = list(raws)
    random.Random(seed).shuffle(shuffled)
    with Replica.open() as one, Replica.open() as two:
        one.apply(raws)
        for raw in shuffled:
            two.apply([raw, raw])
        seen_one = {i.id: (i.lost_to, i.expires_ts) for i in one.leases(include_ended=True)}
        seen_two = {i.id: (i.lost_to, i.expires_ts) for i in two.leases(include_ended=True)}
        assert seen_one == seen_two and len(seen_one) == len(ids)
        decoded = [opsmod.decode(r) for r in raws]
        ts = [rules.Take(rules.lease_id(o.origin, o.seq), "proj", o.body["g"], o.body["r"], o.body["x"],
                         (o.hlc, o.origin, o.seq), o.body["ttl"]) for o in decoded if o.kind == rules.KIND_TAKE]
        cs = [rules.Change(o.body["l"], o.kind, o.body["r"], (o.hlc, o.origin, o.seq)) for o in decoded
              if o.kind != rules.KIND_TAKE]
        assert {lid: lost for lid, (lost, _exp) in seen_one.items()} == {k: v[1] for k, v in _outcome(ts, cs).items()}


# -- the API ----------------------------------------------------------------------------------------


def test_a_clashing_exclusive_take_is_refused_with_the_holder_named() -> None:
    with Replica.open() as a, Replica.open() as b:
        got = a.reserve("/work/repos/proj", "alice", ["src/*.py"], ttl_seconds=600, reason="refactor")
        assert [g.path_pattern for g in got.granted] == ["src/*.py"] and not got.conflicts
        sync_all([a, b])
        refused = b.reserve("proj", "bob", ["src/a.py", "docs/x.md"])
        assert [g.path_pattern for g in refused.granted] == ["docs/x.md"]
        (conflict,) = refused.conflicts
        assert conflict.path == "src/a.py"
        assert [(h.agent, h.reason, h.expires_ts) for h in conflict.holders] == \
            [("alice", "refactor", got.granted[0].expires_ts)]
        shared = b.reserve("proj", "bob", ["notes/n.md"], exclusive=False)
        assert shared.granted and not shared.conflicts  # shared leases clash with exclusive ones only
        assert not b.reserve("proj", "carol", ["notes/*"], exclusive=False).conflicts
        assert [h.agent for h in b.reserve("proj", "carol", ["docs/*"], exclusive=False).conflicts[0].holders] == \
            ["bob"]


def test_taking_what_the_role_already_holds_renews_it() -> None:
    with Replica.open() as r:
        first = r.reserve("proj", "alice", ["src/a.py"], ttl_seconds=60).granted[0]
        again = r.reserve("proj", "alice", ["src/a.py"], ttl_seconds=3600).granted[0]
        assert again.id == first.id and again.expires_ts > first.expires_ts
        assert len(r.leases("proj")) == 1


def test_renew_release_and_force_release() -> None:
    with Replica.open() as a, Replica.open() as b:
        lid = a.reserve("proj", "alice", ["src/a.py"], ttl_seconds=60).granted[0].id
        (renewed,) = a.renew_leases("proj", "alice", extend_seconds=600)
        assert renewed.id == lid and renewed.new_expires_ts > renewed.old_expires_ts
        assert a.release_leases("proj", "alice", paths=["src/a.py"])[0] == 1
        sync_all([a, b])
        assert a.lease(lid).status == "released" and not b.reserve("proj", "bob", ["src/a.py"]).conflicts
        lid2 = a.reserve("proj", "alice", ["docs/x.md"]).granted[0].id
        sync_all([a, b])
        forced = b.force_release("proj", "bob", lid2, note="alice is gone")
        assert (forced.status, forced.released_by) == ("forced", "bob")
        sync_all([a, b])
        assert a.lease(lid2).status == "forced"


def test_a_partition_is_settled_alike_everywhere_and_the_loser_is_told() -> None:
    """Both sides take the same exclusive lease apart; after the heal both replicas agree on the
    earlier take, list the later one as lost, and name it among the losses sessions are told of."""
    with Replica.open() as a, Replica.open() as b:
        mark_a, mark_b = a.lease_mark(), b.lease_mark()
        first = a.reserve("proj", "alice", ["src/a.py"]).granted[0]
        time.sleep(0.002)  # a later wall time: the HLC order is then also the order of the calls
        second = b.reserve("proj", "bob", ["src/*.py"]).granted[0]
        sync_all([a, b])
        for r in (a, b):
            assert r.lease(first.id).status == "held"
            lost = r.lease(second.id)
            assert (lost.status, lost.lost_to, lost.lost_to_agent) == ("lost", first.id, "alice")
        for r, mark in ((a, mark_a), (b, mark_b)):
            (loss,) = r.lease_losses(mark)
            assert (loss.lost.agent, loss.winner and loss.winner.agent) == ("bob", "alice")
        assert b.reserve("proj", "bob", ["src/a.py"]).conflicts  # the winner now blocks the loser


@pytest.mark.parametrize(("call", "error"), [
    (lambda r: r.reserve("proj", "alice", ["../outside"]), "leaves the project"),
    (lambda r: r.reserve("proj", "alice", ["/etc/passwd"]), "not relative"),
    (lambda r: r.reserve("proj", "alice", ["a"], ttl_seconds=0), "ttl_seconds"),
    (lambda r: r.reserve("proj", "alice", ["a"], ttl_seconds=366 * 86400), "ttl_seconds"),
    (lambda r: r.reserve("proj", "alice", []), "paths"),
    (lambda r: r.reserve("proj", "alice", "src/a.py"), "paths"),  # type: ignore[arg-type]
    (lambda r: r.release_leases("proj", "bob", ids=[r.leases()[0].id]), "held by alice"),
    (lambda r: r.renew_leases("proj", "bob", ids=[r.leases()[0].id]), "held by alice"),
])
def test_bad_calls_are_refused_and_change_nothing(call: Any, error: str) -> None:
    with Replica.open() as r:
        r.reserve("proj", "alice", ["held.py"])
        before = r.vector()
        with pytest.raises(InvalidArgument, match=error):
            call(r)
        assert r.vector() == before


def test_an_unknown_lease_id_is_not_found() -> None:
    with Replica.open() as r, pytest.raises(NotFound):
        r.force_release("proj", "bob", "fr_" + "0" * 20)


@pytest.mark.parametrize(("body", "error"), [
    ({"p": "proj", "g": "../x", "r": "a", "i": None, "x": True, "ttl": 1000, "why": ""}, "leaves the project"),
    ({"p": "proj", "g": "x", "r": "a", "i": None, "x": True, "ttl": 0, "why": ""}, "ttl"),
    ({"p": "proj", "g": "x", "r": "a", "i": None, "x": "yes", "ttl": 1000, "why": ""}, "exclusive"),
    ({"p": "proj", "g": "./x", "r": "a", "i": None, "x": True, "ttl": 1000, "why": ""}, "normalised"),
])
def test_a_peers_malformed_lease_op_is_refused_whole(body: dict[str, Any], error: str) -> None:
    w = Writer()
    with Replica.open() as r:
        ok, _ = w.take(int(time.time() * 1000), "alice", "ok.py")
        with pytest.raises(InvalidOp, match=error):
            r.apply([ok, w.op(rules.KIND_TAKE, body, int(time.time() * 1000))])
        assert r.vector() == {} and r.leases() == []


def test_a_forged_lease_op_is_refused() -> None:
    w, forger = Writer(), identity.generate()
    raw, _ = w.take(int(time.time() * 1000), "alice", "src/a.py")
    unsigned, _sig = opsmod._unwrap(raw)[:2]
    forged = opsmod.pack([unsigned, forger.sign(unsigned)])
    with Replica.open() as r:
        with pytest.raises(InvalidOp, match="signature"):
            r.apply([forged])
        assert r.leases() == []


def test_a_release_signed_by_another_role_than_the_holder_does_nothing() -> None:
    w = Writer()
    now = int(time.time() * 1000)
    raw, lid = w.take(now, "alice", "src/a.py")
    with Replica.open() as r:
        r.apply([raw, w.op(rules.KIND_RELEASE, {"l": lid, "r": "mallory"}, now + 1)])
        assert r.lease(lid).status == "held"


# -- older releases -------------------------------------------------------------------------------


def test_lease_ops_are_never_sent_to_a_first_release_peer() -> None:
    with Replica.open() as r:
        r.reserve("proj", "alice", ["src/a.py"])
        (raw,) = [b for _l, b in r.ops_after(0)]
        assert opsmod.decode(raw).v1 is False
        assert opsmod.decode(raw).understood is True


def test_lease_ops_held_by_0_2_0_are_applied_on_upgrade(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0.2.0 replica (op level 2, no lease kinds) holds a peer's lease ops without applying them;
    opening it with this release applies them."""
    db = tmp_path / "r.db"
    w = Writer()
    now = int(time.time() * 1000)
    raw, lid = w.take(now, "alice", "src/a.py")
    older = {k: v for k, v in opsmod._CHECKS.items() if k not in rules.KINDS}
    with monkeypatch.context() as m:
        m.setattr(opsmod, "_CHECKS", older)
        m.setattr(project, "KNOWN_KINDS", frozenset(older))
        m.setattr(migrate, "KNOWN_KINDS", frozenset(older))
        m.setattr(opsmod, "OP_LEVEL", 2)
        m.setattr(migrate, "OP_LEVEL", 2)
        with Replica.open(db) as r:
            r.apply([raw])
            assert r.stats()["newer_ops"] == 1 and r.leases() == []
    with Replica.open(db) as r:
        assert r.stats()["newer_ops"] == 0
        assert r.lease(lid).status == "held"


def test_pull_carries_leases(tmp_path: Path) -> None:
    with Replica.open(tmp_path / "a.db") as a, Replica.open(tmp_path / "b.db") as b:
        lid = a.reserve("proj", "alice", ["src/a.py"]).granted[0].id
        assert pull(b, a) == 1
        assert b.lease(lid).agent == "alice"
