"""Purging past the retention horizon on real replicas (SQLite, in memory and in files)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replica import InvalidArgument, Replica, identity, ops, schema, vector
from replica import retention as ret
from replica.hlc import pack, wall_of
from tests.conftest import pull
from tests.oldfiles import undo_members, undo_roles_seen

H = 10_000  # the horizon of these tests: 10 s of a fake clock
T0 = 1_800_000_000_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def replica(clock: Clock, path: str | Path = ":memory:") -> Replica:
    return Replica.open(path, wall=clock)


def raws(r: Replica) -> list[bytes]:
    return [raw for _, raw in r.ops_after(0, 100_000)]


def held(r: Replica) -> set[tuple[str, int]]:
    """(origin, seq) of every op a replica holds."""
    with r._store.read() as cur:
        return {(bytes(n).hex(), int(s)) for n, s in cur.execute(
            "SELECT g.node, o.seq FROM ops o JOIN origins g ON g.oid = o.oid WHERE o.seq > 0")}


def messages(r: Replica) -> set[str]:
    return {m.id for m in r.message_log(0, 1000).messages}


def rows(r: Replica, sql: str, *args: Any) -> list[Any]:
    with r._store.read() as cur:
        return cur.execute(sql, args).fetchall()


def read_all(r: Replica, role: str) -> list[str]:
    got = r.check_messages(role)
    if got.messages:
        r.mark_as_read([m.receipt_id for m in got.messages])
    return [m.id for m in got.messages]


# -- what leaves, what stays -------------------------------------------------------------------------


def test_read_mail_leaves_after_the_horizon_unread_after_twice_it() -> None:
    """A read message leaves once older than the horizon; an unread one stays until twice the horizon."""
    clock = Clock()
    a, b = replica(clock), replica(clock)
    a.set_retention(H)
    read = a.send_message("alice", "bob", "read words").id
    unread = a.send_message("alice", "carol", "unread words").id
    pull(b, a)
    assert read_all(b, "bob") == [read]
    pull(a, b)
    clock.now += H - 1
    assert a.purge().removed == ret.Removed() and messages(a) == {read, unread}  # not yet past it
    clock.now += 2
    report = a.purge()
    assert messages(a) == {unread} and report.removed.messages == 1 and report.removed.receipts == 1
    clock.now += H
    a.purge()
    assert messages(a) == set()
    assert a.search_messages("words") == []


def test_a_purge_takes_receipts_search_rows_routes_and_thread_numbers_with_the_message() -> None:
    """Nothing filed under a purged message is left: receipts (projection and registers), search rows,
    routes of a multi-role message, its thread number."""
    clock = Clock()
    a = replica(clock)
    a.set_retention(H)
    to_two = a.send_message("alice", "bob,carol", "for two readers").id
    x, y = a.get_or_create_agent("x"), a.get_or_create_agent("y")
    thread = a.create_thread(x, y)
    in_thread = a.append(thread, x, "in a thread").id
    read_all(a, "bob")
    read_all(a, "carol")
    a.catch_up()
    assert rows(a, "SELECT count(*) FROM routes")[0][0] == 2 and a.search_messages("readers")
    clock.now += 2 * H + 1
    a.purge()
    assert not messages(a) & {to_two, in_thread}
    assert rows(a, "SELECT count(*) FROM routes") == [(0,)]
    assert rows(a, "SELECT count(*) FROM receipts") == [(0,)]
    assert rows(a, "SELECT count(*) FROM lww WHERE tbl = 'rcpt'") == [(0,)]
    assert rows(a, "SELECT count(*) FROM message_fts") == [(0,)]
    assert rows(a, "SELECT count(*) FROM thread_seqs WHERE lseq > 0") == [(0,)]
    assert a.search_messages("readers") == [] and a.search_messages("thread") == []
    assert a.get_thread(thread) is not None  # the thread and its members stay


def test_what_is_never_purged() -> None:
    """Membership ops, the ret op in force, profiles, agents and threads stay, however old."""
    clock = Clock()
    a = replica(clock)
    a.admit_node(identity.generate().public_key, "other", "0" * 16)
    a.update_profile("tau", name="Tau")
    a.get_or_create_agent("x")
    a.set_retention(2 * H)
    a.set_retention(H)  # supersedes the first
    kept = held(a)
    clock.now += 100 * H
    a.purge()
    assert held(a) == kept - {(a.node_id, 4)}  # only the superseded ret op left
    assert a.retention().horizon_ms == H and a.get_profile("tau") is not None
    assert [p.name for p in a.list_profiles()] == ["Tau"]


def test_a_hole_is_never_purged() -> None:
    """Ops above their origin's contiguous mark stay until the hole is filled (the vector means held or purged)."""
    clock = Clock()
    src, dst = replica(clock), replica(clock)
    src.set_retention(H)
    for i in range(3):
        src.send_message("alice", "bob", f"m{i}")
    first, second, third, fourth = raws(src)
    dst.apply([first, third, fourth])  # the ret op, then seq 3 and 4 with seq 2 missing
    clock.now += 3 * H
    dst.purge()
    assert len(messages(dst)) == 2 and dst.vector()[src.node_key] == 1
    dst.apply([second])
    dst.purge()
    assert messages(dst) == set() and dst.vector()[src.node_key] == 4


