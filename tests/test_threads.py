"""Agents and threads: the thread-bus semantics and its error messages."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from replica import InvalidArgument, NotFound, Replica, agent_id_for
from tests.conftest import pull
from tests.oldfiles import downgrade_to_v2


def test_agent_id_is_the_same_on_every_replica() -> None:
    """Two replicas creating 'alice' offline get the same agent id, and it converges to one agent."""
    a, b = Replica.open(), Replica.open()
    ida, idb = a.create_agent("alice"), b.create_agent("alice")
    assert ida == idb == agent_id_for("alice")
    pull(a, b)
    pull(b, a)
    assert [x.id for x in a.list_agents()] == [ida] and a.state_digest() == b.state_digest()


def test_create_agent_twice_is_taken(mem: Replica) -> None:
    """create_agent on an existing name raises ValueError('agent name taken'); get_or_create returns it."""
    aid = mem.create_agent("bob")
    with pytest.raises(ValueError, match="agent name taken"):
        mem.create_agent("bob")
    assert mem.get_or_create_agent("bob") == aid


def test_delete_agent_then_recreate(mem: Replica) -> None:
    """A deleted agent is gone from the list; its name can be created again."""
    aid = mem.create_agent("carol")
    mem.delete_agent(aid)
    assert mem.list_agents() == [] and mem.get_agent(aid) is not None and not mem.get_agent(aid).alive  # type: ignore[union-attr]
    with pytest.raises(NotFound, match="unknown agent"):
        mem.delete_agent(aid)
    assert mem.create_agent("carol") == aid


def test_thread_needs_two_participants(mem: Replica) -> None:
    """A thread of one agent (even listed twice) is refused with 'need >=2 participants'."""
    a = mem.create_agent("a")
    with pytest.raises(ValueError, match="need >=2 participants"):
        mem.create_thread(a, a)
    with pytest.raises(NotFound, match="unknown agent"):
        mem.create_thread(a, agent_id_for("ghost"))


def test_thread_conversation_poll_and_read_state(mem: Replica) -> None:
    """Append, poll after a seq, mark read up to a seq, and the unread counts follow."""
    a, b = mem.create_agent("a"), mem.create_agent("b")
    tid = mem.create_thread(a, b)
    assert mem.get_thread(tid).participants == sorted([a, b])  # type: ignore[union-attr]
    s1 = mem.append(tid, a, "hi b").seq
    s2 = mem.append(tid, b, "hi a").seq
    s3 = mem.append(tid, a, "how are you").seq
    assert (s1, s2, s3) == (1, 2, 3)
    assert [m.content for m in mem.poll(tid)] == ["hi b", "hi a", "how are you"]
    assert [m.seq for m in mem.poll(tid, after_seq=s1)] == [s2, s3]
    assert mem.has_unread(tid, b)
    state = mem.get_thread_read_state(tid, b)
    assert state is not None and (state.cursor, state.unread_count, state.unread_from_others) == (0, 3, 2)
    mem.mark_read(tid, b, s2)
    state = mem.get_thread_read_state(tid, b)
    assert state is not None and (state.cursor, state.unread_count, state.unread_from_others) == (s2, 1, 1)
    mem.mark_read(tid, b, s3)
    assert not mem.has_unread(tid, b)
    info = mem.get_thread_info(tid)
    assert info is not None and info.message_count == 3 and info.latest_activity is not None


def test_sender_must_be_in_thread(mem: Replica) -> None:
    """Appending as a non-participant raises 'sender not in thread' and writes nothing."""
    a, b, c = mem.create_agent("a"), mem.create_agent("b"), mem.create_agent("c")
    tid = mem.create_thread(a, b)
    before = mem.state_digest()
    with pytest.raises(ValueError, match="sender not in thread"):
        mem.append(tid, c, "let me in")
    assert mem.state_digest() == before
    mem.join_thread(tid, c)
    mem.append(tid, c, "joined")
    mem.leave_thread(tid, c)
    with pytest.raises(ValueError, match="sender not in thread"):
        mem.append(tid, c, "left already")
    with pytest.raises(InvalidArgument, match="agent not in thread"):
        mem.leave_thread(tid, c)


def test_find_threads_by_participants(mem: Replica) -> None:
    """find_threads returns threads containing all the given agents."""
    a, b, c = mem.create_agent("a"), mem.create_agent("b"), mem.create_agent("c")
    ab = mem.create_thread(a, b)
    abc = mem.create_thread(a, b, c)
    bc = mem.create_thread(b, c)
    assert mem.find_threads(a, b) == [ab, abc]
    assert mem.find_threads(c) == [abc, bc]
    assert mem.find_threads(a, c) == [abc]


def test_unknown_thread(mem: Replica) -> None:
    """Unknown threads: info and read state are None, other calls raise NotFound."""
    assert mem.get_thread_info("th_nope") is None
    assert mem.get_thread_read_state("th_nope", "x") is None
    assert mem.get_thread("th_nope") is None
    for call in (lambda: mem.poll("th_nope"), lambda: mem.append("th_nope", "a", "x"),
                 lambda: mem.has_unread("th_nope", "a"), lambda: mem.mark_read("th_nope", "a", 1)):
        with pytest.raises(NotFound, match="unknown thread"):
            call()


def test_threads_sync_between_replicas() -> None:
    """A thread created on one replica is usable on another after sync, and read state travels."""
    x, y = Replica.open(), Replica.open()
    a, b = x.create_agent("a"), x.create_agent("b")
    tid = x.create_thread(a, b)
    x.append(tid, a, "hello")
    pull(y, x)
    seq = y.append(tid, b, "hello back").seq
    y.mark_read(tid, b, seq)
    pull(x, y)
    assert [m.content for m in x.poll(tid)] == ["hello", "hello back"]
    assert not x.has_unread(tid, b)
    assert x.has_unread(tid, a)


def test_list_threads_names_participants_and_counts(mem: Replica) -> None:
    """The thread overview shows participants by name (ids alongside), counts and latest activity."""
    ann, bob = mem.create_agent("ann"), mem.create_agent("bob")
    tid = mem.create_thread(ann, bob)
    mem.append(tid, bob, "hello")
    [row] = mem.list_threads()
    assert (row.thread_id, sorted(row.participants), sorted(row.participant_ids)) == (
        tid, ["ann", "bob"], sorted([ann, bob]))
    assert row.message_count == 1 and row.latest_activity == mem.poll(tid)[0].created


def test_first_message_of_a_new_thread_is_seq_1_after_many_ops(mem: Replica) -> None:
    """seq numbers messages within their thread: a new thread starts at 1 whatever came before."""
    a, b = mem.create_agent("a"), mem.create_agent("b")
    old = mem.create_thread(a, b)
    for i in range(5):
        mem.append(old, a, f"old {i}")
        mem.send_message("tau", "phi", f"inbox {i}")
    new = mem.create_thread(a, b)
    first = mem.append(new, b, "first")
    assert first.seq == 1 and first.thread_id == new and mem.max_lseq() > 10
    assert [m.seq for m in mem.poll(new)] == [1]
    assert mem.append(old, a, "old again").seq == 6


def test_message_synced_late_takes_the_next_number_here() -> None:
    """A message written earlier on another node gets this replica's next thread number when it lands."""
    x, y = Replica.open(), Replica.open()
    a, b = x.create_agent("a"), x.create_agent("b")
    tid = x.create_thread(a, b)
    pull(y, x)
    early = y.append(tid, b, "written first, offline on y")
    x.append(tid, a, "x one")
    x.append(tid, a, "x two")
    assert early.seq == 1
    pull(x, y)
    assert [(m.seq, m.content) for m in x.poll(tid)] == [
        (1, "x one"), (2, "x two"), (3, "written first, offline on y")]
    assert [m.content for m in x.poll(tid, after_seq=2)] == ["written first, offline on y"]


