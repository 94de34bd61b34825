"""Acknowledgements: a message that asks for one, the recipient's acknowledgement syncing like a
receipt, the status and overdue views, bad calls, and what older releases are sent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from replica import InvalidArgument, NotFound, Replica, open_home
from replica import ops as opsmod
from tests.conftest import sync_all
from tests.daemons import PEERD


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


def test_the_cli_shows_who_acknowledged_and_what_is_overdue(tmp_path: Path) -> None:
    home = tmp_path / "home"
    subprocess.run([str(PEERD), "init", "--home", str(home)], check=True, capture_output=True)
    with open_home(home) as r:
        mid = r.send_message("alice", "bob,carol", "ship it?").id
        r.require_ack(mid)
        r.acknowledge(mid, "bob")
        r.reserve("repo", "alice", ["src/"], reason="release")

    def peerd(*argv: str) -> str:
        done = subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    status = peerd("status", mid)
    assert "ACKNOWLEDGED" in status
    (bob,) = [line for line in status.splitlines() if line.startswith("bob")]
    assert bob.split()[-1].startswith("20")  # an ISO time in the last column
    overdue = json.loads(peerd("acks", "--older-than", "0s", "--json"))
    assert [(o["message_id"], [w["role"] for w in o["waiting_for"]]) for o in overdue] == [(mid, ["carol"])]
    assert "no acknowledgement overdue" in peerd("acks")
    (lease,) = json.loads(peerd("leases", "--json"))
    assert (lease["agent"], lease["path_pattern"], lease["status"]) == ("alice", "src/", "held")
