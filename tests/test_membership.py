"""Fleet membership: the pure rules (removal cutoff, void rotations, the winner, vector capping)
and the replica's side (admit and rekey ops, retraction above the cutoff, sealed key entries)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import InvalidArgument, InvalidOp, NotFound, Replica
from replica import membership as mem
from replica import ops as opsmod

NODES = [bytes([i]) * 32 for i in range(1, 6)]


# -- pure rules ---------------------------------------------------------------------------------

rekeys = st.builds(
    mem.Rekey,
    origin=st.sampled_from(NODES),
    seq=st.integers(1, 20),
    hlc=st.integers(0, 50),
    epoch=st.integers(1, 4),
    fleet_id=st.just("0" * 16),
    entries=st.dictionaries(st.sampled_from(NODES), st.just(b"e" * mem.SEALED_KEY_BYTES), max_size=5),
    removes=st.dictionaries(st.sampled_from(NODES), st.integers(0, 20), max_size=2),
)


# An op is identified by (origin, seq): a replica never holds two with the same pair.
rekey_sets = st.lists(rekeys, min_size=1, max_size=8, unique_by=lambda r: (r.origin, r.seq))


admits = st.builds(
    mem.Admit,
    origin=st.sampled_from(NODES),
    seq=st.integers(1, 20),
    hlc=st.integers(0, 50),
    node=st.sampled_from(NODES),
)
# Membership ops: an (origin, seq) names one op, whichever kind it is.
fleet_sets = st.lists(st.one_of(rekeys, admits), min_size=1, max_size=10, unique_by=lambda o: (o.origin, o.seq))
roots = st.one_of(st.none(), st.frozensets(st.sampled_from(NODES), max_size=2))


def split(ops: list[mem.Rekey | mem.Admit]) -> tuple[list[mem.Rekey], list[mem.Admit]]:
    return [o for o in ops if isinstance(o, mem.Rekey)], [o for o in ops if isinstance(o, mem.Admit)]


@given(fleet_sets, roots, st.randoms())
def test_standing_does_not_depend_on_arrival_order(ops: list[mem.Rekey | mem.Admit], trusted: frozenset[bytes] | None,
                                                  rnd: object) -> None:
    """Any order, any duplicates: the same members, removals, void ops and winner."""
    shuffled = list(ops) + list(ops[:3])
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a, b = mem.standing(*split(ops), trusted, NODES[4]), mem.standing(*split(shuffled), trusted, NODES[4])
    assert (a.removed, a.void, a.winner, a.admitted, a.conflicts) == (b.removed, b.void, b.winner, b.admitted,
                                                                      b.conflicts)
    assert a.winner is None or a.winner.ident not in a.void


@given(fleet_sets, roots)
def test_what_counts_follows_the_rules(ops: list[mem.Rekey | mem.Admit], trusted: frozenset[bytes] | None) -> None:
    """No op that counts lies above its origin's cutoff or comes from a node never let in; every node a
    counting rekey names is removed, at a cutoff no higher than it gave; every node let in is a root
    or named by a counting admit; and every op is decided (counts, or is void)."""
    s = mem.standing(*split(ops), trusted, NODES[4])
    counting = [o for o in ops if o.ident not in s.void]
    for o in counting:
        assert o.origin not in s.removed or o.seq <= s.removed[o.origin]
        assert s.counts(o.origin)
    for r in s.valid:
        for node, upto in r.removes.items():
            assert node in s.removed and s.removed[node] <= upto
    if s.admitted is not None:
        named = {o.node for o in counting if isinstance(o, mem.Admit)}
        assert s.admitted <= (set(trusted or ()) or mem.trusted_roots(split(ops)[1], NODES[4])) | named
    assert set(s.valid) == {o for o in counting if isinstance(o, mem.Rekey)}


def _ids(nodes: set[bytes]) -> set[int]:
    return {n[0] for n in nodes}


def test_mutual_removal_removes_both_at_the_cutoffs_they_gave() -> None:
    """A removes X while X removes A (each past what the other held): both are out, each from the seq
    after the cutoff the other gave, and neither rotation holds the key."""
    a, x = NODES[0], NODES[1]
    mine = mem.Rekey(a, 5, hlc=10, epoch=1, fleet_id="0" * 16, removes={x: 3})
    theirs = mem.Rekey(x, 4, hlc=1, epoch=1, fleet_id="1" * 16, removes={a: 4})
    for order in ([mine, theirs], [theirs, mine]):
        s = mem.standing(order)
        assert s.removed == {x: 3, a: 4} and s.void == {(x, 4), (a, 5)} and s.winner is None
        assert s.conflicts == {a, x}


def test_a_conflict_takes_no_one_else_out() -> None:
    """A stolen node that removed everyone before it was removed takes out only the one that removed
    it: its removal of the others counts for nothing."""
    a, b, c, x = NODES[:4]
    honest = mem.Rekey(a, 9, hlc=10, epoch=1, fleet_id="0" * 16, removes={x: 3})
    thief = mem.Rekey(x, 5, hlc=1, epoch=1, fleet_id="1" * 16, removes={a: 2, b: 0, c: 0})
    s = mem.standing([honest, thief])
    assert s.removed == {a: 2, x: 3} and b not in s.removed and c not in s.removed


def test_a_cycle_of_removals_removes_every_node_in_it() -> None:
    """A removes B, B removes C, C removes A, each past what the remover held: all three are out."""
    a, b, c, d = NODES[:4]
    cycle = [mem.Rekey(p, 9, 1, 1, "0" * 16, removes={q: 5}) for p, q in ((a, b), (b, c), (c, a))]
    s = mem.standing(cycle, [mem.Admit(a, seq, 0, n) for seq, n in enumerate((b, c, d), 1)], {a}, d)
    assert s.removed == {a: 5, b: 5, c: 5} and s.winner is None and s.admitted == {a, b, c, d}


def test_an_admit_past_the_admitters_cutoff_lets_nobody_in() -> None:
    """A removed node cannot bring a friend in after its cutoff; before it, the friend stays in."""
    a, x, late, early = NODES[:4]
    out = mem.Rekey(a, 9, 1, 1, "0" * 16, removes={x: 5})
    lets = [mem.Admit(a, 1, 0, x), mem.Admit(x, 3, 0, early), mem.Admit(x, 7, 0, late)]
    s = mem.standing([out], lets, {a}, a)
    assert early in s.admitted and late not in s.admitted and (x, 7) in s.void


def test_a_fleet_key_alone_lets_nobody_in() -> None:
    """A node that admits itself, or that another node nobody let in admits, counts for nothing; a
    home given only the fleet key trusts whoever let it in, back to the founder."""
    founder, member, me, stranger = NODES[:4]
    lets = [mem.Admit(founder, 1, 0, founder), mem.Admit(founder, 2, 0, member), mem.Admit(member, 1, 0, me),
            mem.Admit(stranger, 1, 0, stranger), mem.Admit(stranger, 2, 0, NODES[4])]
    s = mem.standing([], lets, {founder}, me)
    assert s.admitted == {founder, member, me}
    assert not s.counts(stranger) and mem.barred(s, stranger, 1, me) and not mem.barred(s, stranger, 1, stranger)
    assert mem.standing([], lets, frozenset(), me).admitted == {founder, member, me}
    assert mem.standing([], [], frozenset(), me).admitted == frozenset()  # nobody let it in yet


def test_menders_take_turns_from_the_winners_origin() -> None:
    a, b, c = NODES[:3]
    win = mem.Rekey(b, 1, 1, 1, "f" * 16)
    assert mem.menders(win, {a, b, c}) == [b, a, c]
    assert mem.menders(None, {c, a}) == [a, c]
    assert mem.gaps(None, {a}, {}, {b: 0}) == (set(), {b})  # the first key, which a removed node holds


@given(st.dictionaries(st.sampled_from(NODES), st.integers(0, 100)),
       st.dictionaries(st.sampled_from(NODES), st.integers(0, 100)))
def test_capping_holds_removed_origins_to_their_cutoff(vector: dict[bytes, int], removed: dict[bytes, int]) -> None:
    """A capped vector never exceeds a cutoff and leaves other origins alone."""
    capped = mem.cap_vector(vector, removed)
    assert capped.keys() == vector.keys()
    for o, n in capped.items():
        assert n == (min(vector[o], removed[o]) if o in removed else vector[o])


@given(st.sampled_from(NODES), st.integers(1, 30), st.dictionaries(st.sampled_from(NODES), st.integers(0, 30)))
def test_barred_is_exactly_above_the_cutoff_and_never_our_own(origin: bytes, seq: int,
                                                              removed: dict[bytes, int]) -> None:
    """An op is barred iff its origin is removed, it lies above the cutoff, and it is not ours."""
    me = NODES[0]
    expected = origin != me and origin in removed and seq > removed[origin]
    assert mem.barred(removed, origin, seq, me) == expected


def test_gaps_name_members_a_rotation_missed_and_removed_nodes_it_reached() -> None:
    """A member let in on the winner's fleet needs no entry; one let in before does; a removed entry is stale."""
    a, b, c, x = NODES[:4]
    win = mem.Rekey(a, 1, 1, 1, "f" * 16, entries={a: b"", x: b""})
    missing, stale = mem.gaps(win, {a, b, c}, {b: "f" * 16, c: "e" * 16}, {x: 0})
    assert (missing, stale) == ({c}, {x})
    assert mem.gaps(None, {a}, {}, {}) == (set(), set())


