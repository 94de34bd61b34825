"""Merge is commutative, associative and idempotent: property tests over random ops."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replica import Replica, firstseen, hlc, lww, ops
from replica import registers as regs
from replica.errors import InvalidArgument, NotFound
from replica.firstseen import Seen, Sighting
from replica.lww import Write
from replica.names import name_key
from replica.store import Store
from tests.conftest import pull

ROLES = ["a", "b", "c", "A", "É", "e\u0301"]
PROFILE_VALUES = st.one_of(
    st.text(max_size=5),
    st.fixed_dictionaries({}, optional={"currentTask": st.text(max_size=5), "sessionCount": st.integers(0, 9)}),
)

action = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(ROLES), st.sampled_from(["a", "B", "a,c", "é, A", "broadcast"]), st.text(max_size=8)),
    st.tuples(st.just("profile"), st.sampled_from(["p1", "P1", "p2"]), st.sampled_from(["name", "static", "dynamic"]), PROFILE_VALUES),
    st.tuples(st.just("summary"), st.sampled_from(["p1", "P1"]), st.sampled_from([None, "i1", "I1"]), st.text(max_size=5)),
    st.tuples(st.just("check"), st.sampled_from(ROLES), st.none(), st.none()),
    st.tuples(st.just("read"), st.sampled_from(ROLES), st.none(), st.none()),
    st.tuples(st.just("retract"), st.sampled_from(ROLES), st.none(), st.none()),
    st.tuples(st.just("agent"), st.sampled_from(["x", "y"]), st.booleans(), st.none()),
    st.tuples(st.just("forget"), st.sampled_from(ROLES), st.none(), st.none()),
)


def _run(r: Replica, act: tuple[Any, ...]) -> None:
    kind, a, b, c = act
    if kind == "send":
        r.send_message(a, b, c)
    elif kind == "profile":
        r.update_profile(a, **{b: c if b != "name" or isinstance(c, str) else str(c)})
    elif kind == "summary":
        r.set_summary(a, c, b)
    elif kind == "retract":
        mine = [m for m in r.list_messages(from_=a).messages if m.retracted is None]
        if mine:
            r.retract_message(mine[0].id, a)
    elif kind == "check":
        r.check_messages(a)
    elif kind == "read":
        ids = [m.receipt_id for m in r.check_messages(a).messages]
        if ids:
            r.mark_as_read(ids)
    elif kind == "agent":
        aid = r.get_or_create_agent(a)
        if b:
            r.delete_agent(aid)
    elif kind == "forget":  # only a role this replica knows as seen only reading can be
        with contextlib.suppress(NotFound, InvalidArgument):
            r.forget_role(a)


def _ops_of(origins: list[Replica]) -> list[bytes]:
    return [raw for r in origins for _, raw in r.ops_after(0, 100_000)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.tuples(st.integers(0, 2), action), min_size=1, max_size=25),
    data=st.data(),
)
def test_any_order_any_duplication_any_paging_converges(plan: list[tuple[int, tuple[Any, ...]]], data: st.DataObject) -> None:
    """Ops from three origins applied to three replicas in random orders, duplicated, in random
    partial batches, give every replica the state of applying everything at once."""
    clock = [10_000_000]

    def wall() -> int:
        clock[0] += data.draw(st.integers(-5, 20), label="tick")
        return clock[0]

    origins = [Replica.open(wall=wall) for _ in range(3)]
    for who, act in plan:
        _run(origins[who], act)
        if data.draw(st.booleans(), label="gossip"):  # sometimes origins see each other's ops
            pull(origins[who], origins[(who + 1) % 3])
    origins[0].send_message("a", "b", "anchor")  # at least one op, so there is something to shuffle
    everything = _ops_of(origins)

    reference = Replica.open()
    reference.apply(everything)
    for _ in range(3):
        replica = Replica.open()
        shuffled = data.draw(st.permutations(everything + data.draw(st.lists(st.sampled_from(everything)), label="dups")))
        while shuffled:
            n = data.draw(st.integers(1, len(shuffled)), label="batch")
            replica.apply(shuffled[:n])
            shuffled = shuffled[n:]
        assert replica.state_digest() == reference.state_digest()
        assert replica.vector() == reference.vector()


@settings(max_examples=25, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 2), action), min_size=1, max_size=15), budget=st.integers(50, 3000))
def test_paged_pull_in_any_direction_converges(plan: list[tuple[int, tuple[Any, ...]]], budget: int) -> None:
    """Pulling through small pages of ops_missing, in a ring, brings all replicas to one state."""
    rs = [Replica.open() for _ in range(3)]
    for who, act in plan:
        _run(rs[who], act)
    for _ in range(2):
        for i in range(3):
            pull(rs[i], rs[(i + 1) % 3], budget)
    assert len({r.state_digest() for r in rs}) == 1
    assert all(r.vector() == rs[0].vector() for r in rs)


ORIGINS = [bytes([n]) * 32 for n in (1, 2, 3)]
stamps = st.tuples(st.integers(0, 20), st.sampled_from(ORIGINS))
writes = st.lists(
    st.builds(Write, key=st.sampled_from([("t", "k", "f"), ("t", "k", "g")]), value=st.integers(0, 3), stamp=stamps),
    max_size=36,
    unique_by=lambda w: w.stamp,  # one origin never reuses a stamp, so no two writes share one
)


@given(ws=writes, data=st.data())
def test_lww_merge_laws(ws: list[Write], data: st.DataObject) -> None:
    """LWW merge is commutative, associative and idempotent (three groups of writes with unique stamps)."""
    i = data.draw(st.integers(0, len(ws)), label="cut1")
    j = data.draw(st.integers(i, len(ws)), label="cut2")
    xs, ys, zs = ws[:i], ws[i:j], ws[j:]
    m = lww.merge
    assert m(m({}, xs), ys) == m(m({}, ys), xs)
    assert m(m(m({}, xs), ys), zs) == m(m({}, xs), ys + zs)
    assert m(m({}, xs), xs) == m({}, xs)


# Register writes as ops carry them, to two tables with projections: profile fields (a name, the
# whole text of an older node, keys of its objects as JSON text) and receipt times, under names
# that differ in case and Unicode form.
_profile_value = st.text(max_size=4)
registers = st.one_of(
    st.tuples(st.just("prof"), st.sampled_from([("p1",), ("P1",), ("p2",), ("p1", "i"), ("p1", "")]),
              st.sampled_from(["name", "dynamic"]), _profile_value),
    st.tuples(st.just("prof"), st.sampled_from([("p1",), ("P1",), ("p1", "I")]),
              st.sampled_from(["dynamic.currentTask", "static.role"]), _profile_value.map(json.dumps)),
    st.tuples(st.just("rcpt"), st.sampled_from([("m-1", "r", ""), ("m-1", "R", ""), ("m-1", "r", "é"),
                                                ("m-1", "r", "E\u0301")]),
              st.sampled_from(["d", "r"]), st.integers(0, 10**6)),
)
stored_writes = st.lists(st.tuples(registers, stamps), max_size=24, unique_by=lambda w: w[1])


def _model_write(table: str, key: tuple[str, ...], field: str, value: Any, stamp: Any) -> Write:
    """A write as the pure rules file it: names by key, an older node's whole text as the ``text`` key."""
    field, value = regs.register_field(table, field, value)
    return Write((table, lww.join_key(regs.register_key(table, list(key))), field), value, stamp)


