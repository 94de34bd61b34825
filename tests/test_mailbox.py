"""A reader's mail (replica.mailbox, Replica.mail / record_delivered): routing as the pure rule says,
pending = never delivered, threads for the agent named like the role, and a read path that loads
nothing heavy."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from replica import Replica, agent_id_for
from replica.mailbox import broadcast_floor, connect, delivered_among, mail
from replica.routing import Envelope, visible_to

ROLES = ("alpha", "beta", "gamma")
INSTANCES = (None, "i1", "i2")

sends = st.lists(
    st.tuples(st.sampled_from(ROLES), st.sampled_from(INSTANCES),
              st.sampled_from(["alpha", "beta", "gamma", "beta, gamma", "broadcast"]), st.sampled_from(INSTANCES)),
    min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(sends, st.sampled_from(ROLES), st.sampled_from(INSTANCES))
def test_mail_is_the_unread_inbox_the_routing_rule_gives(batch: list[tuple[str, str | None, str, str | None]],
                                                          role: str, inst: str | None) -> None:
    """mail(role, instance) holds exactly the messages routing.visible_to gives that reader, in
    arrival order, and reading it writes nothing."""
    with Replica.open(":memory:") as r:
        expected = []
        for n, (sender, sender_inst, channel, target) in enumerate(batch):
            sent = r.send_message(sender, channel, f"m{n}", target, sender_inst)
            if visible_to(Envelope(sender, sender_inst, channel, target), role, inst):
                expected.append(sent.id)
        before = r.max_lseq()
        got = r.mail(role, inst, pending_only=False)
        assert [m.id for m in got] == expected
        assert [m.seq for m in got] == sorted(m.seq for m in got)
        assert r.max_lseq() == before


def test_pending_is_mail_never_delivered(mem: Replica) -> None:
    """A message delivered by check_messages or record_delivered leaves the pending mail but stays
    unread; record_delivered writes delivered, never read, and only once."""
    first = mem.send_message("alpha", "beta", "one").id
    second = mem.send_message("alpha", "beta", "two").id
    assert [m.id for m in mem.mail("beta")] == [first, second]
    mem.check_messages("beta", limit=1)
    pending = mem.mail("beta")
    assert [m.id for m in pending] == [second]
    assert mem.record_delivered(pending) == 1
    assert mem.record_delivered(pending) == 0  # already delivered: no new op
    assert mem.mail("beta") == []
    assert [(m.id, m.delivered is not None) for m in mem.mail("beta", pending_only=False)] == [(first, True),
                                                                                               (second, True)]
    assert all(s.read_at is None for s in mem.message_status(second))


def test_after_skips_earlier_arrivals(mem: Replica) -> None:
    """after= is an arrival position: only later mail is returned."""
    a = mem.send_message("alpha", "beta", "a")
    b = mem.send_message("alpha", "beta", "b")
    assert [m.id for m in mem.mail("beta", after=a.seq)] == [b.id]
    assert mem.mail("beta", after=b.seq) == []


def test_thread_mail_goes_to_the_agent_named_like_the_role(mem: Replica) -> None:
    """Others' posts in threads of the agent 'beta' are beta's mail (receipt of the agent); its own
    posts, threads it is not in, and what it marked read are not."""
    for name in ("alpha", "beta", "gamma"):
        mem.create_agent(name)
    a, b, g = (agent_id_for(n) for n in ("alpha", "beta", "gamma"))
    mine = mem.create_thread(a, b)
    other = mem.create_thread(a, g)
    mem.append(mine, b, "from beta itself")
    posted = mem.append(mine, a, "for beta")
    mem.append(other, a, "not beta's thread")
    got = mem.mail("beta")
    assert [(m.content, m.thread, m.thread_seq, m.sender, m.key[1:]) for m in got] == [
        ("for beta", mine, posted.seq, "alpha", (b, ""))]
    assert mem.mail("beta", threads=False) == []
    mem.mark_read(mine, b, posted.seq)
    assert mem.mail("beta", pending_only=False) == []


def test_broadcasts_count_within_the_roles_history() -> None:
    """A role's mail holds broadcasts from its broadcast history on (counted from now for a role
    never seen), as check_messages does; the light path's floor is the replica's."""
    day = 86_400_000
    clock = [1_000 * day]
    with Replica.open(":memory:", wall=lambda: clock[0], broadcast_history_ms=7 * day) as r:
        r.send_message("alpha", "broadcast", "ancient")
        clock[0] += 9 * day
        recent = r.send_message("alpha", "broadcast", "recent").id
        clock[0] += day
        assert [m.id for m in r.mail("late")] == [recent]
        with r._store.read() as cur:
            floor = broadcast_floor(cur, "late", clock[0], 7 * day)
            assert [m.id for m in mail(cur, "late", floor=floor)] == [recent]
        assert [m.id for m in r.check_messages("late").messages] == [recent]


def test_light_read_path_on_its_own_connection(file_replica: Replica) -> None:
    """mailbox.mail on a read-only connection sees what the replica wrote; delivered_among tells
    which receipts have a delivered time."""
    sent = file_replica.send_message("alpha", "beta", "x").id
    conn = connect(file_replica.path)
    try:
        got = mail(conn.cursor(), "beta", floor=0)
        assert [m.id for m in got] == [sent]
        assert delivered_among(conn.cursor(), [got[0].key]) == set()
        file_replica.record_delivered(got)
        assert delivered_among(conn.cursor(), [got[0].key]) == {got[0].key}
    finally:
        conn.close()


def test_reading_mail_loads_no_signing_or_store() -> None:
    """Importing replica.mailbox (what peerd hook reads with) loads neither nacl, msgpack nor the store."""
    code = ("import sys, replica.mailbox; heavy = {'nacl', 'msgpack', 'replica.store', 'replica.api', 'asyncio'}"
            " & set(sys.modules); print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