# -- the replica's side -------------------------------------------------------------------------


def fill(src: Replica, dst: Replica) -> None:
    dst.apply([raw for _, raw in src.ops_after(0, 10_000)])


def test_removal_cuts_a_node_off_at_what_the_remover_held() -> None:
    """Ops of the removed node above the cutoff are refused quietly and never enter the vector."""
    a, x = Replica.open(), Replica.open()
    x.send_message("x", "team", "before")
    fill(x, a)
    rekey = a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    assert rekey.removes == {x.node_key: 1} and x.node_key not in rekey.entries
    x.send_message("x", "team", "after")
    result = a.apply([raw for _, raw in x.ops_after(0)])
    assert (result.new, result.refused) == (0, 1)
    assert a.vector()[x.node_key] == 1
    assert [m.content for m in a.check_messages("team").messages] == ["before"]


def test_a_late_removal_retracts_what_arrived_above_the_cutoff() -> None:
    """A replica holding the removed node's later messages drops them from inbox, search and vector."""
    a, b, x = Replica.open(), Replica.open(), Replica.open()
    x.send_message("x", "team", "kept words")
    fill(x, a)
    x.send_message("x", "team", "dropped words")
    fill(x, b)
    assert b.search_messages("dropped")  # indexed before the removal arrives
    a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    fill(a, b)
    assert [m.content for m in b.check_messages("team").messages] == ["kept words"]
    assert b.search_messages("dropped") == [] and b.search_messages("kept")
    assert b.vector()[x.node_key] == 1
    assert b.stats()["messages"] == a.stats()["messages"] == 1
    before = b.max_lseq()
    b.send_message("b", "team", "still counting")
    assert b.max_lseq() > before  # arrival positions never go back