def _projected(cur: Any) -> dict[tuple[str, str, str], object]:
    """Every receipt register as the receipts table shows it."""
    out: dict[tuple[str, str, str], object] = {}
    for msg, role, inst, delivered, read in cur.execute("SELECT msg_id, role, inst, delivered, read FROM receipts"):
        key = lww.join_key([msg, role, inst])
        out.update({("rcpt", key, "d"): delivered, ("rcpt", key, "r"): read})
    return {k: v for k, v in out.items() if v is not None}


@given(ws=stored_writes, data=st.data())
def test_store_upsert_keeps_what_the_pure_lww_rule_keeps(ws: list[tuple[Any, Any]], data: st.DataObject) -> None:
    """Register writes put into the SQLite store in any order, some twice, leave every register
    (and its projection) at the value ``lww.merge`` picks, once names are keyed."""
    order = data.draw(st.permutations(ws + data.draw(st.lists(st.sampled_from(ws)) if ws else st.just([]))))
    model = lww.merge({}, [_model_write(t, k, f, v, stamp) for (t, k, f, v), stamp in ws])
    st_ = Store(":memory:")
    with st_.write() as cur:
        for (table, key, field, value), (hlc_, origin) in order:
            regs.put_register(cur, [table, list(key), field, value], hlc_, origin)
    with st_.read() as cur:
        held = {(t, k, f): (v, (h, bytes(o))) for t, k, f, v, h, o in cur.execute("SELECT * FROM lww")}
        projected = _projected(cur)
        profiles = {r[0] for r in cur.execute("SELECT id FROM profiles")}
    st_.close()
    assert held == {key: (w.value, w.stamp) for key, w in model.items()}
    assert projected == {key: w.value for key, w in model.items() if key[0] == "rcpt"}
    assert profiles == {key[1] for key in model if key[0] == "prof"}