def test_read_state_and_bounds_use_thread_numbers(file_replica: Replica) -> None:
    """cursor, mark_read and poll speak per-thread numbers; a seq beyond 2**53 - 1 is refused."""
    r = file_replica
    a, b = r.create_agent("a"), r.create_agent("b")
    t1, t2 = r.create_thread(a, b), r.create_thread(a, b)
    for i in range(3):
        r.append(t1, a, f"one {i}")
        r.append(t2, a, f"two {i}")
    r.mark_read(t2, b, 2)
    state = r.get_thread_read_state(t2, b)
    assert state is not None and (state.cursor, state.unread_count) == (2, 1)
    with pytest.raises(InvalidArgument, match="seq must be between"):
        r.mark_read(t2, b, 2**63)
    with pytest.raises(InvalidArgument, match="after_seq must be between"):
        r.poll(t2, after_seq=2**53)


def test_migration_numbers_existing_thread_messages_per_thread(tmp_path: Path) -> None:
    """A replica written before per-thread numbers gets them on open: per thread, in arrival order."""
    path = tmp_path / "old.db"
    with Replica.open(path) as r:
        a, b = r.create_agent("a"), r.create_agent("b")
        t1, t2 = r.create_thread(a, b), r.create_thread(a, b)
        for i in range(3):
            r.append(t1, a, f"one {i}")
            r.append(t2, b, f"two {i}")
        r.mark_read(t1, b, 2)
    _downgrade_to_v2(path)
    with Replica.open(path) as r:
        assert [(m.seq, m.content) for m in r.poll(t1)] == [(1, "one 0"), (2, "one 1"), (3, "one 2")]
        assert [(m.seq, m.content) for m in r.poll(t2)] == [(1, "two 0"), (2, "two 1"), (3, "two 2")]
        state = r.get_thread_read_state(t1, b)
        assert state is not None and state.cursor == 2
        assert r.append(t2, a, "after the upgrade").seq == 4


def _downgrade_to_v2(path: Path) -> None:
    """Turn a replica file back into schema v2 (no per-thread numbers, no name keys), as an older
    peerd left it: the same ops in the same arrival order."""
    downgrade_to_v2(path)


def test_agent_names_match_by_case_and_unicode_form(mem: Replica) -> None:
    """'Zoé', 'ZOÉ' and a decomposed 'zoe\\u0301' are one agent, shown as first written."""
    zoe = mem.create_agent("Zoé")
    assert mem.get_or_create_agent("ZOÉ") == zoe == agent_id_for("zoe\u0301")
    with pytest.raises(ValueError, match="agent name taken"):
        mem.create_agent("zoe\u0301")
    found = mem.find_agent(" zoé ")
    assert found is not None and (found.id, found.name) == (zoe, "Zoé")
    assert mem.find_agent("zoe") is None  # accents are not folded


def test_agent_registered_under_an_unkeyed_name_is_still_found(mem: Replica) -> None:
    """An agent whose id came from the exact spelling (before names were keyed) is found by any spelling."""
    legacy = "ag_" + hashlib.blake2b(b"Alice", digest_size=8, person=b"peerd-agent").hexdigest()
    mem._set([["agent", [legacy], "name", "Alice"], ["agent", [legacy], "alive", True]])
    found = mem.find_agent("ALICE")
    assert found is not None and found.id == legacy
    assert mem.get_or_create_agent("alice") == legacy
    with pytest.raises(ValueError, match="agent name taken"):
        mem.create_agent("Alice")
