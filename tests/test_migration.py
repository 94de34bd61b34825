"""Upgrading a replica file written before name keys (schema v2): it is rebuilt from its ops."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from replica import Replica, hlc, identity, ops, routing, schema
from replica.ids import receipt_id
from tests.oldfiles import undo_roles_seen, write_v2_file


def set_op(ident: identity.Identity, seq: int, stamp: int, writes: list[list[Any]]) -> bytes:
    return ops.encode(ident.public_key, seq, stamp, ops.KIND_SET, {"w": writes}, sign=ident.sign)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_an_older_file_is_upgraded_to_the_state_of_its_ops(tmp_path: Path, version: int) -> None:
    """Keys, routes, receipts, profiles and arrival times of a v2, v3 or v4 file (before name keys) are
    recomputed from its ops: the upgraded file equals a replica that applied the same ops, mixed-case
    names and older texts included."""
    sender = Replica.open(wall=lambda: 1_700_000_000_000)
    first = sender.send_message("Alpha", "TAU", "to TAU")
    sender.send_message("alpha", "Tau, phi", "to a list")
    sender.send_message("alpha", "broadcast", "to all")
    other = identity.generate()
    stamp = hlc.pack(1_700_000_100_000)
    raws = [raw for _, raw in sender.ops_after(0)] + [
        set_op(other, 1, stamp, [["rcpt", [first.id, "TAU", ""], "d", 10], ["rcpt", [first.id, "tau", ""], "r", 20]]),
        set_op(other, 2, stamp + 1, [["prof", ["Delta"], "name", "Delta"], ["prof", ["Delta"], "static", "ETL"],
                                     ["prof", ["DELTA"], "dynamic", "loading"]]),
    ]
    write_v2_file(tmp_path / "old.db", raws)
    if version > 2:  # per-thread numbers (v3) and first-seen times (v4), as the peerd before name keys ran them
        with sqlite3.connect(tmp_path / "old.db") as conn:
            for script in schema.MIGRATIONS[2:version]:
                conn.executescript(script)
            conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (version,))
        conn.close()

    every_broadcast = 10**13  # these messages are from 2023: keep every broadcast in the inboxes
    upgraded = Replica.open(tmp_path / "old.db", broadcast_history_ms=every_broadcast)
    rebuilt = Replica.open(broadcast_history_ms=every_broadcast)
    rebuilt.apply(raws)
    assert upgraded.state_digest() == rebuilt.state_digest()
    assert upgraded.vector() == rebuilt.vector()
    for r in (upgraded, rebuilt):
        assert [m.content for m in r.inbox_all("tau").messages] == ["to TAU", "to a list", "to all"]
        assert [m.content for m in r.check_messages("tau").messages] == ["to a list", "to all"]  # read as TAU
        [status] = r.message_status(first.id)
        assert (status.role, status.receipt_id) == ("tau", receipt_id(first.id, "tau", ""))
        [delta] = r.list_profiles()
        assert (delta.orchestrator_id, delta.name, delta.static, delta.dynamic) == (
            "Delta", "Delta", {"role": "ETL"}, {"currentTask": "loading"})
        assert [h.content for h in r.search_messages("list")] == ["to a list"]
        assert [(s.role, s.instance) for s in r.recent_senders()] in ([("Alpha", None)], [("alpha", None)])
    assert upgraded.position_at(1_700_000_000_000 - 1) == 0  # arrival times from the ops' clocks
    assert upgraded.position_at(1_700_000_100_000) == len(raws)  # (checking the inbox wrote one op since)
    with sqlite3.connect(tmp_path / "old.db") as conn:
        version = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()[0]
        assert int(version) == schema.LATEST
        assert conn.execute("SELECT count(*) FROM routes WHERE role = 'Tau'").fetchone()[0] == 0
    digest = upgraded.state_digest()
    upgraded.close()
    again = Replica.open(tmp_path / "old.db", broadcast_history_ms=every_broadcast)  # nothing rebuilt again
    assert again.state_digest() == digest
    assert routing.channel_key("Tau, phi") == "tau,phi"
    again.close()


def test_a_v13_file_learns_which_roles_were_only_seen_reading(tmp_path: Path) -> None:
    """A file of schema v13 (first-seen times alone) is upgraded: a role that sent or has a profile is
    confirmed, one seen only reading its inbox is unconfirmed (and can be forgotten), and the file holds
    the state of a replica that applied the same ops."""
    db = tmp_path / "r.db"
    with Replica.open(db) as r:
        r.send_message("alpha", "beta", "hi")
        r.update_profile("Delta", name="D")
        r.check_messages("codr")
        raws = [raw for _, raw in r.ops_after(0)]
    conn = sqlite3.connect(db)
    undo_roles_seen(conn)
    conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (schema.ROLES_SEEN - 1,))
    conn.commit()
    conn.close()
    fresh = Replica.open()
    fresh.apply(raws)
    with Replica.open(db) as upgraded:
        assert upgraded.state_digest() == fresh.state_digest()
        for r in (upgraded, fresh):
            assert {x.role: x.status for x in r.role_senders()} == {
                "alpha": "confirmed", "delta": "confirmed", "codr": "unconfirmed"}
        assert upgraded.forget_role("codr").role == "codr"
        assert "codr" not in {x.role for x in upgraded.role_senders()}
