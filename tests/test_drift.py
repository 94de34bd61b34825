"""Stamps from the future: a peer's op stamped further ahead of this replica's clock than the allowed
drift (60 s) is refused, in a batch or a snapshot page, with a reason that names the drift; nothing of
the batch is stored, the vector does not move past it, and the same op is taken once the clocks agree.
A local write is never refused for its clock (this replica's clock is the reference)."""

from __future__ import annotations

import pytest

from replica import Replica
from replica import hlc as hlcmod
from replica import ops as opsmod
from replica.errors import InvalidOp
from tests.conftest import pull
from tests.newer import NewerNode
from tests.snapshots import Server, busy_hub, take

NOW = 1_800_000_000_000  # a fixed wall clock, ms
DAY = 86_400_000


def at(ms_ahead: int, node: NewerNode, text: str = "hi") -> bytes:
    """A message of ``node`` (its next seq) stamped ``ms_ahead`` past ``NOW``."""
    node.seq += 1
    body = {"f": "alice", "fi": None, "c": "bob", "ti": None, "t": None, "x": text}
    return opsmod.encode(node.key, node.seq, hlcmod.pack(NOW + ms_ahead), "msg", body, sign=node.ident.sign)


def test_the_rule_names_the_drift() -> None:
    assert hlcmod.too_far_ahead(hlcmod.pack(NOW + 60_000), NOW) is None
    assert hlcmod.too_far_ahead(hlcmod.pack(NOW - 10 * DAY), NOW) is None  # the past is always taken
    why = hlcmod.too_far_ahead(hlcmod.pack(NOW + 10 * DAY), NOW)
    assert why is not None and why.startswith("stamped 864000 s ahead of this replica's clock; at most 60 s is allowed")


def test_an_op_ten_days_ahead_refuses_its_batch_and_changes_nothing() -> None:
    r = Replica.open(wall=lambda: NOW)
    node = NewerNode()
    fine = [at(0, node, "now"), at(30_000, node, "thirty seconds ahead")]
    future = at(10 * DAY, node, "ten days ahead")
    before = (r.state_digest(), r.vector(), r.stats(), r.clock())
    with pytest.raises(InvalidOp) as err:
        r.apply([*fine, future])
    assert str(err.value).startswith("invalid op: op #2: stamped 864000 s ahead of this replica's clock; "
                                     "at most 60 s is allowed")
    assert (r.state_digest(), r.vector(), r.stats(), r.clock()) == before
    assert r.apply(fine).new == 2  # within the drift: taken
    assert sorted(m.content for m in r.message_log().messages) == ["now", "thirty seconds ahead"]


def test_a_refused_op_is_offered_again_and_taken_once_the_clocks_agree() -> None:
    """Nothing is lost: the writer still holds it, the receiver's vector stays before it, so a later
    round offers it again, and it lands once the receiver's clock has caught up."""
    clock = [NOW]
    writer = Replica.open(wall=lambda: NOW + 10 * DAY)  # a machine whose clock is ten days ahead
    sent = writer.send_message("alice", "bob", "from a clock ten days ahead")  # its own clock: never refused
    assert writer.get_message(sent.id).content == "from a clock ten days ahead"
    reader = Replica.open(wall=lambda: clock[0])
    with pytest.raises(InvalidOp, match="ahead of this replica's clock"):
        pull(reader, writer)
    assert reader.vector().get(writer.node_key, 0) == 0
    clock[0] = NOW + 10 * DAY - 30_000
    pull(reader, writer)
    assert reader.get_message(sent.id).content == "from a clock ten days ahead"


def test_an_op_already_stored_is_never_judged_again() -> None:
    """The drift is judged on arrival only: an op held (taken when it was within the drift) is skipped
    as a duplicate, whatever the clock says now."""
    clock = [NOW + 10 * DAY]
    r = Replica.open(wall=lambda: clock[0])
    node = NewerNode()
    raw = at(10 * DAY, node)
    assert r.apply([raw]).new == 1
    clock[0] = NOW
    assert r.apply([raw]).new == 0


def test_a_snapshot_page_with_an_op_past_the_drift_is_refused() -> None:
    hub = busy_hub(messages=5, wall=lambda: NOW + 10 * DAY)
    taker = Replica.open(wall=lambda: NOW)
    with pytest.raises(InvalidOp, match="ahead of this replica's clock; at most 60 s is allowed"):
        take(taker, Server(hub))
    assert taker.vector().get(hub.node_key, 0) == 0
    behind = Replica.open(wall=lambda: NOW + 10 * DAY)
    take(behind, Server(hub))
    assert behind.state_digest() == hub.state_digest()