def test_unread_is_per_role_and_per_receipt() -> None:
    """A multi-role message read by one role only, and a broadcast one reader has not read, stay past the horizon."""
    clock = Clock()
    a = replica(clock)
    a.set_retention(H)
    two = a.send_message("alice", "bob,carol", "to two").id
    everyone = a.send_message("alice", "broadcast", "to all").id
    nobody_yet = a.send_message("alice", "broadcast", "for instance z only", "z").id  # no reader has it
    read_all(a, "bob")
    a.check_messages("carol")  # delivered, not read
    clock.now += H + 1
    a.purge()
    assert messages(a) == {two, everyone, nobody_yet}
    read_all(a, "carol")
    read_all(a, "bob")
    a.purge()
    assert messages(a) == {nobody_yet}  # never received: unread until twice the horizon
    clock.now += H
    a.purge()
    assert messages(a) == set()


def test_retraction_keeps_working_across_the_horizon() -> None:
    """An unread message kept past the horizon can still be retracted (it then leaves); a retraction that arrives
    after its message was purged changes nothing and leaves nothing behind."""
    clock = Clock()
    a, b = replica(clock), replica(clock)
    a.set_retention(H)
    kept = a.send_message("alice", "bob", "kept unread").id
    gone = a.send_message("alice", "carol", "read and gone").id
    pull(b, a)
    read_all(b, "carol")
    clock.now += H + 1
    a.retract_message(kept, "alice")
    b.retract_message(gone, "alice")  # b still holds it
    a.purge()
    assert messages(a) == {gone}  # the retracted one is in no inbox: read
    pull(a, b)  # carol's receipt and b's retraction of the message a still holds
    a.purge()
    assert messages(a) == set()
    assert rows(a, "SELECT count(*) FROM retractions") == [(0,)]
    clock.now += 2 * H
    a.purge()
    assert rows(a, "SELECT count(*) FROM retractions") == [(0,)] and messages(a) == set()


def test_a_receipt_that_lands_after_its_message_was_purged_files_nothing() -> None:
    """Receipts of a message already purged here are dropped at the next pass; the op goes at twice the horizon."""
    clock = Clock()
    a, b = replica(clock), replica(clock)
    a.set_retention(H)
    mid = a.send_message("alice", "bob", "hello").id
    pull(b, a)
    clock.now += 2 * H + 1
    a.purge()
    assert messages(a) == set()
    read_all(b, "bob")  # b has not purged yet: bob reads it there
    pull(a, b)
    assert rows(a, "SELECT count(*) FROM receipts") == [(1,)]
    a.purge()
    assert rows(a, "SELECT count(*) FROM receipts") == [(0,)]
    assert rows(a, "SELECT count(*) FROM lww WHERE tbl = 'rcpt'") == [(0,)]
    assert mid not in messages(a)


# -- numbers never go back ---------------------------------------------------------------------------------