def test_lww_tie_on_hlc_resolved_by_origin() -> None:
    """Two writes with the same HLC: the higher origin key wins, on every replica, in either order."""
    lo = Write(("prof", "p", "name"), "from-1", (100, b"\x01"))
    hi = Write(("prof", "p", "name"), "from-2", (100, b"\x02"))
    assert m_value([lo, hi]) == m_value([hi, lo]) == "from-2"


def m_value(ws: list[Write]) -> object:
    return lww.merge({}, ws)[("prof", "p", "name")].value


def test_lww_tie_on_hlc_between_replicas() -> None:
    """Concurrent profile updates with equal clocks converge to the same winner everywhere."""
    a = Replica.open(wall=lambda: 42)
    b = Replica.open(wall=lambda: 42)
    a.update_profile("p", name="A")
    b.update_profile("p", name="B")
    pull(a, b)
    pull(b, a)
    winner = "A" if a.node_key > b.node_key else "B"
    assert a.get_profile("p").name == b.get_profile("p").name == winner  # type: ignore[union-attr]


@given(walls=st.lists(st.integers(0, 10**6), min_size=1, max_size=50),
       remotes=st.lists(st.integers(0, 2**50), min_size=1, max_size=50))
def test_hlc_monotonic_under_skewed_remote_clocks(walls: list[int], remotes: list[int]) -> None:
    """Whatever the wall clock and remote stamps do, our clock strictly increases and a
    remote far ahead moves it at most max_drift past our wall clock."""
    last = 0
    for i, wall in enumerate(walls):
        nxt = hlc.tick(last, wall)
        assert nxt > last
        last = nxt
        remote = remotes[i % len(remotes)]
        seen = hlc.observe(last, remote, wall, max_drift_ms=1000)
        assert seen >= last
        assert hlc.wall_of(seen) <= max(hlc.wall_of(last), wall + 1000)
        last = seen


def test_replica_clock_capped_against_far_future_peer() -> None:
    """Applying an op stamped ahead, within the allowed drift, does not drag our clock past the drift
    (an op further ahead is refused: ``tests/test_drift.py``)."""
    future = Replica.open(wall=lambda: 10_000_000 + hlc.DEFAULT_MAX_DRIFT_MS - 1000)
    here = Replica.open(wall=lambda: 10_000_000)
    future.send_message("a", "b", "from the future")
    pull(here, future)
    assert hlc.wall_of(here.clock()) <= 10_000_000 + hlc.DEFAULT_MAX_DRIFT_MS
    assert here.check_messages("b").messages[0].content == "from the future"
    here.send_message("b", "a", "reply")
    assert hlc.wall_of(here.clock()) <= 10_000_000 + hlc.DEFAULT_MAX_DRIFT_MS


# -- first seen: per role, a min, a set and a max ------------------------------------------------------

sightings = st.lists(st.builds(Sighting, st.sampled_from(ROLES), st.integers(0, 10**6),
                               st.sampled_from([firstseen.SENT, firstseen.PROFILE, firstseen.READ, firstseen.FORGET])),
                     max_size=30)


@given(xs=sightings, ys=sightings, zs=sightings)
def test_first_seen_merge_laws(xs: list[Sighting], ys: list[Sighting], zs: list[Sighting]) -> None:
    """What the sightings make of each role (earliest confirmation, read times, latest forget) is
    commutative, associative and idempotent, both merged in and joined as whole states."""
    m, j = firstseen.merge, firstseen.join
    assert m(m({}, xs), ys) == m(m({}, ys), xs) == j(m({}, xs), m({}, ys))
    assert m(m(m({}, xs), ys), zs) == m(m({}, xs), ys + zs) == j(m({}, xs), j(m({}, ys), m({}, zs)))
    assert m(m({}, xs), xs) == m({}, xs) == j(m({}, xs), m({}, xs))
    assert m({}, [*reversed(xs)]) == m({}, xs)


