"""Acknowledgements: a message that asks for one, the recipient's acknowledgement syncing like a
receipt, the status and overdue views, bad calls, and what older releases are sent."""

from __future__ import annotations

import pytest

from replica import InvalidArgument, NotFound, Replica
from replica import ops as opsmod
from tests.conftest import sync_all


def test_an_acknowledgement_syncs_to_the_sender_and_leaves_the_overdue_view() -> None:
    with Replica.open() as a, Replica.open() as b:
        mid = a.send_message("alice", "bob,carol", "deploy at noon?").id
        a.require_ack(mid)
        sync_all([a, b])
        assert b.ack_required(mid)
        assert [(o.message_id, sorted(w.role for w in o.waiting_for)) for o in a.overdue_acks(0)] == \
            [(mid, ["bob", "carol"])]
        done = b.acknowledge(mid, "bob")
        assert done.acknowledged and done.acknowledged_at and done.read_at
        assert b.acknowledge(mid, "Bob") == done  # twice: the first time stands, nothing written
        sync_all([a, b])
        status = {s.role: (s.state, s.acked_at is not None) for s in a.message_status(mid)}
        assert status == {"bob": ("read", True), "carol": ("pending", False)}
        assert [[w.role for w in o.waiting_for] for o in a.overdue_acks(0)] == [["carol"]]
        assert a.overdue_acks(3600) == []  # not overdue yet when the wait is an hour


def test_only_a_recipient_acknowledges_and_unknown_messages_are_not_found() -> None:
    with Replica.open() as r:
        mid = r.send_message("alice", "bob", "hi").id
        r.require_ack(mid)
        before = r.vector()
        with pytest.raises(InvalidArgument, match="not addressed to mallory"):
            r.acknowledge(mid, "mallory")
        with pytest.raises(NotFound):
            r.acknowledge("0011223344556677-9", "bob")
        with pytest.raises(NotFound):
            r.require_ack("0011223344556677-9")
        assert r.vector() == before


def test_the_message_reaches_first_release_peers_and_the_ack_ops_do_not() -> None:
    """The message and the read mark stay ops the first release takes; the ask and the
    acknowledgement are ops of their own that it is never sent."""
    with Replica.open() as a:
        mid = a.send_message("alice", "bob", "ack me").id
        a.require_ack(mid)
        a.acknowledge(mid, "bob")
        ops = [opsmod.decode(raw) for _l, raw in a.ops_after(0)]
        assert [(o.kind, o.v1) for o in ops] == [("msg", True), ("set", False), ("set", True), ("set", False)]