def test_the_next_own_op_after_a_purge_takes_the_next_seq() -> None:
    """After its own ops are purged a node signs seq top + 1, never a seq it signed before; its vector and clock
    never go back."""
    clock = Clock()
    a, b = replica(clock), replica(clock)
    a.set_retention(H)
    for i in range(3):
        a.send_message("alice", "broadcast", f"m{i}")
    pull(b, a)
    b.set_retention(H)
    pull(a, b)
    stamp = a.clock()
    clock.now += 3 * H
    a.purge()
    assert all(o != a.node_id for o, _ in held(a))
    assert a.vector()[a.node_key] == 4
    clock.now -= 10 * H  # even with the wall clock set back
    sent = a.send_message("alice", "bob", "after")
    assert sent.id.endswith("-5") and sent.hlc > stamp
    clock.now = sent.hlc >> 16  # b's clock is right: a's op is neither past the drift nor past the horizon for it
    assert b.apply(raws(a)).new == 1  # b takes it: a new seq, not a replay


def test_local_positions_and_thread_numbers_are_never_given_twice() -> None:
    """Purging the newest op and a thread's newest message leaves floors: new ops and thread messages get new numbers."""
    clock = Clock()
    a = replica(clock)
    a.set_retention(H)
    x, y = a.get_or_create_agent("x"), a.get_or_create_agent("y")
    thread = a.create_thread(x, y)
    first, second = a.append(thread, x, "one"), a.append(thread, x, "two")
    top = a.max_lseq()
    clock.now += 3 * H
    a.purge()
    assert rows(a, "SELECT count(*) FROM ops WHERE id IS NOT NULL") == [(0,)]
    assert a.max_lseq() == top  # the newest row stays, emptied: the change feed's mark never goes back
    assert a.poll(thread) == []
    again = a.append(thread, x, "three")
    assert (first.seq, second.seq, again.seq) == (1, 2, 3)
    assert a.max_lseq() > top
    assert [m.content for m in a.poll(thread)] == ["three"]
    assert [m.content for m in a.poll(thread, 2)] == ["three"]  # a poller's cursor from before still works


# -- the op --------------------------------------------------------------------------------------------------


def test_the_latest_setting_wins_on_every_replica() -> None:
    """Two members set the horizon apart; after sync both hold the later one (last writer wins)."""
    clock = Clock()
    a, b = replica(clock), replica(clock)
    a.set_retention(H)
    clock.now += 1
    b.set_retention(3 * H)
    pull(a, b)
    pull(b, a)
    assert a.retention().horizon_ms == b.retention().horizon_ms == 3 * H
    assert a.retention().set_by == b.node_id and a.state_digest() == b.state_digest()
    a.set_retention(0)
    pull(b, a)
    assert b.horizon_ms() == 0 and b.retention().horizon == "forever"


def test_a_removed_node_cannot_set_the_horizon() -> None:
    """The removed node's own replica refuses to write it; a member refuses its op; nothing changes."""
    clock = Clock()
    a, x = replica(clock), replica(clock)
    x.send_message("x", "team", "before")
    pull(a, x)
    a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    pull(x, a)
    with pytest.raises(InvalidArgument, match="removed from the fleet"):
        x.set_retention(H)
    ident = x._ident
    raw = ops.encode(ident.public_key, 2, pack(clock.now), ret.KIND_RET, ret.ret_body(H), sign=ident.sign)
    before = a.state_digest()
    result = a.apply([raw])
    assert (result.new, result.refused) == (0, 1)
    assert a.horizon_ms() == 0 and a.state_digest() == before


def test_bad_horizons_are_refused_before_anything_is_written() -> None:
    """A horizon that is negative, not an integer or beyond a century writes nothing."""
    a = replica(Clock())
    for bad in (-1, 1.5, True, ret.MAX_HORIZON_MS + 1):
        with pytest.raises(InvalidArgument, match="horizon_ms"):
            a.set_retention(bad)  # type: ignore[arg-type]
    assert a.max_lseq() == 0


# -- passes and steps --------------------------------------------------------------------------------------


def test_a_pass_in_small_steps_removes_what_one_big_step_does() -> None:
    """Steps look at a bounded number of rows and pick up where the last stopped; the result is the same."""
    clock = Clock()
    src = replica(clock)
    src.set_retention(H)
    for i in range(40):
        src.send_message("alice", "bob" if i % 2 else "carol", f"m{i}")
    read_all(src, "bob")
    small, big = replica(clock), replica(clock)
    for r in (small, big):
        r.apply(raws(src))
    clock.now += H + 1
    sweep, steps = small.start_purge(), 0
    while not sweep.done:
        sweep, steps = small.purge_step(sweep, limit=3), steps + 1
    assert steps > 10 and sweep.removed.messages == 20
    assert big.purge().removed.messages == 20
    assert held(small) == held(big) and small.state_digest() == big.state_digest()