@given(xs=sightings)
def test_a_role_is_confirmed_for_good_and_a_forget_hides_only_the_reads_it_covers(xs: list[Sighting]) -> None:
    """A confirmed role keeps every sighting (its time only moves earlier); an unconfirmed one counts
    the reads after its latest forget, and is not known when there are none."""
    for role, seen in firstseen.merge({}, xs).items():
        mine = [s for s in xs if s.role == role]
        confirming = [s.at for s in mine if s.kind in firstseen.CONFIRMING]
        reads = [s.at for s in mine if s.kind == firstseen.READ]
        forgot = max((s.at for s in mine if s.kind == firstseen.FORGET), default=None)
        if confirming:
            assert seen.status == firstseen.CONFIRMED and seen.first == min(confirming + reads)
        else:
            counted = [r for r in reads if forgot is None or r > forgot]
            assert seen.first == (min(counted) if counted else None)
            assert seen.status == (firstseen.UNCONFIRMED if counted else None)


first_seen_action = st.tuples(st.sampled_from(["send", "check", "profile", "thread", "forget"]),
                              st.sampled_from(ROLES), st.integers(-3 * 86_400_000, 3 * 86_400_000))


def _roles_held(replica: Replica) -> dict[str, Seen]:
    """What the store holds of each role, as the pure model's state."""
    with replica._store.read() as cur:
        reads: dict[str, set[int]] = {}
        for role, at in cur.execute("SELECT role, at FROM seen_reads"):
            reads.setdefault(role, set()).add(at)
        rows = cur.execute("SELECT role, at, confirmed, forgot FROM first_seen").fetchall()
    return {role: Seen(at if confirmed else None, frozenset(reads.get(role, ())), forgot)
            for role, at, confirmed, forgot in rows}


@settings(max_examples=40, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 2), first_seen_action), min_size=1, max_size=20), data=st.data())
def test_store_first_seen_is_the_pure_rule_whatever_the_order(plan: list[tuple[int, tuple[str, str, int]]],
                                                               data: st.DataObject) -> None:
    """Ops from three origins with skewed clocks (messages, checks, profiles, thread messages, forgets),
    applied to a replica in any order with duplicates, one by one or in batches, leave each role's
    first-seen time, standing and forget at what the pure ``firstseen.merge`` of the ops'
    ``firstseen.sightings`` says."""
    clocks = [[10**12], [10**12], [10**12]]
    origins = [Replica.open(wall=lambda c=c: c[0]) for c in clocks]  # type: ignore[misc]
    for who, (kind, role, skew) in plan:
        clocks[who][0] = 10**12 + skew
        r = origins[who]
        if kind == "send":
            r.send_message(role, "x", "hi")
        elif kind == "check":
            r.check_messages(role)
        elif kind == "profile":
            r.update_profile(role, name=role)
        elif kind == "forget":  # of a role seen reading here (unless it is confirmed): a forget op is written
            r.check_messages(role)
            with contextlib.suppress(InvalidArgument):
                r.forget_role(role)
        else:
            agents = r.get_or_create_agent(role), r.get_or_create_agent(f"{role}2")
            r.append(r.create_thread(*agents), agents[0], "in a thread")
    everything = _ops_of(origins)
    model = firstseen.merge({}, [s for raw in everything for s in firstseen.sightings(ops.decode(raw))])
    shuffled = data.draw(st.permutations(everything + data.draw(st.lists(st.sampled_from(everything)))))
    one_by_one, batched = Replica.open(), Replica.open()
    for raw in shuffled:
        one_by_one.apply([raw])
    batched.apply(shuffled)
    for replica in (one_by_one, batched):
        held = _roles_held(replica)
        assert {k: (s.first, s.status) for k, s in held.items()} == {k: (s.first, s.status) for k, s in model.items()}
        assert held == {k: Seen(s.first if s.confirmed is not None else None, s.reads, s.forgot)
                        for k, s in model.items()}
        with replica._store.read() as cur:
            assert {k: (at, confirmed) for k, at, confirmed in firstseen.known(cur)} == {
                k: (s.first, s.status == firstseen.CONFIRMED) for k, s in model.items() if s.first is not None}
    assert one_by_one.state_digest() == batched.state_digest()
    assert set(model) == {name_key(role) for _, (kind, role, _) in plan if kind != "thread"}
    assert all(t <= 10**12 + 3 * 86_400_000 for t in firstseen.first_times(model).values())


def test_no_property_test_runs_against_the_clock() -> None:
    """The suite's Hypothesis profile (tests/conftest.py) has no deadline, and explicit
    ``@settings`` inherit it, so a busy machine cannot fail a law that holds."""
    assert settings.default.deadline is None
    assert settings(max_examples=5).deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check
