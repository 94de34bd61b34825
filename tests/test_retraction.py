"""Retraction (delete_message): a signed op by the sender role that every replica applies, in any order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replica import InvalidArgument, NotFound, Replica, identity
from replica.ops import KIND_RETRACT, encode
from tests.conftest import pull, sync_all


def content_column(r: Replica, mid: str) -> Any:
    """The stored column itself, not what the API shows (None too when the message is not held: a
    retracted message's op leaves its origin, so a replica that never held it never gets it)."""
    with r._store.read() as cur:
        row = cur.execute("SELECT content FROM ops WHERE id = ?", (mid,)).fetchone()
        return None if row is None else row[0]


def test_only_the_sender_role_may_retract_and_names_match_by_key(mem: Replica) -> None:
    """Another role is refused and nothing is written; the sender, spelt in any case, may."""
    sent = mem.send_message("Alpha", "beta", "oops, wrong secret")
    before = mem.state_digest()
    with pytest.raises(InvalidArgument, match="only the sender role 'Alpha' may delete"):
        mem.retract_message(sent.id, "beta")
    assert mem.state_digest() == before
    gone = mem.retract_message(sent.id, "ALPHA")
    assert gone.content is None and gone.retracted is not None
    assert mem.retract_message(sent.id, "alpha") == gone  # again: nothing new written
    with pytest.raises(NotFound, match="unknown message id"):
        mem.retract_message("0123456789abcdef-9", "alpha")


def test_retracted_message_leaves_inbox_search_and_log_and_its_content_is_dropped(mem: Replica) -> None:
    """The content column and the search entry are gone; status and get_message show it retracted."""
    kept = mem.send_message("alpha", "beta", "a zebra crossing")
    sent = mem.send_message("alpha", "beta, gamma", "the zebra password is hunter2")
    assert len(mem.search_messages("zebra")) == 2  # indexed before the retraction
    delivered = mem.check_messages("beta").messages
    mem.retract_message(sent.id, "alpha")
    assert content_column(mem, sent.id) is None
    assert [h.id for h in mem.search_messages("zebra")] == [kept.id]
    assert mem.search_messages("hunter2") == []
    assert [m.id for m in mem.check_messages("beta").messages] == [kept.id]
    assert [m.id for m in mem.inbox_all("gamma").messages] == []
    assert next(m for m in mem.message_log().messages if m.id == sent.id).content == ""
    assert mem.get_message(sent.id).retracted is not None
    assert {s.role for s in mem.message_status(sent.id)} == {"beta", "gamma"}  # receipts stay, as history
    assert any(m.id == sent.id for m in delivered)


def test_retraction_replicates_and_wins_even_when_it_arrives_first() -> None:
    """A replica that gets the retraction before the message never stores the content; all converge."""
    a, b, c = Replica.open(), Replica.open(), Replica.open()
    sent = a.send_message("alpha", "beta", "secret")
    pull(b, a)
    b.retract_message(sent.id, "alpha")  # retracted on another machine than the sender's
    retraction = [raw for _, raw in b.ops_after(0) if raw not in {r for _, r in a.ops_after(0)}]
    c.apply(retraction)  # c learns of the retraction first
    assert c.search_messages("secret") == []
    pull(c, a)
    assert content_column(c, sent.id) is None and c.check_messages("beta").messages == []
    sync_all([a, b, c])  # c's inbox check wrote ops of its own (delivery, first seen)
    assert content_column(a, sent.id) is None and content_column(b, sent.id) is None
    assert a.state_digest() == b.state_digest() == c.state_digest()


def test_a_retraction_by_another_role_from_a_peer_has_no_effect() -> None:
    """An op that claims another role than the sender's is stored (the log stays whole) but changes nothing."""
    a, b = Replica.open(), Replica.open()
    sent = a.send_message("alpha", "beta", "mine")
    pull(b, a)
    rogue = identity.generate()
    raw = encode(rogue.public_key, 1, 1 << 16, KIND_RETRACT, {"m": sent.id, "f": "mallory"}, sign=rogue.sign)
    assert b.apply([raw]).new == 1
    assert b.get_message(sent.id).content == "mine" and b.get_message(sent.id).retracted is None


def test_thread_messages_cannot_be_retracted(mem: Replica) -> None:
    """Retraction is for channel messages; a thread message is refused."""
    x, y = mem.create_agent("x"), mem.create_agent("y")
    tid = mem.create_thread(x, y)
    mem.append(tid, x, "hello")
    [msg] = mem.poll(tid)
    with pytest.raises(InvalidArgument, match="thread messages cannot be retracted"):
        mem.retract_message(msg.id, x)


def _held(r: Replica, mid: str) -> bool:
    with r._store.read() as cur:
        return cur.execute("SELECT 1 FROM ops WHERE id = ?", (mid,)).fetchone() is not None


actions = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["send", "retract", "read"])), min_size=1,
                   max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=actions, data=st.data())
def test_retractions_converge_in_any_order(plan: list[tuple[int, str]], data: st.DataObject) -> None:
    """Messages, retractions and reads from three origins, applied in any order and batching, give one state."""
    origins = [Replica.open() for _ in range(3)]
    sent: list[tuple[str, str]] = []
    for who, act in plan:
        r = origins[who]
        if act == "send" or not sent:
            role = data.draw(st.sampled_from(["alpha", "ALPHA", "beta"]), label="sender")
            sent.append((r.send_message(role, "gamma", f"m{len(sent)}").id, role))
        elif act == "retract":
            mid, role = data.draw(st.sampled_from(sent), label="retracted")
            pull(r, origins[(who + 1) % 3])
            pull(r, origins[(who + 2) % 3])
            if _held(r, mid):  # (retracted on its origin before it reached here: it never will)
                r.retract_message(mid, role.lower())
        else:
            ids = [m.receipt_id for m in r.check_messages("gamma").messages]
            if ids:
                r.mark_as_read(ids)
    everything = [raw for r in origins for _, raw in r.ops_after(0, 100_000)]
    reference = Replica.open()
    reference.apply(everything)
    retracted = {m for m, _ in sent if content_column(reference, m) is None}
    assert all(reference.get_message(m).retracted is not None for m in retracted if _held(reference, m))
    for _ in range(2):
        replica = Replica.open()
        shuffled = data.draw(st.permutations(everything), label="order")
        while shuffled:
            n = data.draw(st.integers(1, len(shuffled)), label="batch")
            replica.apply(shuffled[:n])
            shuffled = shuffled[n:]
        assert replica.state_digest() == reference.state_digest()
        assert {m for m, _ in sent if content_column(replica, m) is None} == retracted
        assert {h.id for h in replica.search_messages("m", prefix=True)} == {m for m, _ in sent} - retracted