def test_what_sync_may_drop_on_arrival_is_what_a_pass_would_purge() -> None:
    """The ops purgeable on arrival (the message, the receipt-only op, the retraction) are the ones a pass over
    a replica that stored them removes; the horizon, a mixed set op (first sighting and delivery) and the
    sighting of the sender a retraction writes beside it stay."""
    clock = Clock()
    src = replica(clock)
    src.set_retention(H)
    mid = src.send_message("alice", "bob", "old").id
    read_all(src, "bob")  # one op: bob first seen, and delivered; then one op: read
    before = raws(src)  # (a retracted message's op leaves its origin too: taken while it is held)
    src.retract_message(mid, "alice")
    clock.now += 2 * H + 1
    sent = before + [raw for raw in raws(src) if raw not in before]
    every = [ops.decode(raw) for raw in sent]
    assert [op.kind for op in every] == ["ret", "msg", "set", "set", "set", "rtr"]
    assert [ret.purgeable_on_arrival(op, H, clock.now) for op in every] == [False, True, False, True, False, True]
    stored = replica(clock)
    stored.apply(sent)
    stored.purge()
    kept = {(op.origin.hex(), op.seq) for op in every if not ret.purgeable_on_arrival(op, H, clock.now)}
    assert held(stored) == kept


# -- the file shrinks ---------------------------------------------------------------------------------------