def test_a_late_removal_takes_thread_messages_above_the_cutoff_out_of_the_thread() -> None:
    """A removed node's thread message that arrived above its cutoff is no longer polled."""
    a, b, x = Replica.open(), Replica.open(), Replica.open()
    ann, bob = x.create_agent("ann"), x.create_agent("bob")
    thread = x.create_thread(ann, bob)
    x.append(thread, ann, "kept")
    fill(x, a)
    x.append(thread, bob, "dropped")
    fill(x, b)
    assert [m.content for m in b.poll(thread)] == ["kept", "dropped"]
    a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    fill(a, b)
    assert [m.content for m in b.poll(thread)] == ["kept"]


def test_the_new_key_opens_only_for_remaining_members() -> None:
    """Every remaining member opens the same new key from its entry; the removed node opens none."""
    a, b, x = Replica.open(), Replica.open(), Replica.open()
    for r in (b, x):
        r.send_message(r.node_id[:4], "team", "hi")
        fill(r, a)
    key = os.urandom(32)
    a.remove_node(x.node_key, key, "0" * 16)
    fill(a, b)
    fill(a, x)
    assert a.fleet_keys().current == key and b.fleet_keys().current == key
    xk = x.fleet_keys()
    assert xk.current is None and xk.removed and xk.removed_by == a.node_key
    assert [m.content for m in x.message_log(None, 10).messages] == ["hi", "hi"]  # its own stays its own


def test_remove_refuses_itself_unknown_nodes_and_twice() -> None:
    """Clear errors, and nothing written, for each way removing cannot work."""
    a, x = Replica.open(), Replica.open()
    with pytest.raises(InvalidArgument, match="cannot remove itself"):
        a.remove_node(a.node_key, os.urandom(32), "0" * 16)
    with pytest.raises(NotFound, match="no node"):
        a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    a.admit_node(x.node_key, "x", "0" * 16)
    a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    ops = a.stats()["ops"]
    with pytest.raises(InvalidArgument, match="already removed"):
        a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    assert a.stats()["ops"] == ops


def test_admit_names_the_node_last_writer_wins() -> None:
    """Two admits of one node: every replica keeps the same one (the later by clock, then origin),
    whatever the order they arrive in."""
    a, b, c = Replica.open(), Replica.open(), Replica.open()
    node = os.urandom(32)
    a.admit_node(node, "first", "0" * 16)
    b.admit_node(node, "second", "1" * 16)
    fill(a, c)
    fill(b, c)
    fill(b, a)
    fill(a, b)
    stamps = {r.node_key: r.local_ops_after(0)[-1] for r in (a, b)}
    later = max((opsmod.decode(raw).hlc, origin) for origin, (_l, raw) in stamps.items())[1]
    expected = "first" if later == a.node_key else "second"
    assert {r.fleet_view().admitted[node].name for r in (a, b, c)} == {expected}


@pytest.mark.parametrize(("body", "reason"), [
    ({"e": 0, "f": "0" * 16, "ks": [], "rm": []}, "epoch"),
    ({"e": 1, "f": "xyz", "ks": [], "rm": []}, "fleet id"),
    ({"e": 1, "f": "0" * 16, "ks": [[b"k" * 32, b"short"]], "rm": []}, "sealed key entry"),
    ({"e": 1, "f": "0" * 16, "ks": [[b"k" * 32, b"e" * 80]], "rm": [[b"k" * 32, 1]]}, "removed node cannot"),
    ({"e": 1, "f": "0" * 16, "ks": [], "rm": [], "extra": 1}, "fields this release does not know"),
])
def test_malformed_rekey_bodies_are_refused(body: dict[str, object], reason: str) -> None:
    """A rekey op's body is checked like every op body: a bad one is an InvalidOp naming why."""
    with pytest.raises(InvalidOp, match=reason):
        opsmod.validate_body(mem.KIND_REKEY, body)


def test_an_admit_with_a_bad_name_is_refused() -> None:
    with pytest.raises(InvalidOp, match="name"):
        opsmod.validate_body(mem.KIND_ADMIT, {"k": b"k" * 32, "nm": "", "f": "0" * 16})