def bytes_on_disk(path: Path) -> int:
    """The main file's size once every WAL frame is in it (what the disk holds for good)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()
    return path.stat().st_size


def test_an_op_purgeable_on_arrival_above_a_hole_does_not_hold_its_origin_back() -> None:
    """An expired message that lands before an earlier op of its origin is stored, not dropped: a
    dropped seq above the mark would be forgotten, and the origin's mark (and every later purge of
    its ops) stuck below it. Once the hole fills, the mark passes it and a pass purges it."""
    clock = Clock()
    src = replica(clock)
    src.set_retention(H)
    src.send_message("alice", "bob", "first")
    src.send_message("alice", "dave", "second")
    src.send_message("alice", "carol", "third")
    clock.now += 2 * H + 1  # all three messages are now purgeable on arrival
    ret_op, first, second, third = raws(src)
    r, at_once = replica(clock), replica(clock)
    r.apply([ret_op])
    r.apply([third])  # seqs 2 and 3 not here yet
    r.apply([first])
    r.apply([second])
    at_once.apply([ret_op, first, second, third])
    origin = src.node_key
    mark = "SELECT contig, top FROM origins WHERE node = ?"
    assert rows(r, mark, origin) == rows(at_once, mark, origin) == [(4, 4)]
    for x in (r, at_once):
        x.purge()
    assert held(r) == held(at_once) == {(origin.hex(), 1)} and r.state_digest() == at_once.state_digest()



@settings(deadline=None)
@given(start=st.integers(0, 5), held_=st.sets(st.integers(1, 20)), gone=st.sets(st.integers(1, 20)))
def test_the_seqs_gone_above_a_hole_are_exactly_those_the_mark_cannot_reach(start: int, held_: set[int],
                                                                          gone: set[int]) -> None:
    """``vector.stranded`` (the one rule op batches and snapshot pages share): storing the stranded
    ops instead of counting them as gone leaves the mark where counting all of them would move it,
    and every op dropped as gone is one the mark passes."""
    late = vector.stranded(start, held_, gone)
    reach = vector.contiguous(start, held_ | gone)
    assert late <= gone and all(s > reach for s in late)
    assert vector.contiguous(start, held_ | late | (gone - late)) == reach
    assert all(s <= reach for s in gone - late)
    assert vector.stranded(start, held_, gone - late) == set()  # what is left to drop is all reachable


def test_an_op_gone_right_after_the_mark_is_not_stranded_and_one_after_a_hole_is() -> None:
    assert vector.stranded(3, [5], [4, 7]) == {7}
    assert vector.stranded(0, [], [2, 3]) == {2, 3}
    assert vector.stranded(0, [2], [1, 3]) == set()

def fill(r: Replica, n: int) -> None:
    for i in range(n):
        r.send_message("alice", "bob", f"{i} " + os.urandom(1500).hex())


def test_the_file_shrinks_after_a_purge(tmp_path: Path) -> None:
    """Bytes on disk go down by most of what the purged messages took: their rows, and their search entries'
    data (merged out of the index), given back by incremental vacuum."""
    clock = Clock()
    r = replica(clock, tmp_path / "replica.db")
    r.set_retention(H)
    fill(r, 400)
    while r.catch_up_step(7):  # indexed as a daemon does, a little at a time: many index segments
        pass
    before = bytes_on_disk(tmp_path / "replica.db")
    clock.now += 2 * H + 1
    report = r.purge()
    after = bytes_on_disk(tmp_path / "replica.db")
    assert report.removed.messages == 400
    assert after < before / 4, (before, after)
    assert rows(r, "SELECT count(*) FROM message_fts_data") < [(10,)]
    assert report.bytes_after < report.bytes_before / 4
    assert rows(r, "PRAGMA auto_vacuum") == [(2,)] and r.integrity_check() == "ok"


def test_a_file_made_before_retention_is_vacuumed_once_when_a_horizon_first_takes_effect(tmp_path: Path) -> None:
    """A file without incremental vacuum (as older peerd made them) is rewritten once by the first purge."""
    db = tmp_path / "replica.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("CREATE TABLE meta(k TEXT PRIMARY KEY, v) WITHOUT ROWID")
    conn.execute("DROP TABLE meta")  # the file's header now says no auto-vacuum, and it holds no tables
    conn.close()
    clock = Clock()
    r = replica(clock, db)
    assert rows(r, "PRAGMA auto_vacuum") == [(0,)]
    r.set_retention(H)
    fill(r, 300)
    before = bytes_on_disk(db)
    clock.now += 2 * H + 1
    r.purge()
    assert rows(r, "PRAGMA auto_vacuum") == [(2,)]
    assert bytes_on_disk(db) < before / 4
    fill(r, 50)
    clock.now += 3 * H
    r.purge()  # from now on, incremental
    assert r.integrity_check() == "ok" and messages(r) == set()


def test_an_older_file_gets_the_index_by_creation_time(tmp_path: Path) -> None:
    """Opening a file of the schema before retention adds the index purges walk (a migration, nothing
    rebuilt)."""
    db = tmp_path / "replica.db"
    r = replica(Clock(), db)
    r.send_message("alice", "bob", "hi")
    digest = r.state_digest()
    r.close()
    conn = sqlite3.connect(db)
    conn.execute("DROP INDEX ops_by_hlc")
    conn.execute("DROP TABLE role_pins")  # v9, after v8's index
    for table in ("leases", "lease_changes", "lease_losses"):  # and what the migrations after it added
        conn.execute(f"DROP TABLE {table}")
    conn.execute("ALTER TABLE receipts DROP COLUMN acked")
    undo_roles_seen(conn)
    undo_members(conn)
    conn.execute("DROP TABLE pin_held")
    before = schema.MIGRATIONS.index(schema.SCHEMA_RETENTION)
    conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (before,))
    conn.commit()
    conn.close()
    again = replica(Clock(), db)
    assert rows(again, "SELECT name FROM sqlite_master WHERE name = 'ops_by_hlc'") == [("ops_by_hlc",)]
    assert again.state_digest() == digest


# -- order and repetition -------------------------------------------------------------------------------------

ROLES = ["bob", "carol", "dave"]
action = st.one_of(
    st.tuples(st.just("send"), st.sampled_from([*ROLES, "bob,carol", "broadcast"])),
    st.tuples(st.just("check"), st.sampled_from(ROLES)),
    st.tuples(st.just("read"), st.sampled_from(ROLES)),
    st.tuples(st.just("retract"), st.none()),
    st.tuples(st.just("wait"), st.integers(0, 2 * H)),
)


def _act(r: Replica, clock: Clock, act: tuple[str, Any]) -> None:
    kind, arg = act
    if kind == "send":
        r.send_message("alice", arg, f"to {arg}")
    elif kind == "check":
        r.check_messages(arg)
    elif kind == "read":
        read_all(r, arg)
    elif kind == "retract":
        mine = [m for m in r.list_messages(from_="alice").messages if m.retracted is None]
        if mine:
            r.retract_message(mine[-1].id, "alice")
    else:
        clock.now += arg


def _deliver(r: Replica, order: list[bytes], data: st.DataObject, end: int, *, passes: bool) -> None:
    """Apply ``order`` in random batches, with passes at random earlier times in between if ``passes``."""
    i = 0
    while i < len(order):
        n = data.draw(st.integers(1, len(order) - i), label="batch")
        r.apply(order[i:i + n])
        i += n
        if passes and data.draw(st.booleans(), label="pass between"):
            r.purge(end - data.draw(st.integers(0, H), label="earlier"))


def _plan(plan: list[tuple[int, tuple[str, Any]]], data: st.DataObject, clock: Clock) -> list[bytes]:
    """Run ``plan`` on three writers that sometimes sync; every op they wrote."""
    writers = [replica(clock) for _ in range(3)]
    writers[0].set_retention(H)
    every = dict.fromkeys(raws(writers[0]))
    for who, act in plan:
        if data.draw(st.booleans(), label="gossip"):
            pull(writers[who], writers[(who + 1) % 3])
        _act(writers[who], clock, act)
        every.update(dict.fromkeys(raws(writers[who])))  # taken as written: a retracted message's op leaves its origin
    return list(every)


def _created(every: list[bytes]) -> dict[str, int]:
    return {ops.message_id(op.origin, op.seq): wall_of(op.hlc) for op in map(ops.decode, every) if op.kind == "msg"}


PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PLANS = st.lists(st.tuples(st.integers(0, 2), action), min_size=1, max_size=30)


@PROPERTY
@given(plan=PLANS, age=st.integers(0, 3 * H), data=st.data())
def test_a_purge_does_not_depend_on_arrival_order_and_purging_twice_is_purging_once(
        plan: list[tuple[int, tuple[str, Any]]], age: int, data: st.DataObject) -> None:
    """The same ops, reaching two replicas in different orders and batches, purged at the same time: the same
    ops and state remain; a second pass removes nothing; what is left obeys the horizon."""
    clock = Clock()
    every = _plan(plan, data, clock)
    end = clock.now + age
    a, b = replica(clock), replica(clock)
    for r in (a, b):
        _deliver(r, data.draw(st.permutations(every), label="order"), data, end, passes=False)
        r.purge(end)
    assert held(a) == held(b) and a.state_digest() == b.state_digest()
    kept, digest = held(a), a.state_digest()
    assert a.purge(end).removed == ret.Removed() and held(a) == kept and a.state_digest() == digest
    soft, hard = ret.cutoffs(H, end)
    for mid, created in _created(every).items():
        assert (created >= hard or mid not in messages(a)) and (created < soft or mid in messages(a))


@PROPERTY
@given(plan=PLANS, age=st.integers(0, 3 * H), data=st.data())
def test_passes_run_while_ops_arrive_only_ever_purge_ahead_and_agree_past_twice_the_horizon(
        plan: list[tuple[int, tuple[str, Any]]], age: int, data: st.DataObject) -> None:
    """Passes between arrivals judge by what has arrived: they keep no op a pass over everything would purge,
    what they purged early is only messages then judged read, and past twice the horizon both agree."""
    clock = Clock()
    every = _plan(plan, data, clock)
    end = clock.now + age
    early, late = replica(clock), replica(clock)
    _deliver(early, data.draw(st.permutations(every), label="order"), data, end, passes=True)
    late.apply(every)
    for r in (early, late):
        r.purge(end)
    assert held(early) <= held(late)
    soft, hard = ret.cutoffs(H, end)
    created = _created(every)
    for mid in messages(late) - messages(early):
        assert hard <= created[mid] < soft  # judged read early, unread once every receipt was in
    assert all(f"{o[:16]}-{s}" in created for o, s in held(late) - held(early))  # only those messages
    final = end + 2 * H
    for r in (early, late):
        r.purge(final)
    assert held(early) == held(late) and early.state_digest() == late.state_digest()
